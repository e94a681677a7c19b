"""`jb.quantize_with_transpose` on the CPU: both sides equal two `jb.quantize` calls bit for bit, with nvfp4
tensor scales computed from x or given by the caller (`tensor_scale=`, `t_tensor_scale=`), through the fused
primitive (its CPU lowering) and through the two-call fallback; the caller's scales are checked before any
compute. (On a GPU the same calls run the one-pass kernel: tests/test_gpu_quantize.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from _quantize_helpers import _leaves_equal
from jax_blockscale import quantize_primitive


def _x(shape=(3, 96, 160), seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 5).astype(jnp.bfloat16)


def _expected(x, fmt, t_fmt, ts=None, t_ts=None):
    xt = jnp.swapaxes(x, -1, -2)
    row = None if fmt is None else jb.quantize(x, fmt, **({} if ts is None else dict(tensor_scale=ts)))
    col = None if t_fmt is None else jb.quantize(xt, t_fmt, **({} if t_ts is None else dict(tensor_scale=t_ts)))
    return row, col


def _same(got, want):
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if w is not None:
            _leaves_equal(g, w)


@pytest.fixture(params=[True, False], ids=["fused", "two-calls"])
def fused(request, monkeypatch):
    monkeypatch.setattr(quantize_primitive, "USE_KERNEL", request.param)
    return request.param


@pytest.mark.parametrize("fmt, t_fmt", [("nvfp4", "same"), ("nvfp4", "mxfp8"), ("mxfp8", "nvfp4"), ("mxfp4", None)])
def test_equals_two_quantize_calls(fused, fmt, t_fmt):
    x = _x()
    got = jax.jit(lambda x: jb.quantize_with_transpose(x, fmt, t_fmt))(x)
    _same(got, _expected(x, fmt, fmt if t_fmt == "same" else t_fmt))


def test_given_tensor_scale_is_used_for_both_nvfp4_sides(fused):
    x = _x(seed=1)
    ts = 2.0**-7  # not tensor amax / 2688: the blocks' e4m3 scales and the codes differ from the computed one's
    got = jax.jit(lambda x: jb.quantize_with_transpose(x, "nvfp4", tensor_scale=ts))(x)
    _same(got, _expected(x, "nvfp4", "nvfp4", ts, ts))
    assert float(got[0].tensor_scale) == ts and float(got[1].tensor_scale) == ts
    computed = jb.quantize_with_transpose(x, "nvfp4")
    assert not np.array_equal(np.asarray(computed[0].scales), np.asarray(got[0].scales))


def test_each_side_takes_its_own_tensor_scale(fused):
    x = _x(seed=2)
    got = jax.jit(lambda x, a, b: jb.quantize_with_transpose(x, "nvfp4", tensor_scale=a, t_tensor_scale=b))(
        x, jnp.float32(0.01), jnp.float32(0.02))  # traced scales: used as given
    _same(got, _expected(x, "nvfp4", "nvfp4", 0.01, 0.02))


def test_tensor_scale_beside_a_computed_one(fused):
    x = _x(seed=3)
    got = jb.quantize_with_transpose(x, "nvfp4", "nvfp4", t_tensor_scale=jnp.ones((1,)) * 0.05)
    _same(got, _expected(x, "nvfp4", "nvfp4", None, 0.05))


def test_decoded_sides_carry_the_given_tensor_scale(fused):
    x = _x(seed=4)
    from jax_blockscale.formats import get_format

    nv = get_format("nvfp4")
    row, col = quantize_primitive.quantize_sides(x, nv, nv, "rceil", decoded=True, row_ts=jnp.float32(0.03),
                                                 col_ts=jnp.float32(0.04))
    want_row, want_col = _expected(x, "nvfp4", "nvfp4", 0.03, 0.04)
    for got, want, ts in ((row, want_row, 0.03), (col, want_col, 0.04)):
        assert float(got.tensor_scale) == np.float32(ts)
        deq = jb.dequantize(want, jnp.float32) / np.float32(ts)  # the values without the tensor scale
        np.testing.assert_array_equal(np.asarray(got.values, np.float32), np.asarray(deq.astype(jnp.bfloat16),
                                                                                   np.float32))


@pytest.mark.parametrize("kwargs, message", [
    (dict(fmt="mxfp8", tensor_scale=0.1), "^tensor_scale applies to nvfp4 only, not mxfp8_e4m3$"),
    (dict(fmt="nvfp4", t_fmt="mxfp8", t_tensor_scale=0.1), "^t_tensor_scale applies to nvfp4 only, not mxfp8_e4m3$"),
    (dict(fmt="nvfp4", t_fmt=None, t_tensor_scale=0.1), "^t_tensor_scale applies to nvfp4 only, not None$"),
    (dict(fmt="nvfp4", tensor_scale=-1.0), "finite value > 0"),
    (dict(fmt="nvfp4", tensor_scale=float("nan")), "finite value > 0"),
    (dict(fmt="nvfp4", tensor_scale=jnp.ones((2,))), "one-element array"),
])
def test_bad_tensor_scales_are_refused(kwargs, message):
    kwargs = dict(kwargs)
    fmt = kwargs.pop("fmt")
    t_fmt = kwargs.pop("t_fmt", "same")
    with pytest.raises(ValueError, match=message):
        jb.quantize_with_transpose(_x((64, 64)), fmt, t_fmt, **kwargs)


def test_given_tensor_scales_skip_the_amax_passes(monkeypatch):
    """With both scales given, nothing outside the fused primitive reads x: no tensor-amax reduction."""
    monkeypatch.setattr(quantize_primitive, "USE_KERNEL", True)
    x = _x((64, 64))
    computed = str(jax.make_jaxpr(lambda x: jb.quantize_with_transpose(x, "nvfp4"))(x))
    given = str(jax.make_jaxpr(lambda x: jb.quantize_with_transpose(x, "nvfp4", tensor_scale=0.1))(x))
    assert "blockscaled_quantize" in given and "blockscaled_quantize" in computed
    assert "reduce_max" in computed and "reduce_max" not in given
