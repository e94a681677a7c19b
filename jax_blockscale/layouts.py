"""Value and scale layouts the kernels read, each paired with its exact inverse. Pure jnp.

All functions accept leading batch dimensions and act on the last one or two axes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "pack_fp4",
    "unpack_fp4",
    "to_blackwell_scales",
    "from_blackwell_scales",
    "to_cdna4_scales",
    "from_cdna4_scales",
]


def pack_fp4(codes: jax.Array) -> jax.Array:
    """(..., K) 4-bit codes (an integer array, values 0..15) -> (..., K/2) uint8; element 2i in the low
    nibble (Triton dot_scaled).

    Concrete codes outside 0..15 raise ValueError, float or bool arrays TypeError. Traced codes (under
    `jit`) cannot be checked at trace time: there only the low 4 bits of each code are kept.
    """
    dtype = jnp.asarray(codes).dtype if not hasattr(codes, "dtype") else codes.dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise TypeError(f"pack_fp4 takes integer codes 0..15, got dtype {dtype}")
    try:
        host = np.asarray(codes)
    except jax.errors.TracerArrayConversionError:
        host = None
    if host is not None and host.size and (host.min() < 0 or host.max() > 15):
        bad = host[(host < 0) | (host > 15)]
        raise ValueError(f"pack_fp4 takes 4-bit codes 0..15, got {bad.size} outside, e.g. {bad[:4].tolist()}")
    return _pack_fp4(jnp.asarray(codes))


def _pack_fp4(codes: jax.Array) -> jax.Array:
    """`pack_fp4` without the checks, for codes the library made itself (always 0..15)."""
    if codes.ndim == 0 or codes.shape[-1] % 2:
        raise ValueError(f"pack_fp4 needs an even last axis, got shape {codes.shape}")
    codes = codes.astype(jnp.uint8) & 0xF
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_fp4(packed: jax.Array) -> jax.Array:
    """(..., K/2) uint8 -> (..., K) uint8 codes; inverse of `pack_fp4`."""
    if packed.dtype != jnp.uint8:
        raise TypeError(f"unpack_fp4 takes uint8, got {packed.dtype}")
    pairs = jnp.stack([packed & 0xF, packed >> 4], axis=-1)
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def _need_2d(x, what: str) -> None:
    if len(x.shape) < 2:
        raise ValueError(f"{what} takes (..., rows, cols) scales, got shape {tuple(x.shape)}")


def _check_extent(what: str, name: str, value, stored: int, unit: int) -> None:
    """`value` (rows or cols asked of a padded layout) must be an int that pads to the stored `stored`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what}: {name} must be a non-negative int, got {value!r}")
    if -(-int(value) // unit) * unit != stored:
        raise ValueError(f"{what}: {name}={value} does not match the layout, which holds {stored} "
                         f"({name} padded to a multiple of {unit}: {name} in {max(stored - unit + 1, 0)}..{stored})")


def _pad_last2(x: jax.Array, rows: int, cols: int, value=0) -> jax.Array:
    pr, pc = -x.shape[-2] % rows, -x.shape[-1] % cols
    if pr == 0 and pc == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pr), (0, pc)], constant_values=value)


# NVIDIA tcgen05 scale-factor layout (PTX ISA "tcgen05 scale factor A layout", cuBLAS "1D block scaling
# factors layout"): 128 rows x 4 scale columns form one 512-byte unit, stored so that the 32 lanes that
# read rows r, r+32, r+64, r+96 find their 4 x 4 scales contiguous.
def to_blackwell_scales(scales: jax.Array) -> jax.Array:
    """Row-major (..., R, C) scales -> (..., ceil(R/128), ceil(C/4), 32, 4, 4).

    packed[i0, j0, i2, i1, j1] = scales[i0*128 + i1*32 + i2, j0*4 + j1]; R pads to 128 and C to 4 with
    zeros (never read for in-bounds elements).
    """
    _need_2d(scales, "to_blackwell_scales")
    s = _pad_last2(scales, 128, 4)
    *batch, r, c = s.shape
    s = s.reshape(*batch, r // 128, 4, 32, c // 4, 4)
    nb = len(batch)
    perm = list(range(nb)) + [nb + 0, nb + 3, nb + 2, nb + 1, nb + 4]
    return s.transpose(perm)


def from_blackwell_scales(packed: jax.Array, rows: int, cols: int) -> jax.Array:
    """Inverse of `to_blackwell_scales`: (..., R/128, C/4, 32, 4, 4) -> (..., rows, cols).

    `rows` and `cols` must be the original ones: ceil(rows / 128) = R/128 and ceil(cols / 4) = C/4.
    """
    if len(packed.shape) < 5 or tuple(packed.shape[-3:]) != (32, 4, 4):
        raise ValueError(f"not a Blackwell scale layout: expected (..., R/128, C/4) then trailing dims "
                         f"(32, 4, 4), got shape {tuple(packed.shape)}")
    *batch, r0, c0, i2, i1, j1 = packed.shape
    _check_extent("from_blackwell_scales", "rows", rows, r0 * 128, 128)
    _check_extent("from_blackwell_scales", "cols", cols, c0 * 4, 4)
    nb = len(batch)
    perm = list(range(nb)) + [nb + 0, nb + 3, nb + 2, nb + 1, nb + 4]
    s = packed.transpose(perm).reshape(*batch, r0 * 128, c0 * 4)
    return s[..., :rows, :cols]


# AMD CDNA4 scaled MFMA: each lane supplies one scale per MFMA, and for 4 consecutive MFMAs those 4 scales
# should sit in one 32-bit word so a lane loads them at once. The shuffle groups 32 rows x 8 scale columns
# (the 32x256 element tile that is the smallest unit both MFMA shapes consume) into 256 contiguous bytes.
_CDNA4_SPLIT = {
    # mfma 32x32x64: rows (32), cols (8) -> (C/8, 2, 32, 4): lane-major, 4 K-steps per word.
    32: ((32,), (4, 2), (0, 2, 4, 1, 3)),
    # mfma 16x16x128: rows (2, 16), cols (2, 4) -> word = (col pair, row half) in op order 0, 2, 1, 3.
    16: ((2, 16), (2, 4), (0, 3, 5, 2, 4, 1)),
}


def _cdna4_geometry(mfma: int):
    if mfma not in _CDNA4_SPLIT:
        raise ValueError(f"mfma must be 16 or 32 (the CDNA4 scaled-MFMA non-K sizes), got {mfma}")
    return _CDNA4_SPLIT[mfma]


def to_cdna4_scales(scales: jax.Array, mfma: int = 16) -> jax.Array:
    """Row-major (..., R, C) e8m0 scales -> (..., ceil(R/32), ceil(C/8)*256), pre-shuffled for CDNA4.

    The same permutation as the Triton tutorial's `shuffle_scales_cdna4`; R pads to 32 and C to 8.
    """
    row_split, col_split, perm = _cdna4_geometry(mfma)
    _need_2d(scales, "to_cdna4_scales")
    s = _pad_last2(scales, 32, 8)
    *batch, r, c = s.shape
    s = s.reshape(*batch, r // 32, *row_split, c // 8, *col_split)
    nb = len(batch)
    s = s.transpose(list(range(nb)) + [nb + p for p in perm])
    return s.reshape(*batch, r // 32, c * 32)


def from_cdna4_scales(shuffled: jax.Array, rows: int, cols: int, mfma: int = 16) -> jax.Array:
    """Inverse of `to_cdna4_scales`: (..., R/32, C/8*256) -> (..., rows, cols).

    `rows` and `cols` must be the original ones: ceil(rows / 32) = R/32 and ceil(cols / 8) = C/8.
    """
    row_split, col_split, perm = _cdna4_geometry(mfma)
    _need_2d(shuffled, "from_cdna4_scales")
    *batch, r0, flat = shuffled.shape
    if flat % 256:
        raise ValueError(f"not a CDNA4 scale layout: last dim {flat} is not a multiple of 256")
    c0 = flat // 256
    _check_extent("from_cdna4_scales", "rows", rows, r0 * 32, 32)
    _check_extent("from_cdna4_scales", "cols", cols, c0 * 8, 8)
    split = (r0, *row_split, c0, *col_split)
    permuted = tuple(split[p] for p in perm)
    s = shuffled.reshape(*batch, *permuted)
    inverse = [perm.index(i) for i in range(len(perm))]
    nb = len(batch)
    s = s.transpose(list(range(nb)) + [nb + p for p in inverse])
    return s.reshape(*batch, r0 * 32, c0 * 8)[..., :rows, :cols]
