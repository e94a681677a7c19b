"""The quantization primitive: the jnp quantizer on CPU, the one-pass Triton kernel on a GPU.

`quantize_pair(x, row_fmt, col_fmt)` returns, from one read of x (..., R, C),

    row = quantize(x, row_fmt, axis=-1)                      # x along C (its last axis)
    col = quantize(swapaxes(x, -1, -2), col_fmt, axis=-1)    # x along R, stored transposed

either of which may be skipped (fmt None). Both are bit-identical to the jnp quantizer whatever runs:
the `blockscaled_quantize` primitive lowers

- on CPU, and in programs partitioned over several devices, to the jnp quantizer itself (so XLA's
  sharding propagation sees ordinary HLO and never gathers x for a custom call);
- on one CUDA device (or inside shard_map over every mesh axis) to `_triton/quantize_kernels.py`, whose
  outputs the GPU tests compare bit for bit with the jnp quantizer run on the same GPU.

nvfp4 sides take their tensor scale from the caller (`quantize.nvfp4_tensor_scale`, one reduction), so
the kernel itself is one pass. vmap folds the mapped axis into the kernel's batch (one launch); a
per-example nvfp4 tensor scale under vmap takes the jnp quantizer.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore
from jax.interpreters import batching, mlir

from .formats import Format, MXFormat, NVFP4Format
from .quantize import BlockScaledArray, dequantize, given_tensor_scale, quantize_jnp

__all__ = ["quantize_pair", "quantize_sides", "quantize_with_transpose", "kernel_path", "quantize_p", "Decoded",
           "decoded_pair"]

quantize_p = jcore.Primitive("blockscaled_quantize")
quantize_p.multiple_results = True

# Set to False (at trace time) to run the jnp quantizer everywhere: for benchmarks that compare the two.
USE_KERNEL = True


def _sides(row, col):
    from ._triton.quantize_kernels import Side

    return Side(*row), Side(*col)


def _plan(x_shape, row, col, **overrides):
    """The kernel's launch plan; `overrides` (`quantize_kernels.plan`'s col_mode, tile, num_warps, div, cvt,
    t_words, strips) for benchmarks/quant_variants.py."""
    from ._triton.quantize_kernels import plan

    b = int(np.prod(x_shape[:-2], dtype=np.int64))
    return plan(b, x_shape[-2], x_shape[-1], *_sides(row, col), **overrides)


def out_shapes(x_shape, row, col, decoded: bool = False) -> tuple:
    """The primitive's four (shape, dtype) outputs for x (..., R, C): the kernel plan's codes and scales
    (row values, row scales, column values, column scales), or with `decoded` the bf16 values (lead, R, C)
    and (lead, C, R) with 1-element placeholders for the scales and for a side that is off."""
    if not decoded:
        return _plan(x_shape, row, col).out_shapes
    lead = int(np.prod(x_shape[:-2], dtype=np.int64))
    r, c = x_shape[-2:]
    off, bf16, u8 = (1,), np.dtype(jnp.bfloat16), np.dtype(np.uint8)
    return (((lead, r, c) if row[0] is not None else off, bf16), (off, u8),
            ((lead, c, r) if col[0] is not None else off, bf16), (off, u8))


def _abstract_eval(x, ts, *, row, col, decoded):
    del ts
    return [jax.core.ShapedArray(shape, dtype) for shape, dtype in out_shapes(x.shape, row, col, decoded)]


quantize_p.def_abstract_eval(_abstract_eval)
quantize_p.def_impl(functools.partial(jax._src.dispatch.apply_primitive, quantize_p))


def _raw(q: Optional[BlockScaledArray], lead: int) -> tuple[jax.Array, jax.Array]:
    """A BlockScaledArray's leaves as the kernel stores them: uint8 codes, (lead, rows, cols)."""
    if q is None:
        return jnp.zeros((1,), jnp.uint8), jnp.zeros((1,), jnp.uint8)
    values, scales = q.values, q.scales
    if values.dtype != jnp.uint8:
        values = lax.bitcast_convert_type(values, jnp.uint8)
    if scales.dtype == jnp.float8_e4m3fn:
        scales = lax.bitcast_convert_type(scales, jnp.uint8)
    return values.reshape((lead,) + values.shape[-2:]), scales.reshape((lead,) + scales.shape[-2:])


def _reference(x, ts, *, row, col, decoded=False):
    """The primitive's meaning, in jnp: the jnp quantizer on both sides, laid out as the kernel's outputs
    (with `decoded`, each side's `dequantize(q, bf16)`, nvfp4's tensor scale left out: `decoded_pair`)."""
    lead = int(np.prod(x.shape[:-2], dtype=np.int64))
    outs = []
    for (fmt, rounding), xs, t in ((row, x, ts[0]), (col, jnp.swapaxes(x, -1, -2), ts[1])):
        q = None
        if fmt is not None:
            tensor_scale = t if isinstance(fmt, NVFP4Format) else None
            q = quantize_jnp(xs, fmt, axis=-1, rounding=rounding, tensor_scale=tensor_scale)
        outs += _decoded_raw(q, lead) if decoded else _raw(q, lead)
    return outs


def _decoded_raw(q: Optional[BlockScaledArray], lead: int) -> tuple[jax.Array, jax.Array]:
    """`_raw`'s decoded counterpart: (bf16 values (lead, rows, cols), placeholder scales)."""
    placeholder = jnp.zeros((1,), jnp.uint8)
    if q is None:
        return jnp.zeros((1,), jnp.bfloat16), placeholder
    values = _canonical_nan(dequantize(_without_tensor_scale(q), jnp.bfloat16))
    return values.reshape((lead,) + values.shape[-2:]), placeholder


_BF16_NAN = 0x7FFF  # the canonical NaN of NVIDIA's float32 -> bf16 conversion (cvt.rn.bf16x2.f32)


def _canonical_nan(values: jax.Array) -> jax.Array:
    """NaNs (a NaN block's values) as the bf16 NaN 0x7FFF, whichever NaN the float32 -> bf16 conversion gave:
    XLA's conversion on NVIDIA GPUs writes 0x7FFF where a constant-folded one (or the CPU's) writes 0x7FC0,
    so without this the bits would depend on how XLA compiled `dequantize`. The kernel's conversion writes
    0x7FFF for every NaN, at no cost."""
    # On the bits: XLA may fold a float select of NaN against a NaN test (NaN payloads are not values to it).
    bits = lax.bitcast_convert_type(values, jnp.uint16)
    bits = jnp.where((bits & 0x7FFF) > 0x7F80, jnp.uint16(_BF16_NAN), bits)
    return lax.bitcast_convert_type(bits, values.dtype)


def _without_tensor_scale(q: BlockScaledArray) -> BlockScaledArray:
    """q with an nvfp4 tensor scale of 1, so that its dequantized values are exact in bf16 (the tensor
    scale is any float32; elements times block scales have at most 5 significant bits)."""
    if q.tensor_scale is None:
        return q
    return BlockScaledArray(q.values, q.scales, q.fmt, q.axis, q.length, jnp.ones_like(q.tensor_scale))


def _kernel_allowed(ctx) -> bool:
    """One device, or shard_map's per-device body with every mesh axis manual."""
    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, mlir.ShardingContext):
        return axis_context.num_devices == 1
    if isinstance(axis_context, mlir.SPMDAxisContext):
        return set(axis_context.manual_axes) == set(axis_context.mesh.axis_names)
    return False


def _gpu_lowering(ctx, x, ts, *, row, col, decoded):
    reference = mlir.lower_fun(functools.partial(_reference, row=row, col=col, decoded=decoded),
                               multiple_results=True)
    if not (USE_KERNEL and _kernel_allowed(ctx)):
        return reference(ctx, x, ts)
    from . import backends, primitive
    from ._triton import jt

    # The target as the matmul primitive finds it: the device the program is lowered for.
    device = primitive._lowering_device(ctx)
    if device is None:
        raise ValueError(f"cannot lower jax_blockscale's quantization kernel for "
                         f"{ctx.module_context.platforms[0]} without a device to read the target from")
    target = backends.detect_target(device)
    cc = primitive._compute_capability(target)
    if decoded and decoded_kernel_why_not(x.type.shape, row, col, cc) is not None:
        return reference(ctx, x, ts)  # no kernel writes decoded values there: XLA runs the jnp pair
    with jt.lowering_target(target):
        return mlir.lower_fun(functools.partial(_launch, row=row, col=col, compute_capability=cc, decoded=decoded),
                              multiple_results=True)(ctx, x, ts)


def decoded_kernel_why_not(x_shape, row, col, compute_capability) -> Optional[str]:
    """None when the Gluon MX kernel writes this pair's decoded values (`decoded_pair`) on the target,
    else why XLA runs the jnp quantize-dequantize instead."""
    from ._triton import quantize_mx_gluon

    return quantize_mx_gluon.why_not(tuple(x_shape), jnp.bfloat16, *_sides(row, col), compute_capability)


KERNELS = ("gluon", "triton")


def _gluon_kernel(x_shape, x_dtype, row, col, compute_capability):
    """(the `_triton` module of the Gluon kernel that computes this pair, None), or (None, why none does)."""
    from ._triton import quantize_fp8_gluon, quantize_mx_gluon

    reasons = []
    for module in (quantize_fp8_gluon, quantize_mx_gluon):
        why = module.why_not(x_shape, x_dtype, *_sides(row, col), compute_capability)
        if why is None:
            return module, None
        reasons.append(f"{module.__name__.rsplit('.', 1)[-1]}: {why}")
    return None, "; ".join(reasons)


def fused_kernel(x_shape, x_dtype, row, col, compute_capability) -> str:
    """Which kernel quantizes this (row, column) pair on the GPU by default: "gluon" where a Gluon kernel
    computes it and is the measured faster one (`_triton/quantize_fp8_gluon.py`: fp8 1 x 128 with its
    transposed 1 x 128 or 128 x 128 side, the fp8_deepseek recipe's activations and gradients;
    `_triton/quantize_mx_gluon.py`: the MX / nvfp4 pairs its `preferred` names), else "triton"
    (`quantize_kernels.quantize_kernel`)."""
    return "triton" if default_gluon_kernel(x_shape, x_dtype, row, col, compute_capability) is None else "gluon"


def default_gluon_kernel(x_shape, x_dtype, row, col, compute_capability):
    """The `_triton` module of the Gluon kernel dispatch runs for this pair (`fused_kernel`), or None."""
    module, _ = _gluon_kernel(x_shape, x_dtype, row, col, compute_capability)
    return module if module is not None and module.preferred(*_sides(row, col)) else None


def _launch(x, ts, *, row, col, compute_capability, kernel=None, decoded=False, **overrides):
    """The fused quantization of x (..., R, C). kernel: "gluon" / "triton" / None (`fused_kernel`'s
    choice; the Triton kernel when `overrides` tune its plan); overrides: `quantize_kernels.plan`'s, or with
    kernel="gluon" the Gluon kernel's launch settings (benchmarks/quant_variants.py). decoded: the Gluon
    MX kernel writing dequantized bf16 values (`decoded_pair`)."""
    from ._triton import jt, quantize_mx_gluon
    from ._triton.quantize_kernels import default_cvt, quantize_kernel

    x3 = x.reshape((-1,) + x.shape[-2:])
    if decoded:
        why = decoded_kernel_why_not(x.shape, row, col, compute_capability)
        if why is not None or kernel not in (None, "gluon"):
            raise ValueError(f"decoded values come from the Gluon MX kernel only: {why or kernel}")
        return quantize_mx_gluon.launch(x3, ts, *_sides(row, col), out_shapes(x.shape, row, col, True),
                                        compute_capability, decoded=True, **overrides)
    if kernel is None:
        kernel = "triton" if overrides else fused_kernel(x.shape, x.dtype, row, col, compute_capability)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    # The fp8 element encoder by target: the hardware conversion on NVIDIA sm_89+, integer ops elsewhere.
    cvt = overrides.pop("cvt", default_cvt(compute_capability))
    if kernel == "gluon":
        module, why = _gluon_kernel(x.shape, x.dtype, row, col, compute_capability)
        if module is None:
            raise ValueError(f"the Gluon quantization kernel does not apply: {why}")
        p = _plan(x.shape, row, col, cvt=cvt)
        return module.launch(x3, ts, *_sides(row, col), p.out_shapes, compute_capability, cvt=cvt,
                             **overrides)
    p = _plan(x.shape, row, col, cvt=cvt, **overrides)
    outs = jt.call(
        quantize_kernel, x3, ts.astype(jnp.float32).reshape(2),
        out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in p.out_shapes],
        grid=p.grid, num_warps=p.num_warps, num_stages=1, compute_capability=compute_capability,
        name="jbs_quantize", **p.constexprs,
    )
    return list(outs)


mlir.register_lowering(quantize_p, mlir.lower_fun(_reference, multiple_results=True), platform="cpu")
mlir.register_lowering(quantize_p, _gpu_lowering, platform="cuda")
mlir.register_lowering(quantize_p, _gpu_lowering, platform="rocm")


def _batching_rule(args, dims, *, row, col, decoded):
    x, ts = args
    dx, dts = dims
    if dts is not None:  # per-example tensor scales: the jnp quantizer, vmapped
        outs = jax.vmap(functools.partial(_reference, row=row, col=col, decoded=decoded), in_axes=(dx, dts))(x, ts)
        return outs, [0] * 4
    x = jnp.moveaxis(x, dx, 0)
    v = x.shape[0]
    outs = quantize_p.bind(x, ts, row=row, col=col, decoded=decoded)
    # The kernel's batch is the product of x's leading dims, mapped one first: split it back out.
    result = []
    for out, (shape, _) in zip(outs, out_shapes(x.shape, row, col, decoded)):
        result.append(out.reshape((v, shape[0] // v) + shape[1:]) if shape != (1,) else jnp.broadcast_to(out, (v, 1)))
    return result, [0] * 4


batching.primitive_batchers[quantize_p] = _batching_rule


def _cooked(values, scales, fmt: Format, lead_shape, length: int, ts) -> BlockScaledArray:
    """Kernel outputs back as the BlockScaledArray `quantize` returns."""
    values = values.reshape(lead_shape + values.shape[-2:])
    scales = scales.reshape(lead_shape + scales.shape[-2:])
    if fmt.element.bits == 8:
        values = lax.bitcast_convert_type(values, fmt.element.jnp_dtype)
    if isinstance(fmt, NVFP4Format):
        scales = lax.bitcast_convert_type(scales, jnp.float8_e4m3fn)
    return BlockScaledArray(values, scales, fmt, -1, length, ts if isinstance(fmt, NVFP4Format) else None)


def kernel_path(fmt: Optional[Format]) -> Optional[str]:
    """None when the fused kernel quantizes `fmt` on a GPU, else why the jnp quantizer runs there."""
    from ._triton.quantize_kernels import supported_side

    return supported_side(fmt)


def _bind(x, row_fmt, col_fmt, rounding, row_ts, col_ts, *, decoded: bool):
    """quantize_p on x (..., R, C) with the two tensor scales stacked (1 for a side without one)."""
    if x.ndim < 2:
        raise ValueError(f"a quantization pair needs x of rank >= 2 (..., R, C), got shape {x.shape}")
    one = jnp.ones((), jnp.float32)
    ts = jnp.stack([jnp.asarray(row_ts if row_ts is not None else one, jnp.float32).reshape(()),
                    jnp.asarray(col_ts if col_ts is not None else one, jnp.float32).reshape(())])
    return quantize_p.bind(x, ts, row=(row_fmt, rounding), col=(col_fmt, rounding), decoded=decoded)


def quantize_pair(x: jax.Array, row_fmt: Optional[Format], col_fmt: Optional[Format], *,
                  rounding: str = "rceil", row_ts=None, col_ts=None):
    """(quantize(x, row_fmt, axis=-1), quantize(swapaxes(x, -1, -2), col_fmt, axis=-1)) from one pass.

    x: (..., R, C) float32/bfloat16/float16, R, C > 0; formats resolved (`formats.get_format`); MX sides
    use `rounding`; nvfp4 sides use `row_ts` / `col_ts`, the float32 tensor scales (shape ()).
    Returns a pair of BlockScaledArrays (None for a side whose format is None).
    """
    rv, rs, cv, cs = _bind(x, row_fmt, col_fmt, rounding, row_ts, col_ts, decoded=False)
    lead = x.shape[:-2]
    row = None if row_fmt is None else _cooked(rv, rs, row_fmt, lead, x.shape[-1], row_ts)
    col = None if col_fmt is None else _cooked(cv, cs, col_fmt, lead, x.shape[-2], col_ts)
    return row, col


def quantize_with_transpose(x: jax.Array, fmt, t_fmt="same", *, rounding: str = "rceil", block=None,
                            t_block=None, tensor_scale=None, t_tensor_scale=None):
    """`(quantize(x, fmt, axis=-1), quantize(swapaxes(x, -1, -2), t_fmt, axis=-1))` from one read of x.

    What a training step needs for an operand that two GEMMs contract along different axes (x along K
    for the forward GEMM, along M for the weight gradient): on a GPU one kernel writes both, the second
    already transposed; elsewhere the jnp quantizer runs twice. Bit-identical to those two calls.

    Args:
      x: (..., R, C) float32/bfloat16/float16.
      fmt, t_fmt: format names or objects for the row side (along C) and the transposed side (along R);
        `t_fmt="same"` repeats `fmt`; either may be None to skip that side (returned as None).
        `block` / `t_block` choose fp8_block tiles as in `jax_blockscale.quantize`.
      rounding: MX scale rounding for both sides.
      tensor_scale, t_tensor_scale: nvfp4 sides only, as `quantize`'s `tensor_scale`: the per-tensor scale to
        use instead of computing tensor amax / (448 * 6) from x (one more pass over x per side, which a
        caller holding the amax, e.g. from an earlier step, avoids). With `t_fmt="same"`, t_tensor_scale
        defaults to tensor_scale.
    Returns:
      (BlockScaledArray or None, BlockScaledArray or None); the second has shape (..., C, R).
    """
    from .formats import get_format

    x = jnp.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"quantize_with_transpose needs x of rank >= 2 (..., R, C), got shape {x.shape}")
    if t_fmt == "same":
        t_fmt, t_block = fmt, block if t_block is None else t_block
        t_tensor_scale = tensor_scale if t_tensor_scale is None else t_tensor_scale
    row = None if fmt is None else get_format(fmt, block=block)
    col = None if t_fmt is None else get_format(t_fmt, block=t_block)
    row_ts = given_tensor_scale(row, tensor_scale)
    col_ts = given_tensor_scale(col, t_tensor_scale, "t_tensor_scale")
    return quantize_sides(x, row, col, rounding, row_ts=row_ts, col_ts=col_ts)


def quantize_sides(x: jax.Array, row: Optional[Format], col: Optional[Format], rounding: str, *,
                   decoded: bool = False, row_ts=None, col_ts=None):
    """`quantize_with_transpose` for resolved formats: the fused pair where it applies, else two jnp calls
    (a format the kernel does not take, an empty input, Explicit-axis sharding). decoded: each side as
    `Decoded` bf16 values (`decoded_pair`; MX / nvfp4 formats only) instead of a BlockScaledArray.
    row_ts / col_ts: an nvfp4 side's float32 tensor scale (shape ()), computed from x where None."""
    from . import _explicit_sharding as explicit
    from .api import quantize_operand
    from .quantize import nvfp4_tensor_scale

    if row is None and col is None:
        return None, None
    if decoded:
        _check_decodable(row, col)
    xt = jnp.swapaxes(x, -1, -2)
    fused = (USE_KERNEL and x.size > 0 and kernel_path(row) is None and kernel_path(col) is None
             and explicit.explicit_sharding(x) is None)
    if not fused:
        def one(xs, fmt, ts):
            if fmt is None:
                return None
            q = quantize_operand(xs, fmt, side="a", rounding=rounding, tensor_scale=ts)
            if not decoded:
                return q
            return Decoded(_canonical_nan(explicit.dequantize(_without_tensor_scale(q), jnp.bfloat16)),
                           q.tensor_scale)
        return one(x, row, row_ts), one(xt, col, col_ts)
    if isinstance(row, NVFP4Format) and row_ts is None:
        row_ts = nvfp4_tensor_scale(x)
    if isinstance(col, NVFP4Format) and col_ts is None:
        col_ts = nvfp4_tensor_scale(x, axis=-2)
    pair = decoded_pair if decoded else quantize_pair
    return pair(x, row, col, rounding=rounding, row_ts=row_ts, col_ts=col_ts)


# ---------------------------------------------------------------------------------------------------------
# Decoded sides: a quantization's values in bf16, for GEMMs that would decode the codes to bf16 anyway.


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Decoded:
    """An MX / nvfp4 quantization held as its dequantized values: `values` (..., rows, K) bf16, equal to
    `dequantize(q, bf16)` of the BlockScaledArray q quantized along K, except that nvfp4's float32 tensor
    scale is not multiplied in but kept in `tensor_scale` (None for MX), so that every value is exact in
    bf16 (an element times its block scale has at most 5 significant bits; results below bf16's smallest
    subnormal, 2**-133, round as `dequantize` rounds them). A GEMM of two Decoded operands is their bf16 dot
    times the tensor scales (recipes: Hopper, which has no tensor-core instruction for MX / nvfp4 scales)."""

    values: jax.Array
    tensor_scale: Optional[jax.Array] = None


def _check_decodable(row: Optional[Format], col: Optional[Format]) -> None:
    for fmt in (row, col):
        if fmt is not None and not isinstance(fmt, (MXFormat, NVFP4Format)):
            raise ValueError(f"decoded sides are MX or nvfp4 formats, got {fmt!r}: a block-FP8 GEMM reads its "
                             f"codes natively on every target")


def decoded_pair(x: jax.Array, row_fmt: Optional[Format], col_fmt: Optional[Format], *, rounding: str = "rceil",
                 row_ts=None, col_ts=None) -> tuple[Optional[Decoded], Optional[Decoded]]:
    """`quantize_pair`, decoded: (Decoded of x along C (..., R, C), Decoded of x along R stored transposed
    (..., C, R)), None for a side whose format is None. MX / nvfp4 formats only.

    On one CUDA device with sm_90+ the Gluon MX kernel writes the bf16 values in the same single pass that
    would write codes (`_triton/quantize_mx_gluon.py`, DECODED); elsewhere XLA runs the jnp quantizer and
    `dequantize`. Bit-identical either way (tests/test_gpu_quantize_decoded.py)."""
    _check_decodable(row_fmt, col_fmt)
    rv, _, cv, _ = _bind(x, row_fmt, col_fmt, rounding, row_ts, col_ts, decoded=True)
    lead = x.shape[:-2]
    row = None if row_fmt is None else Decoded(rv.reshape(lead + rv.shape[-2:]),
                                               row_ts if isinstance(row_fmt, NVFP4Format) else None)
    col = None if col_fmt is None else Decoded(cv.reshape(lead + cv.shape[-2:]),
                                               col_ts if isinstance(col_fmt, NVFP4Format) else None)
    return row, col
