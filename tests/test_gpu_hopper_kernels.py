"""GPU tests of the block_fp8 and upcast kernels against `jax_blockscale.reference.matmul`.

Skipped without an NVIDIA GPU (and jax-triton). Operands come from `jax_blockscale.quantize` in the
contract's layouts (problem.py); K is zero-padded to a multiple of every block involved before quantizing.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_blockscale import dequantize, quantize, reference
from jax_blockscale._triton.problem import GemmProblem, TileConfig

from _exhaustive import grid

pytestmark = pytest.mark.gpu

MX_FORMATS = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2", "e2m3": "mxfp6_e2m3", "e3m2": "mxfp6_e3m2",
              "e2m1": "mxfp4"}
DENSE = {"bf16": jnp.bfloat16, "fp16": jnp.float16}
OUT = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


def _cuda_capability() -> int | None:
    try:
        device = jax.devices()[0]
    except RuntimeError:
        return None
    capability = getattr(device, "compute_capability", None)
    if device.platform != "gpu" or not capability or not capability.replace(".", "").isdigit():
        return None  # CPU, or a ROCm device (gfxNNN)
    major, minor = capability.split(".")
    return int(major) * 10 + int(minor)


@pytest.fixture(scope="module")
def capability() -> int:
    cc = _cuda_capability()
    if cc is None:
        pytest.skip("needs an NVIDIA GPU")
    from jax_blockscale._triton import jt

    try:
        jt.jax_triton()
    except ImportError as e:
        pytest.skip(str(e))
    return cc


@pytest.fixture(scope="module")
def kernels(capability):
    # Imported only once a GPU is known to be there: the kernel modules import triton.
    from jax_blockscale._triton import block_fp8, upcast

    return block_fp8, upcast


# ---------------------------------------------------------------------------------------------------------
# Operands and checks.


def padded_k(a_kind: str, b_kind: str, k: int) -> int:
    block = 128 if "block_fp8" in (a_kind, b_kind) else 32
    return -(-k // block) * block


def make_operand(kind: str, x: jax.Array, *, weight: bool):
    """(reference operand, values, scales, tensor scale) of `x` (..., rows, K) quantized as `kind`."""
    if kind in DENSE:
        dense = x.astype(DENSE[kind])
        return dense, dense, jnp.zeros(x.shape[:-1] + (1,), dense.dtype), 1.0
    if kind == "block_fp8":  # DeepSeek-V3: 1 x 128 activation groups, 128 x 128 weight tiles
        q = quantize(x, "fp8_block", block=(128, 128) if weight else (1, 128))
        return q, q.values, q.scales, 1.0
    q = quantize(x, "nvfp4" if kind == "nvfp4" else MX_FORMATS[kind])
    return q, q.values, q.scales, (q.tensor_scale if kind == "nvfp4" else 1.0)


def make_case(p: GemmProblem, seed: int = 0, k_live: int = 200):
    """(kernel operands, float32 reference) for problem `p`; K beyond the first `k_live` columns is zero
    (the caller's padding), so K need not be a multiple of 128 in the data."""
    ka, kb = jax.random.split(jax.random.key(seed))
    k_live = min(p.k, k_live)
    b_shape = ((p.batch,) if p.b_batched else ()) + (p.n, p.k)
    a = jnp.pad(jax.random.normal(ka, (p.batch, p.m, k_live)), [(0, 0), (0, 0), (0, p.k - k_live)])
    b = jnp.pad(jax.random.normal(kb, b_shape[:-1] + (k_live,)), [(0, 0)] * (len(b_shape) - 1) + [(0, p.k - k_live)])
    ref_a, a_values, a_scales, ts_a = make_operand(p.a_kind, a, weight=False)
    ref_b, b_values, b_scales, ts_b = make_operand(p.b_kind, b, weight=True)
    alpha = jnp.reshape(jnp.asarray(ts_a, jnp.float32) * jnp.asarray(ts_b, jnp.float32), (1,))
    return (a_values, a_scales, b_values, b_scales, alpha), reference.matmul(ref_a, ref_b, jnp.float32)


def run(module, p: GemmProblem, operands, capability: int, config: TileConfig | None = None) -> jax.Array:
    config = config or module.default_config(p)
    fn = jax.jit(functools.partial(module.launch, p, config=config, compute_capability=capability))
    out = fn(*operands)
    assert out.shape == (p.batch, p.m, p.n) and out.dtype == OUT[p.out_dtype]
    return out


# Relative error of the tensor cores' accumulation, the floor under the output's rounding. bf16 MMA adds in
# fp32 (seen: 1.7e-5 at K = 16384); Hopper's fp8 MMA keeps only ~14 bits inside each 128-wide K block
# before the kernel promotes it to fp32 (DeepSeek-V3 §3.3.2; seen: 1.1e-4 at K = 768, 2.2e-4 at 16384).
MMA_ACCUMULATION = {"bf16": 5e-5, "fp8": 5e-4}


def tolerance(p: GemmProblem) -> float:
    """Operands are exact in the kernels' dot dtype, so the error is the output's rounding (its eps) or
    the MMA accumulation floor; an fp16 operand beside a non-fp16 one is rounded to bf16 (+ bf16's eps)."""
    floor = MMA_ACCUMULATION["fp8" if p.a_kind == "block_fp8" else "bf16"]
    tol = max(float(jnp.finfo(OUT[p.out_dtype]).eps), floor)
    if "fp16" in (p.a_kind, p.b_kind) and (p.a_kind, p.b_kind) != ("fp16", "fp16"):
        tol += float(jnp.finfo(jnp.bfloat16).eps)
    return tol


def assert_close(out: jax.Array, ref: jax.Array, tol: float) -> None:
    out = np.asarray(out.astype(jnp.float32))
    ref = np.asarray(ref)
    assert np.isfinite(out).all()
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol, f"relative Frobenius error {err:.3g} >= {tol:.3g}"


def check(module, p: GemmProblem, capability: int, config: TileConfig | None = None) -> jax.Array:
    operands, ref = make_case(p)
    out = run(module, p, operands, capability, config)
    assert_close(out, ref, tolerance(p))
    return out


def module_for(kernels, a_kind: str):
    block_fp8, upcast = kernels
    return block_fp8 if a_kind == "block_fp8" else upcast


# ---------------------------------------------------------------------------------------------------------
# Tests.

_UPCAST_KINDS = (*MX_FORMATS, "nvfp4", *DENSE)
ALL_UPCAST_PAIRS = [(a, b) for a in _UPCAST_KINDS for b in _UPCAST_KINDS]
# Default: the same-kind pairs and, for each a kind, one other b kind (b = 3a + 1 mod 8 reaches every b).
UPCAST_GRID = grid(ALL_UPCAST_PAIRS, lambda i, case: i // 8 == i % 8 or i % 8 == (3 * (i // 8) + 1) % 8)
SHAPE_KINDS = [("block_fp8", "block_fp8"), ("e2m1", "e2m1"), ("nvfp4", "nvfp4"), ("e4m3", "e4m3"), ("bf16", "e2m1")]


@pytest.mark.parametrize("a_kind,b_kind", UPCAST_GRID)
def test_upcast_every_pair(kernels, capability, a_kind, b_kind):
    assert (a_kind, b_kind) in kernels[1].SUPPORTED
    p = GemmProblem(2, False, 129, 200, padded_k(a_kind, b_kind, 200), a_kind, b_kind, "bf16")
    check(kernels[1], p, capability)


# Default: each kind at one M, each M for one kind (the diagonal); all 25 with --exhaustive.
@pytest.mark.parametrize("a_kind,b_kind,m", grid([(a, b, m) for a, b in SHAPE_KINDS for m in (1, 7, 128, 129, 1000)],
                                                 lambda i, case: i // 5 == i % 5))
def test_shapes(kernels, capability, a_kind, b_kind, m):
    p = GemmProblem(2, False, m, 333, padded_k(a_kind, b_kind, 200), a_kind, b_kind, "bf16")
    check(module_for(kernels, a_kind), p, capability)


@pytest.mark.parametrize("m", [1, 129])
@pytest.mark.parametrize("a_kind,b_kind", SHAPE_KINDS)
def test_batched_b(kernels, capability, a_kind, b_kind, m):
    p = GemmProblem(3, True, m, 200, padded_k(a_kind, b_kind, 200), a_kind, b_kind, "bf16")
    check(module_for(kernels, a_kind), p, capability)


@pytest.mark.parametrize("out_dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("a_kind,b_kind", [("block_fp8", "block_fp8"), ("nvfp4", "nvfp4"), ("e3m2", "e2m3")])
def test_out_dtypes(kernels, capability, a_kind, b_kind, out_dtype):
    p = GemmProblem(2, False, 129, 200, padded_k(a_kind, b_kind, 200), a_kind, b_kind, out_dtype)
    check(module_for(kernels, a_kind), p, capability)


BLOCK_FP8_CONFIGS = [
    TileConfig(block_m=64, block_n=256, block_k=128, num_warps=8, num_stages=3),  # per-column weight scales
    TileConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=4),  # two K tiles per scale
    TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, split_k=3),
    TileConfig(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=3, split_k=2),
    # Hopper speed paths: swapped operands (decode), TMA loads with 64- and 256-wide tiles.
    TileConfig(block_m=64, block_n=16, block_k=128, num_warps=4, num_stages=4, split_k=2, swap_ab=True),
    TileConfig(block_m=128, block_n=64, block_k=128, num_warps=8, num_stages=4, swap_ab=True),
    TileConfig(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4, tma=True),
    TileConfig(block_m=64, block_n=256, block_k=128, num_warps=8, num_stages=3, tma=True),
]
UPCAST_CONFIGS = [
    TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=2),  # K = 224: masked tail
    TileConfig(block_m=64, block_n=256, block_k=32, num_warps=8, num_stages=4),
    TileConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=3, split_k=3),
    TileConfig(block_m=64, block_n=16, block_k=128, num_warps=4, num_stages=4, split_k=3, swap_ab=True),
]


@pytest.mark.parametrize("config", BLOCK_FP8_CONFIGS, ids=str)
def test_block_fp8_configs(kernels, capability, config):
    p = GemmProblem(2, False, 300, 520, 768, "block_fp8", "block_fp8", "fp32")
    check(kernels[0], p, capability, config)


@pytest.mark.parametrize("config", UPCAST_CONFIGS, ids=str)
@pytest.mark.parametrize("a_kind,b_kind", [("nvfp4", "nvfp4"), ("e4m3", "e2m1")])
def test_upcast_configs(kernels, capability, a_kind, b_kind, config):
    p = GemmProblem(2, False, 300, 520, 224, a_kind, b_kind, "fp32")
    check(kernels[1], p, capability, config)


@pytest.mark.parametrize("a_kind,b_kind", [("nvfp4", "nvfp4"), ("e2m3", "e4m3"), ("e2m1", "bf16")])
def test_upcast_predecoded(kernels, capability, a_kind, b_kind):
    """Large M and N: scaled operands are dequantized to bf16 by XLA before a bf16 x bf16 kernel."""
    p = GemmProblem(1, False, 1000, 700, 224, a_kind, b_kind, "bf16")
    config = kernels[1].default_config(p)
    assert kernels[1].predecoded_sides(p, config) == (True, b_kind != "bf16")
    check(kernels[1], p, capability, config)


@pytest.mark.parametrize("a_kind,b_kind", [("nvfp4", "e2m1"), ("bf16", "e4m3"), ("e5m2", "e3m2")])
def test_upcast_predecoded_tma(kernels, capability, a_kind, b_kind):
    """Both operands predecoded (large M and N): the TMA bf16 kernel, with ragged M and N tiles."""
    p = GemmProblem(1, False, 1000, 1100, 512, a_kind, b_kind, "bf16")
    config = kernels[1].default_config(p)
    assert config.tma
    check(kernels[1], p, capability, config)


@pytest.mark.parametrize("a_kind,b_kind,split_k", [("block_fp8", "block_fp8", 1), ("block_fp8", "block_fp8", 4),
                                                   ("nvfp4", "nvfp4", 1), ("nvfp4", "nvfp4", 4)])
def test_bitwise_deterministic(kernels, capability, a_kind, b_kind, split_k):
    p = GemmProblem(1, False, 64, 256, 2048, a_kind, b_kind, "bf16")
    module = module_for(kernels, a_kind)
    config = module.default_config(p).replace(split_k=split_k)
    operands, _ = make_case(p, k_live=p.k)
    first = run(module, p, operands, capability, config)
    second = run(module, p, operands, capability, config)
    assert np.array_equal(np.asarray(first).view(np.uint16), np.asarray(second).view(np.uint16))


def test_e8m0_special_scales(kernels, capability):
    """e8m0 0xFF (NaN) poisons the rows it scales; 0x00 is 2**-127 (tiny, not zero-coded 1.0 or NaN)."""
    p = GemmProblem(1, False, 64, 128, 256, "e4m3", "e4m3", "fp32")
    ka, kb = jax.random.split(jax.random.key(2))
    qa = quantize(jax.random.normal(ka, (1, p.m, p.k)), "mxfp8")
    qb = quantize(jax.random.normal(kb, (p.n, p.k)), "mxfp8")
    qa = dataclasses.replace(qa, scales=qa.scales.at[0, 3, 1].set(0xFF).at[0, 5, :].set(0))
    ref = np.asarray(reference.matmul(qa, qb, jnp.float32))
    operands = (qa.values, qa.scales, qb.values, qb.scales, jnp.ones((1,), jnp.float32))
    out = np.asarray(run(kernels[1], p, operands, capability))
    assert np.isnan(out[0, 3]).all() and np.isnan(ref[0, 3]).all()
    assert np.isfinite(out[0, 5]).all() and np.abs(out[0, 5]).max() < 1e-30
    rest = [r for r in range(p.m) if r not in (3, 5)]
    assert_close(jnp.asarray(out[0, rest]), jnp.asarray(ref[0, rest]), tolerance(p))


# Rows of the 2 GiB operands repeat with a period of 97, which divides no power of two: a row offset that
# wrapped at 2**31 or 2**32 bytes would read a row with other values. (Drawing 2**31 random bytes on the
# device instead, jax.random.bits, compiles to ~32 GiB of temporaries: threefry's counters and outputs per
# element. Two such tests at once under pytest-xdist do not fit an 80 GB H100.)
_PERIOD = 97


def _repeated_operand(kind: str, key, rows: int, k: int, *, weight: bool):
    """(values, scales, dense) of `rows` rows repeating 97 quantized normal rows; `dense(r)` is the float32
    value of rows `r`."""
    block = {"block": (1, 128)} if kind == "block_fp8" else {}
    base = quantize(jax.random.normal(key, (_PERIOD, k)), "fp8_block" if kind == "block_fp8" else "mxfp8", **block)
    index = jnp.arange(rows) % _PERIOD
    if kind == "block_fp8" and weight:
        # A weight's 128 x 128 tiles would span rows of different base rows: scale 1.0, values as they are.
        scales = jnp.ones((-(-rows // 128), k // 128), jnp.float32)
        dense = base.values.astype(jnp.float32)
    else:
        scales = base.scales[index]
        dense = dequantize(base, jnp.float32)
    return base.values[index], scales, lambda r: dense[r % _PERIOD]


@pytest.mark.parametrize("side", ["a", "b"])
@pytest.mark.parametrize("a_kind", ["block_fp8", "e4m3"])
def test_offsets_past_2_31(kernels, capability, a_kind, side):
    """An operand of >= 2**31 elements (the activations' M * K, or a weight's N * K): the kernels switch to
    64-bit offsets. Checks the last 40 rows (a) or columns (b), which only 64-bit offsets reach."""
    big, k = (1 << 31) // 16384 + 64, 16384
    m, n = (big, 64) if side == "a" else (64, big)
    p = GemmProblem(1, False, m, n, k, a_kind, a_kind, "fp32")
    key_a, key_b = jax.random.split(jax.random.key(1))
    a_values, a_scales, a_dense = _repeated_operand(a_kind, key_a, m, k, weight=False)
    b_values, b_scales, b_dense = _repeated_operand(a_kind, key_b, n, k, weight=True)
    out = run(module_for(kernels, a_kind), p,
              (a_values[None], a_scales[None], b_values, b_scales, jnp.ones((1,), jnp.float32)), capability)
    rows, cols = (jnp.arange(m - 40, m), jnp.arange(n)) if side == "a" else (jnp.arange(m), jnp.arange(n - 40, n))
    ref = jnp.matmul(a_dense(rows), b_dense(cols).T, precision="highest")
    assert_close(out[0][rows[:, None], cols[None, :]], ref, tolerance(p))
