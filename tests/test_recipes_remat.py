"""Recipes under rematerialization: `checkpoint_policy` keeps the quantized weights (and inputs) for the
backward, so the recomputed forward does not quantize them again, with the same gradient bits."""

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale.quantize_primitive import quantize_p
from jax_blockscale.recipes import INPUT_NAME, WEIGHT_NAME, quantized_dense

RNG = np.random.default_rng(3)
# 2**k row factors: block maxima land on the top codes (e4m3 256..448), the ones a float8 round trip
# through reduce_precision(4, 3) would turn into Inf.
X = jnp.asarray(RNG.standard_normal((96, 256)) * 2.0 ** RNG.integers(-4, 5, (96, 1)), jnp.bfloat16)
W_KN = jnp.asarray(RNG.standard_normal((256, 128)) / 16, jnp.float32)


def _loss(recipe, w_layout):
    def f(x, w):
        y = quantized_dense(x, w if w_layout == "kn" else w.T, recipe, w_layout=w_layout)
        return jnp.sum(jnp.tanh(y.astype(jnp.float32)))
    return f


def _count(jaxpr, prim) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += eqn.primitive is prim
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            n += _count(sub, prim)
    return n


POLICIES = {"nothing": None, "weights": jb.checkpoint_policy(), "weights+inputs": jb.checkpoint_policy(inputs=True)}


@pytest.mark.parametrize("recipe", ["fp8_deepseek", "mxfp8", "nvfp4"])
@pytest.mark.parametrize("w_layout", ["kn", "nk"])
def test_gradients_are_the_unrematerialized_bits(recipe, w_layout):
    f = _loss(recipe, w_layout)
    want = jax.jit(jax.grad(f, argnums=(0, 1)))(X, W_KN)
    for name, policy in POLICIES.items():
        got = jax.jit(jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1)))(X, W_KN)
        for g, w in zip(got, want):
            assert bool(jnp.all(jnp.isfinite(g))), name
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=name)


@pytest.mark.parametrize("w_layout", ["kn", "nk"])
def test_saved_quantizations_are_not_recomputed(w_layout):
    # fp8_deepseek: forward quantizes x and W (one kernel each, both layouts), backward quantizes dy.
    # Remat re-runs the forward's quantizations unless the policy keeps them.
    f = _loss("fp8_deepseek", w_layout)
    counts = {name: _count(jax.make_jaxpr(jax.grad(jax.checkpoint(f, policy=p), argnums=(0, 1)))(X, W_KN).jaxpr,
                           quantize_p) for name, p in POLICIES.items()}
    assert counts == {"nothing": 5, "weights": 4, "weights+inputs": 3}
    assert _count(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(X, W_KN).jaxpr, quantize_p) == 3


def test_saved_codes_cross_as_bytes():
    # Remat puts reduce_precision(finfo(dtype)) on every saved floating residual; for float8_e4m3fn that is
    # (4, 3), an IEEE format with Inf to XLA. The named codes must cross as uint8, never through it.
    f = jax.checkpoint(_loss("fp8_deepseek", "kn"), policy=jb.checkpoint_policy(inputs=True))
    text = str(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(X, W_KN))
    assert "exponent_bits=4" not in text and "exponent_bits=5" not in text
    assert f"name={WEIGHT_NAME}" in text and f"name={INPUT_NAME}" in text


def test_bf16_recipe_names_nothing():
    f = jax.checkpoint(_loss("bf16", "kn"), policy=jb.checkpoint_policy(inputs=True))
    assert "name=jax_blockscale" not in str(jax.make_jaxpr(jax.grad(f, argnums=(0, 1)))(X, W_KN))
