"""Block-scaled arrays: quantization and dequantization in pure jnp.

Rounding of MX scales (`rounding=`), following OCP Microscaling v1.0 and common practice. With
amax = max |x| over a block and emax_elem the element type's largest normal exponent (e4m3 8, e5m2 15,
e2m3 2, e3m2 4, e2m1 2), the shared exponent E is:

- ``"floor"`` (OCP §6.3): floor(log2(amax)) - emax_elem. Values above max_normal * 2**E saturate.
- ``"ceil"``: ceil(log2(amax)) - emax_elem.
- ``"even"``: amax first rounded to the element's mantissa width (RNE), then as ``"floor"``; a block whose
  amax would round up into the next binade takes the larger scale.
- ``"rceil"`` (NVIDIA's recipe, never saturates): ceil(log2(amax / max_normal_elem)), the division in
  float32 with RNE.

E is clamped to e8m0's range [-127, 127]. An all-zero block gets E = -127 (code 0x00) and zero elements; a
block holding NaN or ±Inf gets the NaN scale 0xFF and dequantizes to NaN. Elements are x / 2**E rounded to
nearest, ties to even, saturated to ±max_normal of the element type.

float32 subnormal inputs (|x| < 2**-126) are computed on as the backend does: XLA's CPU backend flushes
them to zero.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax import lax

from . import elements
from .formats import BlockFP8Format, Format, FormatLike, MXFormat, NVFP4Format, get_format
from .layouts import pack_fp4, unpack_fp4

__all__ = ["BlockScaledArray", "quantize", "dequantize", "nvfp4_tensor_scale", "ROUNDING_MODES"]

ROUNDING_MODES = ("floor", "ceil", "even", "rceil")
_FLOAT_INPUTS = (jnp.float32, jnp.bfloat16, jnp.float16)


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class BlockScaledArray:
    """A quantized array. Leaves: `values`, `scales`, `tensor_scale`; static: `fmt`, `axis`, `length`.

    - `values`: element codes, the quantized axis zero-padded to whole blocks (fp8: float8 dtype; fp6: one
      uint8 code per element; fp4: uint8, two codes per byte along the quantized axis, low nibble even).
    - `scales`: one per block, same axis order as `values` with the quantized axis divided by the block:
      uint8 e8m0 codes (MX), float8_e4m3fn (nvfp4), float32 (fp8_block; a 2D tile also divides the row
      axis, see `BlockFP8Format`).
    - `tensor_scale`: nvfp4's float32 per-tensor scale (shape `()`), else None.
    - `axis`: the quantized axis, negative, so that leading batch dims added by vmap keep it valid.
    - `length`: the logical (unpadded) size of the quantized axis.
    """

    values: jax.Array
    scales: jax.Array
    fmt: Format
    axis: int
    length: int
    tensor_scale: Optional[jax.Array] = None

    def tree_flatten(self):
        return (self.values, self.scales, self.tensor_scale), (self.fmt, self.axis, self.length)

    @classmethod
    def tree_unflatten(cls, aux, children):
        values, scales, tensor_scale = children
        fmt, axis, length = aux
        return cls(values, scales, fmt, axis, length, tensor_scale)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape of the array that was quantized."""
        shape = list(self.values.shape)
        shape[self.axis] = self.length
        return tuple(shape)

    @property
    def ndim(self) -> int:
        return self.values.ndim

    @property
    def padded_length(self) -> int:
        return self.values.shape[self.axis] * self.fmt.elements_per_byte

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        return dequantize(self, dtype)

    def __repr__(self) -> str:
        return f"BlockScaledArray({self.fmt.name}, shape={self.shape}, axis={self.axis})"


def _normalize_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array of rank {ndim}")
    return axis - ndim if axis >= 0 else axis


def _check_input(x: Any) -> jax.Array:
    x = jnp.asarray(x)
    if x.dtype not in _FLOAT_INPUTS:
        raise TypeError(
            f"quantize takes float32, bfloat16 or float16 input, got {x.dtype}; cast it first"
        )
    if x.ndim == 0:
        raise ValueError("quantize needs at least one axis to block along; got a scalar")
    return x


def _pad_to_blocks(x: jax.Array, axis: int, block: int) -> jax.Array:
    pad = -x.shape[axis] % block
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths)


def _split_blocks(x: jax.Array, block: int) -> jax.Array:
    """(..., K) with K a multiple of block -> (..., K/block, block)."""
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, block)


def _div_rn(x: jax.Array, d) -> jax.Array:
    """x / d in float32, correctly rounded.

    XLA's algebraic simplifier rewrites a division by a broadcast (a scalar divisor included) into a
    multiplication by the reciprocal, which is an ulp off often enough to flip rounding decisions. The
    divisor is therefore broadcast to the full shape and hidden behind an optimization barrier (it still
    fuses). It is also tied to `x` by a no-op bitwise OR, so that under vmap it is batched like `x`: an
    unbatched divisor would be broadcast again after the barrier, where XLA sees it.
    """
    x = jnp.asarray(x, jnp.float32)
    d = jnp.asarray(d, jnp.float32)
    shape = jnp.broadcast_shapes(x.shape, d.shape)
    x = jnp.broadcast_to(x, shape)
    tie = lax.bitcast_convert_type(x, jnp.uint32) & jnp.uint32(0)
    d = lax.bitcast_convert_type(jnp.broadcast_to(d, shape), jnp.uint32) | tie
    d = lax.bitcast_convert_type(d, jnp.float32)
    return x / lax.optimization_barrier(d)


def _mx_shared_exponent(amax: jax.Array, fmt: MXFormat, rounding: str) -> jax.Array:
    elem = fmt.element
    if rounding == "floor":
        return elements.floor_log2(amax) - elem.emax
    if rounding == "ceil":
        return elements.ceil_log2(amax) - elem.emax
    if rounding == "even":
        e = elements.floor_log2(amax)
        q = elements.scale_by_exp2(amax, elem.mbits - e)
        carried = lax.round(q, lax.RoundingMethod.TO_NEAREST_EVEN) >= 2 ** (elem.mbits + 1)
        return e + carried.astype(jnp.int32) - elem.emax
    if rounding == "rceil":
        # For tiny amax the quotient is a float32 subnormal, which flushing backends (XLA CPU) turn into
        # zero, giving E = -127 and saturated elements. Scaling amax by 2**64 first keeps the quotient
        # normal; a power-of-two prescale does not change the RNE quotient's mantissa.
        k = jnp.where(amax < jnp.float32(2.0**-64), 64, 0)
        q = _div_rn(elements.scale_by_exp2(amax, k), elem.max_normal)
        return elements.ceil_log2(q) - k
    raise ValueError(f"unknown rounding {rounding!r}; choose one of {ROUNDING_MODES}")


def _quantize_mx(x: jax.Array, fmt: MXFormat, rounding: str):
    blocks = _split_blocks(x, fmt.block)
    amax = jnp.max(jnp.abs(blocks), axis=-1)
    bad = ~jnp.all(jnp.isfinite(blocks), axis=-1)
    e = jnp.where(amax == 0, -elements.E8M0_BIAS, _mx_shared_exponent(amax, fmt, rounding))
    e = jnp.clip(e, -elements.E8M0_BIAS, elements.E8M0_BIAS)
    scaled = elements.scale_by_exp2(blocks, -e[..., None])
    codes = elements.encode(scaled, fmt.element).reshape(x.shape)
    return codes, elements.encode_e8m0(e, bad)


def nvfp4_tensor_scale(x: jax.Array) -> jax.Array:
    """nvfp4's per-tensor scale: amax(x) / (448 * 6), so that block scales use e4m3's full range."""
    return _div_rn(jnp.max(jnp.abs(x.astype(jnp.float32))), 448.0 * 6.0)


def _quantize_nvfp4(x: jax.Array, fmt: NVFP4Format, tensor_scale):
    if tensor_scale is None:
        tensor_scale = nvfp4_tensor_scale(x)
    tensor_scale = jnp.asarray(tensor_scale, jnp.float32)
    if tensor_scale.shape != ():
        raise ValueError(f"nvfp4 tensor_scale must be a scalar, got shape {tensor_scale.shape}")
    # A zero tensor scale (all-zero input) would divide by zero; 1.0 keeps every block scale zero.
    ts = jnp.where(tensor_scale == 0, jnp.float32(1.0), tensor_scale)
    blocks = _split_blocks(x, fmt.block)
    amax = jnp.max(jnp.abs(blocks), axis=-1)
    block_scale = elements.encode_e4m3_scale(_div_rn(_div_rn(amax, 6.0), ts))
    bad = ~jnp.all(jnp.isfinite(blocks), axis=-1)
    block_scale = jnp.where(bad, jnp.float8_e4m3fn(jnp.nan), block_scale)
    denom = block_scale.astype(jnp.float32) * ts
    safe = jnp.where(denom == 0, 1.0, denom)
    scaled = jnp.where(denom[..., None] == 0, 0.0, _div_rn(blocks, safe[..., None]))
    codes = elements.encode(scaled, fmt.element).reshape(x.shape)
    return codes, block_scale, tensor_scale


def _quantize_block_fp8(x: jax.Array, fmt: BlockFP8Format, axis: int):
    rows, cols = fmt.tile
    if rows > 1 and axis not in (-1, -2):
        raise ValueError(
            f"fp8_block tile {fmt.tile} spans two axes, so the quantized axis must be one of the last two; "
            f"got axis={axis}. Move the axes, or use a (1, {cols}) tile."
        )
    if rows > 1 and x.ndim < 2:
        raise ValueError(f"fp8_block tile {fmt.tile} needs an input of rank >= 2, got shape {x.shape}")
    # Work with the quantized axis last and, for 2D tiles, the tile-row axis second to last.
    xt = jnp.moveaxis(x, axis, -1)
    n_rows = xt.shape[-2] if rows > 1 else 1
    xt = _pad_to_blocks(xt, -2, rows) if rows > 1 else xt
    r = xt.shape[-2] // rows if rows > 1 else None
    if rows > 1:
        tiles = xt.reshape(*xt.shape[:-2], r, rows, xt.shape[-1] // cols, cols)
        amax = jnp.max(jnp.abs(tiles), axis=(-3, -1))
        bad = ~jnp.all(jnp.isfinite(tiles), axis=(-3, -1))
    else:
        tiles = _split_blocks(xt, cols)
        amax = jnp.max(jnp.abs(tiles), axis=-1)
        bad = ~jnp.all(jnp.isfinite(tiles), axis=-1)
    scale = jnp.where(amax == 0, jnp.float32(1.0), _div_rn(amax, 448.0))
    scale = jnp.where(bad, jnp.nan, scale)
    s = scale[..., :, None, :, None] if rows > 1 else scale[..., None]
    codes = elements.encode(_div_rn(tiles, s), fmt.element)
    codes = codes.reshape(xt.shape)
    if rows > 1:
        codes = codes[..., :n_rows, :]
    values = jnp.moveaxis(lax.bitcast_convert_type(codes, jnp.float8_e4m3fn), -1, axis)
    return values, jnp.moveaxis(scale, -1, axis)


def quantize(
    x: jax.Array,
    fmt: FormatLike,
    *,
    axis: int = -1,
    rounding: str = "floor",
    block: tuple[int, int] | None = None,
    tensor_scale: jax.Array | float | None = None,
) -> BlockScaledArray:
    """Quantizes `x` along `axis` to a block-scaled format.

    Args:
      x: float32/bfloat16/float16 array of any shape; the quantized axis is zero-padded to whole blocks
        internally and the logical shape is kept.
      fmt: a format name (`"mxfp8"`, `"mxfp8_e5m2"`, `"mxfp6_e2m3"`, `"mxfp6_e3m2"`, `"mxfp4"`, `"nvfp4"`,
        `"fp8_block"`) or a format object from `jax_blockscale.formats`.
      axis: the axis that blocks run along (the contraction axis of the matmul this feeds).
      rounding: MX scale rounding, one of `"floor"`, `"ceil"`, `"even"`, `"rceil"` (module docstring).
        nvfp4 and fp8_block scales are not powers of two and ignore it (only `"floor"` is accepted
        silently, as the default).
      block: `(rows, cols)` tile for `fp8_block`: `(1, 128)` DeepSeek activations, `(128, 128)` DeepSeek
        weights, default `(256, 256)`.
      tensor_scale: nvfp4 only: a float32 scalar to use instead of amax(x) / (448 * 6).

    Returns:
      A `BlockScaledArray`.
    """
    x = _check_input(x)
    spec = get_format(fmt, block=block)
    axis = _normalize_axis(axis, x.ndim)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {ROUNDING_MODES}")
    if not isinstance(spec, MXFormat) and rounding != "floor":
        raise ValueError(f"rounding={rounding!r} applies to MX formats only; {spec.name} scales are not powers of two")
    if tensor_scale is not None and not isinstance(spec, NVFP4Format):
        raise ValueError(f"tensor_scale applies to nvfp4 only, not {spec.name}")
    length = x.shape[axis]
    xf = x.astype(jnp.float32)
    if isinstance(spec, BlockFP8Format):
        xf = _pad_to_blocks(xf, axis, spec.block)
        values, scales = _quantize_block_fp8(xf, spec, axis)
        return BlockScaledArray(values, scales, spec, axis, length)
    xf = jnp.moveaxis(_pad_to_blocks(xf, axis, spec.block), axis, -1)
    ts = None
    if isinstance(spec, MXFormat):
        codes, scales = _quantize_mx(xf, spec, rounding)
    else:
        codes, scales, ts = _quantize_nvfp4(xf, spec, tensor_scale)
    values = _store_codes(codes, spec)
    return BlockScaledArray(
        jnp.moveaxis(values, -1, axis), jnp.moveaxis(scales, -1, axis), spec, axis, length, ts
    )


def _store_codes(codes: jax.Array, spec: Format) -> jax.Array:
    if spec.element.bits == 8:
        return lax.bitcast_convert_type(codes, spec.element.jnp_dtype)
    if spec.elements_per_byte == 2:
        return pack_fp4(codes)
    return codes


def _load_codes(values: jax.Array, spec: Format) -> jax.Array:
    """Values (quantized axis last) to float32."""
    if spec.elements_per_byte == 2:
        values = unpack_fp4(values)
    return elements.decode(values, spec.element)


def dequantize(q: BlockScaledArray, dtype=jnp.float32) -> jax.Array:
    """Reconstructs the array `q` was quantized from (up to rounding), in its logical shape, as `dtype`."""
    if not isinstance(q, BlockScaledArray):
        raise TypeError(f"dequantize takes a BlockScaledArray, got {type(q).__name__}")
    spec, axis = q.fmt, q.axis
    if isinstance(spec, BlockFP8Format):
        out = _dequantize_block_fp8(q)
    else:
        vals = _load_codes(jnp.moveaxis(q.values, axis, -1), spec)
        blocks = _split_blocks(vals, spec.block)
        scales = jnp.moveaxis(q.scales, axis, -1)
        if isinstance(spec, MXFormat):
            codes = scales
            if codes.dtype == jnp.float8_e8m0fnu:
                codes = lax.bitcast_convert_type(codes, jnp.uint8)
            e = codes.astype(jnp.int32) - elements.E8M0_BIAS
            # Multiplying by the exponent in two steps keeps 2**-127 (code 0) exact; as one float32
            # factor it would be subnormal and flushed to zero on some backends.
            out = elements.scale_by_exp2(blocks, e[..., None])
            out = jnp.where((codes == elements.E8M0_NAN)[..., None], jnp.nan, out)
        else:
            ts = q.tensor_scale.astype(jnp.float32)
            # vmap/scan over quantize gives the tensor scale leading batch dims: align them on the left.
            ts = ts.reshape(ts.shape + (1,) * (scales.ndim - ts.ndim))
            block_scale = scales.astype(jnp.float32) * ts
            out = blocks * block_scale[..., None]
        out = jnp.moveaxis(out.reshape(vals.shape), -1, axis)
    out = lax.slice_in_dim(out, 0, q.length, axis=axis)
    return out.astype(dtype)


def _dequantize_block_fp8(q: BlockScaledArray) -> jax.Array:
    rows, cols = q.fmt.tile
    vals = jnp.moveaxis(q.values.astype(jnp.float32), q.axis, -1)
    scale = jnp.moveaxis(q.scales, q.axis, -1)
    scale = jnp.repeat(scale, cols, axis=-1)
    if rows > 1:
        scale = jnp.repeat(scale, rows, axis=-2)[..., : vals.shape[-2], :]
    return jnp.moveaxis(vals * scale, -1, q.axis)
