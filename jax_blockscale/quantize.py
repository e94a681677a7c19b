"""Block-scaled arrays: quantization and dequantization in pure jnp.

Rounding of MX scales (`rounding=`), following OCP Microscaling v1.0 and common practice. With
amax = max |x| over a block and emax_elem the element type's largest normal exponent (e4m3 8, e5m2 15,
e2m3 2, e3m2 4, e2m1 2), the shared exponent E is (the default is ``"rceil"`` in every entry point:
`quantize`, `quantize_operand`, `matmul(a_format=...)`, the recipes):

- ``"floor"`` (OCP §6.3): floor(log2(amax)) - emax_elem. Values above max_normal * 2**E saturate.
- ``"ceil"``: ceil(log2(amax)) - emax_elem.
- ``"even"``: amax first rounded to the element's mantissa width (RNE), then as ``"floor"``; a block whose
  amax would round up into the next binade takes the larger scale.
- ``"rceil"`` (NVIDIA's recipe, never saturates): ceil(log2(amax / max_normal_elem)), the division in
  float32 with RNE.

E is clamped to e8m0's range [-127, 127]. An all-zero block gets E = -127 (code 0x00) and zero elements; a
block holding NaN or ±Inf gets the NaN scale 0xFF and dequantizes to NaN. Elements are x / 2**E rounded to
nearest, ties to even, saturated to ±max_normal of the element type.

nvfp4 (NVIDIA): tensor scale = tensor amax / (448 * 6), where the tensor amax is the largest block amax
among the blocks that hold no NaN or Inf (0 if there is none: all-zero, all non-finite, or empty input;
then the stored tensor scale is 0 and block scales are computed against 1). So, as in MX, a NaN or Inf
only makes its own block NaN (NaN block scale). Block scale = e4m3(block amax / 6 / tensor scale), RNE,
saturating; elements = RNE-e2m1(x / (block scale * tensor scale)), saturating at 6. An explicit
`tensor_scale=` must be finite and > 0; a traced one cannot be checked at trace time (0 then dequantizes
to zeros, NaN to NaN).

float32 subnormal inputs (|x| < 2**-126) are computed on as the backend does: XLA's CPU backend flushes
them to zero.

How the float32 divisions of the spec are computed (nvfp4, fp8_block, and nvfp4's tensor scale): not as
float32 divisions. XLA rewrites those (a division by a constant, or on CPU by any broadcast, becomes a
multiplication by the rounded reciprocal, and (a / b) / c becomes a / (b * c)), and XLA:GPU emits float32
division as `div.full.f32`, which is up to 2 ulp off (openxla/xla#37181). Instead the quotient is formed
in float64 and rounded once to float32, which is exact whatever XLA does to the float64 expression; see
`_div_rn`. MX formats divide by powers of two, which is an exact multiplication.

Bandwidth: the big tensor is read once by one reduction (per-block amax, which also flags NaN/Inf blocks
and, for nvfp4, gives the tensor amax) and once by one elementwise pass that writes the codes; everything
else is per block.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import elements, validation
from .formats import BlockFP8Format, Format, FormatLike, MXFormat, NVFP4Format, get_format
from .layouts import _pack_fp4, unpack_fp4

__all__ = ["BlockScaledArray", "quantize", "dequantize", "nvfp4_tensor_scale", "ROUNDING_MODES",
           "DEFAULT_ROUNDING"]

ROUNDING_MODES = ("floor", "ceil", "even", "rceil")
# NVIDIA's MXFP8 recipe and jax.nn's quantizer use rceil (bit-identical to ours); it never saturates the
# largest element of a block, which floor does when the block amax's mantissa exceeds the element max's.
DEFAULT_ROUNDING = "rceil"
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
        if all(hasattr(leaf, "shape") for leaf in (self.values, self.scales)):
            return f"BlockScaledArray({self.fmt.name}, shape={self.shape}, axis={self.axis})"
        # Trees of other leaves (PartitionSpecs from get_partition_spec, Flax boxes, nnx Params): show them.
        return (f"BlockScaledArray({self.fmt.name}, axis={self.axis}, length={self.length}, "
                f"values={self.values!r}, scales={self.scales!r}, tensor_scale={self.tensor_scale!r})")


def _normalize_axis(axis: int, ndim: int) -> int:
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, (bool, np.bool_)):
        raise ValueError(f"axis must be an int, got {type(axis).__name__} {axis!r}")
    axis = int(axis)
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


# ---------------------------------------------------------------------------------------------------------
# Correctly rounded float32 division without a float32 division
# ---------------------------------------------------------------------------------------------------------
#
# Lemma. Let x, d be float32 (normal or subnormal, x, d != 0), t = x / d, and p any float64 value with
# |p - t| <= 2**-50 |t|: e.g. RN64(x / d) (error <= 2**-53) or RN64(x * RN64(1 / d)) (< 2**-52), however
# XLA orders those roundings. Then RN32(p) == RN32(t) whenever |RN32(t)| >= 2**-126 (normal or overflow).
#
# Proof. RN32 changes value only at the midpoints between adjacent float32s (and at the overflow threshold
# 2**128 (1 - 2**-25)). In the normal range each is m = M 2**c with M odd, 2**24 < M < 2**25. Write
# x = X 2**a, d = D 2**b with integers 0 < X, D < 2**24. Then t - m = (X 2**a - M D 2**(b+c)) / d.
# (i) t != m: otherwise X 2**(a-b-c) = M D, whose odd part is at least M > 2**24, while X's is below.
# (ii) The numerator is a nonzero multiple of 2**min(a, b+c), so |t - m| >= min(2**a / d, 2**c / D), where
# 2**c / D > 2**(c-24) > 2**-49 |m|, and 2**a / d = |t| / X > 2**-24 |t| >= 2**-25 |m| if |t| >= |m| / 2
# (if not, |t - m| > |m| / 2). So |t - m| > 2**-49 |m|, and
# |p - t| <= 2**-50 (|m| + |t - m|) < |t - m| / 2 + 2**-50 |t - m| < |t - m|: p lies strictly on the same
# side of every midpoint as t, and the two round alike (ties-to-even never decides). QED.
#
# In the float32 subnormal range midpoints have fewer bits and exact ties exist; there the result is
# below 2**-126, which every element type encodes as a signed zero, and XLA:CPU flushes it anyway.
#
# Because only the error bound matters, XLA may rewrite the float64 expression (division by a constant or
# by a broadcast into a multiplication by the reciprocal, reassociation of divisions) without changing the
# float32 result: no optimization barrier is needed for correctness. Two details keep it that way:
# - Values that are rounded to float32 and then used again in float64 go through `_rn32`
#   (reduce_precision to float32's 8 exponent / 23 mantissa bits, in float64) instead of a
#   float64 -> float32 -> float64 convert pair, which XLA:GPU's SimplifyFPConversions removes under its
#   default xla_allow_excess_precision. reduce_precision flushes float32 subnormals to zero, as XLA:CPU
#   does; only per-block scales are affected, and only when they are below 2**-126.
# - float64 is enabled locally (`jax.enable_x64`), so this works with the default jax_enable_x64=False.
#   Only per-block values and one multiply per element (plus two conversions) are float64.


def _rn32(v64: jax.Array) -> jax.Array:
    """Rounds float64 `v64` to the nearest float32 value (RNE), staying float64."""
    return lax.reduce_precision(v64, exponent_bits=8, mantissa_bits=23)


def _widen(v) -> jax.Array:
    """float32 (or narrower) -> float64 (float32 subnormals flush to zero); under `jax.enable_x64(True)`.

    The `_rn32` makes the result a float32 value even where XLA fused away a float64 -> float32 convert
    that produced `v` (see above).
    """
    return _rn32(lax.convert_element_type(jnp.asarray(v), jnp.float64))


def _div_rn(x, d) -> jax.Array:
    """float32 x / d, correctly rounded (see the lemma above), as float32; for per-block and scalar values.

    float32-subnormal x or d count as zero (as on XLA:CPU); a subnormal quotient is the backend's.
    """
    with jax.enable_x64(True):
        return (_widen(x) / _widen(d)).astype(jnp.float32)


# The per-block values that the elementwise pass reads (MX: 2**-E; nvfp4, fp8_block: the float64
# reciprocal of the divisor) go through an optimization barrier. XLA:GPU keeps barriers until after fusion,
# so each is computed once per block (at best in the reduction's epilogue) and read by the elementwise
# pass, instead of being recomputed there for every element (for nvfp4 that would repeat the block-scale
# encoding and a float64 division per element). The arrays are small (one value per block); XLA:CPU drops
# barriers before fusion. Not needed for correctness; `_PIN_PER_BLOCK = False` (read at trace time) lets
# a benchmark compare.
_PIN_PER_BLOCK = True


def _per_block(v: jax.Array) -> jax.Array:
    return lax.optimization_barrier(v) if _PIN_PER_BLOCK else v


def _block_amax(blocks: jax.Array, axis) -> jax.Array:
    """max |x| over `axis` as float32; NaN if the block holds a NaN, else +Inf if it holds an Inf.

    The one reduction over the big tensor. It is an integer max over the bit patterns with the sign bit
    cleared: for non-negative IEEE floats the patterns order like the values, with +Inf above every
    finite value and NaNs above +Inf. (A float max would do for the value, but XLA:CPU's reduce-max drops
    NaNs, so the NaN/Inf block test would need a second reduction.) It runs in the input's own width
    (bf16 input is not widened for it); the result is converted to float32 exactly.
    """
    blocks = jnp.asarray(blocks)
    # Reduced dimensions longer than 32 are split into (n/32, 32), a free reshape: XLA:CPU rewrites a
    # longer reduction into a reduce-window whose input it materializes (an extra full-size pass); XLA:GPU
    # regroups adjacent reduced dimensions, so it sees the same reduction. (Split before the masking, so
    # that XLA cannot fold the split back into the reduction.)
    axes = sorted(a % blocks.ndim for a in ((axis,) if isinstance(axis, int) else axis))
    shape, red = [], []
    for i, n in enumerate(blocks.shape):
        if i in axes and n > 32 and n % 32 == 0:
            red += [len(shape), len(shape) + 1]
            shape += [n // 32, 32]
        else:
            red += [len(shape)] if i in axes else []
            shape.append(n)
    utype = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}[blocks.dtype.itemsize]
    mask = (1 << (8 * blocks.dtype.itemsize - 1)) - 1
    bits = lax.bitcast_convert_type(blocks.reshape(shape), utype) & utype(mask)
    m = jnp.max(bits, axis=tuple(red))
    return lax.bitcast_convert_type(m, blocks.dtype).astype(jnp.float32)


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
        return _rceil_exponent(amax, elem)
    raise ValueError(f"unknown rounding {rounding!r}; choose one of {ROUNDING_MODES}")


def _rceil_exponent(amax: jax.Array, elem) -> jax.Array:
    """ceil(log2(RN32(amax / max_normal))) for amax > 0, from the bits, without dividing.

    With amax = a 2**A and max_normal = c 2**emax (a, c in [1, 2); c is 1.5, 1.75 or 1.875 for every
    element type, so 1 < c < 2), t = amax / max_normal = (a / c) 2**(A - emax):
    - a > c: a / c is in (1, 2/c) and at least 1 + 2**-23 / c > 1 + 2**-24, so RN32(t) stays above
      2**(A - emax) (and below the next power of two): the exponent is A - emax + 1.
    - a == c: t is the power of two 2**(A - emax).
    - a < c: a / c is in [1/c, 1 - 2**-23 / c], which RN32 maps into (1/2, 1) (never onto 1: the midpoint
      below 1 is 1 - 2**-25; never onto 1/2: 1/c > 0.53): the exponent is A - emax.
    So E = A - emax + (mantissa(a) > mantissa(c)). One exception, where t is a float32 subnormal: for
    A - emax == -127 the spacing there is 2**-149, and t rounds down onto 2**-127 unless a exceeds c by at
    least two float32 ulps (a - c = 1 ulp gives t - 2**-127 = 2**-150 / c, under half the spacing). Checked
    against float32 division (with subnormals) for every positive finite float32 amax and every element
    type; E is clamped to [-127, 127] by the caller.
    """
    fa = elements.floor_log2(amax) - elem.emax
    mant = lax.bitcast_convert_type(amax.astype(jnp.float32), jnp.uint32) & 0x7FFFFF
    c_mant = int(np.array(elem.max_normal, np.float32).view(np.uint32)) & 0x7FFFFF
    threshold = jnp.where(fa == -127, jnp.uint32(c_mant + 1), jnp.uint32(c_mant))
    return fa + (mant > threshold).astype(jnp.int32)


def _quantize_mx(x: jax.Array, fmt: MXFormat, rounding: str):
    blocks = _split_blocks(x, fmt.block)
    amax = _block_amax(blocks, -1)
    bad = ~jnp.isfinite(amax)
    e = jnp.where(amax == 0, -elements.E8M0_BIAS, _mx_shared_exponent(amax, fmt, rounding))
    e = jnp.clip(e, -elements.E8M0_BIAS, elements.E8M0_BIAS)
    # x / 2**E as one exact multiplication by the normal float32 2**-E: E <= 126 for every finite amax
    # (floor_log2(amax) <= 127 and emax >= 2, ceil/even/rceil add at most one), and E >= -127, so -E is in
    # [-126, 127]. Only NaN/Inf blocks (whose elements are unspecified) reach E = 127; they use 2**-126.
    factor = _per_block(elements.exp2_normal(-jnp.minimum(e, elements.E8M0_BIAS - 1)))
    scaled = blocks.astype(jnp.float32) * factor[..., None]
    codes = elements.encode(scaled, fmt.element).reshape(x.shape)
    return codes, elements.encode_e8m0(e, bad)


def _tensor_amax(block_amax: jax.Array) -> jax.Array:
    """nvfp4's tensor amax from the per-block maxima: the largest amax of a block that holds no NaN/Inf.

    0 when there is no such block (every block non-finite or all-zero, or an empty input), which the
    callers treat as the all-zero case. Excluding non-finite blocks keeps a NaN or Inf confined to its own
    block, as in the MX formats: otherwise it would become the tensor scale and every block NaN.
    """
    finite = jnp.where(jnp.isfinite(block_amax), block_amax, jnp.float32(0))
    return jnp.max(finite, initial=jnp.float32(0))


def nvfp4_tensor_scale(x: jax.Array, axis: int = -1) -> jax.Array:
    """nvfp4's per-tensor scale: tensor amax / (448 * 6), so that block scales use e4m3's full range.

    The tensor amax is the largest |x| over the 16-element blocks along `axis` (the axis `quantize` would
    block along) that hold no NaN or Inf; 0 if no block does (see `quantize`). x: float32/bfloat16/float16,
    any shape of rank >= 1. Returns a float32 scalar.
    """
    x = _check_input(x)
    axis = _normalize_axis(axis, x.ndim)
    xf = jnp.moveaxis(_pad_to_blocks(x, axis, NVFP4Format.block), axis, -1)
    return _div_rn(_tensor_amax(_block_amax(_split_blocks(xf, NVFP4Format.block), -1)), 448.0 * 6.0)


def given_tensor_scale(spec: Optional[Format], tensor_scale, name: str = "tensor_scale") -> Optional[jax.Array]:
    """A caller's nvfp4 tensor scale for a side quantized to `spec` (None: the side is skipped), checked before
    any compute (`_tensor_scale_arg`); None when not given. Refused for a format other than nvfp4."""
    if tensor_scale is None:
        return None
    if not isinstance(spec, NVFP4Format):
        raise ValueError(f"{name} applies to nvfp4 only, not {spec.name if spec is not None else None}")
    return _tensor_scale_arg(tensor_scale)


def _tensor_scale_arg(tensor_scale) -> jax.Array:
    """An explicit nvfp4 `tensor_scale=` as a float32 scalar: a Python/NumPy scalar, a shape-() or shape-(1,)
    array (jax.nn's convention). A concrete value must be finite and > 0; a traced one cannot be checked
    at trace time and is used as given (0 dequantizes to zeros, NaN to NaN)."""
    ts = jnp.asarray(tensor_scale, jnp.float32)
    if ts.shape not in ((), (1,)):
        raise ValueError(f"tensor_scale: expected a scalar or a one-element array (shape () or (1,)), "
                         f"got shape {ts.shape}")
    ts = ts.reshape(())
    try:
        value = float(ts)
    except jax.errors.ConcretizationTypeError:
        return ts
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"tensor_scale: expected a finite value > 0, got {value}")
    return ts


def _quantize_nvfp4(x: jax.Array, fmt: NVFP4Format, tensor_scale):
    blocks = _split_blocks(x, fmt.block)
    amax = _block_amax(blocks, -1)
    bad = ~jnp.isfinite(amax)
    if tensor_scale is None:
        # nvfp4_tensor_scale(x), from the block maxima instead of another pass over x (the same value).
        tensor_scale = _div_rn(_tensor_amax(amax), 448.0 * 6.0)
    tensor_scale = jnp.asarray(tensor_scale, jnp.float32)
    with jax.enable_x64(True):
        ts = _widen(tensor_scale)
        # A zero tensor scale (all-zero input) would divide by zero; 1.0 keeps every block scale zero.
        ts = jnp.where(ts == 0, 1.0, ts)
        # RN32(RN32(amax / 6) / ts): each quotient rounded to float32 as the spec does (see the lemma).
        block_in = _rn32(_rn32(_widen(amax) / 6.0) / ts)
        block_scale = elements.encode_e4m3_scale(block_in.astype(jnp.float32))
        block_scale = jnp.where(bad, jnp.float8_e4m3fn(jnp.nan), block_scale)
        # denom = RN32(block_scale * ts): the float64 product of a 4-bit and a 24-bit significand is exact.
        denom = _rn32(block_scale.astype(jnp.float64) * ts)
        # One float64 reciprocal per block, the only per-block input of the elementwise pass.
        recip = _per_block(1.0 / denom)
        scaled = (blocks.astype(jnp.float64) * recip[..., None]).astype(jnp.float32)
        # A zero denominator (1 / denom = +-Inf) gives +0 elements, as the spec's "x / denom if denom != 0".
        scaled = jnp.where(jnp.isinf(recip)[..., None], jnp.float32(0), scaled)
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
        amax = _block_amax(tiles, (-3, -1))
    else:
        tiles = _split_blocks(xt, cols)
        amax = _block_amax(tiles, -1)
    bad = ~jnp.isfinite(amax)
    with jax.enable_x64(True):
        # scale = RN32(amax / 448) (see the lemma); a float32-subnormal scale flushes to zero.
        scale64 = jnp.where(amax == 0, 1.0, _rn32(_widen(amax) / 448.0))
        scale64 = jnp.where(bad, jnp.nan, scale64)
        scale = scale64.astype(jnp.float32)
        # One float64 reciprocal per tile; elements RN32(x * (1 / scale)) (see the lemma).
        recip = _per_block(1.0 / scale64)
        r = recip[..., :, None, :, None] if rows > 1 else recip[..., None]
        scaled = (tiles.astype(jnp.float64) * r).astype(jnp.float32)
    codes = elements.encode(scaled, fmt.element)
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
    rounding: str = DEFAULT_ROUNDING,
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
      rounding: MX scale rounding, one of `"rceil"` (the default, as NVIDIA's recipe and `jax.nn`),
        `"floor"` (OCP), `"ceil"`, `"even"` (module docstring). nvfp4 and fp8_block scales are not powers
        of two and ignore it (only the default is accepted silently).
      block: `(rows, cols)` tile for `fp8_block`: `(1, 128)` DeepSeek activations, `(128, 128)` DeepSeek
        weights, default `(256, 256)`.
      tensor_scale: nvfp4 only: the per-tensor scale to use instead of tensor amax / (448 * 6); a scalar or
        a shape-(1,) array, finite and > 0 (checked when concrete; a traced value is not checked).

    Returns:
      A `BlockScaledArray`.
    """
    x = _check_input(x)
    spec = get_format(fmt, block=block)
    axis = _normalize_axis(axis, x.ndim)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {ROUNDING_MODES}")
    if not isinstance(spec, MXFormat) and rounding != DEFAULT_ROUNDING:
        raise ValueError(f"rounding={rounding!r} applies to MX formats only; {spec.name} scales are not powers of two")
    tensor_scale = given_tensor_scale(spec, tensor_scale)
    if _fused_eligible(x, spec, axis):
        from .quantize_primitive import quantize_pair

        ts = nvfp4_tensor_scale(x, axis=-1) if isinstance(spec, NVFP4Format) and tensor_scale is None else tensor_scale
        x2 = x.reshape(1, -1) if x.ndim == 1 else x
        q, _ = quantize_pair(x2, spec, None, rounding=rounding, row_ts=ts)
        if x.ndim == 1:
            q = BlockScaledArray(q.values[0], q.scales[0], q.fmt, q.axis, q.length, q.tensor_scale)
        return q
    return quantize_jnp(x, spec, axis=axis, rounding=rounding, tensor_scale=tensor_scale)


def from_block_fp8(values: jax.Array, scales: jax.Array, *, tile: tuple[int, int] = (128, 128)) -> BlockScaledArray:
    """A `BlockScaledArray` from block FP8 codes and scales quantized elsewhere: a DeepSeek-V3 / R1 checkpoint's
    `weight` (float8_e4m3fn) and `weight_scale_inv` (float32), served as they are (recipe `w8a16_fp8`: bf16
    activations; `fp8_deepseek`: 1 x 128 fp8 activations). No value changes: element i of tile t is
    `values[i] * scales[t]`, as DeepSeek's own dequantization multiplies them.

    Args:
      values: (..., N, K) float8_e4m3fn codes, quantized along K (the weight's contraction axis, last).
      scales: (..., ceil(N / rows), ceil(K / cols)) for a 2D tile, (..., N, ceil(K / cols)) for (1, cols); float32,
        or bf16 / fp16 (widened to float32 exactly).
      tile: (rows, cols) of one scale: DeepSeek's weights (128, 128), its activations (1, 128).

    Returns:
      fp8_block `BlockScaledArray` quantized along the last axis, K zero-padded to whole tiles (padding codes
      are 0, so they add nothing to a product).

    Shapes are checked at trace time, so a transposed or mis-sized scale grid fails here, not in a kernel.
    """
    spec = get_format("fp8_block", block=tile)
    if hasattr(scales, "dtype") and jnp.dtype(scales.dtype) in (jnp.bfloat16, jnp.float16):
        scales = scales.astype(jnp.float32)   # exact
    ranked = hasattr(values, "ndim") and values.ndim > 0   # else check_block_scaled names what values is
    q = BlockScaledArray(_pad_to_blocks(values, -1, spec.block) if ranked else values, scales, spec, -1,
                         values.shape[-1] if ranked else 0)
    validation.check_block_scaled(q, "from_block_fp8")   # the codes' dtype and rank, the scales' dtype and grid
    return q


def _fused_eligible(x: jax.Array, spec: Format, axis: int) -> bool:
    """Whether `quantize` goes through the quantization primitive (jnp on CPU, the fused kernel on one GPU):
    along the last axis, a non-empty input, a format the kernel takes, and not typed with Explicit-axis
    sharding (whose per-device blocks `_explicit_sharding.quantize` arranges around the jnp quantizer)."""
    from . import _explicit_sharding as explicit, quantize_primitive

    if not quantize_primitive.USE_KERNEL or axis != -1 or x.size == 0:
        return False
    if quantize_primitive.kernel_path(spec) is not None:
        return False
    return explicit.explicit_sharding(x) is None


def quantize_jnp(x: jax.Array, spec: Format, *, axis: int, rounding: str, tensor_scale=None) -> BlockScaledArray:
    """The jnp quantizer (the reference): `quantize` after its checks, for a resolved format and a
    normalized (negative) axis."""
    length = x.shape[axis]
    # The input stays in its dtype: the amax reduction reads it as is, the elementwise pass widens it.
    if isinstance(spec, BlockFP8Format):
        xp = _pad_to_blocks(x, axis, spec.block)
        values, scales = _quantize_block_fp8(xp, spec, axis)
        return BlockScaledArray(values, scales, spec, axis, length)
    xf = jnp.moveaxis(_pad_to_blocks(x, axis, spec.block), axis, -1)
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
        return _pack_fp4(codes)
    return codes


def _load_codes(values: jax.Array, spec: Format) -> jax.Array:
    """Values (quantized axis last) to float32."""
    if spec.elements_per_byte == 2:
        values = unpack_fp4(values)
    return elements.decode(values, spec.element)


def _scaled(blocks: jax.Array, q: BlockScaledArray) -> jax.Array:
    """Decoded element values (..., blocks, n) times their block's scale (float32), quantized axis last."""
    scales = jnp.moveaxis(q.scales, q.axis, -1)
    if isinstance(q.fmt, MXFormat):
        codes = scales
        if codes.dtype == jnp.float8_e8m0fnu:
            codes = lax.bitcast_convert_type(codes, jnp.uint8)
        e = codes.astype(jnp.int32) - elements.E8M0_BIAS
        # Multiplying by the exponent in two steps keeps 2**-127 (code 0) exact; as one float32
        # factor it would be subnormal and flushed to zero on some backends.
        out = elements.scale_by_exp2(blocks, e[..., None])
        return jnp.where((codes == elements.E8M0_NAN)[..., None], jnp.nan, out)
    ts = q.tensor_scale.astype(jnp.float32)
    # vmap/scan over quantize gives the tensor scale leading batch dims: align them on the left.
    ts = ts.reshape(ts.shape + (1,) * (scales.ndim - ts.ndim))
    return blocks * (scales.astype(jnp.float32) * ts)[..., None]


def _dequantize_fp4_pairs(q: BlockScaledArray, dtype) -> jax.Array:
    """Packed fp4 to a 16-bit float, quantized axis last and padded: each byte's two values, computed and
    rounded exactly as the general path does, become one uint32 (the even code's 16 bits low, as in
    memory) bitcast to two 16-bit floats. Unpacking the nibbles into a (..., K/2, 2) stack first, as
    `unpack_fp4` does, makes XLA emit a concatenate fusion writing 2-byte elements at a stride of two; this
    is one elementwise pass writing 4 bytes per byte read (the pre-decode of the Hopper upcast GEMMs)."""
    packed = jnp.moveaxis(q.values, q.axis, -1)
    half = q.fmt.block // 2  # a block's bytes

    def values(codes):  # (..., K/2) codes -> (..., K/2) of dtype, as 16-bit integers
        blocks = _scaled(_split_blocks(elements.decode(codes, q.fmt.element), half), q)
        return lax.bitcast_convert_type(blocks.reshape(codes.shape).astype(dtype), jnp.uint16).astype(jnp.uint32)

    pairs = values(packed & 0xF) | (values(packed >> 4) << 16)
    return lax.bitcast_convert_type(pairs, dtype).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize(q: BlockScaledArray, dtype=jnp.float32) -> jax.Array:
    """Reconstructs the array `q` was quantized from (up to rounding), in its logical shape, as `dtype`
    (float32, bfloat16, float16 or float64). `q` is checked field by field first
    (`validation.check_block_scaled`)."""
    if not isinstance(q, BlockScaledArray):
        raise TypeError(f"dequantize takes a BlockScaledArray, got {type(q).__name__}")
    validation.check_block_scaled(q, "q")
    dtype = validation.check_float_dtype(dtype, "dtype")
    spec, axis = q.fmt, q.axis
    if isinstance(spec, BlockFP8Format):
        out = _dequantize_block_fp8(q)
    elif spec.elements_per_byte == 2 and dtype.itemsize == 2:
        out = jnp.moveaxis(_dequantize_fp4_pairs(q, dtype), -1, axis)
    else:
        vals = _load_codes(jnp.moveaxis(q.values, axis, -1), spec)
        out = _scaled(_split_blocks(vals, spec.block), q).reshape(vals.shape)
        out = jnp.moveaxis(out, -1, axis)
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
