"""Recipes on the CPU: each GEMM's formats, gradients against float32 autodiff, transforms, errors.

Tolerances. A block-scaled element rounds to nearest with relative error at most u = 2**-(mbits + 1) (e4m3
1/16, e5m2 1/8, e2m1 1/4; the block scale puts the block's values in the element's normal range, up to the
few far below the block's maximum). A GEMM of two such operands then has a relative Frobenius error of about
sqrt(u_a**2 + u_b**2) at most on inputs without systematic cancellation; dense operands count 0. On random
data the measured errors are 0.35-0.45 of that bound (rounding errors are spread uniformly within
±u). Through a two-layer MLP, forward errors reach the upstream gradient, so the bound is doubled there.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import primitive, recipes
from jax_blockscale.recipes import Recipe, get_recipe, quantize_weight, quantized_dense, recipe_matmul

RNG = np.random.default_rng(0)
M_LEAD, M, K, N = 2, 24, 256, 128  # M_LEAD * M = 48 tokens: not a multiple of 32, so wgrad pads along M


def _x(*shape, spread=True):
    x = RNG.standard_normal(shape).astype(np.float32)
    if spread:  # rows of different magnitude, which per-tensor scaling would handle badly
        x *= 2.0 ** RNG.integers(-3, 4, shape[:-1] + (1,))
    return jnp.asarray(x)


X, W, R = _x(M_LEAD, M, K), _x(N, K) / 16, _x(M_LEAD, M, N)
# Eager quantization would compile every small op on its own: jit it once.
_quantize_weight = jax.jit(quantize_weight, static_argnums=1)


def _u(fmt) -> float:
    return 0.0 if fmt is None else 2.0 ** -(fmt.element.mbits + 1)


def _tol(pair) -> float:
    return math.hypot(_u(pair[0]), _u(pair[1]))


def _rel(a, b) -> float:
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


def _q(t, fmt, rounding):
    if fmt is None:
        return t
    # nvfp4 and fp8_block take no rounding mode.
    return jb.quantize(t, fmt, **({"rounding": rounding} if isinstance(fmt, jb.formats.MXFormat) else {}))


@functools.partial(jax.jit, static_argnums=(2, 3))
def _emulated_gemm(a, b, pair, rounding):
    """The GEMM the recipe documents, built from quantize + the reference matmul."""
    qa, qb = _q(a, pair[0], rounding), _q(b, pair[1], rounding)
    if pair == (None, None):
        return jnp.einsum("...mk,...nk->...mn", qa, qb, precision="highest")
    return jb.reference.matmul(qa, qb)


@functools.lru_cache(maxsize=None)
def _layer_grads(name):
    """y, dx, dW of one layer, loss = sum(y * R), so the upstream gradient is exactly R."""
    def loss(x, w):
        y = recipe_matmul(x, w, name)
        return jnp.sum(y * R), y
    (_, y), (dx, dw) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(X, W)
    return y, dx, dw


def _f32_grads():
    def loss(x, w):
        y = jnp.einsum("bmk,nk->bmn", x, w, precision="highest")
        return jnp.sum(y * R), y
    (_, y), (dx, dw) = jax.value_and_grad(loss, (0, 1), has_aux=True)(X, W)
    return y, dx, dw


def test_recipe_table_and_lookup():
    assert set(recipes.RECIPE_NAMES) >= {"bf16", "mxfp8", "nvfp4", "fp8_deepseek", "w4a8", "w4a16", "w8a16_fp8"}
    served = get_recipe("w8a16_fp8")
    assert served.inference and served.fprop[0] is None and served.fprop[1].tile == (128, 128)
    r = get_recipe("MXFP8")
    assert r is get_recipe(r) and get_recipe("deepseek").name == "fp8_deepseek"
    assert [f.name for f in r.fprop + r.dgrad + r.wgrad] == ["mxfp8_e4m3"] * 6
    ds = get_recipe("fp8_deepseek")
    assert ds.fprop[0].tile == (1, 128) and ds.fprop[1].tile == (128, 128) and ds.dgrad[0].tile == (1, 128)
    assert get_recipe("nvfp4").fprop[0].name == "nvfp4" and get_recipe("nvfp4").dgrad[0].name == "mxfp8_e4m3"
    assert get_recipe("w4a8").fprop[1].name == "mxfp4" and get_recipe("w4a16").fprop[0] is None
    assert "wgrad" in r.describe() and hash(r) == hash(get_recipe("mxfp8"))
    with pytest.raises(ValueError, match="unknown recipe 'fp7'.*mxfp8"):
        get_recipe("fp7")
    with pytest.raises(ValueError, match="scale blocks along K differ"):
        Recipe("bad", fprop=("nvfp4", "mxfp8"))
    with pytest.raises(ValueError, match="unknown rounding"):
        Recipe("bad", rounding="up")


@pytest.mark.parametrize("name", recipes.RECIPE_NAMES)
def test_each_gemm_uses_the_documented_formats(name):
    """fprop, dgrad and wgrad equal the emulation from quantize + reference, operand by operand."""
    r = get_recipe(name)
    y, dx, dw = _layer_grads(name)
    x2, r2 = X.reshape(-1, K), R.reshape(-1, N)
    want_y = _emulated_gemm(X, W, r.fprop, r.rounding)
    want_dx = _emulated_gemm(R, W.T, r.dgrad, r.rounding)
    want_dw = _emulated_gemm(r2.T, x2.T, r.wgrad, r.rounding)
    for got, want in ((y, want_y), (dx, want_dx), (dw, want_dw)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("name", recipes.RECIPE_NAMES)
def test_gradients_vs_float32_autodiff(name):
    r = get_recipe(name)
    got, ref = _layer_grads(name), _f32_grads()
    for what, pair, g, f in zip(("y", "dx", "dW"), (r.fprop, r.dgrad, r.wgrad), got, ref):
        err, tol = _rel(g, f), _tol(pair)
        assert err <= max(tol, 1e-6), f"{name} {what}: relative error {err:.4f} > {tol:.4f}"
        if tol:  # quantization really happened
            assert err > tol / 20, f"{name} {what}: error {err:.2e} is suspiciously small"


def _mlp(params, x, names):
    (w1, w2), (r1, r2) = params, names
    return recipe_matmul(jax.nn.gelu(recipe_matmul(x, w1, r1)), w2, r2)


@pytest.mark.parametrize("names", [("mxfp8", "mxfp8"), ("fp8_deepseek", "fp8_deepseek"), ("nvfp4", "nvfp4"),
                                   ("fp8_deepseek", "mxfp8"), ("w4a8", "bf16")])
def test_two_layer_mlp_gradients_and_mixed_recipes(names):
    params = (_x(2 * N, K, spread=False) / 16, _x(N, 2 * N, spread=False) / 16)

    def loss(p, names):
        return jnp.sum(_mlp(p, X, names) * R)

    got = jax.jit(jax.grad(loss), static_argnums=1)(params, names)
    ref = jax.grad(loss)(params, ("bf16", "bf16"))  # bf16 recipe: dense dots, float32 inputs: exact f32
    rs = [get_recipe(n) for n in names]
    bound = 2 * max(_tol(p) for r in rs for p in (r.fprop, r.dgrad, r.wgrad))
    for g, f in zip(got, ref):
        assert _rel(g, f) <= bound


def _kinds(fn, *args):
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive is primitive.blockscaled_matmul_p:
                found.append((eqn.params["a"].kind, eqn.params["b"].kind))
            for p in eqn.params.values():
                for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(jax.make_jaxpr(fn)(*args).jaxpr)
    return sorted(found)


def test_backward_runs_on_the_primitive():
    """The custom_vjp's backward binds the primitive: fprop + dgrad + wgrad = 3 calls per layer."""
    def grad_fn(name):
        return jax.grad(lambda x, w: jnp.sum(recipe_matmul(x, w, name)), (0, 1))

    assert _kinds(grad_fn("mxfp8"), X, W) == [("e4m3", "e4m3")] * 3
    assert _kinds(grad_fn("fp8_deepseek"), X, W) == [("block_fp8", "block_fp8")] * 3  # all native on sm_90
    assert _kinds(grad_fn("mxfp8_e5m2_grads"), X, W) == [("e4m3", "e4m3"), ("e5m2", "e4m3"), ("e5m2", "e4m3")]
    assert _kinds(grad_fn("nvfp4"), X, W) == [("e4m3", "e4m3"), ("e4m3", "e4m3"), ("nvfp4", "nvfp4")]
    assert _kinds(grad_fn("w4a16"), X, W) == [("fp32", "e2m1")]  # dense x mxfp4 forward, dense backward
    assert _kinds(grad_fn("w8a16_fp8"), X, W) == [("fp32", "block_fp8")]


def test_deepseek_dgrad_weight_is_the_forward_weight_transposed():
    """128x128 tiles of W^T are the transposed tiles of W: dgrad reads exactly the forward's weight."""
    tile = jb.formats.BlockFP8Format(tile=(128, 128))
    both = jax.jit(lambda w: (jb.dequantize(jb.quantize(w, tile)), jb.dequantize(jb.quantize(w.T, tile))))
    fwd, bwd = both(W)
    np.testing.assert_array_equal(fwd.T, bwd)


def test_residuals_are_quantized():
    """The forward saves x^T and W^T quantized (fp8), not the float32 inputs."""
    vjp = jax.jit(lambda x, w: jax.vjp(lambda x, w: recipe_matmul(x, w, "mxfp8"), x, w)[1])(X, W)
    dtypes = {str(leaf.dtype) for leaf in jax.tree_util.tree_leaves(vjp)}
    assert "float8_e4m3fn" in dtypes and "float32" not in dtypes


def test_prequantized_weights_serve_and_backprop_to_activations():
    for name in ("w4a8", "w4a16", "w8a16_fp8", "mxfp8", "nvfp4", "fp8_deepseek"):
        r = get_recipe(name)
        qw = _quantize_weight(W.T, r)  # Flax layout (K, N) in, (N, K) quantized along K out
        assert qw.shape == (N, K) and qw.fmt == r.weight_format
        y = jax.jit(quantized_dense, static_argnums=2)(X, qw, name)
        want = jax.jit(lambda x, qw: jb.reference.matmul(_q(x, r.fprop[0], r.rounding), qw))(X, qw)
        np.testing.assert_allclose(y, want, rtol=2e-5, atol=1e-4)
    dx = jax.jit(jax.grad(lambda x: jnp.sum(quantized_dense(x, qw, "fp8_deepseek") * R)))(X)
    assert _rel(dx, _f32_grads()[1]) <= 2 * _tol(get_recipe("fp8_deepseek").fprop)


def test_vmap_scan_remat():
    f = functools.partial(recipe_matmul, recipe="mxfp8")
    ws = jnp.stack([W, W[::-1], 2 * W])
    # vmap over stacked weights (an ensemble) equals a loop
    got = jax.jit(jax.vmap(f, in_axes=(None, 0)))(X, ws)
    np.testing.assert_allclose(got, jnp.stack([jax.jit(f)(X, w) for w in ws]), rtol=1e-6)
    # a lax.scan over a stack of square layers, under remat, differentiates like the unrolled loop
    sq = ws[:, :, :N] * 4
    x0 = X[..., :N]

    def scanned(sq, x):
        body = jax.checkpoint(lambda h, w: (jnp.tanh(f(h, w)), None))
        return jnp.sum(jax.lax.scan(body, x, sq)[0] * R)

    def unrolled(sq, x):
        for w in sq:
            x = jnp.tanh(f(x, w))
        return jnp.sum(x * R)

    g1 = jax.jit(jax.grad(scanned, (0, 1)))(sq, x0)
    g2 = jax.jit(jax.grad(unrolled, (0, 1)))(sq, x0)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_batched_weights_and_bf16_inputs():
    xb, wb = X.astype(jnp.bfloat16), jnp.stack([W, W]).astype(jnp.bfloat16)
    @jax.jit
    def fwd_bwd(x, w, g):  # (2, M, K) x (2, N, K)
        y, vjp = jax.vjp(lambda x, w: recipe_matmul(x, w, "mxfp8"), x, w)
        return (y, *vjp(g))

    y, dx, dw = fwd_bwd(xb, wb, R.astype(jnp.bfloat16))
    assert y.dtype == dx.dtype == dw.dtype == jnp.bfloat16 and dw.shape == (2, N, K)
    ref = jnp.einsum("bmk,nk->bmn", X, W)
    assert _rel(y.astype(jnp.float32), ref) <= _tol(get_recipe("mxfp8").fprop)


def test_bad_shapes_explain_themselves_at_trace_time():
    def trace(x, w, name="mxfp8"):
        return jax.eval_shape(lambda x, w: recipe_matmul(x, w, name), x, w)

    s = jax.ShapeDtypeStruct
    with pytest.raises(ValueError, match=r"recipe 'mxfp8' cannot handle .*contraction sizes differ"):
        trace(s((4, 64), jnp.float32), s((32, 65), jnp.float32))
    with pytest.raises(ValueError, match="an axis has size 0"):
        trace(s((0, 64), jnp.float32), s((32, 64), jnp.float32))
    with pytest.raises(TypeError, match="must be float32, bfloat16 or float16"):
        trace(s((4, 64), jnp.int8), s((32, 64), jnp.float32))
    qw = jax.eval_shape(lambda: quantize_weight(W.T, "w4a8"))
    with pytest.raises(ValueError, match="expects fp8_block weights, got a pre-quantized mxfp4"):
        trace(X, qw, "fp8_deepseek")
    with pytest.raises(ValueError, match="keeps weights dense"):
        trace(X, qw, "bf16")
    with pytest.raises(ValueError, match="pass activations dense"):
        jax.eval_shape(lambda: recipe_matmul(jb.quantize(X, "mxfp8"), W, "mxfp8"))
    with pytest.raises(ValueError, match="quantized along axis -2"):
        jax.eval_shape(lambda: recipe_matmul(X, jb.quantize(W, "mxfp4", axis=0, rounding="rceil"), "w4a8"))
    with pytest.raises(ValueError, match="2-D weight"):
        quantized_dense(X, jnp.stack([W, W]), "mxfp8")


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4", "fp8_deepseek", "w4a8", "bf16"])
def test_kn_kernel_layout_gives_the_nk_results(name):
    """quantized_dense(w_layout="kn") reads a Flax (K, N) kernel without a transpose: the same forward bits
    as the (N, K) weight (the same blocks, quantized by the transposed side of the kernel), and the same
    gradients up to the wgrad GEMM's summation order, dW coming back (K, N)."""
    def grads(layout):
        def loss(x, w):
            y = quantized_dense(x, w, name, w_layout=layout)
            return jnp.sum(y * R), y
        w = W.T if layout == "kn" else W
        (_, y), (dx, dw) = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True))(X, w)
        return y, dx, dw.T if layout == "kn" else dw

    (y, dx, dw), (y_kn, dx_kn, dw_kn) = grads("nk"), grads("kn")
    np.testing.assert_array_equal(np.asarray(y_kn), np.asarray(y))
    np.testing.assert_array_equal(np.asarray(dx_kn), np.asarray(dx))
    np.testing.assert_allclose(np.asarray(dw_kn), np.asarray(dw), rtol=1e-5, atol=1e-5 * float(jnp.abs(dw).max()))
    with pytest.raises(ValueError, match="w_layout must be"):
        quantized_dense(X, W, name, w_layout="kN")
    with pytest.raises(ValueError, match=r"contraction sizes differ \(256 vs 128\)"):
        quantized_dense(X, W, name if name != "bf16" else "mxfp8", w_layout="kn")  # (N, K) passed as (K, N)
    if name != "bf16":
        qw = _quantize_weight(W.T, name)
        with pytest.raises(ValueError, match="a BlockScaledArray weight is \\(N, K\\)"):
            quantized_dense(X, qw, name, w_layout="kn")
