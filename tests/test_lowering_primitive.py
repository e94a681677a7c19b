"""The whole public path, lowered for CUDA on a CPU machine: jb.matmul → primitive → jax-triton → PTX.

Needs jax-triton importable, which on a CPU machine takes the `jax-cuda13-plugin` wheel (see README); the
lowering compiles each kernel for the named target, so the assertions read the PTX that would run there.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb

from _jax_triton import require_jax_triton

jt = require_jax_triton()


def _q(shape, fmt, side):
    return jb.quantize_operand(jnp.zeros(shape, jnp.float32), fmt, side=side)


def _lowered_ptx(fa, fb, target, a_shape=(2, 100, 512), b_shape=(192, 512), **kw):
    a, b = _q(a_shape, fa, "a"), _q(b_shape, fb, "b")
    fn = jax.jit(lambda a, b: jb.matmul(a, b, target=target, **kw))
    lowered = fn.trace(a, b).lower(lowering_platforms=("cuda",))
    kernels = jt.lowered_kernels(lowered)
    assert len(kernels) == 1, "one fused launch expected"
    return kernels[0]


# (a, b, target, instruction the PTX must hold)
CASES = [
    ("mxfp8", "mxfp8", "sm_100", b"kind::mxf8f6f4.block_scale"),
    ("mxfp8_e5m2", "mxfp8", "sm_100", b"kind::mxf8f6f4.block_scale"),
    ("mxfp6_e2m3", "mxfp6_e3m2", "sm_100", b"kind::mxf8f6f4.block_scale"),
    ("mxfp8", "mxfp4", "sm_100", b"kind::mxf8f6f4.block_scale"),
    ("mxfp4", "mxfp4", "sm_100", b"block_scale"),
    ("nvfp4", "nvfp4", "sm_100", b"kind::mxf4nvf4.block_scale"),
    ("fp8_block", "fp8_block", "sm_100", b"tcgen05.mma"),
    ("fp8_block", "fp8_block", "sm_90", b"e4m3.e4m3"),
    ("mxfp8", "mxfp8", "sm_90", b"wgmma.mma_async.sync.aligned"),
    ("mxfp4", "mxfp4", "sm_90", b"bf16.bf16"),
    ("nvfp4", "nvfp4", "sm_90", b"bf16.bf16"),
    ("bf16", "mxfp4", "sm_90", b"bf16.bf16"),
]


@pytest.mark.parametrize("fa,fb,target,instruction", CASES)
def test_matmul_lowers_to_native_instruction(fa, fb, target, instruction):
    ptx = _lowered_ptx(fa, fb, target)
    assert instruction in ptx, f"{fa} x {fb} on {target}: {instruction!r} not in the kernel"
    if target == "sm_90":
        assert b"tcgen05" not in ptx


def test_vmapped_weights_lower_to_one_batched_launch():
    a = _q((3, 64, 256), "mxfp8", "a")
    ws = jax.vmap(lambda t: jb.quantize(t, "mxfp8"))(jnp.zeros((3, 128, 256)))
    fn = jax.jit(jax.vmap(lambda a, b: jb.matmul(a, b, target="sm_90")))
    kernels = jt.lowered_kernels(fn.trace(a, ws).lower(lowering_platforms=("cuda",)))
    assert len(kernels) == 1


def test_cpu_lowering_has_no_triton_call():
    a, b = _q((4, 64), "mxfp8", "a"), _q((8, 64), "mxfp8", "b")
    lowered = jax.jit(lambda a, b: jb.matmul(a, b, target="sm_90")).trace(a, b).lower()
    assert jt.lowered_kernels(lowered) == []
    np.testing.assert_array_equal(jax.jit(lambda a, b: jb.matmul(a, b))(a, b), np.zeros((4, 8)))
