"""Decoded quantization on a GPU: the Gluon MX kernel's bf16 values (DECODED) bit for bit against the jnp
quantizer + `dequantize` run on the same GPU, and the recipes' decoded training against their codes path.

Skipped without a GPU (sm_90+). Inputs as in tests/test_gpu_quantize_mx_gluon.py (tests/_quant_inputs.py:
zeros, float32 subnormals, binade edges, rceil thresholds, ties, saturation, NaN, +-Inf; 10.5M elements per
case). A block with NaN or Inf decodes to NaN: 0x7FC0 from both (`quantize_primitive._canonical_nan`).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_blockscale import quantize_primitive as qp
from jax_blockscale.quantize import BlockScaledArray, dequantize
from jax_blockscale.recipes import get_recipe, quantized_dense

from _gluon_quant import PAIRS, compute_capability, sm90, tensor_scales  # noqa: F401 (sm90: autouse)
from _quant_inputs import DTYPES, special_array

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

PAIRS = {k: PAIRS[k] for k in ("mxfp8+T", "nvfp4+T", "nvfp4+mxfp8T", "mxfp4+T", "e5m2+e2m3T", "e3m2+nvfp4T",
                              "nvfp4", "mxfp8T")}


def _kernel(x, ts, pair, rounding):
    row, col = pair
    launch = functools.partial(qp._launch, row=(row, rounding), col=(col, rounding),
                               compute_capability=compute_capability(), decoded=True)
    return [np.asarray(a) for a in jax.jit(launch)(x, ts)]


def _want(x, ts, pair, rounding):
    row, col = pair
    ref = functools.partial(qp._reference, row=(row, rounding), col=(col, rounding), decoded=True)
    return [np.asarray(a) for a in jax.jit(ref)(x, ts)]


def _assert_same(got, want, what):
    for name, g, w in zip(("row", "column"), got[::2], want[::2]):
        assert g.shape == w.shape and g.dtype == w.dtype, (what, name, g.shape, w.shape, g.dtype, w.dtype)
        if g.shape == (1,):
            continue
        gb, wb = g.view(np.uint16), w.view(np.uint16)
        diff = np.argwhere(gb != wb)
        first = [(i, hex(gb[i]), hex(wb[i])) for i in map(tuple, diff[:3])]
        assert diff.size == 0, f"{what}: {len(diff)} {name} values differ, first (where, got, want) {first}"


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_decoded_kernel_equals_jnp_on_special_inputs(pair, dtype):
    x = jnp.asarray(special_array((4096, 2560), dtype, 7))
    ts = tensor_scales(x, PAIRS[pair])
    _assert_same(_kernel(x, ts, PAIRS[pair], "rceil"), _want(x, ts, PAIRS[pair], "rceil"), f"{pair} {dtype}")


@pytest.mark.parametrize("rounding", ["floor", "ceil", "even"])
@pytest.mark.parametrize("pair", ["mxfp8+T", "mxfp4+T", "e5m2+e2m3T"])
def test_every_mx_rounding(pair, rounding):
    x = jnp.asarray(special_array((1024, 2048), "f32", 7))
    ts = tensor_scales(x, PAIRS[pair])
    _assert_same(_kernel(x, ts, PAIRS[pair], rounding), _want(x, ts, PAIRS[pair], rounding), f"{pair} {rounding}")


@pytest.mark.parametrize("pair", ["nvfp4+T", "nvfp4+mxfp8T"])
def test_fixed_tensor_scales(pair):
    x = jnp.asarray(special_array((2048, 1536), "bf16", 7))
    ts = tensor_scales(x, PAIRS[pair], fixed=True)
    _assert_same(_kernel(x, ts, PAIRS[pair], "rceil"), _want(x, ts, PAIRS[pair], "rceil"), pair)


@pytest.mark.parametrize("shape", [(1, 1), (17, 40), (130, 300), (1000, 8200), (3, 200, 384), (2, 2, 48, 272)])
@pytest.mark.parametrize("pair", ["mxfp8+T", "nvfp4+mxfp8T", "mxfp4+T", "nvfp4"])
def test_ragged_and_batched_shapes(shape, pair):
    x = jnp.asarray(special_array(shape, "bf16", 7))
    ts = tensor_scales(x, PAIRS[pair])
    _assert_same(_kernel(x, ts, PAIRS[pair], "rceil"), _want(x, ts, PAIRS[pair], "rceil"), f"{shape} {pair}")


@pytest.mark.parametrize("pair", ["mxfp8+T", "nvfp4+mxfp8T", "mxfp4+T"])
def test_decoded_values_are_the_kernels_codes_decoded(pair):
    """The same kernel with DECODED off writes codes; `dequantize` of those (NaN as 0x7FC0) is what DECODED
    writes."""
    row, col = PAIRS[pair]
    x = jnp.asarray(special_array((1024, 1536), "bf16", 9))
    ts = tensor_scales(x, PAIRS[pair])
    got = _kernel(x, ts, PAIRS[pair], "rceil")
    r, c = jax.jit(lambda x: qp.quantize_pair(x, row, col, row_ts=ts[0], col_ts=ts[1]))(x)
    for fmt, q, g in ((row, r, got[0]), (col, c, got[2])):
        one = None if q.tensor_scale is None else jnp.ones((), jnp.float32)
        want = jax.jit(lambda q: qp._canonical_nan(dequantize(
            BlockScaledArray(q.values, q.scales, fmt, -1, q.length, one), jnp.bfloat16)))(q)
        np.testing.assert_array_equal(g[0].view(np.uint16), np.asarray(want).view(np.uint16))


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_decoded_training_step_matches_codes(name):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((4, 256, 1024)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((1024, 768)) / 32, jnp.float32)

    def grads(recipe):
        def f(x, w):
            return jnp.sum(jnp.tanh(quantized_dense(x, w, recipe, w_layout="kn").astype(jnp.float32)))
        return jax.jit(jax.grad(f, argnums=(0, 1)))(x, w)

    for got, want in zip(grads(get_recipe(name + ":decoded")), grads(get_recipe(name + ":codes"))):
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-2  # bf16 dx; summation order
