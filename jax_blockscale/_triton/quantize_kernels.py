"""One-pass block quantization on the GPU: every format, optionally the transposed quantization too.

`quantize_kernel` reads a (BR, BC) tile of x (B, R, C) once and writes, from the same registers:
- the *row* quantization: x quantized along C (its last axis), values (B, R, Cq / epb) and scales, the
  layout `jax_blockscale.quantize(x, fmt, axis=-1)` produces;
- the *column* quantization: x quantized along R, stored transposed, values (B, C, Rq / epb) and scales,
  the layout of `quantize(swapaxes(x, -1, -2), fmt_t, axis=-1)` — what a backward GEMM reads (wgrad
  contracts over tokens). Cast and transpose in one pass: no XLA transpose of x or of the codes.

Either side can be off, and each side has its own format (the nvfp4 recipe quantizes x along K to nvfp4
and along M to mxfp8; fp8_deepseek uses 1x128 groups along K and 128x128 tiles along M).

Every block is a tile (TH, TW) in x's coordinates: MX / nvfp4 / 1xN fp8 groups along C are (1, block),
along R (block, 1); 2D fp8 tiles are (rows, cols) (transposed for the column side). Its amax is an integer
max over the float32 bit patterns with the sign cleared (NaN above +Inf above every finite value).

Bit-identity with the jnp quantizer (quantize.py, the oracle): each per-block and per-element step here
is the same IEEE operation the jnp code asks XLA for, in the same order — the MX exponent from the
amax's bits for all four roundings, the exact power-of-two multiply, the float64 per-block quotients for
nvfp4 and fp8_block with `reduce_precision`-to-float32 done on the float64 bits (`_rn32`), and the integer
RNE encoder of `elements.encode` — with two exchanges that give the same bits: the per-element quotients
RN32(x / d) of nvfp4 and fp8_block, which the jnp code forms in float64, the kernel forms in float64 too or
(plan's div="f32") in float32 with a correction step (`_quotient_parts`: proof sketch); and on NVIDIA
sm_89+ (plan's cvt="hw") 8-bit element codes come from the hardware conversion plus a fix-up
(`_fp8_cvt_ptx`). Float32 subnormals are kept (Triton emits no .ftz, like XLA:GPU), so the kernel matches
XLA:GPU's run of the jnp code; tests compare both on the GPU and, through Triton's interpreter, against
XLA:CPU on normal inputs (XLA:CPU flushes subnormals).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import triton
import triton.language as tl

from ..formats import BlockFP8Format, Format, MXFormat, NVFP4Format

__all__ = ["Side", "Plan", "plan", "quantize_kernel", "supported_side", "default_cvt"]

_F32_MIN_NORMAL = 2.0**-126


# ---------------------------------------------------------------------------------------------------------
# Element and scale arithmetic (mirrors of elements.py / quantize.py, see the module docstring).


@triton.jit
def _exp2_bits(e):
    """2**e as float32 for integer e in [-126, 127], from the exponent bits (elements._exp2)."""
    return ((e + 127).to(tl.uint32) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _encode(x, MBITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_BITS: tl.constexpr, NBITS: tl.constexpr):
    """float32 -> element code (uint8), RNE, saturating; `elements.encode` step by step."""
    bits = x.to(tl.uint32, bitcast=True)
    return _encode_signed(bits, bits >> 31, MBITS, MIN_EXP, MAX_BITS, NBITS)


@triton.jit
def _encode_signed(bits, sign, MBITS: tl.constexpr, MIN_EXP: tl.constexpr, MAX_BITS: tl.constexpr,
                   NBITS: tl.constexpr):
    """`_encode` of the float32 bit pattern `bits`, whose sign is taken from `sign` (0 / 1) instead."""
    sign = sign.to(tl.uint8)
    # Constants as uint32 tensors built from `bits` (not tl.full): shaped and, in Gluon, laid out like it,
    # so the Gluon kernels call this too; LLVM folds them.
    zero = bits & 0
    m = tl.minimum(bits & 0x7FFFFFFF, zero | MAX_BITS)
    DROP: tl.constexpr = 23 - MBITS
    rounded = (m + ((1 << (DROP - 1)) - 1) + ((m >> DROP) & 1)) >> DROP
    normal = rounded - ((127 + MIN_EXP - 1) << MBITS)
    MAGIC_EXP: tl.constexpr = MIN_EXP - MBITS + 23
    MAGIC_BITS: tl.constexpr = (MAGIC_EXP + 127) << 23
    magic = (zero | MAGIC_BITS).to(tl.float32, bitcast=True)
    sub = (m.to(tl.float32, bitcast=True) + magic).to(tl.uint32, bitcast=True) - MAGIC_BITS
    SMALLEST_NORMAL: tl.constexpr = (MIN_EXP + 127) << 23
    magnitude = tl.where(m < SMALLEST_NORMAL, sub, normal).to(tl.uint8)
    return magnitude | (sign << (NBITS - 1))


def _fp8_cvt_ptx(mbits: int) -> str:
    """PTX for `tl.inline_asm_elementwise(pack=4)`: 4 float32 values in $1..$4 and 4 float32 sign sources in
    $5..$8 -> 4 codes of e4m3 (mbits 3) or e5m2 (mbits 2) in $0 (element i in byte i), equal to `_encode`'s
    (`elements.encode`) with the sign taken from the sign source, as `_encode_signed`.

    cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89+) rounds two float32 values to nearest even and saturates
    finite overflow to +-max_normal, the encoder's rounding (a float32 subnormal rounds to a signed zero
    either way, flushed or not). It differs in two places, both fixed on the 4 packed codes at once (SWAR):
    - NaN gives a NaN code (PTX: "NaN in the destination format"; e4m3fn's only NaN magnitude is 0x7F, e5m2's
      are 0x7D..0x7F), and Inf, per PTX +-max_normal, could only give a magnitude above it too (e4m3fn has
      no Inf, e5m2's is 0x7C): `_encode` clips both to max_normal (NaN patterns lie above +Inf's). So every
      magnitude above max_normal's code becomes max_normal's code, whatever the hardware's NaN byte is.
    - The sign: the encoder's is the sign source's bit 31 (the value's own, or the quotient path's q0, whose
      sign survives where q is a zero of the other sign); a NaN code's sign bit is unspecified. So the codes'
      sign bits are dropped and the sources' bit 31 gathered in their place (3 prmt).
    ~11 integer ops and 2 conversions per 4 elements, against ~9 integer ops per element in `_encode`."""
    max_code = 0x7E if mbits == 3 else 0x7B
    bad = 0x80 - (max_code + 1)  # added to a magnitude byte, sets its bit 7 iff the magnitude > max_code
    kind = "e4m3x2" if mbits == 3 else "e5m2x2"
    return ("{\n.reg .b16 lo, hi;\n.reg .b32 w, s, u, t, n, m;\n"
            # the second operand lands in the low byte: elements 0, 1 in lo, 2, 3 in hi
            f"cvt.rn.satfinite.{kind}.f32 lo, $2, $1;\n"
            f"cvt.rn.satfinite.{kind}.f32 hi, $4, $3;\n"
            "mov.b32 w, {lo, hi};\n"
            # the sign sources' top bytes into bytes 0..3 of s (byte 3 of $5, $6 -> bytes 0, 1; of $7, $8 -> 2, 3)
            "prmt.b32 s, $5, $6, 0x0073;\n"
            "prmt.b32 u, $7, $8, 0x0073;\n"
            "prmt.b32 s, s, u, 0x5410;\n"
            "and.b32 s, s, 0x80808080;\n"
            "and.b32 t, w, 0x7F7F7F7F;\n"
            f"add.u32 n, t, {bad * 0x01010101:#x};\n"   # no carry leaves a byte: magnitudes are <= 0x7F
            "and.b32 n, n, 0x80808080;\n"
            "shr.b32 m, n, 7;\n"
            "sub.u32 m, n, m;\n"                        # 0x7F in the bytes above max_code, else 0
            f"xor.b32 u, t, {max_code * 0x01010101:#x};\n"
            "and.b32 u, u, m;\n"
            "xor.b32 t, t, u;\n"                        # those bytes := max_code
            "or.b32 $0, t, s;\n}")


_E4M3_CVT_PTX = tl.constexpr(_fp8_cvt_ptx(3))
_E5M2_CVT_PTX = tl.constexpr(_fp8_cvt_ptx(2))


def _e2m1_pairs_ptx() -> str:
    """PTX for `tl.inline_asm_elementwise(pack=4)` on four float32 operands (low values, high values, their
    sign sources): 4 pairs in $1..$4 (low), $5..$8 (high), $9..$12 and $13..$16 (sign sources) -> 4 bytes in
    $0, byte i = code(low i) | code(high i) << 4 (two e2m1 codes per byte, the even element in the low
    nibble), each code equal to `_encode`'s (`elements.encode`: RNE, saturating, NaN to the largest
    magnitude) with the sign taken from its sign source, as `_encode_signed`. Plain PTX (no fp4 conversion
    before sm_100a): any NVIDIA target. Byte i depends on the operands' elements i only, whichever elements
    the compiler packs together.

    Per element, a = min(|x|, 6) (PTX min returns the non-NaN operand: NaN and +-Inf saturate to 6), then
    one float add rounds a to e2m1's grid: m = 2**max(e(a) + 22, 22), whose ulp is e2m1's step in a's binade
    (0.5 below 2, 1 in [2, 4), 2 in [4, 8); below 1 the subnormal step 0.5), so t = RN(a + m) = m + k * ulp
    with k = RNE(a / ulp) <= 4 and bits(t) - bits(m) = k. A tie rounds k to even, which is e2m1's even code:
    k counts codes from 2 * max(e(a), 0) (the binade's first code), so code = k + 2 * max(e(a), 0) =
    bits(t) - bits(m) + (bits(m) >> 22) - 298, with 298 = bits(2**22) >> 22. Then per pair one shift-add,
    per 4 pairs 3 prmt for the bytes and 3 prmt and two masks per sign nibble: ~9 operations per element,
    against ~15 for `_encode_signed` plus Triton's byte unpacking and repacking of the pairs (~5 per pair)
    on sm_90."""
    def code(src: str, dst: str) -> str:
        return (f"abs.f32 a, {src};\n"
                "min.f32 a, a, 0f40C00000;\n"
                "and.b32 e, a, 0x7F800000;\n"
                "add.u32 m, e, 0x0B000000;\n"       # bits(2**22 * 2**e(a)): exponent field + 22
                "max.u32 m, m, 0x4A800000;\n"       # at least 2**22 (a < 1: the subnormal step)
                "add.f32 t, a, m;\n"
                "shr.b32 u, m, 22;\n"
                "sub.u32 u, u, m;\n"
                "add.u32 u, u, 0xFFFFFED6;\n"       # -298
                f"add.u32 {dst}, t, u;\n")
    body = []
    for i in range(4):
        body.append(code(f"${1 + i}", f"p{i}") + code(f"${5 + i}", "h") + "shl.b32 h, h, 4;\n"
                    f"add.u32 p{i}, p{i}, h;\n")
    return ("{\n.reg .b32 a, e, m, t, u, h, p0, p1, p2, p3, s, v;\n" + "".join(body)
            + "prmt.b32 p0, p0, p1, 0x0040;\n"   # [p0, p1, -, -]
            "prmt.b32 p2, p2, p3, 0x0040;\n"
            "prmt.b32 p0, p0, p2, 0x5410;\n"      # [p0, p1, p2, p3]
            "prmt.b32 s, $9, $10, 0x0073;\n"      # the low sign sources' top bytes
            "prmt.b32 v, $11, $12, 0x0073;\n"
            "prmt.b32 s, s, v, 0x5410;\n"
            "shr.b32 s, s, 4;\n"
            "and.b32 s, s, 0x08080808;\n"         # bit 3: the low code's sign
            "or.b32 p0, p0, s;\n"
            "prmt.b32 s, $13, $14, 0x0073;\n"     # the high sign sources' top bytes
            "prmt.b32 v, $15, $16, 0x0073;\n"
            "prmt.b32 s, s, v, 0x5410;\n"
            "and.b32 s, s, 0x80808080;\n"         # bit 7: the high code's sign
            "or.b32 $0, p0, s;\n}")


_E2M1_PAIRS_PTX = tl.constexpr(_e2m1_pairs_ptx())


@triton.jit
def _encode_e2m1_pairs(lo, hi, lo_sign, hi_sign):
    """Bytes (uint8, shaped like lo) of e2m1 code pairs: code(lo) | code(hi) << 4, each with its sign source's
    sign (`_encode_signed`), by `_e2m1_pairs_ptx` (NVIDIA inline PTX: the Gluon kernel, sm_90+)."""
    return tl.inline_asm_elementwise(_E2M1_PAIRS_PTX, "=r" + ",r" * 16, [lo, hi, lo_sign, hi_sign],
                                     dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def _encode_hw(x, sign_src, MBITS: tl.constexpr):
    """`_encode_signed(x's bits, sign_src's sign bit)` for the 8-bit element types (e4m3: MBITS 3, e5m2:
    MBITS 2) through the hardware conversion (`_fp8_cvt_ptx`), NVIDIA sm_89+ only."""
    if MBITS == 3:
        codes = tl.inline_asm_elementwise(_E4M3_CVT_PTX, "=r,r,r,r,r,r,r,r,r", [x, sign_src], dtype=tl.uint8,
                                          is_pure=True, pack=4)
    else:
        codes = tl.inline_asm_elementwise(_E5M2_CVT_PTX, "=r,r,r,r,r,r,r,r,r", [x, sign_src], dtype=tl.uint8,
                                          is_pure=True, pack=4)
    return codes


@triton.jit
def _encode_elements(x, sign_src, CVT: tl.constexpr, MBITS: tl.constexpr, MIN_EXP: tl.constexpr,
                     MAX_BITS: tl.constexpr, NBITS: tl.constexpr):
    """Element codes of float32 x with sign_src's signs: the hardware conversion where the plan asks for it
    (CVT == "hw") and the element is 8-bit, else the integer encoder."""
    if CVT == "hw" and NBITS == 8:
        codes = _encode_hw(x, sign_src, MBITS)
    else:
        codes = _encode_signed(x.to(tl.uint32, bitcast=True), sign_src.to(tl.uint32, bitcast=True) >> 31,
                               MBITS, MIN_EXP, MAX_BITS, NBITS)
    return codes


@triton.jit
def _e4m3_value(code):
    """e4m3fn code (uint8) -> float32, NaN for 0x7F / 0xFF; from the bits: the exponent and mantissa
    fields drop into float32's, so one multiply by 2**(127 - 7) rescales normals and subnormals alike
    (as upcast.minifloat_to_f32). Not a float8 conversion: its NaN handling differs between backends."""
    c = code.to(tl.uint32)
    value = (((c & 0x7F) << 20) | ((c & 0x80) << 24)).to(tl.float32, bitcast=True) * (2.0 ** 120)
    return tl.where((c & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def _rn32(v):
    """float64 v rounded to the nearest float32 value, as XLA's reduce_precision(8, 23) rounds it: RNE to
    24 significant bits in float64's range, then results below 2**-126 flush to signed zero (a float64 ->
    float32 conversion would round into float32 subnormals instead) and past the largest float32 become
    Inf. Reduce_precision keeps |v| iff |v| >= 2**-126 - 2**-151 (the midpoint below 2**-126 rounds up,
    ties to even), and then equals the conversion's result; so: convert, and flush below that midpoint."""
    keep = tl.abs(v) >= 2.0**-126 - 2.0**-151
    return tl.where(keep | (v != v), v.to(tl.float32), 0.0 * v.to(tl.float32)).to(tl.float64)


@triton.jit
def _widen(v):
    """float32 -> float64 with float32 subnormals flushed to signed zero (quantize._widen)."""
    return tl.where(tl.abs(v) < 2.0**-126, 0.0 * v, v).to(tl.float64)


@triton.jit
def _mx_exponent(amax_bits, amax, MBITS: tl.constexpr, EMAX: tl.constexpr, CMANT: tl.constexpr,
                 ROUNDING: tl.constexpr):
    """The shared exponent E before clamping (quantize._mx_shared_exponent), int32."""
    fl = ((amax_bits >> 23) & 0xFF).to(tl.int32) - 127
    mant = amax_bits & 0x7FFFFF
    if ROUNDING == "floor":
        e = fl - EMAX
    elif ROUNDING == "ceil":
        e = fl + (mant != 0).to(tl.int32) - EMAX
    elif ROUNDING == "even":
        # round(amax * 2**(MBITS - fl)) >= 2**(MBITS + 1): the product is exact and lies in
        # [2**MBITS, 2**(MBITS+1)) for normal amax, and the threshold minus 1/2 is a tie that rounds to
        # the even 2**(MBITS+1), so the test is q >= 2**(MBITS+1) - 1/2.
        k = MBITS - fl
        half = k >> 1  # floor division by 2, as jnp's //
        q = amax * _exp2_bits(half) * _exp2_bits(k - half)
        e = fl + (q >= 2.0 ** (MBITS + 1) - 0.5).to(tl.int32) - EMAX
    else:  # rceil, from the bits (quantize._rceil_exponent)
        fa = fl - EMAX
        threshold = tl.where(fa == -127, CMANT + 1, CMANT).to(tl.uint32)
        e = fa + (mant > threshold).to(tl.int32)
    return e


# The element quotient RN32(x / d) in float32 (DIV="f32"). x / d per element, in float64 as the jnp quantizer
# does (DIV="f64": two float32 <-> float64 conversions per element, which an H100 runs at 16 per clock per
# SM, an eighth of its float32 rate), or with float32 operations only, per block (d: the divisor):
#   c = 2**-e(d), d_s = d * c in [1, 4), y = RN32(1 / d_s)                       (exact power-of-two scaling)
# and per element:
#   x_s = x * c;  q0 = RN32(x_s * y);  r = fma(-q0, d_s, x_s);  q = fma(r, y, q0).
# Proof sketch that encode(q) == encode(RN32(x / d)) (the codes the float64 path gives):
# - Normal d (float32 d is 0, Inf, NaN or >= 2**-126: `_rn32` flushed smaller scales): x_s / d_s == x / d.
#   If |x / d| >= 2**-11 (below that every element type rounds to a signed zero, e4m3's smallest step
#   being 2**-9) and < 2**126, x_s is exact and normal, and so are y (in (1/4, 1]), q0 and d_s; q0 is
#   within 1 ulp of x_s / d_s, so the residual r = x_s - q0 d_s is a float32 (Markstein: it is a multiple
#   of ulp(q0) ulp(d_s) >= 2**-58 |q0| below 2**24 of them), the fma computes it exactly, and
#   q = RN32(q0 + r y) is the correctly rounded quotient (Markstein's theorem, y = RN(1 / d_s)). Without the
#   scaling, a tiny d (d < 2**-90) would put the residual below float32's subnormal grain and break it.
#   Larger quotients: x_s or q0 overflow to Inf, q is Inf or NaN, which encode saturates like the float64
#   path's. Smaller ones: q stays within a few ulps of a value below 2**-11 and encodes to zero too.
# - Special d: c = 1, d_s = 0, y = 1 / d (Inf for d = 0, 0 for d = Inf, NaN for NaN), so q0 = x * y is the
#   float64 path's product (Inf, 0, NaN) and q is NaN, 0 or NaN: saturating alike, or zero.
# - Signs: the code's sign source is x_s + z, z per block: -0.0 for a finite nonzero d (then it is x's
#   sign, which is q0's as y > 0, exact even for zero x, where fma's signed-zero rules would turn -0 into
#   +0), NaN (sign clear) for a NaN d (q0 is NaN: the float32 product's canonical NaN, the sign the float64
#   path gives too) and for nvfp4's zero-divisor blocks, which the spec zeroes as +0. A zero d in fp8
#   (a block whose amax is below 448 * 2**-126) saturates every code: nonzero x to +-Inf, x's sign, and zero
#   x to the NaN of 0 * Inf, whose sign the float64 path takes from the hardware's generated float64 NaN
#   (set on NVIDIA GPUs and x86: XLA:GPU's jnp quantizer writes 0xFE there on an H100), while a float32
#   product's NaN has it clear on NVIDIA. So z = -2**-149 there (zero x gives a negative sum, nonzero x
#   keeps its sign) where a float64 0 * Inf computed once per block has its sign set, else +0.0. One add
#   per element, as the earlier `q0 & mask`. (The q0-sign rule missed that case; tests/
#   test_gpu_quantize_fp8_gluon.py found 645168 differing codes in bf16 blocks with subnormal amax.)
# tests/test_quantize_quotient.py checks this against the float64 path and exact rationals on ~10**6
# (x, d) pairs per format (tiny and huge d, float32 midpoints, e4m3 / e2m1 ties, subnormal x); the
# interpreter tests install an exact fma (Triton's interpreter rounds x * y + z twice).


@triton.jit
def _fp8_block_scale(amax, bad):
    """quantize._quantize_block_fp8's per-block scale, float64: RN32(amax / 448), 1 for an all-zero block,
    NaN for a block with NaN/Inf (`bad`). Formed as a product with float64's 1 / 448: the same float32 by
    quantize.py's lemma (within 2**-52 of the quotient), without a float64 division per block (~10 DFMA and
    a slow path, on a per-block value that many threads hold: 6.8 of 52.6 instructions per element for fp8
    1x128 + transposed on sm_90)."""
    scale64 = tl.where(amax == 0, 1.0, _rn32(_widen(amax) * (1.0 / 448.0)))
    return tl.where(bad, float("nan"), scale64)


@triton.jit
def _quotient_parts(d, ZERO_DIVISOR_ZEROES: tl.constexpr):
    """Per-block (c, d_s, y, z) of the float32 quotient for float32 divisors d (see above); z: the sign
    addend (`_sign_addend`)."""
    normal = (tl.abs(d) >= 2.0**-126) & (tl.abs(d) < float("inf"))
    e = ((d.to(tl.uint32, bitcast=True) >> 23) & 0xFF).to(tl.int32) - 127
    c = tl.where(normal, _exp2_bits(tl.maximum(-e, -126)), 1.0)
    d_s = tl.where(normal, d * c, 0.0)
    # 1.0 built from d's bits, not tl.full: a tensor shaped (and, in Gluon, laid out) like d, so the Gluon
    # kernel (quantize_fp8_gluon) calls this too; LLVM folds it to the constant.
    one = ((d.to(tl.uint32, bitcast=True) & 0) | 0x3F800000).to(tl.float32, bitcast=True)
    y = tl.math.div_rn(one, tl.where(normal, d_s, d))
    if ZERO_DIVISOR_ZEROES:
        y = tl.where(d == 0, 0.0, y)
    return c, d_s, y, _sign_addend(d, ZERO_DIVISOR_ZEROES)


@triton.jit
def _sign_addend(d, ZERO_DIVISOR_ZEROES: tl.constexpr):
    """Per block z such that x_s + z has the code's sign (see above). The zero-divisor fp8 case follows the
    float64 path's 0 * Inf, computed as it is: (0 * d) * Inf for d = 0 (LLVM keeps x * 0 for an x that may
    be non-finite, so nothing is folded)."""
    # As float32 bit patterns, in uint32 tensors shaped like d: NaN 0x7FC00000, -0.0 0x80000000, +0.0 0,
    # -2**-149 0x80000001 (a Python float below float32's normal range would make the constant, and every
    # add, float64).
    u = d.to(tl.uint32, bitcast=True) & 0
    if ZERO_DIVISOR_ZEROES:
        zero_fill = u | 0x7FC00000
    else:
        generated = ((d.to(tl.float64) * 0.0) * float("inf")).to(tl.float32)
        zero_fill = tl.where(generated.to(tl.uint32, bitcast=True) >= 0x80000000, u | 0x80000001, u)
    z = tl.where(d != d, u | 0x7FC00000, tl.where(d == 0, zero_fill, u | 0x80000000))
    return z.to(tl.float32, bitcast=True)


@triton.jit
def _quotient_signed(x, c, d_s, y, z):
    """(q, sign source) of RN32(x / d) from per-block parts broadcast against x (see above). The residual
    negates d_s, not q0: the same exact product, but Triton lowers -q0 to 0 - q0, which LLVM contracts with
    q0's multiply into a separate fma(-x_s, y, 0) per element (sm_90 SASS: one FFMA per element more);
    negating the per-block d_s costs once per block where the parts are not yet broadcast."""
    x_s = x * c
    q0 = x_s * y
    r = tl.fma(q0, -d_s, x_s)
    q = tl.fma(r, y, q0)
    return q, x_s + z


@triton.jit
def _quotient(x4, c, d_s, y, z, TH: tl.constexpr, TW: tl.constexpr):
    """`_quotient_signed` for the `_blocked` view x4 from the per-block `_quotient_parts`."""
    return _quotient_signed(x4, _spread(c, TH, TW), _spread(d_s, TH, TW), _spread(y, TH, TW), _spread(z, TH, TW))


@triton.jit
def _blocked(x, TH: tl.constexpr, TW: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """The (BR, BC) tile with its (TH, TW) blocks on their own axes. 1-wide blocks get a 3D view, not a 4D
    one with a size-1 axis: on an H100 the 4D view of (32, 1) column blocks cost 2-3x in layout shuffles."""
    if TW == 1:
        return tl.reshape(x, (BR // TH, TH, BC))
    elif TH == 1:
        return tl.reshape(x, (BR, BC // TW, TW))
    else:
        return tl.reshape(x, (BR // TH, TH, BC // TW, TW))


@triton.jit
def _block_max(v, TH: tl.constexpr, TW: tl.constexpr):
    """Max over each block of a `_blocked` view: (BR // TH, BC // TW)."""
    if TW == 1:
        return tl.max(v, axis=1)
    elif TH == 1:
        return tl.max(v, axis=2)
    else:
        return tl.max(tl.max(v, axis=3), axis=1)


@triton.jit
def _spread(v, TH: tl.constexpr, TW: tl.constexpr):
    """Per-block values (BR // TH, BC // TW) broadcastable against the `_blocked` view."""
    if TW == 1:
        return v[:, None, :]
    elif TH == 1:
        return v[:, :, None]
    else:
        return v[:, None, :, None]


@triton.jit
def _block_amax(x, TH: tl.constexpr, TW: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """(amax bits, amax) per (TH, TW) block of the (BR, BC) float32 tile: (BR // TH, BC // TW)."""
    bits = _blocked(x.to(tl.uint32, bitcast=True) & 0x7FFFFFFF, TH, TW, BR, BC)
    amax_bits = _block_max(bits, TH, TW)
    return amax_bits, amax_bits.to(tl.float32, bitcast=True)


@triton.jit
def _nvfp4_block_scale(amax, bad, ts):
    """quantize._quantize_nvfp4's per-block parts from the block amax (float32), `bad` (NaN/Inf in the
    block) and the float32 tensor scale ts: (the stored e4m3 scale code, uint8; the element divisor
    RN32(scale * ts), float64). The block scale is e4m3(RN32(RN32(amax / 6) / ts)) and elements are
    RN32(x * (1 / divisor)) in float64, zero where that reciprocal is infinite. The two quotients are formed
    as products with float64 reciprocals: by quantize.py's lemma any float64 value within 2**-50 of the
    quotient rounds (RN32) to the same float32, and `_rn32` follows each."""
    ts64 = _widen(ts)
    ts64 = tl.where(ts64 == 0, 1.0, ts64)
    block_in = _rn32(_rn32(_widen(amax) * (1.0 / 6.0)) * (1.0 / ts64))
    scale_code = _encode(block_in.to(tl.float32), 3, -6, 0x43E00000, 8)
    scale_code = tl.where(bad, 0x7F, scale_code).to(tl.uint8)
    return scale_code, _rn32(_e4m3_value(scale_code).to(tl.float64) * ts64)


# nvfp4's short path (`_nvfp4_parts_short`), for tensor scales in this range (0 counts as 1, as the spec computes
# block scales against 1 then): within it no step of the spec meets a float32 subnormal or overflow that
# changes a code, so the spec's flushes need no code (the bounds are in `_nvfp4_parts_short`); the Gluon kernel
# (quantize_mx_gluon) branches on it once per program, and takes the general path outside it.
_SHORT_TS_LO = tl.constexpr(2.0**-88)
_SHORT_TS_HI = tl.constexpr(2.0**116)
SHORT_PATH_TS = (_SHORT_TS_LO.value, _SHORT_TS_HI.value)


@triton.jit
def _nvfp4_short_path(ts):
    """Whether `_nvfp4_parts_short` computes the spec for tensor scale ts (a float32 scalar): `SHORT_PATH_TS`."""
    return (ts == 0) | ((ts >= _SHORT_TS_LO) & (ts <= _SHORT_TS_HI))


@triton.jit
def _rcp_rn(d):
    """float32 1 / d correctly rounded (PTX rcp.rn.f32, NVIDIA: MUFU.RCP and two FFMA on its fast path, where
    div_rn(1, d) compiles the whole division with its FCHK and slow path)."""
    return tl.inline_asm_elementwise("rcp.rn.f32 $0, $1;", "=r,r", [d], dtype=tl.float32, is_pure=True,
                                     pack=1)


@triton.jit
def _nvfp4_parts_short(amax, bad, ts):
    """`_nvfp4_block_scale` and `_quotient_parts(d, True)` for a tensor scale ts in `SHORT_PATH_TS`, in about
    a third of the instructions (NVIDIA sm_89+: the hardware e4m3 conversion, rcp.rn): (the stored e4m3 scale
    code, uint8; d = RN32(scale * ts), the element divisor; RN32(1 / d); the sign addend z). The elements are
    then `_quotient_signed(x, 1, d, y, z)`: the same bits as the general path's, for these reasons.

    - u = RN32(amax / 6) and v = RN32(u / ts) are float64 products with float64 reciprocals rounded once to
      float32, as `_nvfp4_block_scale` forms them (quantize.py's lemma). The spec flushes a float32-subnormal
      amax or u to zero; here they stay, but then v < 2**-126 / ts <= 2**-38 and the scale code is 0 either
      way (e4m3's smallest subnormal is 2**-9).
    - The scale code is Triton's float32 -> e4m3 conversion of v (cvt.rn.satfinite: RNE, saturating at 448,
      +Inf to 448: `elements.encode`'s rules for v >= 0), 0x7F for a block with NaN/Inf; d's scale value is
      Triton's e4m3 -> float32 conversion (exact; 0x7F gives NaN on NVIDIA). `_encode_hw` and `_e4m3_value`
      give the same values for these inputs, but their fix-ups for signs, NaN and other backends cost 18
      more SASS instructions per row block (sm_90), on the per-block work this path exists to cut.
    - d = scale * ts in float32 is RN32 of the exact product, and is normal: 2**-9 * 2**-88 <= d < 448 * 2**116
      (or 0), so the spec's flush of a subnormal d never applies and 1 / d is a normal float32.
    - No rescaling of x (c = 1; the general path scales x and d by 2**-e(d) so that extreme divisors keep the
      correction exact): r = x - d q0 is exact wherever |x / d| >= 1/8, since then |x| >= d / 8 >= 2**-100
      and x - d q0 lies on a grid of 2**-146 or coarser; below that every candidate quotient rounds to e2m1's
      zero with x's sign, as the spec's does. q0 overflowing (a block scale saturated at 448 by a small
      explicit ts) makes q NaN, which the e2m1 encoder saturates to 6 with the sign source's sign, as the
      spec's +-Inf."""
    ts = tl.where(ts == 0, 1.0, ts)
    u = (amax.to(tl.float64) * (1.0 / 6.0)).to(tl.float32)
    v = (u.to(tl.float64) * (1.0 / ts.to(tl.float64))).to(tl.float32)
    code = v.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.uint8, bitcast=True)
    code = tl.where(bad, 0x7F, code).to(tl.uint8)
    d = code.to(tl.float8e4nv, bitcast=True).to(tl.float32) * ts  # NaN for 0x7F
    y = tl.where(d == 0, 0.0, _rcp_rn(d))
    return code, d, y, _sign_addend(d, True)


@triton.jit
def _mx_block_scale(amax_bits, amax, bad, MBITS: tl.constexpr, EMAX: tl.constexpr, CMANT: tl.constexpr,
                    ROUNDING: tl.constexpr):
    """quantize._quantize_mx's per-block parts: (the stored e8m0 scale, uint8, 0xFF for a block with
    NaN/Inf; the float32 factor 2**-E that scales the elements, an exact multiply)."""
    e = _mx_exponent(amax_bits, amax, MBITS, EMAX, CMANT, ROUNDING)
    e = tl.where(amax == 0, -127, e)
    e = tl.minimum(tl.maximum(e, -127), 127)
    return tl.where(bad, 0xFF, e + 127).to(tl.uint8), _exp2_bits(-tl.minimum(e, 126))


@triton.jit
def _quantize_blocks(x, ts, KIND: tl.constexpr, ROUNDING: tl.constexpr, TH: tl.constexpr, TW: tl.constexpr,
                     BR: tl.constexpr, BC: tl.constexpr, MBITS: tl.constexpr, MIN_EXP: tl.constexpr,
                     MAX_BITS: tl.constexpr, NBITS: tl.constexpr, EMAX: tl.constexpr, CMANT: tl.constexpr,
                     DIV: tl.constexpr, CVT: tl.constexpr):
    """Codes (BR, BC) uint8 and per-block scales (BR // TH, BC // TW) of one side.

    Scales come back as stored: uint8 e8m0 (MX), uint8 e4m3 codes (nvfp4), float32 (fp8 blocks). DIV: how
    nvfp4 / fp8 form the element quotients, "f32" or "f64" (bit-identical; see `_quotient_parts`). CVT: how
    8-bit element codes are formed, "hw" (the sm_89+ conversion, `_fp8_cvt_ptx`) or "int" (`_encode`)."""
    amax_bits, amax = _block_amax(x, TH, TW, BR, BC)
    bad = amax_bits >= 0x7F800000
    x4 = _blocked(x, TH, TW, BR, BC)
    if KIND == "nvfp4":
        scales, denom = _nvfp4_block_scale(amax, bad, ts)
        if DIV == "f32":
            c, d_s, y, z = _quotient_parts(denom.to(tl.float32), True)
            scaled, sign_src = _quotient(x4, c, d_s, y, z, TH, TW)
        else:
            recip = 1.0 / denom
            scaled = (x4.to(tl.float64) * _spread(recip, TH, TW)).to(tl.float32)
            scaled = tl.where(_spread(tl.abs(recip) == float("inf"), TH, TW), 0.0, scaled)
            sign_src = scaled
    elif KIND == "fp8":
        # quantize._quantize_block_fp8: elements RN32(x * (1 / scale)) in float64 (`_fp8_block_scale`).
        scale64 = _fp8_block_scale(amax, bad)
        scales = scale64.to(tl.float32)
        if DIV == "f32":
            c, d_s, y, z = _quotient_parts(scales, False)
            scaled, sign_src = _quotient(x4, c, d_s, y, z, TH, TW)
        else:
            recip = 1.0 / scale64
            scaled = (x4.to(tl.float64) * _spread(recip, TH, TW)).to(tl.float32)
            sign_src = scaled
    else:
        scales, factor = _mx_block_scale(amax_bits, amax, bad, MBITS, EMAX, CMANT, ROUNDING)
        scaled = x4 * _spread(factor, TH, TW)
        sign_src = scaled
    codes = _encode_elements(scaled, sign_src, CVT, MBITS, MIN_EXP, MAX_BITS, NBITS)
    return tl.reshape(codes, (BR, BC)), scales


@triton.jit
def _pack_pairs(codes, ROWS: tl.constexpr, COLS: tl.constexpr):
    """(ROWS, COLS) 4-bit codes -> (ROWS, COLS // 2) bytes, the even element in the low nibble."""
    lo, hi = tl.split(tl.reshape(codes, (ROWS, COLS // 2, 2)))
    return lo | (hi << 4)


# Transposing 1-byte codes through shared memory: Triton's tl.trans + layout conversion of a uint8 tile
# writes and reads single bytes (STS.U8 / LDS.U8, up to 64 per thread for fp8 1x128 + transpose on sm_90,
# with bank conflicts). Instead (plan's t_words): 4 codes adjacent along C, which one thread holds after the
# load, go into one uint32 (no data movement), the uint32 tile is transposed (32-bit shared-memory
# accesses, a quarter of the count), and each thread then holds, for 4 consecutive R, words of 4 consecutive
# C: a 4 x 4 byte transpose in registers (8 prmt per 16 codes) gives, per column c, one word of 4 codes
# consecutive along R, the transposed layout's byte order, stored as uint32.
_BYTE_TRANSPOSE_PTX = tl.constexpr(
    "{\n.reg .b32 a, b, c, d;\n"
    "prmt.b32 a, $4, $5, 0x5140;\n"   # [v0.b0, v1.b0, v0.b1, v1.b1]
    "prmt.b32 b, $6, $7, 0x5140;\n"   # [v2.b0, v3.b0, v2.b1, v3.b1]
    "prmt.b32 c, $4, $5, 0x7362;\n"   # [v0.b2, v1.b2, v0.b3, v1.b3]
    "prmt.b32 d, $6, $7, 0x7362;\n"   # [v2.b2, v3.b2, v2.b3, v3.b3]
    "prmt.b32 $0, a, b, 0x5410;\n"    # byte 0 of v0..v3
    "prmt.b32 $1, a, b, 0x7632;\n"    # byte 1
    "prmt.b32 $2, c, d, 0x5410;\n"    # byte 2
    "prmt.b32 $3, c, d, 0x7632;\n}")  # byte 3


@triton.jit
def _split4(v, D0: tl.constexpr, D1: tl.constexpr):
    """(D0, D1 * 4) -> the 4 (D0, D1) slices v[:, 4 i + j], j = 0..3 (two in-register splits)."""
    a, b = tl.split(tl.reshape(v, (D0, D1, 2, 2)))  # a: j = 0, 2; b: j = 1, 3
    v0, v2 = tl.split(a)
    v1, v3 = tl.split(b)
    return v0, v1, v2, v3


@triton.jit
def _byte_of_each(v0, v1, v2, v3, SHIFT: tl.constexpr):
    """Byte SHIFT / 8 of v0..v3 as bytes 0..3 of one word (ptxas makes byte permutes of it)."""
    return (((v0 >> SHIFT) & 0xFF) | (((v1 >> SHIFT) & 0xFF) << 8) | (((v2 >> SHIFT) & 0xFF) << 16)
            | (((v3 >> SHIFT) & 0xFF) << 24))


@triton.jit
def _store_values_t_words(codes, v_ptr, batch, r0, c0, OUTER: tl.constexpr, INNER: tl.constexpr,
                          BR: tl.constexpr, BC: tl.constexpr, PTX: tl.constexpr):
    """Stores the (BR, BC) 1-byte codes of x's tile transposed, as values (OUTER, INNER) row-major per batch
    (OUTER = C, INNER = padded R, both multiples of 4 with r0, c0): see `_BYTE_TRANSPOSE_PTX`. PTX: NVIDIA
    inline assembly allowed (the plan's cvt "hw")."""
    c0_, c1_, c2_, c3_ = _split4(codes, BR, BC // 4)
    words = (c0_.to(tl.uint32) | (c1_.to(tl.uint32) << 8) | (c2_.to(tl.uint32) << 16)
             | (c3_.to(tl.uint32) << 24))                   # (BR, BC // 4): [r, q] = codes (r, 4q..4q+3)
    wt = tl.trans(words)                                    # (BC // 4, BR)
    v0, v1, v2, v3 = _split4(wt, BC // 4, BR // 4)          # [q, p] = codes (4p + i, 4q..4q+3), i = 0..3
    if PTX:  # 8 prmt per 16 codes; the shift / mask form below costs ~1 integer op per element more on sm_90
        o0, o1, o2, o3 = tl.inline_asm_elementwise(_BYTE_TRANSPOSE_PTX, "=r,=r,=r,=r,r,r,r,r", [v0, v1, v2, v3],
                                                   dtype=(tl.uint32, tl.uint32, tl.uint32, tl.uint32),
                                                   is_pure=True, pack=1)  # o_j[q, p] = codes (4p..4p+3, 4q + j)
    else:  # any target (gfx950)
        o0 = _byte_of_each(v0, v1, v2, v3, 0)
        o1 = _byte_of_each(v0, v1, v2, v3, 8)
        o2 = _byte_of_each(v0, v1, v2, v3, 16)
        o3 = _byte_of_each(v0, v1, v2, v3, 24)
    W: tl.constexpr = INNER // 4
    w_ptr = v_ptr.to(tl.pointer_type(tl.uint32)) + batch * (OUTER * W)
    rows = c0 + 4 * tl.arange(0, BC // 4)
    cols = r0 // 4 + tl.arange(0, BR // 4)
    base = rows[:, None].to(tl.int64) * W + cols[None, :]
    ok = cols[None, :] < W
    tl.store(w_ptr + base, o0, mask=ok & (rows[:, None] < OUTER))
    tl.store(w_ptr + base + W, o1, mask=ok & (rows[:, None] + 1 < OUTER))
    tl.store(w_ptr + base + 2 * W, o2, mask=ok & (rows[:, None] + 2 < OUTER))
    tl.store(w_ptr + base + 3 * W, o3, mask=ok & (rows[:, None] + 3 < OUTER))


@triton.jit
def _store_scales(scales, s_ptr, batch, r0, c0, B_OUTER: tl.constexpr, B_INNER: tl.constexpr,
                  S_OUTER: tl.constexpr, S_INNER: tl.constexpr, TO: tl.constexpr, TI: tl.constexpr):
    """Scales (B_OUTER // TO, B_INNER // TI) of a side oriented as (B_OUTER, B_INNER) into (S_OUTER, S_INNER)."""
    so = r0 // TO + tl.arange(0, B_OUTER // TO)
    si = c0 // TI + tl.arange(0, B_INNER // TI)
    s_ptrs = s_ptr + batch * (S_OUTER * S_INNER) + so[:, None].to(tl.int64) * S_INNER + si[None, :]
    tl.store(s_ptrs, scales, mask=(so[:, None] < S_OUTER) & (si[None, :] < S_INNER))


@triton.jit
def _store_side(codes, scales, v_ptr, s_ptr, batch, r0, c0, OUTER: tl.constexpr, INNER: tl.constexpr,
                S_OUTER: tl.constexpr, S_INNER: tl.constexpr, EPB: tl.constexpr, B_OUTER: tl.constexpr,
                B_INNER: tl.constexpr, TO: tl.constexpr, TI: tl.constexpr):
    """Stores a side already oriented as (B_OUTER, B_INNER) codes, quantized along the inner axis, into
    values (OUTER, INNER / EPB) and scales (S_OUTER, S_INNER), both row-major per batch, masked to the
    (padded) extents. r0 / c0: the tile's first outer / inner index."""
    offs_o = r0 + tl.arange(0, B_OUTER)
    if EPB == 2:
        codes = _pack_pairs(codes, B_OUTER, B_INNER)
    offs_i = c0 // EPB + tl.arange(0, B_INNER // EPB)
    v_ptrs = v_ptr + batch * (OUTER * (INNER // EPB)) + offs_o[:, None].to(tl.int64) * (INNER // EPB) + offs_i[None, :]
    tl.store(v_ptrs, codes, mask=(offs_o[:, None] < OUTER) & (offs_i[None, :] < INNER // EPB))
    _store_scales(scales, s_ptr, batch, r0, c0, B_OUTER, B_INNER, S_OUTER, S_INNER, TO, TI)


@triton.jit
def _load_tile(x_ptr, batch, r0, c0, R: tl.constexpr, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """x's (BR, BC) float32 tile at (r0, c0). Out-of-range elements read as zeros: the zero padding of the
    quantized axes, which leaves every block's amax as it is (quantize pads with zeros too)."""
    offs_r = r0 + tl.arange(0, BR)
    offs_c = c0 + tl.arange(0, BC)
    mask = (offs_r[:, None] < R) & (offs_c[None, :] < C)
    return tl.load(x_ptr + batch * (R * C) + offs_r[:, None].to(tl.int64) * C + offs_c[None, :], mask=mask,
                   other=0.0).to(tl.float32)


@triton.jit
def _column_side(x, codes, scales, ts_ptr, cv_ptr, cs_ptr, batch, r0, c0, C: tl.constexpr, BR: tl.constexpr,
                 BC: tl.constexpr, C_KIND: tl.constexpr, C_ROUNDING: tl.constexpr, C_TH: tl.constexpr,
                 C_TW: tl.constexpr, C_RQ: tl.constexpr, C_EPB: tl.constexpr, C_MBITS: tl.constexpr,
                 C_MIN_EXP: tl.constexpr, C_MAX_BITS: tl.constexpr, C_NBITS: tl.constexpr, C_EMAX: tl.constexpr,
                 C_CMANT: tl.constexpr, COL_MODE: tl.constexpr, DIV: tl.constexpr, CVT: tl.constexpr,
                 T_WORDS: tl.constexpr):
    """The column side of x's (BR, BC) tile at (r0, c0), stored transposed. codes / scales: the row side's
    (used by "reuse" only)."""
    if COL_MODE == "trans":  # quantize x^T row-wise (one float32 transpose of the tile through shared memory)
        c_codes, c_scales = _quantize_blocks(tl.trans(x), tl.load(ts_ptr + 1), C_KIND, C_ROUNDING, C_TW, C_TH,
                                             BC, BR, C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS, C_EMAX, C_CMANT, DIV, CVT)
        _store_side(c_codes, c_scales, cv_ptr, cs_ptr, batch, c0, r0, C, C_RQ, triton.cdiv(C, C_TW),
                    C_RQ // C_TH, C_EPB, BC, BR, C_TW, C_TH)
    else:
        if COL_MODE == "reuse":
            # Same format and the same (square) 2D tile on both sides: the column side's blocks are the row
            # side's, so its codes and scales are the row side's (uint8 / one per tile).
            xc_codes, xc_scales = codes, scales
        else:  # "direct"
            # Quantize down x's columns where x lies; only the 1-byte codes (and the scales) are transposed
            # on the way to the store: a quarter of the shared-memory traffic of transposing float32 x.
            xc_codes, xc_scales = _quantize_blocks(x, tl.load(ts_ptr + 1), C_KIND, C_ROUNDING, C_TH, C_TW, BR,
                                                   BC, C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS, C_EMAX, C_CMANT,
                                                   DIV, CVT)
        if T_WORDS:  # the codes transposed as 32-bit words (`_store_values_t_words`)
            _store_values_t_words(xc_codes, cv_ptr, batch, r0, c0, C, C_RQ, BR, BC, CVT == "hw")
            _store_scales(tl.trans(xc_scales), cs_ptr, batch, c0, r0, BC, BR, triton.cdiv(C, C_TW),
                          C_RQ // C_TH, C_TW, C_TH)
        else:
            _store_side(tl.trans(xc_codes), tl.trans(xc_scales), cv_ptr, cs_ptr, batch, c0, r0, C, C_RQ,
                        triton.cdiv(C, C_TW), C_RQ // C_TH, C_EPB, BC, BR, C_TW, C_TH)


@triton.jit
def quantize_kernel(
    x_ptr, ts_ptr, rv_ptr, rs_ptr, cv_ptr, cs_ptr,  # jax-triton appends outputs last
    R: tl.constexpr, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr,
    # row side: quantized along C, blocks (R_TH, R_TW), padded C = R_CQ
    R_KIND: tl.constexpr, R_ROUNDING: tl.constexpr, R_TH: tl.constexpr, R_TW: tl.constexpr,
    R_CQ: tl.constexpr, R_EPB: tl.constexpr, R_MBITS: tl.constexpr, R_MIN_EXP: tl.constexpr,
    R_MAX_BITS: tl.constexpr, R_NBITS: tl.constexpr, R_EMAX: tl.constexpr, R_CMANT: tl.constexpr,
    # column side: quantized along R (stored transposed), blocks (C_TH, C_TW), padded R = C_RQ
    C_KIND: tl.constexpr, C_ROUNDING: tl.constexpr, C_TH: tl.constexpr, C_TW: tl.constexpr,
    C_RQ: tl.constexpr, C_EPB: tl.constexpr, C_MBITS: tl.constexpr, C_MIN_EXP: tl.constexpr,
    C_MAX_BITS: tl.constexpr, C_NBITS: tl.constexpr, C_EMAX: tl.constexpr, C_CMANT: tl.constexpr,
    COL_MODE: tl.constexpr = "trans", DIV: tl.constexpr = "f64", CVT: tl.constexpr = "int",
    T_WORDS: tl.constexpr = False, STRIPS: tl.constexpr = 1,
):
    """x (B, R, C) float, ts (2,) float32 nvfp4 tensor scales of the row and column sides -> row side (B, R, R_CQ / R_EPB) values + scales, column side (B, C, C_RQ /
    C_EPB) values + scales. Grid (cdiv(C, BC), cdiv(R, BR), B); a KIND of "none" turns a side off (its
    pointers are then unused one-element buffers).

    STRIPS > 1 (both sides on): each side in STRIPS passes over strips of the program's tile, x read again
    for each (the second read of a tile is an L2 hit; DRAM still sees one pass): the row side over
    (BR / STRIPS, BC) row strips, then the column side over (BR, BC / STRIPS) column strips. A tile both
    sides' blocks need whole (fp8 1 x 128 with its 128 x 1 transposed blocks: 128 x 128) then holds a
    fraction of the registers at a time."""
    pid_c = tl.program_id(0)
    pid_r = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    r0 = pid_r * BR
    c0 = pid_c * BC
    if STRIPS == 1:
        x = _load_tile(x_ptr, batch, r0, c0, R, C, BR, BC)
        codes = None
        scales = None
        if R_KIND != "none":
            codes, scales = _quantize_blocks(x, tl.load(ts_ptr), R_KIND, R_ROUNDING, R_TH, R_TW, BR, BC, R_MBITS,
                                             R_MIN_EXP, R_MAX_BITS, R_NBITS, R_EMAX, R_CMANT, DIV, CVT)
            _store_side(codes, scales, rv_ptr, rs_ptr, batch, r0, c0, R, R_CQ, triton.cdiv(R, R_TH),
                        R_CQ // R_TW, R_EPB, BR, BC, R_TH, R_TW)
        if C_KIND != "none":
            _column_side(x, codes, scales, ts_ptr, cv_ptr, cs_ptr, batch, r0, c0, C, BR, BC, C_KIND, C_ROUNDING,
                         C_TH, C_TW, C_RQ, C_EPB, C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS, C_EMAX, C_CMANT,
                         COL_MODE, DIV, CVT, T_WORDS)
    else:
        SR: tl.constexpr = BR // STRIPS
        SC: tl.constexpr = BC // STRIPS
        for i in tl.static_range(STRIPS):
            x = _load_tile(x_ptr, batch, r0 + i * SR, c0, R, C, SR, BC)
            codes, scales = _quantize_blocks(x, tl.load(ts_ptr), R_KIND, R_ROUNDING, R_TH, R_TW, SR, BC, R_MBITS,
                                             R_MIN_EXP, R_MAX_BITS, R_NBITS, R_EMAX, R_CMANT, DIV, CVT)
            _store_side(codes, scales, rv_ptr, rs_ptr, batch, r0 + i * SR, c0, R, R_CQ, triton.cdiv(R, R_TH),
                        R_CQ // R_TW, R_EPB, SR, BC, R_TH, R_TW)
        for i in tl.static_range(STRIPS):
            x = _load_tile(x_ptr, batch, r0, c0 + i * SC, R, C, BR, SC)
            _column_side(x, None, None, ts_ptr, cv_ptr, cs_ptr, batch, r0, c0 + i * SC, C, BR, SC, C_KIND,
                         C_ROUNDING, C_TH, C_TW, C_RQ, C_EPB, C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS, C_EMAX,
                         C_CMANT, COL_MODE, DIV, CVT, T_WORDS)

# ---------------------------------------------------------------------------------------------------------
# Host side: which formats a side supports, and the launch plan shared by the JAX and interpreter paths.


@dataclasses.dataclass(frozen=True)
class Side:
    """One output of the kernel: `fmt` along the side's axis, MX `rounding`; None fmt = off."""

    fmt: Optional[Format]
    rounding: str = "rceil"


def _bits_of(v: float) -> int:
    return int(np.array(v, np.float32).view(np.uint32))


def _tile(fmt: Format, column: bool) -> tuple[int, int]:
    """The block as (TH, TW) in x's coordinates for the row (along C) or column (along R) side."""
    if isinstance(fmt, BlockFP8Format):
        rows, cols = fmt.tile
    else:
        rows, cols = 1, fmt.block
    return (cols, rows) if column else (rows, cols)


def supported_side(fmt: Optional[Format]) -> Optional[str]:
    """None when the kernel takes `fmt`, else why not (the jnp quantizer runs instead)."""
    if fmt is None or isinstance(fmt, (MXFormat, NVFP4Format)):
        return None
    if isinstance(fmt, BlockFP8Format):
        rows, cols = fmt.tile
        if any(d & (d - 1) for d in (rows, cols)):
            return f"fp8_block tile {fmt.tile} is not a power of two in each dim (Triton block shapes are)"
        if rows * cols > 256 * 256 or max(rows, cols) > 256:
            return f"fp8_block tile {fmt.tile} is larger than 256 x 256"
        return None
    return f"no quantization kernel for {fmt!r}"


def _side_constexprs(prefix: str, side: Side, extent: int) -> dict:
    """The kernel's per-side constexprs; `extent` is the logical length of the side's quantized axis."""
    fmt = side.fmt
    if fmt is None:
        values = dict(KIND="none", ROUNDING="none", TH=1, TW=1, EPB=1, MBITS=3, MIN_EXP=-6,
                      MAX_BITS=0, NBITS=8, EMAX=8, CMANT=0)
        values["RQ" if prefix == "C_" else "CQ"] = 1
        return {prefix + k: v for k, v in values.items()}
    column = prefix == "C_"
    th, tw = _tile(fmt, column)
    block = th if column else tw
    elem = fmt.element
    kind = "nvfp4" if isinstance(fmt, NVFP4Format) else "fp8" if isinstance(fmt, BlockFP8Format) else "mx"
    values = dict(
        KIND=kind, ROUNDING=side.rounding if kind == "mx" else "none", TH=th, TW=tw,
        EPB=fmt.elements_per_byte, MBITS=elem.mbits, MIN_EXP=elem.min_normal_exp,
        MAX_BITS=_bits_of(elem.max_normal), NBITS=elem.bits, EMAX=elem.emax,
        CMANT=_bits_of(elem.max_normal) & 0x7FFFFF,
    )
    values["RQ" if column else "CQ"] = -(-extent // block) * block
    return {prefix + k: v for k, v in values.items()}


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything a launch needs: grid, warps, constexprs and the four output shapes/dtypes."""

    grid: tuple[int, int, int]
    num_warps: int
    constexprs: dict
    out_shapes: tuple[tuple[tuple[int, ...], np.dtype], ...]  # row values, row scales, col values, col scales


def _scale_dtype(fmt: Format) -> np.dtype:
    return np.dtype(np.float32) if isinstance(fmt, BlockFP8Format) else np.dtype(np.uint8)


COL_MODES = ("trans", "direct", "reuse")


def _reusable(row: Side, col: Side) -> bool:
    """The column side's blocks are the row side's (same fp8 format, square tile): reuse its codes."""
    return (isinstance(row.fmt, BlockFP8Format) and row.fmt == col.fmt and row.fmt.tile[0] == row.fmt.tile[1])


def default_col_mode(row: Side, col: Side) -> str:
    """"reuse" where it applies, else "direct" (as fast as "trans" or faster on an H100, 2026-11-22:
    fp8 128x128 + transpose 97 us vs 242 us; MX and 1x128 within 1%)."""
    if _reusable(row, col):
        return "reuse"
    return "direct"


def _default_tile(row: Side, col: Side, heights: list[int], widths: list[int]) -> tuple[int, int]:
    """Program tile with a column side: one column block high, so its blocks span the tile's height
    (benchmarks/quant_variants.py on an H100, bf16 8192^2, 2026-11-22: mxfp8 + transpose 183 us at 32 x 256
    vs 194 us at 64 x 128; nvfp4 + transpose 333 us at 16 x 256 vs 491 us; nvfp4 + mxfp8 transposed 195 us
    at 32 x 128 vs 228 us at 64 x 64). Without one, at least 64 x 64 (enough bytes per program)."""
    if col.fmt is None:
        return max([64] + heights), max([64] + widths)
    br = max(heights)
    if br >= 128:
        return br, max([128] + widths)
    bc = 128 if isinstance(row.fmt, NVFP4Format) and not isinstance(col.fmt, NVFP4Format) else 256
    return br, max([bc] + widths)


DIVS = ("f32", "f64")
CVTS = ("hw", "int")


def default_cvt(compute_capability: Optional[int]) -> str:
    """"hw" on NVIDIA targets with the fp8 conversion (sm_89+), else "int" (AMD's gfx950 and older NVIDIA)."""
    return "hw" if compute_capability is not None and compute_capability >= 89 else "int"


def plan(batch: int, r: int, c: int, row: Side, col: Side, *, col_mode: Optional[str] = None,
         tile: Optional[tuple[int, int]] = None, num_warps: Optional[int] = None, div: Optional[str] = None,
         cvt: str = "int", t_words: Optional[bool] = None, strips: Optional[int] = None) -> Plan:
    """Launch plan for x (batch, r, c). The program tile (BR, BC) holds whole blocks of both sides.

    col_mode / tile / num_warps override the defaults (benchmarks/quant_variants.py compares them); div
    picks how nvfp4 / fp8_block form element quotients, bit-identically: "f64" (float64 as the jnp
    quantizer: 2 conversions per element) or "f32" (float32 operations and one more integer op per element,
    see `_quotient_parts`). Default (None): "f32" for nvfp4 with its transposed nvfp4 side, else "f64"
    (nvfp4 + transposed mxfp8 is unmeasured), as measured on an H100 (2026-11-22, bf16 8192², benchmarks/quant_variants.py, kernel
    time): nvfp4 + transposed 292 us with "f32" against 333 with "f64"; row-only nvfp4 94.0 against 101.9
    and fp8 1x128 + transposed 277 against 284 the other way.

    cvt picks how e4m3 / e5m2 element codes are formed, bit-identically: "int" (`_encode`, integer ops on
    the float32 bits: every target) or "hw" (the cvt.rn.satfinite fp8 conversion plus a fix-up, NVIDIA
    sm_89+ only: `_fp8_cvt_ptx`); fp4 / fp6 elements always take "int". The plan does not know the target:
    the primitive passes `default_cvt(compute_capability)`. "hw" also lets the word transpose (t_words) use
    prmt; "int" emits no inline PTX at all (gfx950).

    t_words: the column side's 1-byte codes go through shared memory as uint32 words
    (`_store_values_t_words`) instead of bytes; applies to the "direct" and "reuse" column modes with 1-byte
    codes (not fp4), default where it applies with cvt "hw".

    strips: each side in that many passes over strips of the tile, x re-read per strip (the kernel's
    STRIPS). Default 2 for tiles of >= 128 x 128 where strips keep whole blocks (fp8 1x128 + its 128 x 1
    transposed blocks), with div "f32"; else 1. Measured on an H100 (2026-11-22, bf16 8192², kernel time,
    `quant_variants --strips`): fp8 1x128 + transposed 181 us against 277 in one pass (255 -> 122
    registers per thread at 8 warps); strips made mxfp8 + transposed (32 x 256) and nvfp4 + transposed
    (16 x 256) slower (134.8 vs 133.6, 351 vs 291 us), so their tiles keep one pass."""
    if div is not None and div not in DIVS:
        raise ValueError(f"div must be one of {DIVS}, got {div!r}")
    if cvt not in CVTS:
        raise ValueError(f"cvt must be one of {CVTS}, got {cvt!r}")
    for side in (row, col):
        why = supported_side(side.fmt)
        if why:
            raise ValueError(why)
    if col_mode is None:
        col_mode = default_col_mode(row, col)
    if col_mode not in COL_MODES or (col_mode == "reuse" and not _reusable(row, col)):
        raise ValueError(f"col_mode {col_mode!r} does not apply to {row} / {col}")
    heights = [_tile(s.fmt, s is col)[0] for s in (row, col) if s.fmt is not None]
    widths = [_tile(s.fmt, s is col)[1] for s in (row, col) if s.fmt is not None]
    # Block dims are powers of two, so the largest height (width) is a multiple of every other one.
    br, bc = _default_tile(row, col, heights, widths)
    if tile is not None:
        if tile[0] % max(heights) or tile[1] % max(widths) or any(t & (t - 1) for t in tile):
            raise ValueError(f"tile {tile} must be powers of two holding whole blocks "
                             f"({max(heights)} x {max(widths)})")
        br, bc = tile
    elements = br * bc
    if num_warps is None:  # as measured (quant_variants.py): 4 for one-block-high column tiles up to 8192
        # elements (8 was 1.4-1.7x slower there), 8 for row-only 64 x 128 (1x128: 74 us vs 84 with 4)
        small = 4096 if col.fmt is None else 8192
        num_warps = 4 if elements <= small else 8 if elements <= 128 * 128 else 16
    words_apply = (col.fmt is not None and col_mode != "trans" and col.fmt.elements_per_byte == 1
                   and br % 4 == 0 and bc % 4 == 0 and _side_constexprs("C_", col, r)["C_RQ"] % 4 == 0)
    if t_words is None:  # with cvt "int" the byte transpose is shifts and masks: sm_90's SASS count is no lower
        t_words = words_apply and cvt == "hw"
    if t_words and not words_apply:
        raise ValueError("t_words applies to 'direct' / 'reuse' column sides with 1-byte codes only")

    def strips_apply(n: int) -> bool:
        # Row strips must hold whole row blocks and column strips whole column blocks; "reuse" needs the
        # row side's codes of the whole tile.
        return (row.fmt is not None and col.fmt is not None and col_mode != "reuse" and n >= 1 and not n & (n - 1)
                and n <= min(br, bc) and (br // n) % _tile(row.fmt, False)[0] == 0
                and (bc // n) % _tile(col.fmt, True)[1] == 0)

    if strips is None:  # 2 for tiles of >= 128 x 128 (fp8 1x128 + transposed), measured; see the docstring
        strips = 2 if br * bc >= 128 * 128 and strips_apply(2) else 1
    if strips != 1 and not strips_apply(strips):
        raise ValueError(f"strips={strips} needs both sides, a column mode other than 'reuse', row strips "
                         f"({br // max(strips, 1)} rows) holding whole row blocks and column strips "
                         f"({bc // max(strips, 1)} columns) whole column blocks")
    if div is None:
        div = "f32" if strips > 1 or all(f is not None and f.name == "nvfp4" for f in (row.fmt, col.fmt)) else "f64"
    ce = dict(R=r, C=c, BR=br, BC=bc, COL_MODE=col_mode if col.fmt is not None else "trans", DIV=div, CVT=cvt,
              T_WORDS=t_words, STRIPS=strips,
              **_side_constexprs("R_", row, c), **_side_constexprs("C_", col, r))
    shapes = []
    for prefix, side, outer, inner_key in (("R_", row, r, "R_CQ"), ("C_", col, c, "C_RQ")):
        if side.fmt is None:
            shapes += [((1,), np.dtype(np.uint8)), ((1,), np.dtype(np.uint8))]
            continue
        inner = ce[inner_key]
        th, tw = ce[prefix + "TH"], ce[prefix + "TW"]
        t_outer, t_inner = (tw, th) if prefix == "C_" else (th, tw)
        shapes.append(((batch, outer, inner // side.fmt.elements_per_byte), np.dtype(np.uint8)))
        shapes.append(((batch, -(-outer // t_outer), inner // t_inner), _scale_dtype(side.fmt)))
    grid = (triton.cdiv(c, bc), triton.cdiv(r, br), batch)
    return Plan(grid, num_warps, ce, tuple(shapes))

