"""End-to-end GPU tests of jax_blockscale.matmul (the primitive → jax-triton → kernel path).

Skipped without a GPU. Every result is compared with the jnp reference (`jax_blockscale.reference`); the
tolerance is a relative Frobenius error derived from the output dtype: the kernels' products are exact
(decoded values times power-of-two scales fit bf16) and only accumulation order and the final rounding
differ, except fp8 wgmma, whose accumulator keeps fewer bits between the per-128-K promotions.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb

from _exhaustive import grid
from _matmul_checks import rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

RNG = np.random.default_rng(1)
TARGET = jb.detect_target() if jax.default_backend() == "gpu" else None


def _x(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _q(x, fmt, side):
    return jb.quantize_operand(x, fmt, side=side)


def _tolerance(out_dtype, fa):
    eps = float(jnp.finfo(out_dtype).eps)
    accumulation = 2e-3 if fa == "fp8_block" else 1e-5
    return 2 * eps + accumulation if out_dtype != jnp.float32 else accumulation


PAIRS = [
    ("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8_e5m2"), ("mxfp6_e2m3", "mxfp6_e2m3"),
    ("mxfp6_e3m2", "mxfp6_e3m2"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"),
    ("bf16", "mxfp4"), ("bf16", "nvfp4"), ("fp16", "mxfp8"), ("fp8_block", "fp8_block"),
]
SHAPES = [(1, 256, 512), (7, 200, 320), (128, 384, 1024), (129, 130, 4160), (1000, 264, 768)]


# By default every pair once, the shapes rotating over the pairs (each shape several times); the full
# pairs x shapes grid with --exhaustive.
MATMUL_GRID = grid([(fa, fb, *shape) for fa, fb in PAIRS for shape in SHAPES],
                   lambda i, case: i % len(SHAPES) == (i // len(SHAPES)) % len(SHAPES))


@pytest.mark.parametrize("fa,fb,m,n,k", MATMUL_GRID)
def test_matmul_matches_reference(fa, fb, m, n, k):
    a, b = _q(_x(m, k), fa, "a"), _q(_x(n, k) / np.sqrt(k), fb, "b")
    for out_dtype in (jnp.bfloat16, jnp.float32):
        out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype))(a, b)
        ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
        assert out.shape == (m, n) and out.dtype == out_dtype
        err = rel_err(out, ref)
        assert err < _tolerance(out_dtype, fa), (fa, fb, out_dtype, err, jb.explain(a, b))


@pytest.mark.parametrize("fa,fb", [("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block"),
                                   ("bf16", "mxfp4")])
def test_fp16_output_and_batch_dims(fa, fb):
    a, b = _q(_x(2, 3, 65, 256), fa, "a"), _q(_x(136, 256) / 16, fb, "b")
    out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float16))(a, b)
    assert out.shape == (2, 3, 65, 136)
    assert rel_err(out, jb.reference.matmul(a, b)) < _tolerance(jnp.float16, fa)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4", "fp8_block"])
def test_vmap_matches_python_loop(fmt):
    mm = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32))
    qa = jax.vmap(lambda t: _q(t, fmt, "a"))(_x(3, 33, 256))
    qws = jax.vmap(lambda t: _q(t, fmt, "b"))(_x(3, 160, 256) / 16)
    qw = _q(_x(160, 256) / 16, fmt, "b")
    pick = lambda q, i: jax.tree_util.tree_map(lambda t: t[i], q)
    cases = {
        "activations": (jax.jit(jax.vmap(mm, in_axes=(0, None)))(qa, qw), [mm(pick(qa, i), qw) for i in range(3)]),
        "weights": (jax.jit(jax.vmap(mm, in_axes=(None, 0)))(pick(qa, 0), qws),
                    [mm(pick(qa, 0), pick(qws, i)) for i in range(3)]),
        "both": (jax.jit(jax.vmap(mm))(qa, qws), [mm(pick(qa, i), pick(qws, i)) for i in range(3)]),
    }
    for name, (batched, looped) in cases.items():
        err = rel_err(batched, jnp.stack(looped))
        assert err < 1e-6, (name, err)


@pytest.mark.parametrize("fa,fb", [("mxfp8", "mxfp8"), ("mxfp4", "mxfp4"), ("fp8_block", "fp8_block")])
def test_bitwise_deterministic(fa, fb):
    a, b = _q(_x(300, 2048), fa, "a"), _q(_x(520, 2048) / 45, fb, "b")
    mm = jax.jit(lambda a, b: jb.matmul(a, b))
    first = np.asarray(mm(a, b)).view(np.uint16)
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(mm(a, b)).view(np.uint16), first)


def test_grad_on_gpu_matches_reference_grad():
    x, w = _x(64, 512), _x(96, 512) / 22

    def loss(x, w):
        return jnp.sum(jb.matmul(x, w, a_format="mxfp8", b_format="mxfp8", out_dtype=jnp.float32) ** 2)

    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    xq, wq = jb.dequantize(jb.quantize(x, "mxfp8")), jb.dequantize(jb.quantize(w, "mxfp8"))
    g = 2 * jnp.matmul(xq, wq.T, precision="highest")
    assert rel_err(gx, jnp.matmul(g, wq, precision="highest")) < 1e-4
    assert rel_err(gw, jnp.matmul(g.T, xq, precision="highest")) < 1e-4


def test_explain_reports_a_kernel_for_this_gpu():
    choice = jb.explain("mxfp8", "mxfp8")
    assert choice.target == TARGET
    if TARGET in ("sm_90", "sm_100"):
        assert choice.path in ("native", "upcast")
