"""GPU tests of the decode kernel (`_triton/decode.py`, <= 64 rows x one weight) against the jnp reference.

Skipped without a GPU. Every weight format, with bf16 and with quantized activations, at M in {1, 5, 16,
64} (FMA variant up to 4 rows, MMA above) and odd N and K, as dispatch sends them; every variant
(compute x split-K reduction x fp4 decode) on one shape per format; bitwise determinism of the default
(ordered split-K) mode. Products are exact in bf16, so float32 outputs differ from the reference only by
the fp32 summation order (1e-5) and bf16 outputs by their rounding (2 eps). tests/test_decode_interpret.py
runs the same kernel in Triton's interpreter on the CPU.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale._triton.problem import GemmProblem, TileConfig

from _dispatch import enable_entry, sm90_decode_kernel
from _exhaustive import grid
from _matmul_checks import KINDS, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]


@pytest.fixture(autouse=True)
def _decode_dispatched_on_sm90(monkeypatch):
    """The decode entry is opt-in on sm_90 (backends.KERNEL_TABLE says why): these tests check it."""
    enable_entry(monkeypatch, "sm_90", "decode")

# weight format -> the quantized activation format paired with it (besides bf16)
WEIGHTS = {
    "mxfp4": "mxfp8", "nvfp4": "nvfp4", "mxfp6_e2m3": "mxfp6_e3m2", "mxfp6_e3m2": "mxfp6_e2m3",
    "mxfp8": "mxfp8", "mxfp8_e5m2": "mxfp4", "fp8_block": "fp8_block",
}
PAIRS = [(fa, fb) for fb, fq in WEIGHTS.items() for fa in ("bf16", fq)]
FP4 = ("mxfp4", "nvfp4")
N, K = 1000, 1000  # no whole number of weight tiles; K pads to 1024 (1000 is no multiple of 128 or 32)


def _dispatched(fa, fb, rows):
    """The decode kernel dispatch picks here: on sm_90 bf16 x fp4 weights at some rows take the Gluon kernel
    (tests/test_gpu_decode_wgmma.py), everything else decode.py."""
    return sm90_decode_kernel(fa, fb, rows) if backends.detect_target() == "sm_90" else "decode"


def _x(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32))


def _tolerance(out_dtype):
    return 2 * float(jnp.finfo(out_dtype).eps) + 1e-5 if out_dtype != jnp.float32 else 1e-5


def _operands(fa, fb, m, n, k, seed=0, a_gain=1.0):
    rng = np.random.default_rng(seed)
    a = _x(rng, m, k) * a_gain
    a = a.astype(jnp.bfloat16) if fa == "bf16" else jb.quantize_operand(a, fa, side="a")
    return a, jb.quantize_operand(_x(rng, n, k) / np.sqrt(k), fb, side="b")


def _check(a, b, out_dtype=jnp.bfloat16, config=None):
    out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype, config=config))(a, b)
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    assert out.shape == ref.shape and out.dtype == out_dtype
    assert np.isfinite(np.asarray(out, np.float32)).all()
    err = rel_err(out, ref)
    # decode_fp8 (dispatched for block FP8 x block FP8 on sm_90) multiplies the codes on the fp8 wgmma, whose
    # accumulation truncates (block_fp8.py): its own tolerance, as in tests/test_gpu_decode_fp8.py.
    fp8_wgmma = config is None and jb.explain(a, b).kernel == "decode_fp8"
    assert err < (2e-3 if fp8_wgmma else _tolerance(out_dtype)), (err, jb.explain(a, b), config)
    return out


# Default: every pair once, the row counts rotating; the full grid with --exhaustive.
@pytest.mark.parametrize("fa,fb,m", grid([(fa, fb, m) for fa, fb in PAIRS for m in (1, 5, 16, 64)],
                                         lambda i, case: i % 4 == (i // 4) % 4))
def test_every_format_as_dispatched(fa, fb, m):
    """The default configuration, float32 output (strict) and bf16 output (as served)."""
    a, b = _operands(fa, fb, m, N, K, seed=m)
    assert jb.explain(a, b).kernel == _dispatched(fa, fb, m)
    _check(a, b, jnp.float32)
    _check(a, b, jnp.bfloat16)


@pytest.mark.parametrize("fb", ["mxfp8", "mxfp8_e5m2"])
@pytest.mark.parametrize("fa,m,n,k", [("bf16", 1, 7168, 4096), ("mxfp8", 1, 7168, 2048), ("bf16", 1, 7168, 7168),
                                      ("mxfp8", 1, 2048, 8192), ("mxfp4", 3, 7168, 3072), ("bf16", 2, 7168, 4096),
                                      ("bf16", 1, 1024, 4096)])
def test_8bit_gemv_tiles_as_dispatched(fa, fb, m, n, k):
    """The 8-bit weights' sm_90 GEMV tiles (gemv_tiles.FP8_GEMV_TILES: whole rows on 8 warps at one row, 16 x 1024
    codes at 2-4 rows, the split table tile where N is short), on the shapes that pick them."""
    a, b = _operands(fa, fb, m, n, k, seed=n + k)
    assert jb.explain(a, b).kernel == "decode"
    _check(a, b, jnp.float32)


@pytest.mark.parametrize("fa,n,k", [("bf16", 1536, 2048), ("bf16", 7168, 4096), ("bf16", 2112, 8192),
                                    ("bf16", 1024, 4096), ("fp8_block", 7168, 4096), ("fp8_block", 2112, 8192),
                                    ("fp8_block", 7168, 2048)])
def test_block_fp8_gemv_tiles_as_dispatched(fa, n, k):
    """bf16 or block FP8 activations x block FP8 weights at one row (gemv_tiles.BLOCK_FP8_GEMV_TILES: whole 2048- /
    4096-code rows on 8 warps, 16 x 1024 codes beyond; for bf16 the heuristic tile where N is short), on the shapes
    that pick them."""
    a, b = _operands(fa, "fp8_block", 1, n, k, seed=n + k)
    assert jb.explain(a, b).kernel == "decode"
    _check(a, b, jnp.float32)
    _check(a, b, jnp.bfloat16)


def _configs(fb, rows):
    """The compute variants (FMA only for few rows, the GEMV for <= 16), no split / ordered split 3 / atomic
    split 8, and for fp4 weights the PTX decode and the fp32 one."""
    block_k = 256 if fb in FP4 else 128
    out = []
    for fma, (split, atomic), asm in itertools.product(
            (False, True), ((1, False), (3, False), (8, True)), (True, False) if fb in FP4 else (True,)):
        if fma and rows > 8:
            continue
        block_m = max(1, 1 << (rows - 1).bit_length()) if fma else max(16, 1 << (rows - 1).bit_length())
        out.append(TileConfig(block_m=block_m, block_n=32 if fma else 64, block_k=block_k, group_m=1,
                              num_warps=4, num_stages=3, split_k=split, fma=fma, atomic_split_k=atomic,
                              asm_decode=asm))
    if fb != "fp8_block" and rows > 4:  # the MMA on the 32-row, 2-warp mma.sync tiles of the tuned sm_90
        for split, asm in ((1, True), (2, False)):  # fp4 configs
            out.append(TileConfig(block_m=max(16, 1 << (rows - 1).bit_length()), block_n=32, block_k=2 * block_k,
                                  group_m=1, num_warps=2, num_stages=3, split_k=split, asm_decode=asm))
    if rows <= 16:  # the streaming GEMV: its 512-code fp4 / 256-byte tiles, with and without the prefetch
        # (K = 2048 holds 4 of these K tiles: the atomic split is 4 here)
        for (split, atomic), asm in itertools.product(((1, False), (3, False), (4, True)),
                                                      (True, False) if fb in FP4 else (True,)):
            out.append(TileConfig(block_m=max(1, 1 << (rows - 1).bit_length()), block_n=16, block_k=2 * block_k,
                                  group_m=1, num_warps=4, num_stages=2, split_k=split, atomic_split_k=atomic,
                                  asm_decode=asm, gemv=True, prefetch=split != 3))
        if fb in FP4:  # the GEMV's fp16-route PTX decode (f16_decode), and the bf16 one where that is default
            for block_k, split, f16 in ((2048, 1, True), (1024, 2, True), (2048, 1, False)):  # K = 2048
                out.append(TileConfig(block_m=max(1, 1 << (rows - 1).bit_length()), block_n=8, block_k=block_k,
                                      group_m=1, num_warps=4, num_stages=4, split_k=split, gemv=True,
                                      prefetch=False, f16_decode=f16))
    return out


# Each case compiles up to 16 configurations: by default every weight format once, M alternating.
@pytest.mark.parametrize("fb,m", grid([(fb, m) for fb in WEIGHTS for m in (3, 16)],
                                      lambda i, case: i % 2 == (i // 2) % 2))
def test_every_variant(fb, m):
    fa = WEIGHTS[fb] if fb in ("nvfp4", "fp8_block") else "bf16"
    a, b = _operands(fa, fb, m, 520, 2048, seed=7)
    for config in _configs(fb, m):
        _check(a, b, jnp.float32, config=config)


@pytest.mark.parametrize("fa,fb", [("bf16", fb) for fb in WEIGHTS] + [("nvfp4", "nvfp4"), ("fp8_block", "fp8_block")])
def test_default_mode_is_bitwise_deterministic(fa, fb):
    """The default reduction is ordered: the same bits on every run, with a split K (forced where the
    default configuration does not split: the tuned sm_90 ones at some sizes)."""
    from jax_blockscale._triton import decode

    m, n, k = 16, 1024, 8192
    config = decode.default_config(GemmProblem(1, False, m, n, k, KINDS[fa], KINDS[fb], "bf16"))
    if config.split_k == 1:
        config = config.replace(split_k=2)
    config = config.replace(kernel="decode", atomic_split_k=False)
    a, b = _operands(fa, fb, m, n, k, seed=11)
    mm = jax.jit(lambda a, b: jb.matmul(a, b, config=config))
    first = np.asarray(mm(a, b)).view(np.uint16)
    for _ in range(5):
        np.testing.assert_array_equal(np.asarray(mm(a, b)).view(np.uint16), first)
    again = jax.jit(lambda a, b: jb.matmul(a, b, config=config))(a, b)  # a second compilation
    np.testing.assert_array_equal(np.asarray(again).view(np.uint16), first)


def test_nvfp4_tensor_scales_and_batch_folding():
    rng = np.random.default_rng(5)
    x = _x(rng, 2, 3, 512) * 40
    a = jb.quantize_operand(x, "nvfp4", side="a")  # 6 rows in a batch of 2, tensor scale != 1
    b = jb.quantize_operand(_x(rng, 300, 512) * 0.01, "nvfp4", side="b")
    for lhs in (a, x.astype(jnp.bfloat16)):
        assert jb.explain(lhs, b).kernel == _dispatched("nvfp4" if lhs is a else "bf16", "nvfp4", 6)
        _check(lhs, b, jnp.float32)
