"""The one default MX scale rounding, "rceil", in every entry point that quantizes MX: `quantize`,
`quantize_operand`, `matmul(a_format=...)` and the recipes; and why it is the default (floor clips)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb

RNG = np.random.default_rng(0)
MX_NAMES = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4")


def _leaves_equal(p, q):
    for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(q)):
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))


def _data(*shape):
    # Per-block magnitudes spread over many binades, so blocks of every amax mantissa occur.
    x = RNG.standard_normal(shape) * np.exp(RNG.uniform(-4, 4, size=shape[:-1] + (1,)))
    return jnp.asarray(x.astype(np.float32))


@pytest.mark.parametrize("name", MX_NAMES)
def test_every_entry_point_defaults_to_rceil(name):
    x = _data(16, 96)
    want = jb.quantize(x, name, rounding="rceil")
    floor = jb.quantize(x, name, rounding="floor")
    assert np.any(np.asarray(want.scales) != np.asarray(floor.scales))  # the data tells the two apart
    _leaves_equal(jb.quantize(x, name), want)
    _leaves_equal(jb.quantize_operand(x, name, side="a"), want)
    _leaves_equal(jb.quantize_operand(x, name, side="b"), want)
    w = jb.quantize(_data(8, 96), "mxfp8", rounding="rceil")
    np.testing.assert_array_equal(np.asarray(jb.matmul(x, w, a_format=name, out_dtype=jnp.float32)),
                                  np.asarray(jb.matmul(want, w, out_dtype=jnp.float32)))
    assert jb.get_recipe("mxfp8").rounding == "rceil"


def test_floor_clips_the_block_maximum_and_rceil_does_not():
    # e4m3's max normal is 1.75 * 2**8. A block whose amax has a larger mantissa (1.9) gets, with floor,
    # E = floor(log2 1.9) - 8 = -8, so 1.9 * 2**8 = 486.4 saturates at 448: the maximum comes back as 1.75.
    # rceil picks E = -7, and 1.9 * 2**7 = 243.2 rounds to the e4m3 value 240: 1.875.
    x = jnp.zeros((1, 32), jnp.float32).at[0, 0].set(1.9).at[0, 1].set(-0.3)
    assert float(jb.quantize(x, "mxfp8", rounding="floor").dequantize()[0, 0]) == 1.75
    assert float(jb.quantize(x, "mxfp8").dequantize()[0, 0]) == 1.875


def test_rceil_is_bit_identical_to_jax_nn_quantizer():
    try:
        from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize
    except ImportError:
        pytest.skip("jax.nn's block-scale quantizer is not at its private path in this jax")
    config = BlockScaleConfig(mode="mxfp8", block_size=32, data_type=jnp.float8_e4m3fn,
                              scale_type=jnp.float8_e8m0fnu, global_scale=None, infer_only=False)
    x = _data(64, 256)
    values, scales = quantize(x, config)
    ours = jb.quantize(x, "mxfp8")
    np.testing.assert_array_equal(np.asarray(ours.scales), np.asarray(scales).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(ours.values).view(np.uint8), np.asarray(values).view(np.uint8))
