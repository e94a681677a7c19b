"""A correctly rounded float32 fused multiply-add in NumPy, and its installation into Triton's interpreter.

NumPy has no fma, and Triton's interpreter computes `tl.fma(x, y, z)` as `x * y + z` in the operands'
type: two roundings. The quantization kernel's float32 quotient (quantize_kernels._quotient) relies on one
rounding (its residual x - q0 * d must come out exact), so its interpreter tests install this instead.

float32 fma(a, b, c) = RN32(a * b + c): the product of two 24-bit significands is exact in float64, and
the float64 sum s = RN64(a * b + c) carries its rounding error e exactly (TwoSum). RN32(s) is RN32 of the
exact sum unless s is a float32 rounding boundary (a midpoint between adjacent float32s) that e moved the
sum onto; there the sign of e decides, so s is nudged one float64 step towards the exact sum first. Off a
boundary the nudge is not needed (s and the exact sum lie on the same side of every boundary: a boundary
is itself a float64 value, and RN64 never crosses one). Overflow to +-Inf and NaN follow float64's rules,
which agree with float32's for these operands.
"""

from __future__ import annotations

import numpy as np


def _is_f32_midpoint(s: np.ndarray) -> np.ndarray:
    """Whether float64 `s` lies exactly halfway between two adjacent float32 values (finite s only)."""
    with np.errstate(over="ignore", invalid="ignore"):
        r = s.astype(np.float32)
        other = np.where(r.astype(np.float64) < s, np.nextafter(r, np.float32(np.inf)),
                         np.nextafter(r, np.float32(-np.inf)))
        mid = (r.astype(np.float64) + other.astype(np.float64)) * 0.5
        return np.isfinite(s) & (r.astype(np.float64) != s) & (mid == s)


def fma32(a, b, c) -> np.ndarray:
    """RN32(a * b + c) for float32 arrays (broadcast), exactly one rounding; IEEE special values."""
    a64, b64, c64 = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(over="ignore", invalid="ignore"):
        p = a64 * b64  # exact: 48 significant bits at most, and no float64 overflow / underflow for float32s
        s = p + c64
        bb = s - p
        err = (p - (s - bb)) + (c64 - bb)  # TwoSum: p + c == s + err exactly
        err = np.where(np.isfinite(s), err, 0.0)
        nudge = _is_f32_midpoint(s) & (err != 0)
        s = np.where(nudge, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def install() -> None:
    """Make Triton's interpreter compute float32 tl.fma with one rounding (other types as before)."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder, "_exact_fma", False):
        return
    original = builder.create_fma

    def create_fma(self, x, y, z):
        if z.data.dtype == np.float32:
            return interpreter.TensorHandle(fma32(x.data, y.data, z.data), z.dtype.scalar)
        return original(self, x, y, z)

    builder.create_fma = create_fma
    builder._exact_fma = True
