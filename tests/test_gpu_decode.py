"""GPU tests of the decode kernel (`_triton/decode.py`, <= 64 rows x one weight) against the jnp reference.

Skipped without a GPU. Tolerances as in tests/test_gpu_matmul.py: products are exact in bf16, so only the
accumulation order and the output rounding differ (block_fp8 here runs a bf16 MMA per 128-K block, no
fp8 truncation, so its tolerance is the exact-product one too).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale._triton.problem import TileConfig

from _exhaustive import grid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

RNG = np.random.default_rng(3)

# weight format x the activation formats that pair with it
PAIRS = [("bf16", w) for w in ("mxfp4", "nvfp4", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp8", "mxfp8_e5m2", "fp8_block")] + [
    ("mxfp8", "mxfp4"), ("mxfp8", "mxfp8"), ("mxfp6_e2m3", "mxfp6_e3m2"), ("mxfp4", "mxfp4"),
    ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block"),
]
ROWS = [1, 7, 16, 33, 64]


def _x(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def _tolerance(out_dtype):
    return 2 * float(jnp.finfo(out_dtype).eps) + 1e-5 if out_dtype != jnp.float32 else 1e-5


def _operands(fa, fb, m, n, k):
    a = _x(m, k)
    a = a.astype(jnp.bfloat16) if fa == "bf16" else jb.quantize_operand(a, fa, side="a")
    return a, jb.quantize_operand(_x(n, k) / np.sqrt(k), fb, side="b")


def _check(a, b, out_dtype=jnp.bfloat16, config=None):
    out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype, config=config))(a, b)
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    assert out.shape == ref.shape and out.dtype == out_dtype
    err = _rel_err(out, ref)
    assert err < _tolerance(out_dtype), (err, jb.explain(a, b), config)
    return out


# Default: every pair once, the row counts rotating; the full grid with --exhaustive.
@pytest.mark.parametrize("fa,fb,m", grid([(fa, fb, m) for fa, fb in PAIRS for m in ROWS],
                                         lambda i, case: i % len(ROWS) == (i // len(ROWS)) % len(ROWS)))
def test_decode_matches_reference(fa, fb, m):
    a, b = _operands(fa, fb, m, 1000, 1536)  # N not a multiple of any tile; K of 6 fp4 tiles
    assert jb.explain(a, b).kernel == "decode"
    _check(a, b)


@pytest.mark.parametrize("fa,fb", [("bf16", "mxfp4"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block")])
def test_odd_k_and_fp32_output(fa, fb):
    a, b = _operands(fa, fb, 5, 259, 4160)  # K padded to 4352 inside
    _check(a, b, jnp.float32)


def _configs(rows, fb):
    block_k = 256 if fb in ("mxfp4", "nvfp4") else 128
    out = []
    for fma, split, atomic, asm in itertools.product((False, True), (1, 3, 8), (False, True), (True, False)):
        if fma and rows > 8 or (atomic and split == 1):
            continue
        block_m = max(1, 1 << (rows - 1).bit_length()) if fma else max(16, 1 << (rows - 1).bit_length())
        out.append(TileConfig(block_m=block_m, block_n=32 if fma else 64, block_k=block_k, group_m=1,
                              num_warps=4, num_stages=3, split_k=split, fma=fma, atomic_split_k=atomic,
                              asm_decode=asm))
    return out


# Each case compiles ~10 configurations: by default mxfp4 at M = 1 (FMA and MMA) and mxfp8 at M = 16.
@pytest.mark.parametrize("fb,m", grid([(fb, m) for fb in ("mxfp4", "nvfp4", "fp8_block", "mxfp8") for m in (1, 4, 16)],
                                      lambda i, case: case in (("mxfp4", 1), ("mxfp8", 16))))
def test_every_variant(fb, m):
    """Both compute variants, split-K 1/3/8 with both reductions, PTX and fp32 decode."""
    fa = "fp8_block" if fb == "fp8_block" else "bf16"
    a, b = _operands(fa, fb, m, 520, 2048)
    for config in _configs(m, fb):
        _check(a, b, config=config)


@pytest.mark.parametrize("fa,fb", [("bf16", "mxfp4"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block")])
def test_default_mode_is_bitwise_deterministic(fa, fb):
    a, b = _operands(fa, fb, 16, 1024, 8192)
    split = TileConfig(block_m=16, block_n=64, block_k=256 if fb != "fp8_block" else 128, group_m=1,
                       num_warps=4, num_stages=3, split_k=8)
    for config in (None, split):
        mm = jax.jit(lambda a, b: jb.matmul(a, b, config=config))
        first = np.asarray(mm(a, b)).view(np.uint16)
        for _ in range(5):
            np.testing.assert_array_equal(np.asarray(mm(a, b)).view(np.uint16), first)


def test_nvfp4_tensor_scales_and_batch_folding():
    a = jb.quantize_operand(_x(2, 3, 512) * 40, "nvfp4", side="a")  # 6 rows, tensor scale != 1
    b = jb.quantize_operand(_x(300, 512) * 0.01, "nvfp4", side="b")
    assert jb.explain(a, b).kernel == "decode"
    _check(a, b)
