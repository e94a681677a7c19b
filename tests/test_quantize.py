"""Bit-exact tests of `jax_blockscale.quantize` / `dequantize` against an independent numpy model of the spec.

The model below (`ref_*`) re-implements the module docstring of `jax_blockscale/quantize.py` in float64
numpy (float32 numpy where the spec computes in float32: rceil's amax / max_normal, nvfp4's divisions,
fp8_block's amax / 448 and x / scale). It shares no code with the package: element grids are rebuilt from
the bit fields, rounding is numpy's round-half-to-even on exactly scaled float64 values.

Runtime note: on CPU, eager jnp compiles every op once per new shape (seconds per quantize call), while a
jitted quantize compiles in a fraction of a second. `Q` therefore runs eagerly on the one shape that most
tests share (TABLE_SHAPE, float32), where the per-op cache is warm, and under jit everywhere else.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_blockscale as jb

# `jax_blockscale.quantize` is the function (re-exported by the package), which shadows the submodule.
qmod = importlib.import_module("jax_blockscale.quantize")

# --------------------------------------------------------------------------------------------------------
# Independent model of the spec
# --------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class P:
    """Element parameters, written out from the OCP MX v1.0 tables (not read from the package)."""

    name: str
    ebits: int
    mbits: int
    bias: int
    max_normal: float
    emax: int

    @property
    def bits(self):
        return 1 + self.ebits + self.mbits

    @property
    def emin(self):
        return 1 - self.bias


E4M3 = P("e4m3", 4, 3, 7, 448.0, 8)
E5M2 = P("e5m2", 5, 2, 15, 57344.0, 15)
E2M3 = P("e2m3", 2, 3, 1, 7.5, 2)
E3M2 = P("e3m2", 3, 2, 3, 28.0, 4)
E2M1 = P("e2m1", 2, 1, 1, 6.0, 2)

MX = {
    "mxfp8_e4m3": E4M3,
    "mxfp8_e5m2": E5M2,
    "mxfp6_e2m3": E2M3,
    "mxfp6_e3m2": E3M2,
    "mxfp4": E2M1,
}
MX_NAMES = list(MX)
ROUNDINGS = ["floor", "ceil", "even", "rceil"]
TINY32 = float(np.finfo(np.float32).tiny)  # 2**-126


@functools.lru_cache(None)
def magnitude_table(p: P) -> np.ndarray:
    """Value of every magnitude code 0 .. 2**(bits-1)-1, from the bit fields (float64)."""
    mag = np.arange(1 << (p.bits - 1))
    ef = mag >> p.mbits
    mf = mag & ((1 << p.mbits) - 1)
    sub = mf * 2.0 ** (p.emin - p.mbits)
    nrm = (1 + mf / 2.0**p.mbits) * 2.0 ** (ef - p.bias)
    return np.where(ef == 0, sub, nrm)


def max_code(p: P) -> int:
    return int(np.nonzero(magnitude_table(p) == p.max_normal)[0][0])


def ref_round(x, p: P) -> np.ndarray:
    """RNE to the element grid, saturating to +-max_normal, sign kept (float64 in, float64 out)."""
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(x), p.max_normal)
    _, fe = np.frexp(a)  # a = m * 2**fe, m in [0.5, 1); floor(log2 a) = fe - 1
    e = np.maximum(fe - 1, p.emin)
    quantum = np.ldexp(1.0, e - p.mbits)
    v = np.minimum(np.round(a / quantum) * quantum, p.max_normal)  # np.round: half to even; a/quantum exact
    return np.copysign(v, x)


def ref_code(v, p: P) -> np.ndarray:
    """Exact grid value (float64, may be -0.0) -> uint8 code."""
    v = np.asarray(v, np.float64)
    table = magnitude_table(p)[: max_code(p) + 1]
    mag = np.searchsorted(table, np.abs(v))
    assert np.all(table[np.minimum(mag, len(table) - 1)] == np.abs(v)), "not a grid value"
    return (mag | (np.signbit(v).astype(np.int64) << (p.bits - 1))).astype(np.uint8)


def ref_decode(codes, p: P) -> np.ndarray:
    codes = np.asarray(codes).astype(np.int64)
    mag = magnitude_table(p)[codes & ((1 << (p.bits - 1)) - 1)]
    return np.where(codes >> (p.bits - 1) & 1, -mag, mag)


def _floor_log2(a):
    _, fe = np.frexp(a)
    return fe - 1


def _ceil_log2(a):
    m, fe = np.frexp(a)
    return np.where(m == 0.5, fe - 1, fe)


def _pad_last(x, mult):
    pad = -x.shape[-1] % mult
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x


def ref_mx(x, p: P, rounding: str, block: int = 32):
    """x float32 with the quantized axis last -> (codes padded (..., Kp), scale codes (..., Kp/block), bad)."""
    x = _pad_last(np.asarray(x, np.float32), block)
    b = x.reshape(*x.shape[:-1], -1, block).astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~np.all(np.isfinite(b), axis=-1)
        amax = np.max(np.abs(b), axis=-1)
    a = np.where(bad | (amax == 0), 1.0, amax)
    if rounding == "floor":
        E = _floor_log2(a) - p.emax
    elif rounding == "ceil":
        E = _ceil_log2(a) - p.emax
    elif rounding == "even":
        e = _floor_log2(a)
        n = np.round(a / np.ldexp(1.0, e - p.mbits))
        E = e + (n >= 2 ** (p.mbits + 1)) - p.emax
    elif rounding == "rceil":
        r = a.astype(np.float32) / np.float32(p.max_normal)  # float32 division, RNE (numpy keeps subnormals)
        E = _ceil_log2(r.astype(np.float64))
    else:
        raise AssertionError(rounding)
    E = np.where(amax == 0, -127, E)
    E = np.clip(E, -127, 127)
    E = np.where(bad, 0, E)  # elements of NaN blocks are unspecified; keep the arithmetic finite
    scaled = b * np.ldexp(1.0, -E)[..., None]
    with np.errstate(invalid="ignore"):
        scaled = np.where(np.isfinite(scaled), scaled, 0.0)
    codes = ref_code(ref_round(scaled, p), p).reshape(x.shape)
    scales = np.where(bad, 0xFF, E + 127).astype(np.uint8)
    return codes, scales, bad


def ref_mx_dequant(codes, scales, p: P, block=32):
    vals = ref_decode(codes, p).reshape(*codes.shape[:-1], -1, block)
    s = np.ldexp(1.0, scales.astype(np.int64) - 127)
    out = vals * s[..., None]
    out = np.where((scales == 0xFF)[..., None], np.nan, out)
    return out.reshape(codes.shape)


def ref_nvfp4(x, tensor_scale=None):
    """x float32, quantized axis last -> (e2m1 codes, e4m3 scale codes, scale values f32, ts, bad)."""
    x = _pad_last(np.asarray(x, np.float32), 16)
    with np.errstate(invalid="ignore", over="ignore"):
        b = x.reshape(*x.shape[:-1], -1, 16)
        bad = ~np.all(np.isfinite(b), axis=-1)
        if tensor_scale is None:
            # The tensor amax skips blocks holding NaN/Inf (0 when none is left), so they stay confined.
            finite = np.abs(np.where(bad[..., None], np.float32(0), b))
            ts = np.float32(np.max(finite, initial=np.float32(0))) / np.float32(448.0 * 6.0)
        else:
            ts = np.float32(tensor_scale)
        ts0 = np.float32(1.0) if ts == 0 else ts
        amax = np.max(np.abs(b), axis=-1).astype(np.float32)
        bs_in = (amax / np.float32(6.0)) / ts0  # float32, left to right
        bs_in = np.where(bad, 0, bs_in)
        bs = ref_round(bs_in.astype(np.float64), E4M3).astype(np.float32)
        denom = bs * ts0  # float32
        safe = np.where(denom == 0, np.float32(1.0), denom)
        scaled = np.where(denom[..., None] == 0, np.float32(0), b / safe[..., None]).astype(np.float32)
        scaled = np.where(bad[..., None], 0, scaled)
    codes = ref_code(ref_round(scaled.astype(np.float64), E2M1), E2M1).reshape(x.shape)
    scale_codes = ref_code(bs.astype(np.float64), E4M3)
    return codes, scale_codes, bs, np.float32(ts), bad


def ref_fp8_block(x, tile):
    """x float32 with the quantized axis last and, for rows > 1, the tile-row axis second to last."""
    rows, cols = tile
    x = _pad_last(np.asarray(x, np.float32), cols)
    n_rows = x.shape[-2] if rows > 1 else None
    if rows > 1:
        pr = -x.shape[-2] % rows
        xp = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pr), (0, 0)])
        t = xp.reshape(*xp.shape[:-2], xp.shape[-2] // rows, rows, xp.shape[-1] // cols, cols)
        red = (-3, -1)
    else:
        xp = x
        t = xp.reshape(*xp.shape[:-1], xp.shape[-1] // cols, cols)
        red = (-1,)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~np.all(np.isfinite(t), axis=red)
        amax = np.max(np.abs(t), axis=red).astype(np.float32)
        scale = np.where(amax == 0, np.float32(1.0), amax / np.float32(448.0)).astype(np.float32)
        scale = np.where(bad, np.float32(np.nan), scale)
        s = scale[..., :, None, :, None] if rows > 1 else scale[..., None]
        scaled = (t / s).astype(np.float32)
        scaled = np.where(np.isfinite(scaled), scaled, 0)
    codes = ref_code(ref_round(scaled.astype(np.float64), E4M3), E4M3).reshape(xp.shape)
    if rows > 1:
        codes = codes[..., :n_rows, :]
    return codes, scale, bad


# --------------------------------------------------------------------------------------------------------
# Reading a BlockScaledArray back as plain numpy (independent of the package's unpacking)
# --------------------------------------------------------------------------------------------------------


def codes_last(q) -> np.ndarray:
    """Element codes as uint8, quantized axis last, padded length."""
    v = np.moveaxis(np.asarray(q.values), q.axis, -1)
    if v.dtype != np.uint8:
        v = v.view(np.uint8)
    if q.fmt.elements_per_byte == 2:
        v = np.stack([v & 0xF, v >> 4], axis=-1).reshape(*v.shape[:-1], v.shape[-1] * 2)
    return v


def scales_last(q) -> np.ndarray:
    return np.moveaxis(np.asarray(q.scales), q.axis, -1)


def assert_equal_ftz(got, want):
    """Exact equality, except that float32-subnormal expected values may come back flushed to zero."""
    got = np.asarray(got, np.float32)
    with np.errstate(over="ignore"):  # a dequantized block may legitimately overflow to Inf
        want = np.asarray(want, np.float32)
    assert got.shape == want.shape
    with np.errstate(invalid="ignore"):
        ok = (got == want) | (np.isnan(got) & np.isnan(want)) | ((np.abs(want) < TINY32) & (got == 0))
    bad = np.nonzero(~ok)
    first = [i[:3] for i in bad]
    assert ok.all(), f"{bad[0].size} mismatches, first at {first}: {got[bad][:5]} vs {want[bad][:5]}"


# --------------------------------------------------------------------------------------------------------
# Running quantize
# --------------------------------------------------------------------------------------------------------

TABLE_SHAPE = (64, 64)  # every hand-made table is padded (with zero rows) to this shape


@functools.partial(jax.jit, static_argnames=("fmt", "rounding", "axis", "block"))
def _qd_jit(x, tensor_scale, *, fmt, rounding, axis, block):
    q = jb.quantize(x, fmt, rounding=rounding, axis=axis, block=block, tensor_scale=tensor_scale)
    return q, jb.dequantize(q)


def Q(x, fmt, *, rounding=None, axis=-1, block=None, tensor_scale=None):
    """quantize + dequantize: eagerly on TABLE_SHAPE float32 input, jitted otherwise. Returns (q, deq).

    MX formats default to rounding="floor" here (these tables were written for it; the library's default is
    "rceil"); the other formats take no rounding."""
    if rounding is None:
        rounding = "floor" if isinstance(jb.get_format(fmt, block=block), jb.formats.MXFormat) else qmod.DEFAULT_ROUNDING
    x = jnp.asarray(x)
    if x.shape == TABLE_SHAPE and x.dtype == jnp.float32:
        q = jb.quantize(x, fmt, rounding=rounding, axis=axis, block=block, tensor_scale=tensor_scale)
        return q, np.asarray(jb.dequantize(q))
    ts = None if tensor_scale is None else jnp.asarray(tensor_scale, jnp.float32)
    q, d = _qd_jit(x, ts, fmt=fmt, rounding=rounding, axis=axis, block=block)
    return q, np.asarray(d)


def check_mx(x, name, rounding, axis=-1):
    """Quantizes and compares codes, scales and dequantized values bit for bit with the model."""
    p = MX[name]
    q, deq = Q(x, name, rounding=rounding, axis=axis)
    x32 = np.asarray(x).astype(np.float32)
    xl = np.moveaxis(x32, axis, -1)
    codes, scales, bad = ref_mx(xl, p, rounding)
    assert q.shape == x32.shape and q.length == x32.shape[axis] and q.axis == axis - x32.ndim * (axis >= 0)
    assert q.scales.dtype == np.uint8
    np.testing.assert_array_equal(scales_last(q), scales, err_msg=f"{name}/{rounding} scales")
    got_c = codes_last(q)
    assert got_c.shape == codes.shape
    keep = np.repeat(~bad, 32, axis=-1)
    np.testing.assert_array_equal(
        np.where(keep, got_c, 0), np.where(keep, codes, 0), err_msg=f"{name}/{rounding} codes"
    )
    assert deq.shape == x32.shape and deq.dtype == np.float32
    want = np.moveaxis(ref_mx_dequant(codes, scales, p)[..., : xl.shape[-1]], -1, axis)
    assert_equal_ftz(deq, want)
    return q, deq, codes, scales


# --------------------------------------------------------------------------------------------------------
# MX: hand-made tables
# --------------------------------------------------------------------------------------------------------


def _to_tables(blocks, block):
    """List of 1D blocks (each <= block long, zero padded) -> list of TABLE_SHAPE float32 arrays."""
    per_table = TABLE_SHAPE[0] * TABLE_SHAPE[1] // block
    flat = np.zeros((len(blocks), block), np.float32)
    for i, b in enumerate(blocks):
        assert len(b) <= block
        flat[i, : len(b)] = b
    out = []
    for i in range(0, len(blocks), per_table):
        t = np.zeros((per_table, block), np.float32)
        chunk = flat[i : i + per_table]
        t[: len(chunk)] = chunk
        out.append(t.reshape(TABLE_SHAPE))
    return out


def _test_points(p: P) -> np.ndarray:
    """Positive test values in element units: every value, every midpoint, and their float32 neighbours."""
    grid = magnitude_table(p)[: max_code(p) + 1]
    mids = (grid[:-1] + grid[1:]) / 2
    pts = np.concatenate([grid, mids]).astype(np.float32)
    nz = pts[pts > 0]
    return np.concatenate([pts, np.nextafter(nz, np.float32(np.inf)), np.nextafter(nz, np.float32(0))]).astype(
        np.float64
    )


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


# --------------------------------------------------------------------------------------------------------
# nvfp4
# --------------------------------------------------------------------------------------------------------


def check_nvfp4(x, axis=-1, tensor_scale=None):
    q, deq = Q(x, "nvfp4", axis=axis, tensor_scale=tensor_scale)
    x32 = np.asarray(x).astype(np.float32)
    xl = np.moveaxis(x32, axis, -1)
    codes, scale_codes, bs, ts, bad = ref_nvfp4(xl, tensor_scale)
    assert q.shape == x32.shape
    assert q.scales.dtype == jnp.float8_e4m3fn
    assert q.tensor_scale.shape == () and q.tensor_scale.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(q.tensor_scale), ts)
    got_s = scales_last(q)
    np.testing.assert_array_equal(np.isnan(got_s.astype(np.float32)), bad)
    np.testing.assert_array_equal(np.where(bad, 0, got_s.view(np.uint8)), np.where(bad, 0, scale_codes))
    keep = np.repeat(~bad, 16, axis=-1)
    np.testing.assert_array_equal(np.where(keep, codes_last(q), 0), np.where(keep, codes, 0))
    # Dequantize: elements * (block_scale * tensor_scale), both products in float32.
    ts0 = np.float32(np.asarray(q.tensor_scale))
    with np.errstate(invalid="ignore", over="ignore"):
        blk = (np.where(bad, np.float32(np.nan), bs) * ts0).astype(np.float32)
        want = ref_decode(codes, E2M1).astype(np.float32).reshape(*codes.shape[:-1], -1, 16) * blk[..., None]
    want = np.moveaxis(want.reshape(codes.shape)[..., : xl.shape[-1]], -1, axis)
    assert_equal_ftz(deq, want)
    return q, deq, codes, scale_codes


def nvfp4_blocks(seed=0):
    rng = np.random.default_rng(seed)
    blocks = []
    pts = _test_points(E2M1)
    pts = pts[pts <= 6.0]
    # Block scale c exactly representable in e4m3: amax = 6*c makes the scale c (with tensor scale 1).
    for c in (1.0, 2.0**-5, 2.0**7, 1.125, 3.5, 0.875 * 2**-6, 448.0):
        vals = pts * c * rng.choice([-1.0, 1.0], size=pts.size)
        for i in range(0, len(vals), 15):
            blocks.append(np.concatenate([[6.0 * c], vals[i : i + 15]]))
    # Ties in the e4m3 block scale (amax/6 at an e4m3 midpoint), its subnormals, zero and saturation.
    for m in (1.0625, 1.1875, 3.25, 2.0**-7 * 1.5, 2.0**-8, 2.0**-10, 2.0**-11, 464.0, 480.0, 1000.0):
        blocks.append(np.array([6.0 * m, -3.0 * m, 1.0 * m, 0.25 * m, 5.0 * m]))
    blocks.append(np.zeros(16))
    blocks.append(-np.zeros(16))
    for _ in range(6):
        blocks.append(rng.standard_normal(16) * 2.0 ** rng.integers(-8, 8))
    return [np.asarray(b, np.float32) for b in blocks]


def test_nvfp4_tables_bit_exact():
    tables = _to_tables(nvfp4_blocks(), 16)
    for t in tables:
        check_nvfp4(t, tensor_scale=1.0)  # block scale = e4m3(amax / 6)
        check_nvfp4(t, tensor_scale=2.0**-3)
        check_nvfp4(t, tensor_scale=0.3)  # not a power of two: float32 division rounding matters
        check_nvfp4(t)  # default tensor scale amax / 2688


def test_nvfp4_explicit():
    x = np.zeros(TABLE_SHAPE, np.float32)
    x[0, :6] = [6, -3, 2.5, 0.25, 0.75, 7]
    q, _ = Q(x, "nvfp4", tensor_scale=7.0 / 6.0)
    # Block scale (7/6)/(7/6) = 1 -> e4m3 0x38; the all-zero blocks get scale 0.
    assert np.asarray(q.scales).view(np.uint8)[0].tolist() == [0x38, 0, 0, 0]
    assert float(q.tensor_scale) == np.float32(7.0 / 6.0)
    q, _ = Q(x, "nvfp4")
    assert float(q.tensor_scale) == np.float32(7.0) / np.float32(2688.0)
    # amax/6/ts = (7/6) / (7/2688) = 448: the largest e4m3 scale.
    assert np.asarray(q.scales).view(np.uint8)[0].tolist() == [0x7E, 0, 0, 0]
    check_nvfp4(x)
    check_nvfp4(x, tensor_scale=7.0 / 6.0)


def test_nvfp4_random_odd_shapes_and_axes():
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((2, 3, 100)) * 10).astype(np.float32)
    q, deq, _, _ = check_nvfp4(x)
    assert q.shape == (2, 3, 100) and deq.shape == (2, 3, 100)
    assert np.asarray(q.values).shape == (2, 3, 56) and np.asarray(q.scales).shape == (2, 3, 7)
    y = rng.standard_normal((70, 5)).astype(np.float32)
    q0, _, _, _ = check_nvfp4(y, axis=0)
    assert q0.axis == -2 and np.asarray(q0.values).shape == (40, 5) and np.asarray(q0.scales).shape == (5, 5)
    z = rng.standard_normal((3, 50, 4)).astype(np.float32)
    q1, _, _, _ = check_nvfp4(z, axis=1, tensor_scale=0.01)
    assert np.asarray(q1.values).shape == (3, 32, 4)
    t = rng.standard_normal(TABLE_SHAPE).astype(np.float32) * np.float32(100)
    check_nvfp4(t)


def test_nvfp4_nonfinite_blocks():
    rng = np.random.default_rng(5)
    t = rng.standard_normal(TABLE_SHAPE).astype(np.float32)
    t[0, 3] = np.nan
    t[1, 20] = -np.inf
    bad = np.zeros((64, 4), bool)
    bad[0, 0] = bad[1, 1] = True
    # With an explicit tensor scale: the bad blocks get a NaN scale, and only they dequantize to NaN.
    _, deq, _, _ = check_nvfp4(t, tensor_scale=0.01)
    deq = deq.reshape(64, 4, 16)
    assert np.all(np.isnan(deq[bad])) and np.all(np.isfinite(deq[~bad]))
    # With the default tensor scale the NaN/Inf blocks are left out of the tensor amax: still only they
    # dequantize to NaN, and the tensor scale is the finite blocks' amax / 2688.
    q, deq, _, _ = check_nvfp4(t)
    finite_amax = np.abs(t.reshape(64, 4, 16))[~bad].max()
    assert float(q.tensor_scale) == np.float32(finite_amax) / np.float32(2688.0)
    deq = deq.reshape(64, 4, 16)
    assert np.all(np.isnan(deq[bad])) and np.all(np.isfinite(deq[~bad]))
    # Every block non-finite: tensor amax 0, handled as the all-zero tensor (stored tensor scale 0).
    q, deq = Q(np.full(TABLE_SHAPE, np.nan, np.float32), "nvfp4")
    assert float(q.tensor_scale) == 0.0 and np.all(np.isnan(deq))


def test_nvfp4_zero_tensor():
    x = np.zeros(TABLE_SHAPE, np.float32)
    q, deq, codes, _ = check_nvfp4(x)
    assert float(q.tensor_scale) == 0.0
    assert np.all(np.asarray(q.scales).view(np.uint8) == 0)
    assert np.all(codes_last(q) == 0)
    np.testing.assert_array_equal(deq, x)


def test_tensor_scale_override():
    rng = np.random.default_rng(6)
    x = rng.standard_normal(TABLE_SHAPE).astype(np.float32)
    for ts in (0.5, 1e-3, np.float32(2.0), jnp.float32(0.02)):
        q, _, _, _ = check_nvfp4(x, tensor_scale=ts)
        assert float(q.tensor_scale) == np.float32(ts)
    # A tiny tensor scale saturates every e4m3 block scale at 448.
    q, _, _, _ = check_nvfp4(x, tensor_scale=1e-6)
    assert np.all(np.asarray(q.scales).astype(np.float32) == 448.0)
    # jax.nn's convention, a one-element array, is the same scale.
    q1, _ = Q(x, "nvfp4", tensor_scale=np.full((1,), 0.5, np.float32))
    _leaves_equal(q1, Q(x, "nvfp4", tensor_scale=0.5)[0])
    with pytest.raises(ValueError, match="expected a scalar or a one-element array"):
        jb.quantize(x, "nvfp4", tensor_scale=np.ones(2, np.float32))
    with pytest.raises(ValueError, match="tensor_scale applies to nvfp4 only"):
        jb.quantize(x, "mxfp8", tensor_scale=1.0)


# --------------------------------------------------------------------------------------------------------
# fp8_block
# --------------------------------------------------------------------------------------------------------


def check_fp8_block(x, tile, axis=-1, pass_block=True):
    q, deq = Q(x, "fp8_block", axis=axis, block=tile if pass_block else None)
    assert q.fmt.tile == tuple(tile)
    x32 = np.asarray(x).astype(np.float32)
    xl = np.moveaxis(x32, axis, -1)
    codes, scale, bad = ref_fp8_block(xl, tile)
    assert q.scales.dtype == np.float32 and q.values.dtype == jnp.float8_e4m3fn
    got_s = scales_last(q)
    assert_equal_ftz(got_s, scale)
    # A tile whose scale amax/448 is a float32 subnormal is at the backend's mercy (XLA CPU flushes it to
    # zero); its codes are not compared.
    sub = (scale > 0) & (scale < TINY32)
    rows, cols = tile

    def per_element(mask):
        m = np.repeat(mask, cols, axis=-1)
        if rows > 1:
            m = np.repeat(m, rows, axis=-2)[..., : codes.shape[-2], :]
        return m

    keep = per_element(~bad & ~sub)
    got_c = codes_last(q)
    assert got_c.shape == codes.shape
    np.testing.assert_array_equal(np.where(keep, got_c, 0), np.where(keep, codes, 0))
    with np.errstate(invalid="ignore"):
        want = ref_decode(codes, E4M3).astype(np.float32) * per_element(scale)
    want = np.moveaxis(want[..., : xl.shape[-1]], -1, axis)
    assert deq.shape == x32.shape
    subl = np.moveaxis(per_element(sub)[..., : xl.shape[-1]], -1, axis)
    assert_equal_ftz(np.where(subl, 0, deq), np.where(subl, 0, want))
    assert np.all(np.isfinite(deq[subl]))
    return q, deq, codes, scale


def _near_boundary_multiples(p: P, scale32: np.float32, rng) -> np.ndarray:
    """float32 x whose quotient x / scale lands on or within 2 ulps of each element value and midpoint."""
    grid = magnitude_table(p)[: max_code(p) + 1]
    mids = (grid[:-1] + grid[1:]) / 2
    targets = np.concatenate([grid[1:], mids])
    x0 = (targets * np.float64(scale32)).astype(np.float32)
    out = [x0]
    for direction in (np.inf, -np.inf):
        a = x0
        for _ in range(2):
            a = np.nextafter(a, np.float32(direction))
            out.append(a)
    x = np.concatenate(out)
    return x * rng.choice(np.array([-1, 1], np.float32), size=x.size)


def test_fp8_block_1x128_tables():
    rng = np.random.default_rng(7)
    pts = _test_points(E4M3)
    rows = []
    for s in (0, -20, 30, 100):  # scale 2**s: x / scale is exact, so every tie is hit
        vals = pts * 2.0**s * rng.choice([-1.0, 1.0], size=pts.size)
        for i in range(0, len(vals), 127):
            rows.append(np.concatenate([[448.0 * 2.0**s], vals[i : i + 127]]))
    for amax in (448.0 * 1.1, 3.3, 1e5 / 7):  # scales that are not powers of two: the division rounds
        scale32 = np.float32(amax) / np.float32(448.0)
        vals = _near_boundary_multiples(E4M3, scale32, rng)
        vals = vals[np.abs(vals) < np.float32(amax)]
        for i in range(0, len(vals), 127):
            rows.append(np.concatenate([[amax], vals[i : i + 127]]))
    rows.append(np.zeros(128))
    rows.append(-np.zeros(128))
    fmax = float(np.finfo(np.float32).max)
    rows.append([fmax, -fmax, 1e30, 1.0])
    rows.append([3 * TINY32, TINY32, -2 * TINY32])  # amax/448 is a float32 subnormal
    rows.append(rng.standard_normal(128) * 1000)
    rows.append(np.concatenate([[1000.0], rng.standard_normal(127) * 1e-3]))  # element-subnormal results
    assert len(rows) <= 64
    x = np.zeros((64, 128), np.float32)
    for i, r in enumerate(rows):
        x[i, : len(r)] = r
    q, _, _, scale = check_fp8_block(x, (1, 128))
    assert np.asarray(q.scales).shape == (64, 1)
    assert np.all(np.asarray(q.scales)[len(rows) :] == 1.0)  # all-zero tiles
    assert np.asarray(q.scales)[len(rows) - 6, 0] == 1.0 and np.asarray(q.scales)[len(rows) - 5, 0] == 1.0


@pytest.mark.parametrize("tile", [(1, 128), (128, 128), (256, 256), (3, 40)], ids=str)
def test_fp8_block_tiles(tile):
    rng = np.random.default_rng(8)
    shape = {(1, 128): (5, 300), (128, 128): (130, 200), (256, 256): (260, 300), (3, 40): (10, 90)}[tile]
    x = (rng.standard_normal(shape) * 2.0 ** rng.integers(-10, 10, size=(shape[0], 1))).astype(np.float32)
    x[-1, :] = 0.0  # with (1, k) tiles: all-zero tiles get scale 1
    x[0, 0] = 2000.0  # a large outlier: its tile has element-subnormal results
    r, c = tile
    q, _, _, _ = check_fp8_block(x, tile, pass_block=tile != (256, 256))  # (256, 256) is the default
    assert np.asarray(q.scales).shape == (-(-shape[0] // r) if r > 1 else shape[0], -(-shape[1] // c))
    assert np.asarray(q.values).shape == (shape[0], -(-shape[1] // c) * c)
    assert q.shape == shape
    # NaN / Inf tiles: NaN scale, and only those tiles dequantize to NaN.
    y = x.copy()
    y[1, 1] = np.nan
    y[-1, -1] = np.inf
    q, deq, _, _ = check_fp8_block(y, tile)
    nan_tiles = np.isnan(np.asarray(q.scales))
    assert nan_tiles.sum() == 2
    s = np.repeat(nan_tiles, c, axis=-1)[:, : shape[1]]
    if r > 1:
        s = np.repeat(s, r, axis=0)[: shape[0]]
    np.testing.assert_array_equal(np.isnan(deq), s)


def test_fp8_block_axes_and_batch():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 7, 90)).astype(np.float32)
    q, _, _, _ = check_fp8_block(x, (3, 40))
    assert np.asarray(q.scales).shape == (2, 3, 3)
    q, _, _, _ = check_fp8_block(x, (3, 40), axis=1)  # quantized axis -2: tile rows run along the last axis
    assert q.axis == -2 and np.asarray(q.scales).shape == (2, 1, 30) and np.asarray(q.values).shape == (2, 40, 90)
    q, _, _, _ = check_fp8_block(x, (1, 40), axis=0)
    assert q.axis == -3 and np.asarray(q.scales).shape == (1, 7, 90)
    # (eval_shape runs the same Python checks without compiling anything)
    with pytest.raises(ValueError, match="must be one of the last two"):
        jax.eval_shape(lambda v: jb.quantize(v, "fp8_block", block=(3, 40), axis=0), x)
    with pytest.raises(ValueError, match="needs an input of rank >= 2"):
        jax.eval_shape(lambda v: jb.quantize(v, "fp8_block", block=(3, 40)), x[0, 0])


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


def _leaves_equal(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for u, v in zip(la, lb):
        u, v = np.asarray(u), np.asarray(v)
        assert u.dtype == v.dtype and u.shape == v.shape
        if u.dtype.itemsize == 1 and u.dtype != np.uint8:
            u, v = u.view(np.uint8), v.view(np.uint8)
        np.testing.assert_array_equal(u, v)


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
