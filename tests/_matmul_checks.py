"""Helpers the GPU matmul test files share: the relative error they assert on, a jitted matmul, and the
kernel operand kind (problem.py's names) of each format name the tests quantize with."""

import jax
import jax.numpy as jnp
import numpy as np

import jax_blockscale as jb

# format name (jb.quantize_operand) -> operand kind (GemmProblem.a_kind / b_kind)
KINDS = {"bf16": "bf16", "mxfp4": "e2m1", "nvfp4": "nvfp4", "mxfp6_e2m3": "e2m3", "mxfp6_e3m2": "e3m2",
         "mxfp8": "e4m3", "mxfp8_e5m2": "e5m2", "fp8_block": "block_fp8"}


def rel_err(out, ref) -> float:
    """Frobenius-norm relative error of `out` against `ref`, in float64."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def run_matmul(a, b, config=None, out_dtype=jnp.float32):
    """jb.matmul(a, b) under jit, with an optional TileConfig."""
    return jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype, config=config))(a, b)
