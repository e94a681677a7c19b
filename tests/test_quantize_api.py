"""Tests of the `jax_blockscale.quantize` / `dequantize` API around the formats: half-precision inputs,
packed storage, e8m0 scales, round-trip error bounds, the HLO structure of the jnp quantizer, input
validation, format names and aliases, and jit / vmap / scan / checkpoint / pytree behaviour.
"""

from __future__ import annotations

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_blockscale as jb
from _quantize_helpers import TABLE_SHAPE, Q, _leaves_equal, check_mx, check_nvfp4

# `jax_blockscale.quantize` is the function (re-exported by the package), which shadows the submodule.
qmod = importlib.import_module("jax_blockscale.quantize")

# --------------------------------------------------------------------------------------------------------
# Inputs, options, storage
# --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, formats", [(jnp.bfloat16, ("mxfp8", "nvfp4")), (jnp.float16, ("mxfp4",))])
def test_half_precision_inputs(dtype, formats):
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.standard_normal(TABLE_SHAPE).astype(np.float32) * 3).astype(dtype)
    x32 = np.asarray(x.astype(jnp.float32))
    for name in formats:
        q, deq = Q(x, name)  # jitted (not float32)
        q32, deq32 = Q(x32, name)  # eager on the upcast copy
        _leaves_equal(q, q32)
        np.testing.assert_array_equal(deq, deq32)
    if "nvfp4" in formats:
        check_nvfp4(x)
    if "mxfp4" in formats:
        check_mx(x, "mxfp4", "floor")
    d = jb.dequantize(q32, dtype)
    assert d.dtype == dtype
    np.testing.assert_array_equal(np.asarray(d), deq32.astype(dtype))


def test_fp4_packing_low_nibble_is_even_element():
    x = np.zeros(TABLE_SHAPE, np.float32)
    x[0, :4] = [0.5, -6.0, 4.0, 1.5]  # e2m1 codes 1, 0xF, 6, 3 (amax 6 -> E = 0)
    q, _ = Q(x, "mxfp4")
    v = np.asarray(q.values)
    assert v.dtype == np.uint8 and v.shape == (64, 32)
    assert v[0, 0] == 0xF1 and v[0, 1] == 0x36 and np.all(v[0, 2:] == 0) and np.all(v[1:] == 0)
    # Packing along axis 0 pairs consecutive rows.
    q0, _ = Q(np.ascontiguousarray(x.T), "mxfp4", axis=0)
    v0 = np.asarray(q0.values)
    assert v0.shape == (32, 64) and v0[0, 0] == 0xF1 and v0[1, 0] == 0x36
    qn, _ = Q(x, "nvfp4", tensor_scale=1.0)  # block scale 6/6 = 1
    assert np.asarray(qn.values)[0, :3].tolist() == [0xF1, 0x36, 0]


def test_fp6_and_fp8_storage():
    x = np.zeros(TABLE_SHAPE, np.float32)
    x[0, :3] = [-7.5, 1.0, 0.125]
    q, _ = Q(x, "mxfp6_e2m3")  # amax 7.5 -> E = 0
    assert q.values.dtype == np.uint8 and np.asarray(q.values).shape == TABLE_SHAPE
    # e2m3: -7.5 = sign (bit 5) | 0x1F, 1.0 = 0x08, 0.125 = the first subnormal, 0x01
    assert np.asarray(q.values)[0, :3].tolist() == [0x3F, 0x08, 0x01]
    q8, _ = Q(x, "mxfp8_e5m2")
    assert q8.values.dtype == jnp.float8_e5m2
    # e5m2: amax 7.5 -> E = 2 - 15 = -13; 7.5 * 2**13 = 61440 > 57344 saturates (no Inf).
    np.testing.assert_array_equal(np.asarray(q8.values)[0, :3].view(np.uint8), [0xFB, 0x70, 0x64])
    np.testing.assert_array_equal(np.asarray(q8.values)[0, :3].astype(np.float32), [-57344.0, 8192.0, 1024.0])
    assert Q(x, "mxfp8")[0].values.dtype == jnp.float8_e4m3fn


def test_e8m0_scale_dtype_accepted_by_dequantize():
    rng = np.random.default_rng(11)
    x = rng.standard_normal(TABLE_SHAPE).astype(np.float32)
    x[0, 0] = np.nan
    x[1] = 0.0  # zero blocks -> code 0x00 (2**-127)
    x[2, :32] = rng.standard_normal(32).astype(np.float32) * np.float32(2.0**-120)
    q, deq = Q(x, "mxfp4")
    assert np.asarray(q.scales)[1].tolist() == [0, 0]
    q8 = dataclasses.replace(q, scales=jnp.asarray(np.asarray(q.scales).view(ml_dtypes.float8_e8m0fnu)))
    got = np.asarray(jb.dequantize(q8))
    np.testing.assert_array_equal(got, deq)
    assert np.isnan(got[0, :32]).all() and np.isfinite(got[0, 32:]).all() and np.all(got[1] == 0)


@pytest.mark.parametrize(
    "fmt, rounding, bound",
    [
        # Per block, |dequantize(quantize(x)) - x| <= bound * amax(block). With E the shared exponent:
        # floor/even: amax/2**E < 2**(emax+1), so values past max_normal saturate with error below
        # (2**(emax+1) - max_normal) / max_normal * amax; other values are off by at most half a
        # quantum, below 2**-(mbits+1) * amax. The bound is the larger of the two.
        ("mxfp8_e4m3", "floor", 1 / 7),
        ("mxfp8_e5m2", "even", 1 / 7),
        ("mxfp6_e2m3", "floor", 1 / 15),
        ("mxfp6_e3m2", "floor", 1 / 7),
        ("mxfp4", "floor", 1 / 3),
        ("mxfp4", "even", 1 / 3),
        # ceil: amax/2**E in (2**(emax-1), 2**emax], never saturates: half a quantum < 2**-(mbits+1) * amax.
        ("mxfp8_e4m3", "ceil", 2.0**-4),
        ("mxfp4", "ceil", 2.0**-2),
        # rceil: amax/2**E in (max_normal/2, max_normal]: half a quantum < 2**-mbits * amax.
        ("mxfp8_e4m3", "rceil", 2.0**-3),
        ("mxfp8_e5m2", "rceil", 2.0**-2),
        ("mxfp6_e2m3", "rceil", 2.0**-3),
        ("mxfp6_e3m2", "rceil", 2.0**-2),
        ("mxfp4", "rceil", 2.0**-1),
        # nvfp4: the e4m3 block scale is within 2**-4 of amax/6/ts (normal e4m3 range), so |x|/denom <= 6.4
        # and the error is at most one e2m1 half quantum (1) times denom <= amax/6 * 17/16 < 0.18 * amax.
        ("nvfp4", None, 0.18),
        # fp8_block: x/scale <= 448 and half an e4m3 quantum is at most 16: error <= 16 * amax/448 = amax/28.
        ("fp8_block", None, 1 / 28 * (1 + 1e-6)),
    ],
)
def test_round_trip_error_bounds(fmt, rounding, bound):
    rng = np.random.default_rng(12)
    x = rng.standard_normal(TABLE_SHAPE) * np.exp(rng.uniform(-3, 3, size=TABLE_SHAPE))
    if fmt != "nvfp4":  # nvfp4's bound needs e4m3-normal block scales: no huge spread between blocks
        x = x * 2.0 ** rng.integers(-20, 20, size=(64, 1))
    x = x.astype(np.float32)
    q, deq = Q(x, fmt, rounding=rounding, block=(1, 32) if fmt == "fp8_block" else None)
    err = np.abs(deq.astype(np.float64) - x)
    blk = q.fmt.block
    amax = np.max(np.abs(x.reshape(64, -1, blk)), axis=-1, keepdims=True)
    ratio = (err.reshape(64, -1, blk) / amax).max()
    assert ratio <= bound
    assert ratio > bound / 8  # the bound is not vacuous for this data


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_half_precision_nonfinite_blocks(dtype):
    # The block maximum (and its NaN/Inf flag) is taken in the input's own width: NaN, +-Inf and -0 in
    # bf16/f16 input must give exactly what the float32 upcast gives.
    rng = np.random.default_rng(18)
    x = jnp.asarray(rng.standard_normal(TABLE_SHAPE).astype(np.float32) * 3).astype(dtype)
    x = x.at[0, 3].set(jnp.nan).at[1, 40].set(-jnp.inf).at[2, 0].set(jnp.inf).at[3, :].set(-0.0)
    x32 = np.asarray(x.astype(jnp.float32))
    for name, kw in (("mxfp8", {}), ("mxfp4", {"rounding": "rceil"}), ("nvfp4", {"tensor_scale": 0.5}),
                     ("fp8_block", {"block": (1, 32)})):
        q = jax.jit(lambda v: jb.quantize(v, name, **kw))(x)
        q32 = jb.quantize(x32, name, **kw)
        _leaves_equal(q, q32)
    q, _ = Q(x, "nvfp4")  # default tensor scale: the NaN/Inf blocks are left out of the tensor amax
    assert np.isfinite(float(q.tensor_scale)) and float(q.tensor_scale) > 0
    _leaves_equal(q, jb.quantize(x32, "nvfp4"))


def test_div_rn_is_correctly_rounded():
    # qmod._div_rn against numpy's float32 division where it is hardest: quotients within a few float32
    # ulps of a rounding midpoint (x = RN(m * d) for midpoints m, then +-3 ulps), normal x and results.
    rng = np.random.default_rng(19)
    n = 1 << 16
    d = (rng.uniform(1, 2, n) * 2.0 ** rng.integers(-40, 40, n)).astype(np.float32)
    m = (rng.integers(2**24, 2**25, n) | 1) * 2.0 ** (rng.integers(-40, 40, n) - 24)
    x = (m * d.astype(np.float64)).astype(np.float32)
    x = (x.view(np.int32) + rng.integers(-3, 4, n).astype(np.int32)).view(np.float32)
    with np.errstate(all="ignore"):
        want = x / d
    got = np.asarray(jax.jit(qmod._div_rn)(x, d))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    # The float32 product with the rounded reciprocal, which XLA substitutes for a float32 division, is
    # wrong on a good part of these inputs: the test would notice.
    with np.errstate(all="ignore"):
        assert np.mean(x * (np.float32(1) / d) != want) > 0.1


_FULL = 256


@pytest.mark.parametrize(
    "fmt, kw",
    [("mxfp8", {}), ("mxfp4", {"rounding": "rceil"}), ("nvfp4", {}), ("fp8_block", {"block": (1, 128)}),
     ("fp8_block", {"block": (128, 128)})],
    ids=["mxfp8", "mxfp4-rceil", "nvfp4", "fp8_block-1x128", "fp8_block-128x128"],
)
def test_one_reduction_and_no_full_size_barrier(fmt, kw):
    # Bandwidth structure (issue #4): the big tensor is reduced once (per-block amax, which also flags
    # NaN/Inf blocks and gives nvfp4's tensor amax), no optimization barrier holds a full-size array (on
    # GPU a barrier survives fusion, so its operand is materialized), and there is no float32 division.
    import re

    # The jnp quantizer itself (jb.quantize on a GPU runs the fused kernel instead).
    from jax_blockscale.quantize import quantize_jnp

    spec = jb.get_format(fmt)
    text = jax.jit(lambda v: quantize_jnp(v, spec, axis=-1, rounding=kw.get("rounding", "rceil"))).lower(
        jax.ShapeDtypeStruct((_FULL, _FULL), jnp.bfloat16)).as_text()

    def size(t):
        return int(np.prod([int(d) for d in t.split("x")[:-1]] or [1]))

    reduces = re.findall(r"stablehlo\.reduce\(.*?: \(tensor<([^>]*)>", text)
    assert sum(size(t) == _FULL * _FULL for t in reduces) == 1, reduces
    barriers = re.findall(r"stablehlo\.optimization_barrier[^\n]*?: (?:\()?tensor<([^>]*)>", text)
    assert all(size(t) <= _FULL * _FULL // 16 for t in barriers), barriers
    assert not re.search(r"stablehlo\.divide[^\n]*tensor<[^>]*xf32>", text)


# --------------------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------------------


def test_bad_inputs():
    x = np.ones((4, 32), np.float32)
    with pytest.raises(ValueError, match=r"unknown format 'mxfp5'.*mxfp8_e4m3"):
        jb.quantize(x, "mxfp5")
    with pytest.raises(ValueError, match=r"block= only applies to 'fp8_block'"):
        jb.quantize(x, "mxfp8", block=(1, 32))
    with pytest.raises(ValueError, match=r"block= only applies to 'fp8_block'"):
        jb.quantize(x, "nvfp4", block=(1, 16))
    with pytest.raises(ValueError, match=r"unknown rounding 'nearest'.*floor"):
        jb.quantize(x, "mxfp4", rounding="nearest")
    with pytest.raises(TypeError, match=r"float32, bfloat16 or float16 input, got int32"):
        jb.quantize(np.ones((4, 32), np.int32), "mxfp8")
    with pytest.raises(TypeError, match=r"got uint8"):
        jb.quantize(np.ones((4, 32), np.uint8), "mxfp8")
    with pytest.raises(ValueError, match=r"at least one axis.*scalar"):
        jb.quantize(np.float32(1.0), "mxfp8")
    with pytest.raises(ValueError, match=r"rounding='ceil' applies to MX formats only"):
        jb.quantize(x, "nvfp4", rounding="ceil")
    with pytest.raises(ValueError, match=r"rounding='floor' applies to MX formats only"):
        jb.quantize(x, "fp8_block", rounding="floor")
    jb.quantize(x, "fp8_block", rounding="rceil")  # the default, accepted for every format
    with pytest.raises(ValueError, match=r"axis 2 is out of range"):
        jb.quantize(x, "mxfp8", axis=2)
    with pytest.raises(ValueError, match=r"two positive ints"):
        jb.quantize(x, "fp8_block", block=(0, 32))
    with pytest.raises(TypeError, match=r"format must be a name"):
        jb.quantize(x, 8)
    with pytest.raises(TypeError, match=r"dequantize takes a BlockScaledArray"):
        jb.dequantize(x)


def test_format_names_and_aliases():
    x = np.random.default_rng(13).standard_normal(TABLE_SHAPE).astype(np.float32)
    a, _ = Q(x, "mxfp8")
    b, _ = Q(x, "MXFP8_E4M3")
    assert a.fmt == b.fmt and a.fmt.name == "mxfp8_e4m3"
    _leaves_equal(a, b)
    c = jb.quantize(x, jb.get_format("mxfp4_e2m1"))
    assert c.fmt.name == "mxfp4"
    assert repr(c) == "BlockScaledArray(mxfp4, shape=(64, 64), axis=-1)"
    spec = jax.sharding.PartitionSpec("model", None)
    specs = jax.tree.map(lambda leaf: spec, c)  # a tree of specs, as Flax's get_partition_spec makes
    assert repr(specs) == (f"BlockScaledArray(mxfp4, axis=-1, length=64, values={spec!r}, scales={spec!r}, "
                           "tensor_scale=None)")
    assert jax.eval_shape(lambda v: jb.quantize(v, "fp8_block"), x).fmt.tile == (256, 256)  # no compile


# --------------------------------------------------------------------------------------------------------
# Transformations
# --------------------------------------------------------------------------------------------------------


_JIT_CASES = [("mxfp8", "floor", None), ("mxfp6_e2m3", "even", None), ("mxfp4", "rceil", None),
              ("nvfp4", "rceil", None), ("fp8_block", "rceil", (1, 32))]


@pytest.mark.parametrize("fmt, rounding, block", _JIT_CASES, ids=[c[0] for c in _JIT_CASES])
def test_jit_and_vmap_match_eager(fmt, rounding, block):
    rng = np.random.default_rng(14)
    x = rng.standard_normal(TABLE_SHAPE).astype(np.float32)
    x[3, :40] = 0.0
    x[5, 7] = np.nan
    eager = jb.quantize(x, fmt, rounding=rounding, block=block)
    eager_d = np.asarray(eager.dequantize())
    ts = np.float32(np.nanmax(np.abs(x))) / np.float32(2688.0)

    @jax.jit
    def run(v):
        q = jb.quantize(v, fmt, rounding=rounding, block=block)
        out = (q, jb.dequantize(q), q.dequantize(jnp.bfloat16))
        # vmap over rows: each row is quantized on its own, which for 1D blocks equals quantizing the matrix
        # (nvfp4 needs the whole matrix's tensor scale for that).
        row_ts = ts if fmt == "nvfp4" else None
        qv = jax.vmap(lambda r: jb.quantize(r, fmt, rounding=rounding, block=block, tensor_scale=row_ts))(v)
        return out + (qv, jax.vmap(jb.dequantize)(qv))

    res = run(x)
    q, d, dbf = res[:3]
    _leaves_equal(q, eager)
    np.testing.assert_array_equal(np.asarray(d), eager_d)
    assert dbf.dtype == jnp.bfloat16
    want_bf = eager_d.astype(jnp.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(dbf).astype(np.float32), want_bf)
    # dequantize jitted on its own, taking the BlockScaledArray as a pytree argument.
    np.testing.assert_array_equal(np.asarray(jax.jit(jb.dequantize)(eager)), eager_d)
    qv, dv = res[3:]
    if fmt == "nvfp4":
        eager = jb.quantize(x, fmt, tensor_scale=ts)
        eager_d = np.asarray(eager.dequantize())
        np.testing.assert_array_equal(np.asarray(qv.tensor_scale), np.full(64, ts, np.float32))
        np.testing.assert_array_equal(np.asarray(qv.values), np.asarray(eager.values))
        np.testing.assert_array_equal(
            np.asarray(qv.scales).view(np.uint8), np.asarray(eager.scales).view(np.uint8)
        )
    else:
        _leaves_equal(qv, eager)
    np.testing.assert_array_equal(np.asarray(dv), eager_d)
    # The stacked result is usable outside vmap as well (its axis is negative; nvfp4's tensor scale has a
    # leading batch dim).
    np.testing.assert_array_equal(np.asarray(jb.dequantize(qv)), eager_d)


def test_nvfp4_tensor_scale_per_vmapped_slice():
    # Default tensor scale inside vmap: one per slice. Dequantizing the stacked result outside vmap must
    # pair each slice with its own tensor scale (batch 2 == blocks per row 2, so a wrong broadcast would
    # not even raise).
    rng = np.random.default_rng(15)
    x = (rng.standard_normal((2, 64, 32)) * np.array([1.0, 100.0])[:, None, None]).astype(np.float32)
    @jax.jit
    def run(v):
        q = jax.vmap(lambda r: jb.quantize(r, "nvfp4"))(v)
        return q, jax.vmap(jb.dequantize)(q)

    qv, dv = run(x)
    assert np.asarray(qv.tensor_scale).shape == (2,)
    outside = np.asarray(jax.jit(jb.dequantize)(qv))
    np.testing.assert_array_equal(outside, np.asarray(dv))
    for i in range(2):
        qi, di = Q(x[i], "nvfp4")
        np.testing.assert_array_equal(np.asarray(qv.tensor_scale)[i], np.asarray(qi.tensor_scale))
        np.testing.assert_array_equal(outside[i], di)


def test_nvfp4_tensor_scale_function():
    x = np.random.default_rng(16).standard_normal(TABLE_SHAPE).astype(np.float32)
    want = np.float32(np.max(np.abs(x))) / np.float32(2688.0)
    assert np.asarray(qmod.nvfp4_tensor_scale(jnp.asarray(x))) == want
    got = jax.jit(lambda v: (qmod.nvfp4_tensor_scale(v), jax.vmap(qmod.nvfp4_tensor_scale)(v)))(x)
    assert np.asarray(got[0]) == want
    np.testing.assert_array_equal(np.asarray(got[1]), np.max(np.abs(x), axis=1) / np.float32(2688.0))


def test_pytree_scan_checkpoint():
    rng = np.random.default_rng(17)
    xs = rng.standard_normal((3,) + TABLE_SHAPE).astype(np.float32)
    for fmt in ("mxfp4", "nvfp4"):
        q = jb.quantize(xs[0], fmt)
        leaves, treedef = jax.tree_util.tree_flatten(q)
        assert len(leaves) == (3 if fmt == "nvfp4" else 2)  # a None tensor_scale is not a leaf
        q2 = jax.tree_util.tree_unflatten(treedef, leaves)
        assert isinstance(q2, jb.BlockScaledArray) and q2.fmt == q.fmt and q2.length == q.length
        _leaves_equal(q2, q)
        q3 = jax.tree_util.tree_map(np.asarray, q)  # leaves swapped for numpy copies
        assert isinstance(q3, jb.BlockScaledArray) and isinstance(q3.values, np.ndarray)
        np.testing.assert_array_equal(np.asarray(q3.dequantize()), np.asarray(q.dequantize()))

    # scan: quantize in the body, carry one BlockScaledArray and stack the others as outputs.
    def body(carry, x):
        q = jb.quantize(x, "nvfp4")
        return q, q

    init = jb.quantize(jnp.zeros(TABLE_SHAPE), "nvfp4")
    last, stacked = jax.lax.scan(body, init, xs)
    assert stacked.shape == (3,) + TABLE_SHAPE and np.asarray(stacked.tensor_scale).shape == (3,)
    _leaves_equal(last, jb.quantize(xs[2], "nvfp4"))
    deq = np.asarray(jax.jit(jb.dequantize)(stacked))
    for i in range(3):
        np.testing.assert_array_equal(deq[i], np.asarray(jb.quantize(xs[i], "nvfp4").dequantize()))

    # scan over a stacked BlockScaledArray as xs.
    qs = jax.tree_util.tree_map(lambda *a: np.stack(a), *[jb.quantize(v, "mxfp4") for v in xs])
    _, ys = jax.lax.scan(lambda c, q: (c, jb.dequantize(q)), 0, qs)
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(ys[i]), np.asarray(jb.quantize(xs[i], "mxfp4").dequantize()))

    # checkpoint: a BlockScaledArray argument of a rematerialized function, differentiated w.r.t. a dense one.
    q = jb.quantize(xs[0], "mxfp4")
    f = jax.checkpoint(lambda w, q: jnp.sum(jb.dequantize(q) * w))
    g = jax.jit(jax.grad(f))(jnp.ones(TABLE_SHAPE), q)
    np.testing.assert_array_equal(np.asarray(g), np.asarray(q.dequantize()))
    h = jax.checkpoint(lambda v: jb.dequantize(jb.quantize(v, "mxfp4")))(xs[0])
    np.testing.assert_array_equal(np.asarray(h), np.asarray(q.dequantize()))


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_fp4_to_16_bit_pairs_match_the_float32_path(fmt, dtype):
    """dequantize to bf16 / f16 decodes each fp4 byte's two values into one uint32 (no nibble stack); the
    bits are those of the float32 dequantization rounded to the dtype, with every scale code: MX's 0
    (2**-127, subnormal values), 0xFF (NaN blocks) and the largest (f16 overflow to inf), nvfp4's e4m3
    extremes, ragged lengths on either axis, and a vmapped batch with its own tensor scales."""
    rng = np.random.default_rng(7)

    def same(q):
        new = jax.jit(lambda q: jb.dequantize(q, dtype))(q)
        old = jb.dequantize(q, jnp.float32).astype(dtype)
        assert new.shape == old.shape == q.shape
        bits = [np.asarray(jax.lax.bitcast_convert_type(v, jnp.uint16)) for v in (new, old)]
        np.testing.assert_array_equal(*bits)

    for shape, axis in (((40, 100), -1), ((70, 33), 0), ((2, 5, 64), -1)):
        x = jnp.asarray(rng.standard_normal(shape) * np.exp(rng.uniform(-20, 20, shape)), jnp.float32)
        q = jb.quantize(x, fmt, axis=axis)
        same(q)
        raw = rng.integers(0, 256, q.scales.shape, dtype=np.uint8)
        if fmt == "mxfp4":
            raw.reshape(-1)[:4] = [0, 0xFF, 254, 1]
            scales = jnp.asarray(raw)
        else:  # every e4m3 code except its NaNs (0x7F, 0xFF), extremes included
            raw = np.where((raw & 0x7F) == 0x7F, raw - 1, raw)
            scales = jax.lax.bitcast_convert_type(jnp.asarray(raw), jnp.float8_e4m3fn)
        same(dataclasses.replace(q, scales=scales))
    xs = jnp.asarray(rng.standard_normal((3, 16, 64)) * np.array([1e-3, 1.0, 1e3])[:, None, None], jnp.float32)
    q = jax.vmap(lambda x: jb.quantize(x, fmt))(xs)
    vm = jax.vmap(lambda q: jb.dequantize(q, dtype))(q)
    np.testing.assert_array_equal(np.asarray(jax.lax.bitcast_convert_type(vm, jnp.uint16)),
                                  np.asarray(jax.lax.bitcast_convert_type(
                                      jax.vmap(lambda q: jb.dequantize(q))(q).astype(dtype), jnp.uint16)))


def test_fp4_to_16_bit_dequantize_has_no_concatenate():
    """The pairs path lowers without the (..., K/2, 2) stack (a concatenate) that unpacking nibbles makes."""
    q = jb.quantize(jnp.ones((64, 128), jnp.float32), "mxfp4")
    assert "concatenate" not in jax.jit(lambda q: jb.dequantize(q, jnp.bfloat16)).lower(q).as_text()
    assert "concatenate" in jax.jit(lambda q: jb.dequantize(q, jnp.float32)).lower(q).as_text()
