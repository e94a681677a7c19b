"""`matmul(transpose_out=True)`: the product transposed, (..., N, M), the plain product's values, under
jit, vmap, grad and a sharded jit (8 host CPU devices, tests/conftest.py; the GEMM opaque as on a GPU). The
Hopper kernel that writes it from its epilogue: tests/test_lowering_block_fp8_gluon.py (CPU) and
tests/test_gpu_block_fp8_persistent.py (GPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sharding_helpers import GATHERS, opaque_cpu_gemm
from _sharding_helpers import put as _put
from _sharding_helpers import run as _run
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb

RNG = np.random.default_rng(5)
PAIRS = [("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block"), ("bf16", "mxfp4")]


def _x(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _q(x, fmt, side):
    return jb.quantize_operand(x, fmt, side=side)


def _same(got, want):
    """Equal up to float32 summation order: on XLA:CPU the reference's dot may absorb the transpose (a dot
    with swapped operands, blocked differently). The GPU kernel's bits are the plain product's exactly."""
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))


@pytest.mark.parametrize("fa,fb", PAIRS)
def test_bits_are_the_transposed_product(fa, fb):
    a, b = _q(_x(2, 48, 256), fa, "a"), _q(_x(128, 256), fb, "b")
    mm = jax.jit(lambda a, b, t: jb.matmul(a, b, out_dtype=jnp.float32, transpose_out=t), static_argnums=2)
    out = mm(a, b, True)
    assert out.shape == (2, 128, 48)
    _same(out, np.swapaxes(np.asarray(mm(a, b, False)), -1, -2))


def test_vmap_over_weights():
    a, b = _q(_x(3, 32, 256), "mxfp8", "a"), _q(_x(3, 64, 256), "mxfp8", "b")
    mm = lambda t: jax.jit(jax.vmap(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32, transpose_out=t)))  # noqa
    got, want = mm(True)(a, b), mm(False)(a, b)
    assert got.shape == (3, 64, 32)
    _same(got, np.swapaxes(np.asarray(want), -1, -2))


def test_gradients_match_the_plain_product():
    x, w, r = _x(40, 256), _x(96, 256), _x(40, 96)

    def loss(transposed):
        def f(x, w):
            out = jb.matmul(x, w, a_format="mxfp8", b_format="mxfp4", out_dtype=jnp.float32,
                            transpose_out=transposed)
            return jnp.sum((out.T if transposed else out) * r)
        return f

    for g, want in zip(jax.grad(loss(True), (0, 1))(x, w), jax.grad(loss(False), (0, 1))(x, w)):
        _same(g, want)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices: tests/conftest.py sets XLA_FLAGS")
@pytest.mark.parametrize("a_spec,b_spec,out_spec,collective", [
    (P("data", None), P("model", None), P("model", "data"), None),  # the result's dims swap places
    (P(None, "model"), P(None, "model"), P(), "all-reduce"),         # K split: partial sums reduced
])
def test_sharded_without_gathering(a_spec, b_spec, out_spec, collective):
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    a = _q(jnp.asarray(RNG.integers(-4, 5, (32, 512)), jnp.float32), "mxfp8", "a")
    b = _q(jnp.asarray(RNG.integers(-4, 5, (512, 512)), jnp.float32), "mxfp8", "b")
    with opaque_cpu_gemm():
        fn = lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32, transpose_out=True)  # noqa: E731
        want = jax.jit(fn)(a, b)
        out, found = _run(fn, (_put(mesh, a, a_spec), _put(mesh, b, b_spec)))
    assert not found & set(GATHERS), found
    assert (collective in found) if collective else not found
    assert out.sharding.spec == out_spec or out_spec == P()
    np.testing.assert_array_equal(np.asarray(out), np.asarray(want))
