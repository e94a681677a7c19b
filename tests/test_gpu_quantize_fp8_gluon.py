"""The Gluon fp8 1x128 + transposed quantization kernel on a GPU, bit for bit against the jnp quantizer.

Skipped without a GPU (sm_90+). `_triton/quantize_fp8_gluon.py` is the default on sm_90+ for fp8
1 x 128 with a transposed 1 x 128 or 128 x 128 side (the fp8_deepseek recipe's activations and
gradients); these tests compare its codes and scales with `quantize_jnp` jitted on the same GPU and with
the Triton kernel (`quantize_kernels`) for special inputs (tests/_quant_inputs.py: zeros, float32
subnormals, binade edges, ties, saturation, NaN, +-Inf; 10.5M elements), ragged shapes (padding) and a
batch.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_blockscale import get_format, quantize_primitive as qp
from jax_blockscale.quantize import quantize_jnp

from _quant_inputs import DTYPES, assert_same_outputs, code_bits, special_array

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

ROW = get_format("fp8_block", block=(1, 128))
COLS = {"1x128": get_format("fp8_block", block=(1, 128)), "128x128": get_format("fp8_block", block=(128, 128))}


def _cc() -> int:
    return int(float(jax.devices()[0].compute_capability) * 10)


def _input(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return special_array(shape, dtype, 11)


def _run(x, col, kernel):
    launch = functools.partial(qp._launch, row=(ROW, "rceil"), col=(col, "rceil"), compute_capability=_cc(),
                               kernel=kernel)
    ts = jnp.ones((2,), jnp.float32)
    return [np.asarray(a) for a in jax.jit(launch)(x, ts)]


def _want(x, col):
    ts = jnp.ones((2,), jnp.float32)
    return [np.asarray(a) for a in jax.jit(functools.partial(qp._reference, row=(ROW, "rceil"),
                                                             col=(col, "rceil")))(x, ts)]


@pytest.fixture(autouse=True)
def _sm90():
    if _cc() < 90:
        pytest.skip("the Gluon kernel needs sm_90+")


@pytest.mark.parametrize("col", sorted(COLS))
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_gluon_equals_jnp_and_triton_on_special_inputs(col, dtype):
    x = jnp.asarray(_input((4096, 2560), dtype))
    got = _run(x, COLS[col], "gluon")
    assert_same_outputs(got, _want(x, COLS[col]), f"gluon vs jnp {col} {dtype}")
    assert_same_outputs(got, _run(x, COLS[col], "triton"), f"gluon vs triton {col} {dtype}")


@pytest.mark.parametrize("shape", [(1, 1), (130, 300), (1000, 8200), (3, 200, 384), (2, 2, 128, 256)])
@pytest.mark.parametrize("col", sorted(COLS))
def test_gluon_pads_ragged_and_batched_shapes(shape, col):
    x = jnp.asarray(_input(shape, "bf16"))
    assert_same_outputs(_run(x, COLS[col], "gluon"), _want(x, COLS[col]), f"{shape} {col}")


def test_default_dispatch_takes_gluon_and_matches_the_jnp_pair():
    x = jnp.asarray(_input((512, 1024), "bf16"))
    assert qp.fused_kernel(x.shape, x.dtype, (ROW, "rceil"), (COLS["1x128"], "rceil"), _cc()) == "gluon"
    row, col = jax.jit(lambda x: qp.quantize_pair(x, ROW, COLS["1x128"]))(x)
    want_row, want_col = jax.jit(lambda x: (quantize_jnp(x, ROW, axis=-1, rounding="rceil"),
                                               quantize_jnp(x.T, COLS["1x128"], axis=-1, rounding="rceil")))(x)
    for side, got, want in (("row", row, want_row), ("column", col, want_col)):
        for leaf in ("values", "scales"):
            g, w = code_bits(getattr(got, leaf)), code_bits(getattr(want, leaf))
            assert g.shape == w.shape, (side, leaf, g.shape, w.shape)
            diff = np.argwhere(g != w)
            assert diff.size == 0, (side, leaf, len(diff), diff[:3].tolist(), g[tuple(diff[0])], w[tuple(diff[0])])
