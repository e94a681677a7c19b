"""GPU tests of the opt-in Gluon MX GEMM (`_triton/mx_gluon.py`, bf16 activations x MX / nvfp4 weights).

Skipped without a Hopper GPU (sm_90) and jax-triton. Each result is compared with
`jax_blockscale.reference.matmul` (dequantize + fp32 dot) under test_gpu_matmul.py's tolerance: the decoded
weight is exact, so only the fp32 summation order and the output rounding differ.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale._triton import mx_gluon
from jax_blockscale._triton.problem import TileConfig
from _matmul_checks import rel_err

from test_gpu_hopper_mx import _hopper  # noqa: F401  (autouse: skips without an sm_90 GPU and jax-triton)

pytestmark = pytest.mark.gpu

RNG = np.random.default_rng(11)


def _operands(m, n, k, fb):
    a = jnp.asarray(RNG.standard_normal((m, k)).astype(np.float32)).astype(jnp.bfloat16)
    b = jnp.asarray((RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
    return a, jb.quantize_operand(b, fb, side="b")


def _tolerance(out_dtype):
    return 2 * float(jnp.finfo(out_dtype).eps) + 1e-5 if out_dtype != jnp.float32 else 1e-5


WEIGHTS = ("mxfp4", "nvfp4", "mxfp8", "mxfp8_e5m2")
# Odd M and N (partial tiles, N = 130 / 333 also take the pointer store), K padded by the primitive, one
# program with several tiles (4100 x 4160: the prefetch across tiles).
SHAPES = [(65, 130, 256), (200, 333, 1000), (1000, 264, 768), (300, 4100, 4160)]
CONFIGS = [None, TileConfig(block_m=128, block_n=128, block_k=64, num_warps=4, num_stages=3, num_sms=7)]


@pytest.mark.parametrize("fb", WEIGHTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("variant", [0, 1])
def test_matches_reference(fb, m, n, k, variant):
    a, b = _operands(m, n, k, fb)
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    for out_dtype in (jnp.bfloat16, jnp.float32):
        config = CONFIGS[variant]
        if config is None:  # the defaults for this output (fewer stages beside an fp32 output)
            from jax_blockscale._triton.problem import GemmProblem
            from jax_blockscale.api import operand_kind

            p = GemmProblem(1, False, m, n, k, "bf16", operand_kind(b, "b"),
                            "bf16" if out_dtype == jnp.bfloat16 else "fp32")
            config = mx_gluon.default_config(p)
        config = config.replace(kernel="mx_gluon")
        out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype, config=config))(a, b)
        assert out.shape == (m, n) and out.dtype == out_dtype
        assert rel_err(out, ref) < _tolerance(out_dtype), (fb, out_dtype, rel_err(out, ref))


def test_nvfp4_tensor_scale_is_applied():
    a, _ = _operands(256, 512, 512, "nvfp4")
    w = jnp.asarray(RNG.standard_normal((512, 512)).astype(np.float32) * 300.0)  # amax far from 1: a real tensor scale
    b = jb.quantize_operand(w, "nvfp4", side="b")
    config = TileConfig(block_m=128, block_n=256, block_k=64, num_warps=4, num_stages=2, kernel="mx_gluon")
    out = jb.matmul(a, b, out_dtype=jnp.float32, config=config)
    assert rel_err(out, jb.reference.matmul(a, b, out_dtype=jnp.float32)) < 1e-5
