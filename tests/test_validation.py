"""Bad inputs at the public boundary: each gets a clear error before any compute (also under jax.jit), or a
documented, tested behaviour. Table-driven: every row is an input that once gave a silently wrong result
or an error from deep inside, with the message fragment the user now sees."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import layouts
from jax_blockscale.__main__ import main as demo_main

RNG = np.random.default_rng(0)
M, N, K = 8, 160, 300  # K not a multiple of any block: padding is part of what is checked


def _x(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


X, W = _x(M, K), _x(N, K)
WEIGHTS = {fmt: jb.quantize_operand(W, fmt, side="b") for fmt in ("mxfp8", "mxfp4", "nvfp4", "fp8_block")}
RECIPE_FOR = {"mxfp8": "mxfp8", "mxfp4": "w4a8", "nvfp4": "nvfp4", "fp8_block": "fp8_deepseek"}


def _re(text: str) -> str:
    return re.escape(text)


def _rep(q, **fields):
    return dataclasses.replace(q, **fields)


# (id, base format, corruption, message fragment after the operand's name)
CORRUPT = [
    ("scales_one_block_short", "mxfp4", lambda q: _rep(q, scales=q.scales[:, :-1]), ".scales: expected shape (160, 10)"),
    ("scales_one_block_extra", "mxfp8",
     lambda q: _rep(q, scales=jnp.concatenate([q.scales, q.scales[:, :1]], 1)), ".scales: expected shape (160, 10)"),
    ("values_cast_to_float32", "mxfp8", lambda q: _rep(q, values=q.values.astype(jnp.float32)),
     ".values: expected dtype float8_e4m3fn for mxfp8_e4m3, got float32"),
    ("fp4_values_as_int8", "mxfp4", lambda q: _rep(q, values=q.values.astype(jnp.int8)),
     ".values: expected dtype uint8"),
    ("nvfp4_tensor_scale_none", "nvfp4", lambda q: _rep(q, tensor_scale=None),
     ".tensor_scale: expected a float32 array for nvfp4"),
    ("nvfp4_tensor_scale_float16", "nvfp4", lambda q: _rep(q, tensor_scale=q.tensor_scale.astype(jnp.float16)),
     ".tensor_scale: expected dtype float32"),
    ("nvfp4_tensor_scale_per_row", "nvfp4", lambda q: _rep(q, tensor_scale=jnp.ones((3,), jnp.float32)),
     ".tensor_scale: expected shape () or leading dims"),
    ("mx_with_tensor_scale", "mxfp8", lambda q: _rep(q, tensor_scale=jnp.ones((), jnp.float32)),
     ".tensor_scale: expected None for mxfp8_e4m3"),
    ("fmt_as_string", "mxfp8", lambda q: _rep(q, fmt="mxfp8"), ".fmt: expected a format object"),
    ("length_too_short", "mxfp8", lambda q: _rep(q, length=250), ".values: expected 256 along the quantized axis"),
    ("length_too_long", "nvfp4", lambda q: _rep(q, length=320), ".values: expected 160 along the quantized axis"),
    ("axis_positive", "mxfp8", lambda q: _rep(q, axis=1), ".axis: expected a negative int in [-2, -1]"),
    ("axis_float", "mxfp8", lambda q: _rep(q, axis=-1.0), ".axis: expected a negative int"),
    ("mx_scales_int32", "mxfp8", lambda q: _rep(q, scales=q.scales.astype(jnp.int32)),
     ".scales: expected dtype uint8 or float8_e8m0fnu"),
    ("nvfp4_scales_float32", "nvfp4", lambda q: _rep(q, scales=q.scales.astype(jnp.float32)),
     ".scales: expected dtype float8_e4m3fn"),
    ("fp8_tile_rows_short", "fp8_block", lambda q: _rep(q, scales=q.scales[:1]),
     ".scales: expected shape (2, 3) (one scale per 128x128 tile"),
]
ENTRY = {
    # entry point -> (function of the corrupted weight, the operand's name in the message)
    "matmul": (lambda q: jb.matmul(X, q), "b"),
    "matmul_jit": (lambda q: jax.jit(jb.matmul)(X, q), "b"),
    "explain": (lambda q: jb.explain(X, q), "b"),
    "explain_sm90": (lambda q: jb.explain("bf16", q, target="sm_90"), "b"),
    "dequantize": (lambda q: jb.dequantize(q), "q"),
    "dequantize_jit": (lambda q: jax.jit(jb.dequantize)(q), "q"),
    "reference": (lambda q: jb.reference.matmul(X, q), "b"),
}


@pytest.mark.parametrize("entry", list(ENTRY))
@pytest.mark.parametrize("case", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_inconsistent_block_scaled_array_is_rejected(case, entry):
    _, fmt, corrupt, fragment = case
    fn, name = ENTRY[entry]
    bad = corrupt(WEIGHTS[fmt])
    with pytest.raises(ValueError, match="^" + _re(name + fragment)):
        fn(bad)


@pytest.mark.parametrize("case", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_recipes_and_dot_general_check_a_pre_quantized_weight(case):
    _, fmt, corrupt, fragment = case
    bad = corrupt(WEIGHTS[fmt])
    with pytest.raises(ValueError, match="^" + _re("w" + fragment)):
        jb.recipe_matmul(X, bad, RECIPE_FOR[fmt])
    with pytest.raises(ValueError, match="^" + _re("rhs" + fragment)):
        jb.dot_general(RECIPE_FOR[fmt])(X, bad, (((1,), (1,)), ((), ())))


def test_consistent_arrays_pass_every_entry_point():
    # The table's base operands are valid: each row fails only because of its corruption.
    for fmt, q in WEIGHTS.items():
        want = np.asarray(jb.reference.matmul(X, q))
        np.testing.assert_array_equal(np.asarray(jb.matmul(X, q, out_dtype=jnp.float32)), want)
        np.testing.assert_array_equal(np.asarray(jax.jit(jb.dequantize)(q)), np.asarray(jb.dequantize(q)))
        assert jb.recipe_matmul(X, q, RECIPE_FOR[fmt]).shape == (M, N)
        assert jb.dot_general(RECIPE_FOR[fmt])(X, q, (((1,), (1,)), ((), ()))).shape == (M, N)
        assert jb.explain(X, q).path == "reference"


def test_e8m0fnu_scales_are_accepted_by_matmul():
    q = WEIGHTS["mxfp8"]
    q8 = _rep(q, scales=jax.lax.bitcast_convert_type(q.scales, jnp.float8_e8m0fnu))
    np.testing.assert_array_equal(np.asarray(jb.matmul(X, q8, out_dtype=jnp.float32)),
                                  np.asarray(jb.matmul(X, q, out_dtype=jnp.float32)))


# ------------------------------------------------------------------------------------ other bad arguments

_NV = jb.get_format("nvfp4")
CALLS = [
    # (id, call, exception, message fragment)
    ("tensor_scale_zero", lambda: jb.quantize(X, "nvfp4", tensor_scale=0.0), ValueError,
     "tensor_scale: expected a finite value > 0, got 0.0"),
    ("tensor_scale_negative", lambda: jb.quantize(X, "nvfp4", tensor_scale=-1.0), ValueError,
     "tensor_scale: expected a finite value > 0"),
    ("tensor_scale_nan", lambda: jb.quantize(X, "nvfp4", tensor_scale=np.float32(np.nan)), ValueError,
     "tensor_scale: expected a finite value > 0, got nan"),
    ("tensor_scale_inf", lambda: jb.quantize(X, "nvfp4", tensor_scale=jnp.inf), ValueError,
     "tensor_scale: expected a finite value > 0, got inf"),
    ("tensor_scale_two_values", lambda: jb.quantize(X, "nvfp4", tensor_scale=np.ones(2, np.float32)), ValueError,
     "tensor_scale: expected a scalar or a one-element array (shape () or (1,)), got shape (2,)"),
    ("tensor_scale_mx", lambda: jb.quantize(X, "mxfp8", tensor_scale=1.0), ValueError,
     "tensor_scale applies to nvfp4 only"),
    ("axis_float", lambda: jb.quantize(X, "mxfp8", axis=1.0), ValueError, "axis must be an int, got float 1.0"),
    ("axis_bool", lambda: jb.quantize(X, "mxfp8", axis=True), ValueError, "axis must be an int"),
    ("nvfp4_tensor_scale_axis_float", lambda: jb.nvfp4_tensor_scale(X, axis=1.0), ValueError,
     "axis must be an int"),
    ("rounding_for_nvfp4", lambda: jb.quantize(X, "nvfp4", rounding="floor"), ValueError,
     "rounding='floor' applies to MX formats only"),
    ("unknown_rounding_operand", lambda: jb.quantize_operand(X, "fp8_block", side="a", rounding="up"),
     ValueError, "unknown rounding 'up'"),
    ("unknown_rounding_matmul", lambda: jb.matmul(X, WEIGHTS["mxfp4"], rounding="up"), ValueError,
     "unknown rounding 'up'"),
    ("pack_fp4_above_15", lambda: layouts.pack_fp4(jnp.array([17, 255], jnp.int32)), ValueError,
     "pack_fp4 takes 4-bit codes 0..15, got 2 outside, e.g. [17, 255]"),
    ("pack_fp4_negative", lambda: layouts.pack_fp4(np.array([-1, 3], np.int8)), ValueError,
     "got 1 outside, e.g. [-1]"),
    ("pack_fp4_float", lambda: layouts.pack_fp4(jnp.array([1.0, 2.0])), TypeError,
     "pack_fp4 takes integer codes 0..15, got dtype float32"),
    ("pack_fp4_bool", lambda: layouts.pack_fp4(jnp.array([True, False])), TypeError, "got dtype bool"),
    ("from_blackwell_rows", lambda: layouts.from_blackwell_scales(
        layouts.to_blackwell_scales(jnp.zeros((130, 6), jnp.uint8)), 300, 6), ValueError,
     "from_blackwell_scales: rows=300 does not match the layout, which holds 256"),
    ("from_blackwell_cols", lambda: layouts.from_blackwell_scales(
        layouts.to_blackwell_scales(jnp.zeros((130, 6), jnp.uint8)), 130, 3), ValueError,
     "cols=3 does not match the layout, which holds 8 (cols padded to a multiple of 4: cols in 5..8)"),
    ("from_cdna4_rows", lambda: layouts.from_cdna4_scales(
        layouts.to_cdna4_scales(jnp.zeros((40, 9), jnp.uint8)), 20, 9), ValueError,
     "from_cdna4_scales: rows=20 does not match the layout, which holds 64"),
    ("from_cdna4_cols", lambda: layouts.from_cdna4_scales(
        layouts.to_cdna4_scales(jnp.zeros((40, 9), jnp.uint8), mfma=32), 40, 17, mfma=32), ValueError,
     "cols=17 does not match"),
    ("to_blackwell_1d", lambda: layouts.to_blackwell_scales(jnp.zeros((8,), jnp.uint8)), ValueError,
     "to_blackwell_scales takes (..., rows, cols) scales, got shape (8,)"),
    ("to_cdna4_1d", lambda: layouts.to_cdna4_scales(jnp.zeros((8,), jnp.uint8)), ValueError,
     "to_cdna4_scales takes (..., rows, cols) scales"),
    ("side_c_mx", lambda: jb.quantize_operand(X, "mxfp8", side="c"), ValueError, "side: expected 'a'"),
    ("side_c_fp8_block", lambda: jb.quantize_operand(X, "fp8_block", side="c"), ValueError, "side: expected 'a'"),
    ("side_c_dense", lambda: jb.quantize_operand(X, "bf16", side="c"), ValueError, "side: expected 'a'"),
    ("dequantize_int32", lambda: jb.dequantize(WEIGHTS["mxfp8"], jnp.int32), ValueError,
     "dtype: expected a float dtype (float32, bfloat16, float16), got int32"),
    ("dequantize_method_uint8", lambda: WEIGHTS["nvfp4"].dequantize(jnp.uint8), ValueError,
     "dtype: expected a float dtype"),
    ("dequantize_not_a_dtype", lambda: jb.dequantize(WEIGHTS["mxfp8"], "nope"), ValueError,
     "dtype: expected a float dtype"),
]


@pytest.mark.parametrize("case", CALLS, ids=[c[0] for c in CALLS])
def test_bad_argument_is_rejected(case):
    _, call, exc, fragment = case
    with pytest.raises(exc, match=_re(fragment)):
        call()


# explain and matmul share one check: for every pair and target, both raise or neither does.
PAIR_TARGETS = [
    ("mxfp8", "nvfp4", None), ("nvfp4", "mxfp4", None), ("bf16", "bf16", None), ("nvfp4", "fp8_block", None),
    ("mxfp8", "mxfp8", "sm_80"), ("mxfp8", "mxfp8", "cuda"), ("mxfp8", "mxfp8", "gfx942"),
    ("mxfp8", "mxfp8", "blackwell"), ("mxfp8", "mxfp8", 100),
]


@pytest.mark.parametrize("fa,fb,target", PAIR_TARGETS)
def test_explain_rejects_what_matmul_rejects(fa, fb, target):
    a, b = jb.quantize_operand(X, fa, side="a"), jb.quantize_operand(W, fb, side="b")
    with pytest.raises(ValueError) as from_matmul:
        jax.jit(lambda a, b: jb.matmul(a, b, target=target))(a, b)
    for args in ((a, b), (fa, fb)):
        with pytest.raises(ValueError) as from_explain:
            jb.explain(*args, target=target)
        assert str(from_explain.value) == str(from_matmul.value)


@pytest.mark.parametrize("target,want", [("sm_100a", "sm_100"), ("SM_90A", "sm_90"), ("gfx950", "gfx950"),
                                         ("cpu", "cpu")])
def test_target_aliases_are_accepted_by_both(target, want):
    assert jb.explain("mxfp8", "mxfp4", target=target).target == want
    assert jb.explain_all(target).startswith(f"target: {want}\n")
    jax.jit(lambda a, b: jb.matmul(a, b, target=target)).trace(X, WEIGHTS["mxfp4"])  # traces, no error


def test_explain_on_every_supported_pair_agrees_with_matmul():
    for fa, fb in [("mxfp8", "mxfp4"), ("nvfp4", "nvfp4"), ("bf16", "nvfp4"), ("fp8_block", "fp8_block"),
                   ("mxfp8", "fp32"), ("fp16", "mxfp6_e2m3")]:
        a, b = jb.quantize_operand(X, fa, side="a"), jb.quantize_operand(W, fb, side="b")
        jb.matmul(a, b)
        # Names carry no shape: give them the operands' activation rows (decode dispatch depends on it).
        rows = int(np.prod(X.shape[:-1]))
        assert jb.explain(fa, fb, target="sm_90", rows=rows) == jb.explain(a, b, target="sm_90")


# ------------------------------------------------------------------------------------ the demo's options


@pytest.mark.parametrize("argv", [["--reps", "0"], ["--m", "0"], ["--n", "-3"], ["--k", "x"]])
def test_demo_rejects_nonpositive_sizes(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        demo_main(argv)
    assert exit_info.value.code == 2
    assert "must be a positive integer" in capsys.readouterr().err or argv[1] == "x"


def test_demo_help_describes_each_option(capsys):
    with pytest.raises(SystemExit):
        demo_main(["--help"])
    text = capsys.readouterr().out
    for fragment in ("contraction size K", "rows of the activations", "rows of the weight", "timed calls"):
        assert fragment in text


# ------------------------------------------------------------------------------ documented nvfp4 behaviour


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nvfp4_nonfinite_stays_in_its_block(bad):
    # As in MX: one NaN/Inf makes its own 16-element block NaN and nothing else (the tensor amax skips it).
    x = X.at[2, 37].set(bad)
    for q in (jb.quantize(x, "nvfp4"), jax.jit(lambda v: jb.quantize(v, "nvfp4"))(x)):
        d = np.asarray(jb.dequantize(q))
        assert np.isnan(d[2, 32:48]).all()
        nan = np.isnan(d)
        nan[2, 32:48] = False
        assert not nan.any()
        np.testing.assert_array_equal(np.asarray(q.tensor_scale), np.asarray(jb.nvfp4_tensor_scale(x)))
        # The tensor scale comes from the finite blocks only. The tensor amax of this data lies outside the
        # bad block, so every other element dequantizes exactly as without the NaN/Inf.
        clean = jb.quantize(x.at[2, 32:48].set(0.0), "nvfp4")
        assert float(clean.tensor_scale) == float(q.tensor_scale)
        keep = np.ones(d.shape, bool)
        keep[2, 32:48] = False
        np.testing.assert_array_equal(d[keep], np.asarray(jb.dequantize(clean))[keep])
    out = np.asarray(jb.matmul(jb.quantize(x, "nvfp4"), WEIGHTS["nvfp4"], out_dtype=jnp.float32))
    assert np.isnan(out[2]).all() and np.isfinite(np.delete(out, 2, axis=0)).all()


def test_nvfp4_empty_input_is_an_empty_array_with_zero_tensor_scale():
    for shape in ((0, 64), (4, 0), (0,)):
        q = jb.quantize(jnp.zeros(shape), "nvfp4")
        assert float(q.tensor_scale) == 0.0 and q.shape == shape
        assert jb.dequantize(q).shape == shape
        assert float(jb.nvfp4_tensor_scale(jnp.zeros(shape))) == 0.0


def test_nvfp4_tensor_scale_shapes_and_traced_values():
    want = jb.quantize(X, "nvfp4", tensor_scale=0.01)
    for ts in (np.float32(0.01), np.array(0.01, np.float32), jnp.full((1,), 0.01), [0.01]):
        q = jb.quantize(X, "nvfp4", tensor_scale=ts)
        assert q.tensor_scale.shape == ()
        np.testing.assert_array_equal(np.asarray(q.scales).view(np.uint8), np.asarray(want.scales).view(np.uint8))
    # A traced tensor scale cannot be checked at trace time (documented): the shape still is; 0 gives an
    # all-zero array (block scales computed against 1, stored scale 0), NaN an all-NaN one.
    f = jax.jit(lambda x, t: jb.dequantize(jb.quantize(x, "nvfp4", tensor_scale=t)))
    np.testing.assert_array_equal(np.asarray(f(X, jnp.full((1,), 0.01))), np.asarray(want.dequantize()))
    assert np.all(np.asarray(f(X, 0.0)) == 0)
    assert np.isnan(np.asarray(f(X, jnp.nan))).all()
    with pytest.raises(ValueError, match=_re("got shape (3,)")):
        f(X, jnp.ones(3))


def test_tree_unflatten_does_not_validate():
    # JAX rebuilds the class with placeholder leaves (PartitionSpecs, None, object()): no check there.
    q = WEIGHTS["nvfp4"]
    specs = jax.tree.map(lambda leaf: jax.sharding.PartitionSpec(), q)
    assert isinstance(specs, jb.BlockScaledArray) and specs.fmt == q.fmt
    assert jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(q), [object()] * 3).length == q.length


def test_flax_layers_check_a_quantized_kernel():
    pytest.importorskip("flax")
    from flax import nnx

    from jax_blockscale.nn import linen as jbl
    from jax_blockscale.nn import nnx as jbnnx

    layer = jbl.Dense(N, recipe="w4a8", use_bias=False)
    served = jbl.quantize_params(layer, layer.init(jax.random.key(0), X), X)
    kernel = served["params"]["kernel"]
    bad = {"params": {"kernel": _rep(kernel, scales=kernel.scales[:, :-1])}}
    with pytest.raises(ValueError, match="^" + _re("kernel.scales: expected shape (160, 10)")):
        layer.apply(bad, X)

    lin = jbnnx.Linear(K, N, recipe="w4a8", use_bias=False, rngs=nnx.Rngs(0))
    lin.quantize_weights()
    lin.kernel = nnx.data(_rep(lin.kernel, fmt="mxfp4"))
    with pytest.raises(ValueError, match="^" + _re("kernel.fmt: expected a format object")):
        lin(X)
