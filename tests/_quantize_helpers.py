"""Independent numpy model of the quantization spec, and the check helpers the tests/test_quantize_*.py files
share (split out of the former tests/test_quantize.py).

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
import numpy as np

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
