"""Bit-exact tests of `jax_blockscale.quantize` / `dequantize` for nvfp4 (e2m1 elements, e4m3 block scales,
float32 tensor scale) and fp8_block (DeepSeek-style e4m3 with float32 tile scales), against the independent
numpy model in _quantize_helpers.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from _quantize_helpers import (
    E2M1,
    E4M3,
    TABLE_SHAPE,
    TINY32,
    P,
    Q,
    _leaves_equal,
    _test_points,
    _to_tables,
    assert_equal_ftz,
    check_nvfp4,
    codes_last,
    magnitude_table,
    max_code,
    ref_decode,
    ref_fp8_block,
    scales_last,
)

# --------------------------------------------------------------------------------------------------------
# nvfp4
# --------------------------------------------------------------------------------------------------------


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
