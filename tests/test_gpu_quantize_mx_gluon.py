"""The Gluon MX / nvfp4 quantization kernel on a GPU, bit for bit against the jnp quantizer.

Skipped without a GPU (sm_90+). `_triton/quantize_mx_gluon.py` quantizes MX (every element type, every
rounding) and nvfp4 sides, either side optional: these tests compare its codes and scales with
`quantize_jnp` jitted on the same GPU (`quantize_primitive._reference`) and with the Triton kernel
(`quantize_kernels`), on special inputs (tests/_quant_inputs.py: zeros, float32 subnormals, binade edges,
rceil thresholds, ties, saturation, NaN, +-Inf; 10.5M elements per case), for every input dtype, every MX
rounding, nvfp4 tensor scales from the data and fixed, ragged shapes (padding), batches, and the launch
variants benchmarks/quant_variants.py times.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_blockscale import quantize_primitive as qp
from jax_blockscale._triton.quantize_kernels import SHORT_PATH_TS
from jax_blockscale.quantize import nvfp4_tensor_scale, quantize_jnp

from _gluon_quant import PAIRS, compute_capability, sm90, tensor_scales  # noqa: F401 (sm90: autouse)
from _quant_inputs import DTYPES, assert_same_outputs, code_bits, special_array

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

ROUNDINGS = ("rceil", "floor", "ceil", "even")


def _input(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return special_array(shape, dtype, 7)


def _run(x, ts, pair, rounding, kernel, **config):
    row, col = pair
    launch = functools.partial(qp._launch, row=(row, rounding), col=(col, rounding),
                               compute_capability=compute_capability(), kernel=kernel, **config)
    return [np.asarray(a) for a in jax.jit(launch)(x, ts)]


def _want(x, ts, pair, rounding):
    row, col = pair
    ref = functools.partial(qp._reference, row=(row, rounding), col=(col, rounding))
    return [np.asarray(a) for a in jax.jit(ref)(x, ts)]


@pytest.mark.parametrize("pair", sorted(PAIRS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_gluon_equals_jnp_and_triton_on_special_inputs(pair, dtype):
    x = jnp.asarray(_input((4096, 2560), dtype))
    ts = tensor_scales(x, PAIRS[pair], fixed=False)
    got = _run(x, ts, PAIRS[pair], "rceil", "gluon")
    assert_same_outputs(got, _want(x, ts, PAIRS[pair], "rceil"), f"gluon vs jnp {pair} {dtype}")
    assert_same_outputs(got, _run(x, ts, PAIRS[pair], "rceil", "triton"), f"gluon vs triton {pair} {dtype}")


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("pair", ["mxfp8+T", "mxfp4+T", "e5m2+e2m3T", "e3m2+nvfp4T"])
def test_every_mx_rounding(pair, rounding):
    x = jnp.asarray(_input((1024, 2048), "f32"))
    ts = tensor_scales(x, PAIRS[pair], fixed=False)
    assert_same_outputs(_run(x, ts, PAIRS[pair], rounding, "gluon"), _want(x, ts, PAIRS[pair], rounding),
                 f"{pair} {rounding}")


@pytest.mark.parametrize("pair", ["nvfp4+T", "nvfp4+mxfp8T", "nvfp4T"])
def test_fixed_tensor_scales(pair):
    x = jnp.asarray(_input((2048, 1536), "bf16"))
    ts = tensor_scales(x, PAIRS[pair], fixed=True)
    assert_same_outputs(_run(x, ts, PAIRS[pair], "rceil", "gluon"), _want(x, ts, PAIRS[pair], "rceil"), pair)


# nvfp4's short path runs where every nvfp4 side's tensor scale lies in quantize_kernels.SHORT_PATH_TS (or
# is 0), the general path elsewhere: tensor scales at both ends of that range and one float32 step outside,
# 0, far outside (where the spec's flushes and saturations decide codes), and a pair with one side in range
# and the other out (the whole program then takes the general path).
_LO, _HI = SHORT_PATH_TS
EDGE_TENSOR_SCALES = {
    "lo": (_LO, _LO), "below_lo": (np.nextafter(np.float32(_LO), np.float32(0)),) * 2,
    "hi": (_HI, _HI), "above_hi": (np.nextafter(np.float32(_HI), np.float32(np.inf)),) * 2,
    "zero": (0.0, 0.0), "tiny": (2.0**-120, 2.0**-120), "huge": (2.0**120, 2.0**120),
    "mixed": (0.37, 2.0**120), "mixed_rev": (2.0**-100, 3.0e-3),
}


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("ts", sorted(EDGE_TENSOR_SCALES))
@pytest.mark.parametrize("pair", ["nvfp4+T", "nvfp4+mxfp8T", "nvfp4", "nvfp4T", "e3m2+nvfp4T"])
def test_nvfp4_short_and_general_paths_at_the_range_edges(pair, ts, dtype):
    x = jnp.asarray(_input((1024, 1536), dtype))
    t = jnp.asarray(EDGE_TENSOR_SCALES[ts], jnp.float32)
    assert_same_outputs(_run(x, t, PAIRS[pair], "rceil", "gluon"), _want(x, t, PAIRS[pair], "rceil"),
                        f"{pair} ts={ts} {dtype}")


@pytest.mark.parametrize("shape", [(1, 1), (17, 40), (130, 300), (1000, 8200), (3, 200, 384), (2, 2, 48, 272)])
@pytest.mark.parametrize("pair", ["mxfp8+T", "nvfp4+T", "nvfp4+mxfp8T", "mxfp4", "nvfp4T"])
def test_gluon_pads_ragged_and_batched_shapes(shape, pair):
    x = jnp.asarray(_input(shape, "bf16"))
    ts = tensor_scales(x, PAIRS[pair], fixed=False)
    assert_same_outputs(_run(x, ts, PAIRS[pair], "rceil", "gluon"), _want(x, ts, PAIRS[pair], "rceil"), f"{shape} {pair}")


@pytest.mark.parametrize("pair", ["mxfp8+T", "nvfp4+T", "nvfp4+mxfp8T", "nvfp4"])
def test_launch_variants_give_the_samecode_bits(pair):
    """Every variant benchmarks/quant_variants.py times (tiles, warps, columns per thread)."""
    from benchmarks.quant_variants import gluon_mx_variants

    x = jnp.asarray(_input((1000, 2100), "bf16"))
    ts = tensor_scales(x, PAIRS[pair], fixed=False)
    want = _want(x, ts, PAIRS[pair], "rceil")
    for variant in gluon_mx_variants(*PAIRS[pair]):
        assert_same_outputs(_run(x, ts, PAIRS[pair], "rceil", "gluon", **variant), want, f"{pair} {variant}")


def test_quantize_with_transpose_matches_the_jnp_pair():
    """The public entry point on the default dispatch (the recipes' path), nvfp4 rows with mxfp8 columns."""
    x = jnp.asarray(_input((512, 1024), "bf16"))
    row_fmt, col_fmt = PAIRS["nvfp4+mxfp8T"]
    row, col = jax.jit(lambda x: qp.quantize_with_transpose(x, row_fmt, col_fmt))(x)
    want_row = quantize_jnp(x, row_fmt, axis=-1, rounding="rceil", tensor_scale=nvfp4_tensor_scale(x))
    want_col = quantize_jnp(x.T, col_fmt, axis=-1, rounding="rceil")
    for side, got, want in (("row", row, want_row), ("column", col, want_col)):
        for leaf in ("values", "scales"):
            g, w = code_bits(getattr(got, leaf)), code_bits(getattr(want, leaf))
            assert g.shape == w.shape, (side, leaf, g.shape, w.shape)
            diff = np.argwhere(g != w)
            assert diff.size == 0, (side, leaf, len(diff), diff[:3].tolist())
