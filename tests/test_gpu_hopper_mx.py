"""GPU tests of the Hopper MX GEMM with in-kernel decode (`_triton/hopper_mx.py`) on odd shapes.

Skipped without a Hopper GPU (sm_90) and jax-triton. Each result is compared with
`jax_blockscale.reference.matmul` (dequantize + fp32 dot) under test_gpu_matmul.py's tolerance: the
decoded products are exact, so only the fp32 summation order and the output rounding differ.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from _dispatch import enable_entry
import jax_blockscale as jb
from jax_blockscale._triton.problem import TileConfig
from _matmul_checks import rel_err

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(7)
ON_HOPPER = jax.default_backend() == "gpu" and jb.detect_target() == "sm_90"


@pytest.fixture(scope="module", autouse=True)
def _hopper():
    if not ON_HOPPER:
        pytest.skip("needs an sm_90 GPU")
    from jax_blockscale._triton import jt

    try:
        jt.jax_triton()
    except ImportError as e:
        pytest.skip(str(e))


def _operands(m, n, k, fa, fb, batch=()):
    a = jnp.asarray(RNG.standard_normal((*batch, m, k)).astype(np.float32))
    b = jnp.asarray((RNG.standard_normal((*batch, n, k)) / np.sqrt(k)).astype(np.float32))
    a = a.astype(jnp.bfloat16) if fa == "bf16" else jb.quantize_operand(a, fa, side="a")
    return a, jb.quantize_operand(b, fb, side="b")


def _tolerance(out_dtype):
    return 2 * float(jnp.finfo(out_dtype).eps) + 1e-5 if out_dtype != jnp.float32 else 1e-5


PAIRS = [("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8"), ("mxfp6_e2m3", "mxfp6_e3m2"), ("mxfp4", "mxfp4"),
         ("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"), ("bf16", "mxfp4"), ("bf16", "nvfp4")]
# Odd M and N (partial tiles on both sides), K not a multiple of 256 (padded by the primitive), M > 64.
SHAPES = [(65, 130, 96), (200, 333, 1000), (1000, 264, 768), (129, 4100, 4160)]


@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matches_reference(fa, fb, m, n, k, monkeypatch):
    a, b = _operands(m, n, k, fa, fb)
    enable_entry(monkeypatch, "sm_90", "hopper_mx")  # opt-in (backends.KERNEL_TABLE says why)
    assert jb.explain(a, b).kernel == "hopper_mx"
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    for out_dtype in (jnp.bfloat16, jnp.float32):
        out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype))(a, b)
        assert out.shape == (m, n) and out.dtype == out_dtype
        assert rel_err(out, ref) < _tolerance(out_dtype), (fa, fb, out_dtype, rel_err(out, ref))


# The variants the benchmark sweeps: fp8 promotion per MX block, other tiles, the non-PTX fp4 decode.
VARIANTS = [
    ("mxfp8", "mxfp8", TileConfig(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=4, fp8_mma=True)),
    ("mxfp8_e5m2", "mxfp8", TileConfig(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=4,
                                       fp8_mma=True)),
    ("mxfp4", "mxfp4", TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4)),
    ("mxfp4", "mxfp4", TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3,
                                  asm_decode=False)),
    ("nvfp4", "nvfp4", TileConfig(block_m=64, block_n=256, block_k=64, num_warps=4, num_stages=4)),
]


@pytest.mark.parametrize("fa,fb,config", VARIANTS)
@pytest.mark.parametrize("m,n,k", [(200, 333, 1000), (1000, 264, 768)])
def test_variants_match_reference(fa, fb, config, m, n, k):
    a, b = _operands(m, n, k, fa, fb)
    out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32, config=config.replace(kernel="hopper_mx")))(a, b)
    # Hopper's fp8 wgmma keeps fewer accumulator bits than fp32 within each 32-K step (DeepSeek-V3 §3.3.2;
    # measured 4.1e-5 to 4.6e-5 on an H100): the block FP8 kernels' tolerance. The bf16 decode is exact.
    tol = 5e-4 if config.fp8_mma else 1e-5
    assert rel_err(out, jb.reference.matmul(a, b, out_dtype=jnp.float32)) < tol


def test_nan_scale_and_batched_weight():
    # A block whose scale is NaN (0xFF) makes its output rows NaN, as the reference; the rest are finite.
    a, b = _operands(130, 200, 512, "mxfp4", "mxfp4", batch=(3,))
    a = dataclasses.replace(a, scales=a.scales.at[1, 5, 2].set(0xFF))
    out = jax.jit(jb.matmul)(a, b)
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    assert np.array_equal(np.isnan(np.asarray(out, np.float32)), np.isnan(np.asarray(ref)))
    finite = ~np.isnan(np.asarray(ref))
    assert rel_err(np.where(finite, out, 0), np.where(finite, ref, 0)) < _tolerance(jnp.bfloat16)
