"""Bit-exact tests of `jax_blockscale.quantize` / `dequantize` for the MX formats (mxfp8 e4m3/e5m2, mxfp6
e2m3/e3m2, mxfp4) under every rounding mode, against the independent numpy model in _quantize_helpers.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from _quantize_helpers import (
    MX,
    MX_NAMES,
    ROUNDINGS,
    TABLE_SHAPE,
    TINY32,
    P,
    Q,
    _test_points,
    _to_tables,
    check_mx,
    codes_last,
    magnitude_table,
    max_code,
)

# --------------------------------------------------------------------------------------------------------
# MX: hand-made tables
# --------------------------------------------------------------------------------------------------------


def mx_blocks(p: P, rounding: str, seed=0):
    rng = np.random.default_rng(seed)
    blocks = []
    # Sweeps of values/midpoints/neighbours under a pinned amax that makes E = s exactly.
    pin = 2.0**p.emax if rounding == "ceil" else p.max_normal
    pts = _test_points(p)
    pts = pts[pts <= pin]
    min_pt = pts[pts > 0].min()
    for s in (0, -9, 13, 90, -100):
        if min_pt / 2 * 2.0**s < TINY32:  # stay in float32's normal range (XLA CPU flushes subnormals)
            continue
        vals = pts * 2.0**s * rng.choice([-1.0, 1.0], size=pts.size)
        for i in range(0, len(vals), 31):
            blocks.append(np.concatenate([[pin * 2.0**s * rng.choice([-1, 1])], vals[i : i + 31]]))
    # Saturation: amax in (max_normal, 2**(emax+1)) * 2**s saturates under floor; neighbours of max_normal.
    top = 2.0 ** (p.emax + 1)
    mn = p.max_normal
    sat = [top * (1 - 2.0 ** -(p.mbits + 3)), mn, float(np.nextafter(np.float32(mn), np.float32(np.inf))),
           (mn + top) / 2, mn * (1 + 2.0 ** -(p.mbits + 2)), -top * 0.99, mn / 2, 1.0]
    for s in (0, 5, -5):
        blocks.append(np.asarray(sat) * 2.0**s)
    # Element-subnormal results under a normal scale.
    sub_unit = 2.0 ** (p.emin - p.mbits)
    subs = np.arange(0, 2 ** (p.mbits + 1) + 1) * sub_unit / 2  # subnormals, midpoints, first normals
    blocks.append(np.concatenate([[mn], subs, -subs[1:3]]))
    blocks.append(np.concatenate([[mn * 2.0**-20], subs * 2.0**-20]))
    # Zeros: all-zero, all -0, signed zeros mixed with values.
    blocks.append(np.zeros(32))
    blocks.append(-np.zeros(32))
    blocks.append(np.array([0.0, -0.0, 1.0, -0.0, 3.0, 0.0] * 5))
    # Huge amax (near float32 max) and tiny amax (E clamps at -127).
    fmax = float(np.finfo(np.float32).max)
    blocks.append(np.array([fmax, -fmax, fmax / 3, 2.0**127, 1.5 * 2.0**120, 1e30, 1.0, -2.0**100]))
    blocks.append(np.array([2.0**127, 1.75 * 2.0**126, 2.0**126, -2.0**110]))
    for amax in (TINY32, 1.5 * TINY32, 3 * TINY32, 2.0**-120, 1.9 * 2.0**-119, 0.75 * TINY32 * mn,
                 0.5 * TINY32 * mn, 0.9 * TINY32 * mn, 1.01 * TINY32 * mn, 1e-36, 2.0**-100):
        others = rng.uniform(TINY32, amax, size=15)
        blocks.append(np.concatenate([[amax, -amax], others, -others[:5]]))
    # rceil/even/ceil boundaries: amax a few float32 ulps around max_normal * 2**k and 2**k.
    for k in (-120, -60, -3, 0, 7, 60, 100):
        for base in (mn, 2.0**p.emax):
            c = np.float32(base * 2.0**k)
            for u in (-2, -1, 0, 1, 2):
                a = c
                for _ in range(abs(u)):
                    a = np.nextafter(a, np.float32(np.sign(u) * np.inf))
                blocks.append(np.array([a, c / 3, -c / 7]))
    # Random blocks spanning many binades.
    for _ in range(8):
        mag = 2.0 ** rng.uniform(-20, 20, size=32)
        blocks.append(mag * rng.choice([-1.0, 1.0], size=32))
    return [np.asarray(b, np.float32) for b in blocks]


@pytest.mark.parametrize("rounding", ROUNDINGS)
@pytest.mark.parametrize("name", MX_NAMES)
def test_mx_tables_bit_exact(name, rounding):
    p = MX[name]
    tables = _to_tables(mx_blocks(p, rounding), 32)
    grid = magnitude_table(p)[: max_code(p) + 1]
    mids = (grid[:-1] + grid[1:]) / 2
    n_ties = 0
    for t in tables:
        _, _, _, scales = check_mx(t, name, rounding)
        # The sweeps really hit exact ties in the element domain (guards the tables against drifting).
        scaled = t.reshape(-1, 32).astype(np.float64) * np.ldexp(1.0, 127 - scales.reshape(-1, 1).astype(np.int64))
        n_ties += np.isin(np.abs(scaled), mids).sum()
    assert n_ties >= 2 * len(mids)


@pytest.mark.parametrize("rounding", ROUNDINGS)
def test_mx_rounding_modes_pick_the_documented_exponent(rounding):
    # One block per amax; the shared exponent per the docstring, worked out by hand for e4m3 (emax 8).
    amaxes = np.array([448.0, 480.0, 500.0, 512.0, 256.0, 1.0, 0.0, 3.0 * 2**-126, 1.5 * 2**-118], np.float32)
    want_E = {
        #          448 480 500 512 256 1   0     3*2**-126  1.5*2**-118
        "floor": [0, 0, 0, 1, 0, -8, -127, -127, -126],
        "ceil": [1, 1, 1, 1, 0, -8, -127, -127, -125],
        "even": [0, 0, 1, 1, 0, -8, -127, -127, -126],  # 480 = 1.875*2**8 keeps 3 bits; 500 carries
        "rceil": [0, 1, 1, 1, 0, -8, -127, -127, -126],  # ceil(log2(amax/448)); 1.5*2**-118/448 > 2**-127
    }[rounding]
    x = np.zeros(TABLE_SHAPE, np.float32)
    x[: len(amaxes), 0] = amaxes
    x[: len(amaxes), 1] = -amaxes / 3
    q, _, _, _ = check_mx(x, "mxfp8_e4m3", rounding)
    np.testing.assert_array_equal(np.asarray(q.scales)[: len(amaxes), 0], np.array(want_E) + 127)


def test_mx_explicit_mxfp4_ties():
    # Hand-computed: amax 7 -> floor E = 2 - 2 = 0; e2m1 grid 0 .5 1 1.5 2 3 4 6 (codes 0..7).
    x = np.zeros(TABLE_SHAPE, np.float32)
    x[0, :10] = [7, 2.5, 3.5, 5, 0.25, 0.75, -1.25, 1.75, -0.0, 6.5]
    want = np.zeros(32, np.uint8)
    want[:10] = [7, 4, 6, 6, 0, 2, 8 | 2, 4, 8, 7]
    q, deq = Q(x, "mxfp4")
    assert np.asarray(q.scales)[0].tolist() == [127, 0]
    np.testing.assert_array_equal(codes_last(q)[0, :32], want)
    np.testing.assert_array_equal(deq[0, :10], [6, 2, 4, 4, 0, 1, -1, 2, -0.0, 6])
    assert np.signbit(deq[0, 8])


@pytest.mark.parametrize("name", MX_NAMES)
def test_mx_nan_inf_blocks(name):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(TABLE_SHAPE).astype(np.float32)
    x[0, 3] = np.nan
    x[1, 40] = np.inf
    x[2, 0] = -np.inf
    x[3, :32] = np.inf
    x[4, 5] = np.nan
    x[4, 50] = -np.inf
    x[5, 33] = np.nan
    x[5, 34] = 1e30  # a finite huge value next to a NaN
    bad = np.zeros((64, 2), bool)
    bad[[0, 1, 2, 3, 4, 4, 5], [0, 1, 0, 0, 0, 1, 1]] = True
    for rounding in ROUNDINGS:
        q, deq, _, _ = check_mx(x, name, rounding)
        np.testing.assert_array_equal(np.asarray(q.scales) == 0xFF, bad)
        deq = deq.reshape(64, 2, 32)
        assert np.all(np.isnan(deq[bad]))
        assert np.all(np.isfinite(deq[~bad]))


@pytest.mark.parametrize("name", ["mxfp8_e4m3", "mxfp6_e3m2", "mxfp4"])  # fp8, one-code-per-byte, packed
def test_mx_odd_lengths_axes_and_batch(name):
    rng = np.random.default_rng(2)
    epb = 2 if name == "mxfp4" else 1
    # Non-multiple-of-block length with batched leading dims: padding stays internal.
    x = (rng.standard_normal((2, 3, 100)) * 2.0 ** rng.integers(-30, 30, size=(2, 3, 1))).astype(np.float32)
    q, deq, _, _ = check_mx(x, name, "rceil")
    assert q.shape == (2, 3, 100) and deq.shape == (2, 3, 100)
    assert q.length == 100 and q.axis == -1 and q.padded_length == 128 and q.ndim == 3
    assert np.asarray(q.values).shape == (2, 3, 128 // epb) and np.asarray(q.scales).shape == (2, 3, 4)
    # Quantized along axis 0 and along a middle axis.
    y = rng.standard_normal((70, 5)).astype(np.float32)
    q0, _, _, _ = check_mx(y, name, "even", axis=0)
    assert q0.axis == -2 and q0.shape == (70, 5)
    assert np.asarray(q0.values).shape == (96 // epb, 5) and np.asarray(q0.scales).shape == (3, 5)
    z = rng.standard_normal((3, 50, 4)).astype(np.float32)
    q1, _, _, _ = check_mx(z, name, "ceil", axis=1)
    assert q1.axis == -2 and q1.shape == (3, 50, 4)
    assert np.asarray(q1.values).shape == (3, 64 // epb, 4) and np.asarray(q1.scales).shape == (3, 2, 4)


@pytest.mark.parametrize("name", MX_NAMES)
def test_mx_random(name):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(TABLE_SHAPE) * np.exp(rng.uniform(-8, 8, size=TABLE_SHAPE))
    x = (x * 2.0 ** rng.integers(-60, 60, size=(64, 1))).astype(np.float32)
    for rounding in ROUNDINGS:
        check_mx(x, name, rounding)


def test_mx_rceil_quotient_in_float32_subnormal_range():
    # amax = max_normal * 2**-127 * (1 + k ulp): amax / max_normal is a float32 subnormal near 2**-127,
    # where float32's spacing is 2**-149. One ulp above rounds down onto 2**-127 (E = -127); two ulps above
    # rounds up past it (E = -126). A power-of-two prescale of amax would compute the quotient with 24
    # significant bits instead, and get E = -126 for one ulp.
    for name, p in MX.items():
        a = np.float32(p.max_normal * 2.0**-127)
        vals = [a]
        for _ in range(2):
            vals.append(np.nextafter(vals[-1], np.float32(1)))
        x = np.zeros(TABLE_SHAPE, np.float32)
        x[:3, 0] = vals
        q, _, _, _ = check_mx(x, name, "rceil")
        assert np.asarray(q.scales)[:3, 0].tolist() == [0, 0, 1]
