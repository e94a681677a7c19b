"""Shared by the GPU tests of the Gluon MX / nvfp4 quantizer (tests/test_gpu_quantize_mx_gluon.py, codes;
tests/test_gpu_quantize_decoded.py, decoded values): its (row, column) format pairs, the device's compute
capability and each pair's nvfp4 tensor scales."""

import jax
import jax.numpy as jnp
import pytest

from jax_blockscale import get_format
from jax_blockscale.quantize import nvfp4_tensor_scale

F = get_format
# (row, column) pairs: the recipes' (mxfp8 both ways; nvfp4 rows with mxfp8 or nvfp4 columns), every
# element type on some side, and each side alone.
PAIRS = {
    "mxfp8+T": (F("mxfp8"), F("mxfp8")),
    "nvfp4+T": (F("nvfp4"), F("nvfp4")),
    "nvfp4+mxfp8T": (F("nvfp4"), F("mxfp8")),
    "mxfp4+T": (F("mxfp4"), F("mxfp4")),
    "e5m2+e2m3T": (F("mxfp8_e5m2"), F("mxfp6_e2m3")),
    "e3m2+nvfp4T": (F("mxfp6_e3m2"), F("nvfp4")),
    "nvfp4": (F("nvfp4"), None),
    "mxfp8": (F("mxfp8"), None),
    "mxfp4": (F("mxfp4"), None),
    "mxfp8T": (None, F("mxfp8")),
    "nvfp4T": (None, F("nvfp4")),
}


def compute_capability() -> int:
    return int(float(jax.devices()[0].compute_capability) * 10)


@pytest.fixture(autouse=True)
def sm90():
    """Imported by a test module: skips its tests below sm_90 (the Gluon kernel's floor)."""
    if compute_capability() < 90:
        pytest.skip("the Gluon kernel needs sm_90+")


def tensor_scales(x, pair, fixed: bool = False):
    """The (row, column) tensor scales: the data's (`nvfp4_tensor_scale` along each side's axis) or fixed."""
    if fixed:
        return jnp.asarray([0.37, 3.0e-3], jnp.float32)
    row, col = pair
    return jnp.stack([nvfp4_tensor_scale(x) if row is not None and row.name == "nvfp4" else jnp.float32(1),
                      nvfp4_tensor_scale(x, axis=-2) if col is not None and col.name == "nvfp4" else jnp.float32(1)])
