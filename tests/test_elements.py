"""Bit-exact tests of the element and scale codecs in `jax_blockscale.elements`.

The oracle is ml_dtypes' own float -> small-float cast (RNE). Our encoder saturates, so the oracle input is
first clipped to +-max_normal; with that, every code must agree bit for bit.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_blockscale import elements
from jax_blockscale.formats import E2M1, E2M3, E3M2, E4M3, E5M2

ELEMS = [E4M3, E5M2, E2M3, E3M2, E2M1]
ELEM_IDS = [e.name for e in ELEMS]

# Eager jnp compiles every op once per new shape, which dominates the runtime of a CPU test suite. The
# codecs are elementwise, so inputs are padded to one fixed length and run through one jitted function per
# element type; `test_codecs_under_jit_and_vmap` checks that jit and eager agree.
_CHUNK = 8192
_encode_jit = jax.jit(elements.encode, static_argnums=1)
_decode_jit = jax.jit(elements.decode, static_argnums=1)
_floor_log2_jit = jax.jit(elements.floor_log2)
_ceil_log2_jit = jax.jit(elements.ceil_log2)
_e4m3_scale_jit = jax.jit(elements.encode_e4m3_scale)


def _padded(fn, x, *args):
    x = np.asarray(x)
    flat = x.reshape(-1)
    n = flat.size
    assert n <= _CHUNK
    buf = np.zeros(_CHUNK, flat.dtype)
    buf[:n] = flat
    return np.asarray(fn(buf, *args))[:n].reshape(x.shape)


def _enc(x, elem):
    return _padded(_encode_jit, np.asarray(x, np.float32), elem)


def _dec(codes, elem):
    return _padded(_decode_jit, codes, elem)


def _all_codes(elem):
    return np.arange(1 << elem.bits, dtype=np.uint8)


def _ml_values(elem):
    """Every code's value according to ml_dtypes (as float64)."""
    return _all_codes(elem).view(elem.jnp_dtype).astype(np.float64)


def _positive_grid(elem):
    """Sorted distinct non-negative finite values of the element type."""
    v = _ml_values(elem)
    v = v[np.isfinite(v) & (v >= 0)]
    return np.unique(v)


def _ml_encode(x32, elem):
    """ml_dtypes' RNE cast after clipping to the saturating range, as uint8 codes."""
    clipped = np.clip(x32, -elem.max_normal, elem.max_normal).astype(np.float32)
    return clipped.astype(elem.jnp_dtype).view(np.uint8)


def _dense_inputs(elem):
    """Every value, every midpoint, the float32 neighbours of both, specials; both signs."""
    grid = _positive_grid(elem).astype(np.float32)
    mids = ((grid[:-1].astype(np.float64) + grid[1:]) / 2).astype(np.float32)
    assert np.all(mids.astype(np.float64) == (grid[:-1].astype(np.float64) + grid[1:]) / 2)  # exact
    pts = np.concatenate([grid, mids])
    up = np.nextafter(pts, np.float32(np.inf))
    down = np.nextafter(pts, np.float32(-np.inf))
    mn = np.float32(elem.max_normal)
    min_sub = grid[1]
    specials = np.array(
        [
            0.0,
            mn,
            np.nextafter(mn, np.float32(np.inf)),
            mn * 1.0625,  # past saturation, below the next would-be binade midpoint
            mn * 1.5,
            mn * 4,
            3.0e38,
            np.finfo(np.float32).max,
            np.inf,
            min_sub / 2,  # tie between 0 and the smallest subnormal: goes to 0 (even)
            np.nextafter(min_sub / 2, np.float32(np.inf)),
            np.nextafter(min_sub / 2, np.float32(0)),
            min_sub / 4,
            np.finfo(np.float32).tiny,  # 2**-126
            1e-30,
        ],
        np.float32,
    )
    pos = np.concatenate([pts, up, down, specials]).astype(np.float32)
    pos = pos[pos >= 0]
    return np.concatenate([pos, -pos]).astype(np.float32)


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_encode_matches_ml_dtypes_dense(elem):
    x = _dense_inputs(elem)
    got = _enc(x, elem)
    want = _ml_encode(x, elem)
    assert got.dtype == np.uint8
    mism = np.nonzero(got != want)[0]
    assert mism.size == 0, f"{elem.name}: {x[mism][:8]} -> {got[mism][:8]} want {want[mism][:8]}"
    # The dense grid really contains ties that round down (to even) and ties that round up (to even).
    grid = _positive_grid(elem)
    mids = (grid[:-1] + grid[1:]) / 2
    mid_codes = _enc(mids, elem)
    lower_codes = _enc(grid[:-1], elem)
    assert np.all(mid_codes % 2 == 0)
    assert np.any(mid_codes == lower_codes) and np.any(mid_codes == lower_codes + 1)


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_encode_random_matches_ml_dtypes(elem):
    rng = np.random.default_rng(elem.bits * 100 + elem.mbits)
    mag = 2.0 ** rng.uniform(elem.min_normal_exp - elem.mbits - 3, elem.emax + 3, size=4096)
    x = (mag * rng.choice([-1.0, 1.0], size=mag.size)).astype(np.float32)
    got = _enc(x, elem)
    np.testing.assert_array_equal(got, _ml_encode(x, elem))


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_encode_zeros_subnormals_saturation(elem):
    sign = np.uint8(1 << (elem.bits - 1))
    grid = _positive_grid(elem)
    min_sub = grid[1]
    x = np.array(
        [0.0, -0.0, min_sub, -min_sub, min_sub / 2, -min_sub / 2, elem.max_normal, 1e30, -np.inf, np.inf],
        np.float32,
    )
    got = _enc(x, elem)
    mc = np.uint8(elem.max_code)
    want = np.array([0, sign, 1, sign | 1, 0, sign, mc, mc, sign | mc, mc], np.uint8)
    np.testing.assert_array_equal(got, want)
    # Every subnormal code is the subnormal value it names.
    sub_vals = np.arange(1 << elem.mbits) * 2.0 ** (elem.min_normal_exp - elem.mbits)
    sub_codes = _enc(sub_vals, elem)
    np.testing.assert_array_equal(sub_codes, np.arange(1 << elem.mbits, dtype=np.uint8))


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_encode_nan_gives_largest_code(elem):
    x = np.array([np.nan, -np.nan], np.float32)
    got = _enc(x, elem)
    mag = got & np.uint8((1 << (elem.bits - 1)) - 1)
    np.testing.assert_array_equal(mag, [elem.max_code] * 2)


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_float32_subnormal_inputs_encode_to_signed_zero(elem):
    x = np.array([1e-40, -1e-40, 1e-45, -1e-45], np.float32)
    got = _enc(x, elem)
    np.testing.assert_array_equal(got, _ml_encode(x, elem))


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_decode_every_code(elem):
    codes = _all_codes(elem)
    want = _ml_values(elem).astype(np.float32)
    got = _dec(codes, elem)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)  # NaN positions must agree too
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))  # -0 stays -0
    # Storage dtype input (fp8 values are stored as float8) decodes the same.
    if elem.bits == 8:
        got8 = _dec(codes.view(elem.jnp_dtype), elem)
        np.testing.assert_array_equal(got8, want)
    # Codes are masked to the element width: high bits are ignored.
    if elem.bits < 8:
        high = codes | np.uint8(0xFF << elem.bits & 0xFF)
        np.testing.assert_array_equal(_dec(high, elem), want)


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_encode_decode_round_trip(elem):
    codes = _all_codes(elem)
    vals = _ml_values(elem)
    finite = np.isfinite(vals)
    back = _enc(_dec(codes[finite], elem), elem)
    np.testing.assert_array_equal(back, codes[finite])


def test_element_constants():
    assert [e.emax for e in ELEMS] == [8, 15, 2, 4, 2]
    assert [e.max_code for e in ELEMS] == [0x7E, 0x7B, 0x1F, 0x1F, 0x7]
    assert [e.bits for e in ELEMS] == [8, 8, 6, 6, 4]
    for e in ELEMS:
        assert _positive_grid(e).max() == e.max_normal


def _np_floor_log2(x):
    m, e = np.frexp(np.abs(x.astype(np.float64)))
    return (e - 1).astype(np.int32)


def _np_ceil_log2(x):
    m, e = np.frexp(np.abs(x.astype(np.float64)))
    return np.where(m == 0.5, e - 1, e).astype(np.int32)


def test_floor_ceil_log2():
    k = np.arange(-126, 128)
    p = (2.0**k).astype(np.float32)
    x = np.concatenate(
        [
            p,
            np.nextafter(p, np.float32(np.inf)),
            np.nextafter(p, np.float32(0))[1:],  # below 2**-126 is subnormal; covered separately
            p * 1.5,
            np.array([np.finfo(np.float32).max, 3.0, 0.75, 1e-20], np.float32),
        ]
    ).astype(np.float32)
    x = x[np.isfinite(x)]
    x = np.concatenate([x, -x])
    fl = _padded(_floor_log2_jit, x)
    ce = _padded(_ceil_log2_jit, x)
    assert fl.dtype == np.int32 and ce.dtype == np.int32
    np.testing.assert_array_equal(fl, _np_floor_log2(x))
    np.testing.assert_array_equal(ce, _np_ceil_log2(x))
    # Exact powers of two: floor == ceil == k.
    np.testing.assert_array_equal(_padded(_ceil_log2_jit, p), k)
    np.testing.assert_array_equal(_padded(_floor_log2_jit, p), k)
    # Zero and float32 subnormals read as -127 (documented: below every exponent, callers clamp).
    z = np.array([0.0, -0.0, 1e-40, 2.0**-149], np.float32)
    np.testing.assert_array_equal(_padded(_floor_log2_jit, z), [-127] * 4)
    np.testing.assert_array_equal(_padded(_ceil_log2_jit, z[:2]), [-127] * 2)


def test_scale_by_exp2_extremes():
    # x * 2**e stays exact across e8m0's whole range as long as the result is a normal float32.
    e = np.array([-127, -127, 127, 127, -254 + 127, 0, 5], np.int32)
    x = np.array([2.0**100, 1.5 * 2.0**1, 2.0**-100, -1.25, 2.0**100, 3.0, -7.0], np.float32)
    got = np.asarray(elements.scale_by_exp2(jnp.asarray(x), jnp.asarray(e)))
    np.testing.assert_array_equal(got, (x.astype(np.float64) * 2.0 ** e.astype(np.float64)).astype(np.float32))


def test_encode_e8m0():
    exps = np.arange(-200, 201, dtype=np.int32)
    nan = (exps % 7) == 0
    extra = np.array([-127, 127, 0, -500, 500], np.int32)
    e = np.arange(-127, 128, dtype=np.int32)
    all_e = np.concatenate([exps, extra, e])
    all_nan = np.concatenate([nan, np.zeros(extra.size + e.size, bool)])
    got = np.asarray(elements.encode_e8m0(jnp.asarray(all_e), jnp.asarray(all_nan)))
    assert got.dtype == np.uint8
    want = np.where(nan, 0xFF, np.clip(exps, -127, 127) + 127).astype(np.uint8)
    np.testing.assert_array_equal(got[: exps.size], want)
    np.testing.assert_array_equal(got[exps.size : exps.size + 5], [0x00, 0xFE, 0x7F, 0x00, 0xFE])
    # Agrees with ml_dtypes' e8m0 for every finite code.
    ml = (2.0**e).astype(ml_dtypes.float8_e8m0fnu).view(np.uint8)
    np.testing.assert_array_equal(got[exps.size + 5 :], ml)


def test_decode_e8m0_every_code():
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    for inp in (codes, codes.view(ml_dtypes.float8_e8m0fnu)):
        got = np.asarray(elements.decode_e8m0(jnp.asarray(inp)))
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.astype(np.float64), want)
    got = np.asarray(elements.decode_e8m0(jnp.asarray(codes))).astype(np.float64)
    assert got[0x00] == 2.0**-127
    assert got[0x7F] == 1.0
    assert got[0xFE] == 2.0**127
    assert np.isnan(got[0xFF])
    assert not np.any(np.isnan(got[:0xFF]))


def test_encode_e4m3_scale():
    x = np.array([1.0, 500.0, 1e30, -1e30, 0.0625 * 1.0625, 2.0**-10, 3.0 * 2**-10, 240.0], np.float32)
    got = _padded(_e4m3_scale_jit, x)
    assert got.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(got.view(np.uint8), _ml_encode(x, E4M3))
    assert not np.any(np.isnan(got.astype(np.float32)))


def test_codecs_under_jit_and_vmap():
    x = _dense_inputs(E4M3)[:256].reshape(4, 64)
    for elem in (E4M3, E2M1):
        want = _ml_encode(x, elem)
        if elem is E4M3:  # eager (each op compiles once per shape on CPU: keep it to one element type)
            np.testing.assert_array_equal(np.asarray(elements.encode(jnp.asarray(x), elem)), want)
            np.testing.assert_array_equal(np.asarray(elements.decode(jnp.asarray(want), elem)), _dec(want, elem))
        jitted = np.asarray(jax.jit(elements.encode, static_argnums=1)(x, elem))
        vm = np.asarray(jax.jit(jax.vmap(lambda r: elements.encode(r, elem)))(x))
        np.testing.assert_array_equal(jitted, want)
        np.testing.assert_array_equal(vm, want)
        dec = np.asarray(jax.jit(jax.vmap(lambda c: elements.decode(c, elem)))(want))
        np.testing.assert_array_equal(dec, _dec(want, elem))
    codes = np.arange(256, dtype=np.uint8).reshape(4, 64)
    np.testing.assert_array_equal(
        np.asarray(jax.jit(elements.decode_e8m0)(codes)), np.asarray(elements.decode_e8m0(jnp.asarray(codes)))
    )
    np.testing.assert_array_equal(
        np.asarray(jax.jit(jax.vmap(elements.decode_e8m0))(codes)),
        np.asarray(elements.decode_e8m0(jnp.asarray(codes))),
    )
    np.testing.assert_array_equal(
        np.asarray(jax.jit(elements.floor_log2)(x)), np.asarray(elements.floor_log2(jnp.asarray(x)))
    )


@pytest.mark.parametrize("elem", ELEMS, ids=ELEM_IDS)
def test_encode_random_bit_patterns(elem):
    # The encoder works on the float32 bit pattern: random patterns of every exponent (finite, both signs,
    # float32 subnormals excluded: XLA:CPU flushes them) against ml_dtypes, 256k at a time.
    rng = np.random.default_rng(elem.bits * 7 + elem.mbits)
    bits = rng.integers(0, 2**32, size=1 << 18, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x) & ((np.abs(x) >= np.finfo(np.float32).tiny) | (x == 0))]
    got = np.asarray(jax.jit(elements.encode, static_argnums=1)(x, elem))
    np.testing.assert_array_equal(got, _ml_encode(x, elem))
