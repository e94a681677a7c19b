"""The quantization primitive lowered for CUDA on a CPU machine: one fused kernel, no XLA transposes.

On one device `jb.quantize` and `quantize_with_transpose` lower to a single Triton call; a recipe's
forward + backward lowers with the quantized operands produced by those calls only (no XLA transpose or
copy of a quantized buffer: the transposed layouts come out of the kernel).
"""

import jax
import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from jax_blockscale import primitive

from _jax_triton import require_jax_triton

jt = require_jax_triton()


class _H100:
    platform = "gpu"
    compute_capability = "9.0"
    device_kind = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def hopper(monkeypatch):
    """Target detection sees an H100 (this machine has none); everything after it is the real lowering."""
    monkeypatch.setattr(primitive, "_lowering_device", lambda ctx: _H100())


def _stablehlo(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4", "fp8_block"])
def test_quantize_lowers_to_one_kernel(hopper, fmt):
    x = jnp.zeros((256, 512), jnp.bfloat16)
    lowered = jax.jit(lambda x: jb.quantize_with_transpose(x, fmt)).trace(x).lower(lowering_platforms=("cuda",))
    assert len(jt.lowered_kernels(lowered)) == 1
    assert not _quantized_transposes(lowered.as_text())


QUANTIZED = ("f8E4M3FN", "f8E5M2", "xui8>")


def _quantized_transposes(text: str) -> list[str]:
    """StableHLO transposes whose result is a quantized buffer (codes or e8m0/e4m3 scales). (nvfp4's
    tensor amax of the transposed side reads x through a transpose that XLA fuses into the reduction.)"""
    return [line for line in text.splitlines()
            if "stablehlo.transpose" in line and any(t in line.split("->")[-1] for t in QUANTIZED)]


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp8_deepseek"])
def test_training_step_has_no_transpose_of_a_quantized_tensor(hopper, recipe):
    x = jnp.zeros((512, 1024), jnp.bfloat16)
    w = jnp.zeros((768, 1024), jnp.bfloat16)

    def step(x, w):
        return jax.value_and_grad(lambda x, w: jb.recipe_matmul(x, w, recipe).astype(jnp.float32).sum(),
                                  (0, 1))(x, w)

    offending = _quantized_transposes(_stablehlo(step, x, w))
    assert not offending, "\n".join(offending)
    # x, W and dy are each read once by a quantization kernel (both layouts), plus three GEMMs.
    lowered = jax.jit(step).trace(x, w).lower(lowering_platforms=("cuda",))
    names = [k for k in jt.lowered_kernels(lowered)]
    assert len(names) == 6, len(names)
