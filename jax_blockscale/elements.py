"""Bit-exact encoding and decoding of the element and scale types, in pure jnp.

Encoding works on float32 bit patterns rather than on XLA's float conversions so that the result is the
same on every backend (XLA CPU flushes subnormals and some backends round fp8 via f16) and matches the
spec: round to nearest, ties to even, saturating to the largest finite value.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .formats import E4M3, ElementType

__all__ = [
    "floor_log2",
    "ceil_log2",
    "encode",
    "decode",
    "decode_e8m0",
    "encode_e8m0",
    "E8M0_NAN",
]

E8M0_NAN = 0xFF
E8M0_BIAS = 127


def _f32_bits(x: jax.Array) -> jax.Array:
    return lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)


def floor_log2(x: jax.Array) -> jax.Array:
    """floor(log2(|x|)) for finite nonzero float32, read from the exponent bits (int32).

    Zero and float32 subnormals give -127, below every element and scale exponent, so callers clamp.
    """
    return ((_f32_bits(x) >> 23) & 0xFF).astype(jnp.int32) - 127


def ceil_log2(x: jax.Array) -> jax.Array:
    """ceil(log2(|x|)): floor_log2, plus one unless |x| is an exact power of two."""
    has_fraction = (_f32_bits(x) & 0x7FFFFF) != 0
    return floor_log2(x) + has_fraction.astype(jnp.int32)


def _exp2(e: jax.Array) -> jax.Array:
    """2**e as float32 for integer e in [-126, 127], built from bits (exact, no transcendental)."""
    return lax.bitcast_convert_type(((e + 127).astype(jnp.uint32) << 23), jnp.float32)


def scale_by_exp2(x: jax.Array, e: jax.Array) -> jax.Array:
    """x * 2**e for integer e in [-254, 254], exact while the result stays normal.

    Split in two factors since 2**e alone leaves float32's exponent range at the e8m0 extremes.
    """
    half = e // 2
    return x * _exp2(half) * _exp2(e - half)


def exp2_normal(e: jax.Array) -> jax.Array:
    """2**e as float32 for integer e in [-126, 127] (a normal float32), built from the exponent bits."""
    return _exp2(e)


def encode(x: jax.Array, elem: ElementType) -> jax.Array:
    """Rounds float32 `x` to `elem` (RNE, saturating) and returns the codes as uint8.

    Codes hold sign in bit (bits-1) and magnitude below it. NaN inputs encode as the largest code,
    which callers override through the NaN scale.

    Integer arithmetic on the float32 bit pattern, no float->int conversion (those are slow on GPUs, and
    this runs once per element). With m = |x|'s bits (sign cleared):
    - Saturation and NaN: for non-negative floats the bit patterns order like the values, and NaN
      patterns lie above +Inf, so min(m, bits(max_normal)) clips and sends NaN to max_normal in one step.
    - Element normals (|x| >= 2**min_normal_exp): the code is m's exponent and top `mbits` mantissa
      bits, rebiased, after rounding the dropped 23 - mbits bits to nearest even by an integer add
      (half - 1, plus the lowest kept bit); a carry runs into the exponent field, which is the next
      binade. Since |x| <= max_normal, a grid value, rounding never passes max_normal's code.
    - Element subnormals (and zero): |x| + 2**(min_normal_exp - mbits + 23) has its last place at the
      element quantum 2**(min_normal_exp - mbits), so the float add rounds |x| to a multiple of it (RNE);
      the added constant's bits subtracted leave the multiple n in [0, 2**mbits] (2**mbits is the code
      of the smallest normal). A float32 subnormal |x| gives n = 0 whether or not the backend flushes it,
      and since the add's operand is a bit pattern, not a product, no FMA contraction can change it.
    Bit-identical to ml_dtypes' RNE cast of the clipped value (tests/test_elements.py).
    """
    bits = _f32_bits(x)
    sign = (bits >> 31).astype(jnp.uint8)
    m = jnp.minimum(bits & jnp.uint32(0x7FFFFFFF), jnp.uint32(_bits_of(elem.max_normal)))
    drop = 23 - elem.mbits
    rounded = (m + jnp.uint32((1 << (drop - 1)) - 1) + ((m >> drop) & jnp.uint32(1))) >> drop
    normal = rounded - jnp.uint32((127 + elem.min_normal_exp - 1) << elem.mbits)
    magic = 2.0 ** (elem.min_normal_exp - elem.mbits + 23)
    sub = lax.bitcast_convert_type(lax.bitcast_convert_type(m, jnp.float32) + jnp.float32(magic), jnp.uint32)
    sub = sub - jnp.uint32(_bits_of(magic))
    magnitude = jnp.where(m < jnp.uint32(_bits_of(2.0**elem.min_normal_exp)), sub, normal).astype(jnp.uint8)
    return magnitude | (sign << (elem.bits - 1))


def _bits_of(v: float) -> int:
    return int(np.array(v, np.float32).view(np.uint32))


def _code_table(elem: ElementType) -> np.ndarray:
    codes = np.arange(1 << elem.bits, dtype=np.uint8)
    if elem.bits == 8:
        return codes.view(elem.jnp_dtype).astype(np.float32)
    sign = np.where(codes >> (elem.bits - 1), -1.0, 1.0)
    mag = codes & ((1 << (elem.bits - 1)) - 1)
    exp_field = mag >> elem.mbits
    mant = (mag & ((1 << elem.mbits) - 1)).astype(np.float64)
    value = np.where(
        exp_field == 0,
        mant * 2.0 ** (elem.min_normal_exp - elem.mbits),
        (1 + mant / (1 << elem.mbits)) * 2.0 ** (exp_field.astype(np.float64) - elem.bias),
    )
    return (sign * value).astype(np.float32)


def decode(codes: jax.Array, elem: ElementType) -> jax.Array:
    """uint8 codes of `elem` to float32 (exact: every code is a float32 value)."""
    if codes.dtype == elem.jnp_dtype:
        return codes.astype(jnp.float32)
    table = jnp.asarray(_code_table(elem))
    return table[codes.astype(jnp.int32) & ((1 << elem.bits) - 1)]


def encode_e8m0(exponent: jax.Array, nan: jax.Array) -> jax.Array:
    """Unbiased exponent (clamped to [-127, 127]) to e8m0 uint8 codes; `nan` marks blocks coded 0xFF."""
    code = (jnp.clip(exponent, -E8M0_BIAS, E8M0_BIAS) + E8M0_BIAS).astype(jnp.uint8)
    return jnp.where(nan, jnp.uint8(E8M0_NAN), code)


def decode_e8m0(codes: jax.Array) -> jax.Array:
    """e8m0 codes (uint8 or float8_e8m0fnu) to float32 powers of two; 0xFF is NaN, 0x00 is 2**-127."""
    if codes.dtype == jnp.float8_e8m0fnu:
        codes = lax.bitcast_convert_type(codes, jnp.uint8)
    # Built from bits: 2**-127 (code 0x00) is a float32 subnormal, and computing it by multiplication
    # would flush it to zero on backends that flush subnormals (XLA CPU). 0x00400000 is 2**-127.
    bits = jnp.where(codes == 0, jnp.uint32(0x00400000), codes.astype(jnp.uint32) << 23)
    value = lax.bitcast_convert_type(bits, jnp.float32)
    return jnp.where(codes == E8M0_NAN, jnp.nan, value)


def encode_e4m3_scale(x: jax.Array) -> jax.Array:
    """float32 to float8_e4m3fn, RNE and saturating (XLA's own convert turns overflow into NaN)."""
    return lax.bitcast_convert_type(encode(x, E4M3), jnp.float8_e4m3fn)
