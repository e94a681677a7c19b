"""Checks at the public boundary, run before any compute (and at trace time under `jit`: shapes, dtypes and
the static fields of a `BlockScaledArray` are known then).

- `check_block_scaled`: a `BlockScaledArray`'s fields agree with its format: `fmt` is a format object,
  `axis` a negative int, `values` has the format's storage dtype and holds `length` zero-padded to whole
  blocks, `scales` has one scale of the format's dtype per block (per 2-D tile for `fp8_block`), and
  nvfp4 carries a float32 `tensor_scale` (shape `()`, or the leading dims of a vmapped stack) while the
  other formats carry none. Each error names the field, what was expected and what was found.
- `check_matmul_operands`: what `jax_blockscale.matmul` multiplies: compatible families, quantized along
  the last axis, NT shapes that agree. `matmul` and `explain` both call it, so `explain` never describes a
  pair that `matmul` rejects.
- `check_target`: an explicit `target=` must name a target of the dispatch table (aliases such as
  `"sm_100a"` accepted); None means "detect this machine's", which may be any device.

Called by `matmul`, `explain`, `dequantize`, `reference.matmul`, the recipes, `dot_general` and the Flax
layers; not by `BlockScaledArray.tree_unflatten`, which JAX calls with placeholder leaves.

This module reads a `BlockScaledArray` by its fields and does not import `quantize.py` (which calls it),
so an operand counts as block-scaled when it has `values`, `scales` and `fmt` attributes.
"""

from __future__ import annotations

from typing import Any, Optional

import jax.numpy as jnp
import numpy as np

from . import backends
from ._triton.problem import DTYPE_NAMES
from .formats import BlockFP8Format, MXFormat, NVFP4Format

__all__ = [
    "check_block_scaled",
    "check_matmul_operands",
    "check_operands",
    "check_pair",
    "check_target",
    "check_side",
    "check_float_dtype",
    "is_block_scaled",
]

_FORMAT_TYPES = (MXFormat, NVFP4Format, BlockFP8Format)
SIDES = ("a", "b")


def is_block_scaled(x: Any) -> bool:
    """Whether `x` is a BlockScaledArray (or anything shaped like one: `values`, `scales`, `fmt`)."""
    return all(hasattr(x, f) for f in ("values", "scales", "fmt"))


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_array(v) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype")


def _got(v) -> str:
    if _is_array(v):
        return f"an array of shape {tuple(v.shape)} and dtype {jnp.dtype(v.dtype)}"
    return f"{type(v).__name__} {v!r}"


def _values_dtype(fmt):
    # fp8 elements are stored as the float8 dtype; fp6 (one code per byte) and fp4 (two per byte) as uint8.
    return jnp.dtype(fmt.element.jnp_dtype) if fmt.element.bits == 8 else jnp.dtype(jnp.uint8)


def _scale_dtypes(fmt) -> tuple:
    if isinstance(fmt, MXFormat):
        # e8m0 codes as uint8 (what quantize makes) or as ml_dtypes' float8_e8m0fnu (what jax.nn uses).
        return (jnp.dtype(jnp.uint8), jnp.dtype(jnp.float8_e8m0fnu))
    if isinstance(fmt, NVFP4Format):
        return (jnp.dtype(jnp.float8_e4m3fn),)
    return (jnp.dtype(jnp.float32),)


def check_block_scaled(q: Any, name: str = "array") -> None:
    """Raises ValueError, naming the field, unless `q`'s fields are consistent with its format.

    Only static information is read (shapes, dtypes, `fmt`, `axis`, `length`), so it works on tracers and
    `jax.ShapeDtypeStruct` leaves; the element codes themselves are not inspected.
    """
    fmt = q.fmt
    if not isinstance(fmt, _FORMAT_TYPES):
        hint = f" (jax_blockscale.get_format({fmt!r}))" if isinstance(fmt, str) else ""
        raise ValueError(f"{name}.fmt: expected a format object{hint}, got {_got(fmt)}")
    for field in ("values", "scales"):
        if not _is_array(getattr(q, field)):
            raise ValueError(f"{name}.{field}: expected an array, got {_got(getattr(q, field))}")
    values, scales = q.values, q.scales
    shape = tuple(values.shape)
    ndim = len(shape)
    if ndim == 0:
        raise ValueError(f"{name}.values: expected at least one axis (the quantized one), got a scalar")
    axis = q.axis
    if not _is_int(axis) or not -ndim <= axis < 0:
        raise ValueError(f"{name}.axis: expected a negative int in [{-ndim}, -1] for values of rank {ndim} "
                         f"(the quantized axis counted from the end), got {axis!r}")
    axis = int(axis)
    want = _values_dtype(fmt)
    if jnp.dtype(values.dtype) != want:
        raise ValueError(f"{name}.values: expected dtype {want} for {fmt.name}, got {jnp.dtype(values.dtype)}")
    length = q.length
    if not _is_int(length) or length < 0:
        raise ValueError(f"{name}.length: expected a non-negative int (the unpadded size of the quantized "
                         f"axis), got {length!r}")
    epb = fmt.elements_per_byte
    padded = -(-int(length) // fmt.block) * fmt.block
    if shape[axis] * epb != padded:
        per_byte = ", two fp4 codes per byte" if epb == 2 else ""
        raise ValueError(
            f"{name}.values: expected {padded // epb} along the quantized axis {axis} (length={length} "
            f"zero-padded to whole blocks of {fmt.block}{per_byte}), got shape {shape}"
        )
    want_scales = list(shape)
    want_scales[axis] = padded // fmt.block
    if isinstance(fmt, BlockFP8Format) and fmt.tile[0] > 1:
        rows = fmt.tile[0]
        if ndim < 2 or axis not in (-1, -2):
            raise ValueError(f"{name}.axis: a {fmt.tile} fp8_block tile spans the last two axes, so the "
                             f"quantized axis must be -1 or -2 of values of rank >= 2; got axis {axis}, "
                             f"shape {shape}")
        row_axis = -2 if axis == -1 else -1
        want_scales[row_axis] = -(-shape[row_axis] // rows)
    if jnp.dtype(scales.dtype) not in _scale_dtypes(fmt):
        want_dt = " or ".join(str(d) for d in _scale_dtypes(fmt))
        raise ValueError(f"{name}.scales: expected dtype {want_dt} for {fmt.name}, got {jnp.dtype(scales.dtype)}")
    if tuple(scales.shape) != tuple(want_scales):
        what = f"{fmt.tile[0]}x{fmt.tile[1]} tile" if isinstance(fmt, BlockFP8Format) else f"block of {fmt.block}"
        raise ValueError(f"{name}.scales: expected shape {tuple(want_scales)} (one scale per {what} of values "
                         f"{shape} along axis {axis}), got {tuple(scales.shape)}")
    ts = q.tensor_scale
    if isinstance(fmt, NVFP4Format):
        if ts is None or not _is_array(ts):
            raise ValueError(f"{name}.tensor_scale: expected a float32 array for nvfp4 (the per-tensor scale, "
                             f"amax / (448 * 6) from quantize), got {_got(ts)}")
        if jnp.dtype(ts.dtype) != jnp.float32:
            raise ValueError(f"{name}.tensor_scale: expected dtype float32, got {jnp.dtype(ts.dtype)}")
        lead = shape[: ndim + axis]  # dims before the quantized axis: a vmapped stack's tensor scales
        ts_shape = tuple(ts.shape)
        if ts_shape != lead[: len(ts_shape)]:
            raise ValueError(f"{name}.tensor_scale: expected shape () or leading dims of values {shape} "
                             f"(one scale per quantized tensor, e.g. {lead[:1]} for a stack), got {ts_shape}")
    elif ts is not None:
        raise ValueError(f"{name}.tensor_scale: expected None for {fmt.name} (only nvfp4 has a tensor scale), "
                         f"got {_got(ts)}")


def check_side(side: Any) -> str:
    """A matmul side: "a" (activations, (..., M, K)) or "b" (weight, (..., N, K))."""
    if side not in SIDES:
        raise ValueError(f"side: expected 'a' (activations (..., M, K)) or 'b' (weight (..., N, K)), got {side!r}")
    return side


def check_float_dtype(dtype: Any, what: str) -> jnp.dtype:
    """`dtype` as a jnp dtype if it is float64/32, bfloat16 or float16, else ValueError naming `what`."""
    try:
        d = jnp.dtype(dtype)
    except TypeError:
        raise ValueError(f"{what}: expected a float dtype (float32, bfloat16, float16), got {dtype!r}") from None
    if d not in (jnp.dtype(jnp.float64), jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        raise ValueError(f"{what}: expected a float dtype (float32, bfloat16, float16), got {d}")
    return d


def check_target(target: Optional[str]) -> Optional[str]:
    """The normalized name of an explicit target (None stays None: detect this machine's).

    Explicit targets must be in the dispatch table (`backends.TARGETS`, aliases such as "sm_100a" and
    "sm_90a" accepted): a name the table does not know (`"sm_80"`, `"cuda"`, `"gfx942"`) is a typo or a
    target no kernel was written for, and is rejected rather than silently served by the reference.
    """
    if target is None:
        return None
    if not isinstance(target, str):
        raise ValueError(f"target: expected a target name or None, got {_got(target)}")
    t = backends._normalize_target(target)
    if t not in backends.TARGETS:
        raise ValueError(f"unknown target {target!r}; choose one of {backends.TARGETS} (aliases sm_100a, "
                         f"sm_103, sm_90a) or None to detect this machine's")
    return t


def _family(x) -> str:
    if not is_block_scaled(x):
        return "dense"
    return {MXFormat: "mx", NVFP4Format: "nvfp4", BlockFP8Format: "fp8_block"}[type(x.fmt)]


_COMPATIBLE = {
    frozenset({"mx"}), frozenset({"nvfp4"}), frozenset({"fp8_block"}),
    frozenset({"dense", "mx"}), frozenset({"dense", "nvfp4"}), frozenset({"dense", "fp8_block"}),
}


def check_pair(a: Any, b: Any) -> None:
    """The operand pair is one the matmul computes: families, quantized axis, dense dtypes."""
    fa, fb = _family(a), _family(b)
    if fa == fb == "dense":
        raise ValueError(
            "both operands are dense: quantize one (jax_blockscale.quantize) or pass a_format=/b_format= "
            "to quantize inside the matmul"
        )
    if frozenset({fa, fb}) not in _COMPATIBLE:
        raise ValueError(
            f"cannot multiply {a.fmt.name} by {b.fmt.name}: their scale blocks along K differ. Supported: "
            f"MX x MX (any element types), nvfp4 x nvfp4, fp8_block x fp8_block, dense x any"
        )
    if fa == fb == "fp8_block" and a.fmt.tile[1] != b.fmt.tile[1]:
        raise ValueError(f"fp8_block tiles {a.fmt.tile} and {b.fmt.tile} must have the same width along K")
    for name, x in (("a", a), ("b", b)):
        if is_block_scaled(x) and x.axis != -1:
            raise ValueError(
                f"{name} is quantized along axis {x.axis}; matmul contracts the last axis (b is (N, K)), so "
                f"quantize {name} with axis=-1"
            )
        if not is_block_scaled(x) and jnp.dtype(x.dtype) not in DTYPE_NAMES:
            raise TypeError(f"{name} must be a BlockScaledArray or a float32/bfloat16/float16 array, "
                            f"got {x.dtype}")


def _logical_shape(x) -> tuple[int, ...]:
    if is_block_scaled(x):
        shape = list(x.values.shape)
        shape[x.axis] = x.length
        return tuple(shape)
    return tuple(x.shape)


def check_operands(a: Any, b: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validates the NT matmul shapes: a (..., M, K), b (..., N, K). Returns both logical shapes."""
    sa, sb = _logical_shape(a), _logical_shape(b)
    if len(sa) < 2 or len(sb) < 2:
        raise ValueError(f"matmul needs a of shape (..., M, K) and b of shape (N, K); got {sa} and {sb}")
    if sa[-1] != sb[-1]:
        raise ValueError(
            f"contraction sizes differ: a is {sa} and b is {sb} (b is (N, K), i.e. the weight transposed); "
            f"their last axes must match"
        )
    try:
        jnp.broadcast_shapes(sa[:-2], sb[:-2])
    except ValueError:
        raise ValueError(f"batch dims of a {sa[:-2]} and b {sb[:-2]} do not broadcast") from None
    return sa, sb


def _check_matmul_tensor_scale(x, name: str) -> None:
    # The primitive aligns an nvfp4 tensor scale with the batch dims (numpy broadcasting from the right),
    # so a stacked one must cover exactly the batch dims, not also M or N.
    ts = x.tensor_scale
    batch = tuple(x.values.shape[:-2])
    if ts is not None and tuple(ts.shape) not in ((), batch):
        raise ValueError(f"{name}.tensor_scale: expected shape () or the batch dims {batch} for matmul, got "
                         f"{tuple(ts.shape)}")


def check_matmul_operands(a: Any, b: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Everything `matmul` (and so `explain`) requires of its two (already quantized) operands.

    Each block-scaled operand is checked field by field, then the pair and the NT shapes. Returns both
    logical shapes.
    """
    for name, x in (("a", a), ("b", b)):
        if is_block_scaled(x):
            check_block_scaled(x, name)
        elif not _is_array(x):
            raise TypeError(f"{name} must be a BlockScaledArray or a float array, got {type(x).__name__}")
    check_pair(a, b)
    shapes = check_operands(a, b)
    for name, x in (("a", a), ("b", b)):
        if isinstance(getattr(x, "fmt", None), NVFP4Format):
            _check_matmul_tensor_scale(x, name)
    return shapes
