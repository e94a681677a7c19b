"""Tests of the value and scale layouts in `jax_blockscale.layouts`, against explicit numpy index loops and
numpy ports of the Triton block-scaled matmul tutorial's (un)shuffles."""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jax_blockscale import layouts


def _rand_u8(shape, seed=0, high=256):
    return np.random.default_rng(seed).integers(0, high, size=shape, dtype=np.uint8)


def _pad2(s, rows, cols):
    pr, pc = -s.shape[-2] % rows, -s.shape[-1] % cols
    return np.pad(s, [(0, 0)] * (s.ndim - 2) + [(0, pr), (0, pc)])


# --------------------------------------------------------------------------------------------------------
# fp4 packing
# --------------------------------------------------------------------------------------------------------


def test_pack_fp4_nibble_order_and_round_trip():
    codes = _rand_u8((3, 5, 10), seed=1, high=16)
    packed = np.asarray(layouts.pack_fp4(jnp.asarray(codes)))
    assert packed.dtype == np.uint8 and packed.shape == (3, 5, 5)
    for idx in np.ndindex(3, 5, 5):
        *lead, i = idx
        lo, hi = codes[(*lead, 2 * i)], codes[(*lead, 2 * i + 1)]
        assert packed[idx] == lo | (hi << 4)  # element 2i in the low nibble
    np.testing.assert_array_equal(np.asarray(layouts.unpack_fp4(jnp.asarray(packed))), codes)
    # Explicit bytes.
    np.testing.assert_array_equal(
        np.asarray(layouts.pack_fp4(jnp.array([[0x1, 0xF, 0x6, 0x3]], jnp.uint8))), [[0xF1, 0x36]]
    )
    np.testing.assert_array_equal(
        np.asarray(layouts.unpack_fp4(jnp.array([[0xF1, 0x36, 0x00, 0xA5]], jnp.uint8))),
        [[0x1, 0xF, 0x6, 0x3, 0, 0, 0x5, 0xA]],
    )


def test_pack_fp4_rejects_concrete_codes_above_15_and_keeps_low_nibble_when_traced():
    codes = _rand_u8((4, 8), seed=2, high=16)
    noisy = codes | (_rand_u8((4, 8), seed=3, high=16) << 4)
    noisy[0, 0] |= 0x10  # at least one code above 15
    with pytest.raises(ValueError, match="4-bit codes 0..15"):
        layouts.pack_fp4(jnp.asarray(noisy))
    # Under jit the values are unknown at trace time: only the low 4 bits are kept (documented).
    np.testing.assert_array_equal(
        np.asarray(jax.jit(layouts.pack_fp4)(jnp.asarray(noisy))), np.asarray(layouts.pack_fp4(jnp.asarray(codes)))
    )
    every_byte = np.arange(256, dtype=np.uint8).reshape(4, 64)
    unpacked = layouts.unpack_fp4(jnp.asarray(every_byte))
    assert unpacked.shape == (4, 128) and unpacked.dtype == jnp.uint8
    assert np.asarray(unpacked).max() <= 15
    np.testing.assert_array_equal(np.asarray(layouts.pack_fp4(unpacked)), every_byte)


def test_pack_fp4_errors():
    with pytest.raises(ValueError, match="even last axis"):
        layouts.pack_fp4(jnp.zeros((2, 3), jnp.uint8))
    with pytest.raises(TypeError, match="unpack_fp4 takes uint8"):
        layouts.unpack_fp4(jnp.zeros((2, 3), jnp.int32))


# --------------------------------------------------------------------------------------------------------
# NVIDIA Blackwell (tcgen05) scale layout
# --------------------------------------------------------------------------------------------------------


def _blackwell_loops(s):
    """packed[i0, j0, i2, i1, j1] = S[i0*128 + i1*32 + i2, j0*4 + j1], S zero-padded; explicit loops."""
    sp = _pad2(s, 128, 4)
    r0, c0 = sp.shape[0] // 128, sp.shape[1] // 4
    out = np.empty((r0, c0, 32, 4, 4), s.dtype)
    for i0 in range(r0):
        for j0 in range(c0):
            for i2 in range(32):
                for i1 in range(4):
                    for j1 in range(4):
                        out[i0, j0, i2, i1, j1] = sp[i0 * 128 + i1 * 32 + i2, j0 * 4 + j1]
    return out


def _tutorial_unpack_scale(packed):
    """The Triton tutorial's reference unpacking: permute(0, 3, 2, 1, 4) then reshape to 2D."""
    m0, k0 = packed.shape[:2]
    return packed.reshape(m0, k0, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(m0 * 128, k0 * 4)


@pytest.mark.parametrize("shape", [(128, 4), (200, 7), (256, 12), (1, 1)])
def test_to_blackwell_scales_elementwise(shape):
    s = _rand_u8(shape, seed=shape[0])
    packed = np.asarray(layouts.to_blackwell_scales(jnp.asarray(s)))
    want = _blackwell_loops(s)
    assert packed.shape == want.shape == (-(-shape[0] // 128), -(-shape[1] // 4), 32, 4, 4)
    np.testing.assert_array_equal(packed, want)
    np.testing.assert_array_equal(_tutorial_unpack_scale(packed), _pad2(s, 128, 4))
    # The padding is zero.
    flat = _tutorial_unpack_scale(packed)
    assert np.all(flat[shape[0] :] == 0) and np.all(flat[:, shape[1] :] == 0)
    back = layouts.from_blackwell_scales(jnp.asarray(packed), *shape)
    np.testing.assert_array_equal(np.asarray(back), s)


def test_blackwell_scales_batch_dims_and_dtypes():
    s = _rand_u8((2, 3, 130, 6), seed=5)
    packed = np.asarray(layouts.to_blackwell_scales(jnp.asarray(s)))
    assert packed.shape == (2, 3, 2, 2, 32, 4, 4)
    for b in np.ndindex(2, 3):
        np.testing.assert_array_equal(packed[b], _blackwell_loops(s[b]))
    np.testing.assert_array_equal(np.asarray(layouts.from_blackwell_scales(jnp.asarray(packed), 130, 6)), s)
    # nvfp4 scales (float8_e4m3fn) and fp32 scales move the same way, bit for bit.
    for dt in (ml_dtypes.float8_e4m3fn, np.float32):
        v = (np.random.default_rng(6).standard_normal((2, 130, 6)) * 10).astype(dt)
        p = np.asarray(layouts.to_blackwell_scales(jnp.asarray(v)))
        assert p.dtype == dt
        for b in range(2):
            np.testing.assert_array_equal(p[b].astype(np.float32), _blackwell_loops(v[b]).astype(np.float32))
        np.testing.assert_array_equal(
            np.asarray(layouts.from_blackwell_scales(jnp.asarray(p), 130, 6)).astype(np.float32),
            v.astype(np.float32),
        )
    # e8m0 codes stored as float8_e8m0fnu: the in-bounds part round-trips bit for bit.
    e = s[0].view(ml_dtypes.float8_e8m0fnu)
    pe = layouts.to_blackwell_scales(jnp.asarray(e))
    back = np.asarray(layouts.from_blackwell_scales(pe, 130, 6))
    np.testing.assert_array_equal(back.view(np.uint8), s[0])


def test_from_blackwell_scales_rejects_other_layouts():
    with pytest.raises(ValueError, match=r"not a Blackwell scale layout.*\(32, 4, 4\)"):
        layouts.from_blackwell_scales(jnp.zeros((1, 1, 4, 32, 4), jnp.uint8), 128, 4)


# --------------------------------------------------------------------------------------------------------
# AMD CDNA4 scale shuffle
# --------------------------------------------------------------------------------------------------------


def _shuffle_scales_cdna4(scales, mfma_nonkdim):
    """numpy port of the Triton tutorial's `shuffle_scales_cdna4` (torch view/permute -> reshape/transpose)."""
    s = scales.copy()
    sm, sn = s.shape
    if mfma_nonkdim == 32:
        s = s.reshape(sm // 32, 32, sn // 8, 4, 2, 1)
        s = s.transpose(0, 2, 4, 1, 3, 5)
    elif mfma_nonkdim == 16:
        s = s.reshape(sm // 32, 2, 16, sn // 8, 2, 4, 1)
        s = s.transpose(0, 3, 5, 2, 4, 1, 6)
    return np.ascontiguousarray(s).reshape(sm // 32, sn * 32)


def _unshuffle_like_kernel(shuffled, mfma_nonkdim):
    """numpy port of the tutorial kernel's in-register unshuffle (whole matrix as one tile)."""
    m32, flat = shuffled.shape
    k8 = flat // 256
    if mfma_nonkdim == 32:
        s = shuffled.reshape(m32, k8, 2, 32, 4, 1).transpose(0, 3, 1, 4, 2, 5)
    else:
        s = shuffled.reshape(m32, k8, 4, 16, 2, 2, 1).transpose(0, 5, 3, 1, 4, 2, 6)
    return s.reshape(m32 * 32, k8 * 8)


def _cdna4_loops(s, mfma):
    """Explicit index formulas of the same permutation (derived from the reshapes above)."""
    sp = _pad2(s, 32, 8)
    r0, c0 = sp.shape[0] // 32, sp.shape[1] // 8
    out = np.empty((r0, c0 * 256), s.dtype)
    for i0 in range(r0):
        for r in range(32):
            for j in range(c0 * 8):
                j0, jj = divmod(j, 8)
                if mfma == 32:  # (i0, j0, col%2, row, col//2)
                    pos = j0 * 256 + (jj % 2) * 128 + r * 4 + jj // 2
                else:  # (i0, j0, col%4, row%16, col//4, row//16)
                    pos = j0 * 256 + (jj % 4) * 64 + (r % 16) * 4 + (jj // 4) * 2 + r // 16
                out[i0, pos] = sp[i0 * 32 + r, j]
    return out


@pytest.mark.parametrize("mfma", [16, 32])
@pytest.mark.parametrize("shape", [(32, 8), (64, 16), (50, 13), (1, 1)])
def test_to_cdna4_scales_matches_tutorial(shape, mfma):
    s = _rand_u8(shape, seed=shape[0] + mfma)
    got = np.asarray(layouts.to_cdna4_scales(jnp.asarray(s), mfma=mfma))
    want = _shuffle_scales_cdna4(_pad2(s, 32, 8), mfma)
    assert got.shape == want.shape == (-(-shape[0] // 32), -(-shape[1] // 8) * 256)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, _cdna4_loops(s, mfma))
    np.testing.assert_array_equal(_unshuffle_like_kernel(got, mfma), _pad2(s, 32, 8))
    back = layouts.from_cdna4_scales(jnp.asarray(got), *shape, mfma=mfma)
    np.testing.assert_array_equal(np.asarray(back), s)


def test_cdna4_mfma16_is_default_and_layouts_differ():
    s = _rand_u8((64, 16), seed=7)
    d = np.asarray(layouts.to_cdna4_scales(jnp.asarray(s)))
    np.testing.assert_array_equal(d, _shuffle_scales_cdna4(s, 16))
    assert not np.array_equal(d, np.asarray(layouts.to_cdna4_scales(jnp.asarray(s), mfma=32)))
    np.testing.assert_array_equal(np.asarray(layouts.from_cdna4_scales(jnp.asarray(d), 64, 16)), s)


@pytest.mark.parametrize("mfma", [16, 32])
def test_cdna4_scales_batch_dims(mfma):
    s = _rand_u8((2, 3, 40, 9), seed=8)
    got = np.asarray(layouts.to_cdna4_scales(jnp.asarray(s), mfma=mfma))
    assert got.shape == (2, 3, 2, 512)
    for b in np.ndindex(2, 3):
        np.testing.assert_array_equal(got[b], _shuffle_scales_cdna4(_pad2(s[b], 32, 8), mfma))
    np.testing.assert_array_equal(np.asarray(layouts.from_cdna4_scales(jnp.asarray(got), 40, 9, mfma=mfma)), s)


def test_cdna4_errors():
    with pytest.raises(ValueError, match="mfma must be 16 or 32"):
        layouts.to_cdna4_scales(jnp.zeros((32, 8), jnp.uint8), mfma=8)
    with pytest.raises(ValueError, match="mfma must be 16 or 32"):
        layouts.from_cdna4_scales(jnp.zeros((1, 256), jnp.uint8), 32, 8, mfma=64)
    with pytest.raises(ValueError, match="not a CDNA4 scale layout"):
        layouts.from_cdna4_scales(jnp.zeros((1, 100), jnp.uint8), 32, 8)


# --------------------------------------------------------------------------------------------------------
# Transformations
# --------------------------------------------------------------------------------------------------------


def test_layouts_under_jit_and_vmap():
    s = _rand_u8((3, 130, 10), seed=9)
    codes = _rand_u8((3, 130, 10), seed=10, high=16)
    bw_eager = np.asarray(layouts.to_blackwell_scales(jnp.asarray(s)))
    cd_eager = np.asarray(layouts.to_cdna4_scales(jnp.asarray(s), mfma=32))
    pk_eager = np.asarray(layouts.pack_fp4(jnp.asarray(codes)))

    @jax.jit
    def fwd(s, codes):
        return (
            layouts.to_blackwell_scales(s),
            layouts.to_cdna4_scales(s, mfma=32),
            layouts.pack_fp4(codes),
            jax.vmap(layouts.to_blackwell_scales)(s),
            jax.vmap(functools.partial(layouts.to_cdna4_scales, mfma=32))(s),
            jax.vmap(layouts.pack_fp4)(codes),
        )

    bw, cd, pk, bw_v, cd_v, pk_v = fwd(s, codes)
    for got, want in ((bw, bw_eager), (cd, cd_eager), (pk, pk_eager), (bw_v, bw_eager), (cd_v, cd_eager),
                      (pk_v, pk_eager)):
        np.testing.assert_array_equal(np.asarray(got), want)

    @jax.jit
    def back(bw, cd, pk):
        return (
            layouts.from_blackwell_scales(bw, 130, 10),
            layouts.from_cdna4_scales(cd, 130, 10, mfma=32),
            layouts.unpack_fp4(pk),
            jax.vmap(lambda p: layouts.from_blackwell_scales(p, 130, 10))(bw),
            jax.vmap(lambda p: layouts.from_cdna4_scales(p, 130, 10, mfma=32))(cd),
            jax.vmap(layouts.unpack_fp4)(pk),
        )

    r = back(bw_eager, cd_eager, pk_eager)
    for i, want in enumerate((s, s, codes, s, s, codes)):
        np.testing.assert_array_equal(np.asarray(r[i]), want)
