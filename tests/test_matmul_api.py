"""jax_blockscale.matmul on the CPU: the primitive's reference lowering, batching rule, custom_vjp, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import backends, primitive

RNG = np.random.default_rng(0)


def _x(*shape, scale=1.0):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32) * scale)


def _q(x, fmt, side):
    return jb.quantize_operand(x, fmt, side=side)


PAIRS = [
    ("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8_e5m2"), ("mxfp6_e2m3", "mxfp6_e3m2"), ("mxfp4", "mxfp4"),
    ("mxfp8", "mxfp4"), ("nvfp4", "nvfp4"), ("bf16", "mxfp4"), ("fp16", "nvfp4"), ("mxfp8", "bf16"),
    ("fp8_block", "fp8_block"),
]


def _primitive_calls(jaxpr):
    """Every blockscaled_matmul equation, looking inside custom_vjp/pjit sub-jaxprs."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is primitive.blockscaled_matmul_p:
            found.append(eqn)
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                found += _primitive_calls(inner)
    return found


def _unbatch(q, i):
    return jax.tree_util.tree_map(lambda t: t[i], q)


@pytest.mark.parametrize("fa,fb", PAIRS)
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_equals_reference(fa, fb, out_dtype):
    a, b = _q(_x(2, 7, 100), fa, "a"), _q(_x(33, 100), fb, "b")
    out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype))(a, b)
    assert out.shape == (2, 7, 33) and out.dtype == out_dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32),
                                  np.asarray(jb.reference.matmul(a, b, out_dtype=out_dtype), np.float32))


def _mm(a, b):
    return jb.matmul(a, b, out_dtype=jnp.float32)


@pytest.mark.parametrize("fmt", ["mxfp8", "nvfp4", "fp8_block"])
def test_vmap_activations_folds_into_one_call(fmt):
    xs = _x(4, 5, 64)
    qa = jax.vmap(lambda t: _q(t, fmt, "a"))(xs)
    qb = _q(_x(24, 64), fmt, "b")
    batched = jax.vmap(_mm, in_axes=(0, None))(qa, qb)
    looped = jnp.stack([_mm(_unbatch(qa, i), qb) for i in range(4)])
    np.testing.assert_array_equal(batched, looped)
    jaxpr = jax.make_jaxpr(jax.vmap(_mm, in_axes=(0, None)))(qa, qb)
    calls = _primitive_calls(jaxpr.jaxpr)
    assert len(calls) == 1
    # the weight stays unbatched: the lowering folds the batch into M
    assert calls[0].invars[3].aval.shape == qb.values.shape


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
def test_vmap_weights_and_both(fmt):
    qa = _q(_x(3, 5, 64), fmt, "a")
    qws = jax.vmap(lambda t: _q(t, fmt, "b"))(_x(2, 24, 64))
    out = jax.vmap(_mm, in_axes=(None, 0))(qa, qws)
    assert out.shape == (2, 3, 5, 24)
    for i in range(2):
        np.testing.assert_array_equal(out[i], _mm(qa, _unbatch(qws, i)))
    qas = jax.vmap(lambda t: _q(t, fmt, "a"))(_x(2, 5, 64))
    both = jax.vmap(_mm)(qas, qws)
    for i in range(2):
        np.testing.assert_array_equal(both[i], _mm(_unbatch(qas, i), _unbatch(qws, i)))


def test_vmap_in_axes_nonzero_and_nested():
    x = _x(5, 3, 64)  # batch on axis 1 of the dense activation
    qb = _q(_x(16, 64), "mxfp8", "b")
    out = jax.vmap(lambda t: _mm(t.astype(jnp.bfloat16), qb), in_axes=1)(x)
    for i in range(3):
        np.testing.assert_array_equal(out[i], _mm(x[:, i].astype(jnp.bfloat16), qb))
    qws = jax.vmap(lambda t: _q(t, "mxfp8", "b"))(_x(2, 16, 64))
    qa = jax.vmap(lambda t: _q(t, "mxfp8", "a"))(_x(3, 5, 64))
    nested = jax.vmap(jax.vmap(_mm, in_axes=(0, None)), in_axes=(None, 0))(qa, qws)
    assert nested.shape == (2, 3, 5, 16)
    np.testing.assert_array_equal(nested[1, 2], _mm(_unbatch(qa, 2), _unbatch(qws, 1)))


def test_grad_straight_through_matches_dequantized_product():
    x, w = _x(6, 96), _x(20, 96)

    def loss(x, w):
        return jnp.sum(jb.matmul(x, w, a_format="mxfp8", b_format="mxfp4", out_dtype=jnp.float32) ** 2)

    gx, gw = jax.grad(loss, argnums=(0, 1))(x, w)
    xq, wq = jb.dequantize(jb.quantize(x, "mxfp8")), jb.dequantize(jb.quantize(w, "mxfp4"))
    g = 2 * (xq @ wq.T)
    np.testing.assert_allclose(gx, g @ wq, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw, g.T @ xq, rtol=1e-5, atol=1e-5)


def test_grad_dense_activation_with_quantized_weight_and_batch():
    x = _x(2, 4, 64)
    qw = _q(_x(8, 64), "nvfp4", "b")
    gx = jax.grad(lambda x: jb.matmul(x, qw, out_dtype=jnp.float32).sum())(x)
    expected = jnp.ones((2, 4, 8)) @ jb.dequantize(qw)
    np.testing.assert_allclose(gx, expected, rtol=1e-5)
    # a quantized operand is a constant: its cotangent is zero, and grad through jit works
    gq = jax.jit(jax.grad(lambda w: jb.matmul(x, w, b_format="mxfp8", out_dtype=jnp.float32).sum()))(_x(8, 64))
    assert gq.shape == (8, 64) and np.all(np.isfinite(gq))


def test_batched_weight_grad_sums_correctly():
    x, w = _x(3, 4, 32), _x(3, 8, 32)
    gw = jax.grad(lambda w: jb.matmul(x, w, b_format="mxfp8", a_format="mxfp8",
                                      out_dtype=jnp.float32).sum())(w)
    xq = jb.dequantize(jb.quantize(x, "mxfp8"))
    np.testing.assert_allclose(gw, jnp.einsum("bmn,bmk->bnk", jnp.ones((3, 4, 8)), xq), rtol=1e-5)


def test_errors_at_trace_time():
    qa, qb = _q(_x(4, 64), "mxfp8", "a"), _q(_x(8, 96), "mxfp8", "b")
    with pytest.raises(ValueError, match="contraction sizes differ"):
        jb.matmul(qa, qb)
    with pytest.raises(ValueError, match="scale blocks along K differ"):
        jb.matmul(qa, _q(_x(8, 64), "nvfp4", "b"))
    with pytest.raises(ValueError, match="quantize a with axis=-1"):
        jb.matmul(jb.quantize(_x(64, 4), "mxfp8", axis=0), _q(_x(8, 4), "mxfp8", "b"))
    with pytest.raises(ValueError, match="both operands are dense"):
        jb.matmul(_x(4, 64), _x(8, 64))
    with pytest.raises(TypeError, match="float32/bfloat16/float16"):
        jb.matmul(jnp.ones((4, 64), jnp.int32), _q(_x(8, 64), "mxfp8", "b"))
    with pytest.raises(ValueError, match="out_dtype"):
        jb.matmul(qa, _q(_x(8, 64), "mxfp8", "b"), out_dtype=jnp.int8)
    with pytest.raises(ValueError, match="unknown target"):
        jb.matmul(qa, _q(_x(8, 64), "mxfp8", "b"), target="sm_75")
    with pytest.raises(ValueError, match="already quantized"):
        jb.matmul(qa, _q(_x(8, 64), "mxfp8", "b"), a_format="mxfp8")
    with pytest.raises(ValueError, match="same width along K"):
        jb.matmul(jb.quantize(_x(4, 64), "fp8_block", block=(1, 64)), _q(_x(8, 64), "fp8_block", "b"))


def test_explain_names_each_path():
    assert jb.explain("mxfp8", "mxfp8", target="sm_100").path == "native"
    assert jb.explain("mxfp8", "mxfp8", target="sm_90").path == "upcast"
    assert jb.explain("fp8_block", "fp8_block", target="sm_90").kernel == "block_fp8"
    assert jb.explain("nvfp4", "nvfp4", target="gfx950").path == "upcast"
    assert jb.explain("mxfp4", "mxfp4", target="gfx950").path == "native"
    assert jb.explain("mxfp8", "mxfp8", target="cpu").path == "reference"
    # An explicit target outside the table is rejected, as matmul rejects it; a detected GPU without
    # kernels (an A100 is "sm_80") is served by the reference, and the dispatch says why.
    with pytest.raises(ValueError, match="unknown target 'sm_80'"):
        jb.explain("mxfp8", "mxfp8", target="sm_80")
    unknown = backends.choose("sm_80", "e4m3", "e4m3")
    assert unknown.path == "reference" and "sm_80" in unknown.why
    fp32_dense = jb.explain(_x(2, 32), _q(_x(4, 32), "mxfp8", "b"), target="sm_90")
    assert fp32_dense.path == "reference"  # never a silent downcast of float32 activations
    table = jb.explain_all("sm_90")
    assert "fp8_block" in table and "upcast" in table and "native" in table


def test_explain_all_says_which_quantizer_runs():
    gpu = jb.explain_all("sm_90")
    assert "quantization" in gpu and "one-pass kernel" in gpu
    assert " 1 rows x one 7168 x 4096 weight" in gpu and "bf16: " not in gpu
    # the decode lines dispatch at that weight shape: one block FP8 row takes the GEMV, which applies by N and K
    one_row = next(line for line in gpu.splitlines() if " 1 rows x one" in line)
    assert "fp8_block x fp8_block: decode," in one_row
    assert jb.quantizer("fp8_block", "sm_90", block=(3, 128)).startswith("jnp quantizer (XLA): fp8_block tile")
    assert jb.quantizer("mxfp8", "gfx950").startswith("one-pass kernel")
    assert jb.quantizer("nvfp4", "cpu").startswith("jnp quantizer")
    assert "one-pass kernel" not in jb.explain_all("cpu")
