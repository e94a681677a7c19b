"""The public matmul: operand checks, the pair table, `custom_vjp`, and `explain`."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional, Union

import jax
import jax.numpy as jnp
from jax import lax

from . import _explicit_sharding as explicit
from . import backends, partitioning, primitive, validation
from ._triton.problem import DTYPE_NAMES, TileConfig
from .formats import DEEPSEEK_TILES, FormatLike, MXFormat, NVFP4Format, format_for_side
from .quantize import DEFAULT_ROUNDING, ROUNDING_MODES, BlockScaledArray, quantize

__all__ = ["matmul", "explain", "explain_all", "operand_kind", "quantize_operand", "quantizer"]

Operand = Union[BlockScaledArray, jax.Array]
_DENSE_NAMES = {"bf16": jnp.bfloat16, "bfloat16": jnp.bfloat16, "fp16": jnp.float16, "float16": jnp.float16,
                "fp32": jnp.float32, "float32": jnp.float32}


def operand_kind(x: Operand, side: str) -> str:
    """The kernel-table name of an operand: element kind (MX), 'nvfp4', 'block_fp8', or its dense dtype."""
    if not isinstance(x, BlockScaledArray):
        return DTYPE_NAMES[jnp.dtype(x.dtype)]
    fmt = x.fmt
    if isinstance(fmt, MXFormat):
        return fmt.element.name
    if isinstance(fmt, NVFP4Format):
        return "nvfp4"
    rows, cols = fmt.tile
    # The block-FP8 kernels implement DeepSeek-V3's pairing: 1x128 activation groups, 128x128 weight tiles.
    return "block_fp8" if fmt.tile == DEEPSEEK_TILES[side] else f"fp8_block_{rows}x{cols}"


@dataclasses.dataclass(frozen=True)
class _Static:
    out_dtype: jnp.dtype
    a_format: Optional[FormatLike]
    b_format: Optional[FormatLike]
    rounding: str
    target: Optional[str]
    config: Optional[TileConfig]
    transpose_out: bool = False


def quantize_operand(x: jax.Array, fmt: Optional[FormatLike], *, side: str,
                     rounding: str = DEFAULT_ROUNDING, tensor_scale=None) -> Operand:
    """`x` prepared as matmul side "a" (activations, (..., M, K)) or "b" (weight, (..., N, K)).

    A format quantizes along K ("fp8_block" by name takes DeepSeek-V3's tile for the side: 1x128 for a,
    128x128 for b; `rounding` applies to MX formats only, default "rceil"; `tensor_scale` to nvfp4 only, as
    in `quantize`); "bf16"/"fp16"/"fp32" cast; None returns `x`.
    """
    validation.check_side(side)
    if rounding not in ROUNDING_MODES:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {ROUNDING_MODES}")
    if fmt is None:
        return x
    if isinstance(fmt, str) and fmt.lower() in _DENSE_NAMES:
        return jnp.asarray(x).astype(_DENSE_NAMES[fmt.lower()])
    spec = format_for_side(fmt, side)
    # nvfp4 and fp8_block scales are not powers of two: the MX rounding mode does not apply to them.
    kw = dict(rounding=rounding) if isinstance(spec, MXFormat) else {}
    if tensor_scale is not None:
        kw["tensor_scale"] = tensor_scale  # quantize refuses it for formats other than nvfp4
    return explicit.quantize(lambda t: quantize(t, spec, axis=-1, **kw), x, spec)


def _maybe_quantize(x: Operand, fmt, rounding: str, name: str) -> Operand:
    if fmt is not None and isinstance(x, BlockScaledArray):
        raise ValueError(f"{name} is already quantized ({x.fmt.name}); drop {name}_format=")
    return quantize_operand(x, fmt, side=name, rounding=rounding)


def _raw(x: Operand, other: Operand, side: str):
    """Primitive operands and spec for one side; dense K is zero-padded to the other side's padded K."""
    if isinstance(x, BlockScaledArray):
        ts = x.tensor_scale if x.tensor_scale is not None else jnp.ones((), jnp.float32)
        spec = primitive.OperandSpec(x.fmt, operand_kind(x, side), x.length)
        scales = x.scales
        if scales.dtype == jnp.float8_e8m0fnu:  # e8m0 as jax.nn stores it: the kernels read the uint8 codes
            scales = lax.bitcast_convert_type(scales, jnp.uint8)
        return (x.values, scales, ts), spec
    values = x
    if isinstance(other, BlockScaledArray):
        pad = other.padded_length - x.shape[-1]
        values = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x
    dummy_scales = jnp.zeros(x.shape[:-1] + (1,), jnp.uint8)
    spec = primitive.OperandSpec(None, operand_kind(x, side), x.shape[-1])
    return (values, dummy_scales, jnp.ones((), jnp.float32)), spec


def _forward(a: Operand, b: Operand, s: _Static) -> jax.Array:
    (av, asc, ats), aspec = _raw(a, b, "a")
    (bv, bsc, bts), bspec = _raw(b, a, "b")
    # partitioning.bind: the primitive with sharding rules, so a sharded jit does not gather the operands.
    return partitioning.bind(av, asc, ats, bv, bsc, bts, a=aspec, b=bspec, out_dtype=s.out_dtype,
                             target=s.target, config=s.config, transpose_out=s.transpose_out)


def _as_f32(x: Operand) -> jax.Array:
    return explicit.dequantize(x, jnp.float32) if isinstance(x, BlockScaledArray) else x.astype(jnp.float32)


def _sum_to_shape(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    keep = tuple(i for i, d in enumerate(shape) if d == 1 and x.shape[i] != 1)
    return x.sum(axis=keep, keepdims=True) if keep else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(a: Operand, b: Operand, s: _Static) -> jax.Array:
    return _forward(_maybe_quantize(a, s.a_format, s.rounding, "a"),
                    _maybe_quantize(b, s.b_format, s.rounding, "b"), s)


def _matmul_fwd(a, b, s):
    qa = _maybe_quantize(a, s.a_format, s.rounding, "a")
    qb = _maybe_quantize(b, s.b_format, s.rounding, "b")
    return _forward(qa, qb, s), (a, b, qa, qb)


def _matmul_bwd(s, residuals, g):
    """High-precision backward: float32 products with the dequantized other operand.

    Dense operands (quantized inside through a_format/b_format or not) get the straight-through gradient;
    BlockScaledArray operands are constants and get a zero cotangent.
    """
    a, b, qa, qb = residuals
    g = g.astype(jnp.float32)
    if s.transpose_out:  # the cotangent of the (.., N, M) result, as the (.., M, N) product's
        g = jnp.swapaxes(g, -1, -2)
    hp = dict(precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)

    # On a mesh with Explicit axes the contraction (over N for da, M for db) may be sharded on both sides,
    # so each product names its sharding, and a cotangent must have its primal's exactly.
    def grad_a():
        shape = jnp.broadcast_shapes(g.shape[:-2], qb.shape[:-2]) + a.shape[-2:]
        out = explicit.grad_sharding(a, g, shape)
        da = jnp.einsum("...mn,...nk->...mk", g, _as_f32(qb), out_sharding=out, **hp)
        return explicit.like(_sum_to_shape(da, a.shape).astype(a.dtype), explicit.explicit_sharding(a))

    def grad_b():
        shape = jnp.broadcast_shapes(g.shape[:-2], qa.shape[:-2]) + b.shape[-2:]
        out = explicit.grad_sharding(b, g, shape)
        db = jnp.einsum("...mn,...mk->...nk", g, _as_f32(qa), out_sharding=out, **hp)
        return explicit.like(_sum_to_shape(db, b.shape).astype(b.dtype), explicit.explicit_sharding(b))

    da = jax.tree_util.tree_map(jnp.zeros_like, a) if isinstance(a, BlockScaledArray) else grad_a()
    db = jax.tree_util.tree_map(jnp.zeros_like, b) if isinstance(b, BlockScaledArray) else grad_b()
    return _zero_float0(da), _zero_float0(db)


def _zero_float0(tree):
    def leaf(x):
        if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
            return jnp.zeros(x.shape, jax.dtypes.float0)
        return x
    return jax.tree_util.tree_map(leaf, tree)


_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def matmul(
    a: Operand,
    b: Operand,
    *,
    out_dtype=jnp.bfloat16,
    a_format: Optional[FormatLike] = None,
    b_format: Optional[FormatLike] = None,
    rounding: str = DEFAULT_ROUNDING,
    target: Optional[str] = None,
    config: Optional[TileConfig] = None,
    transpose_out: bool = False,
) -> jax.Array:
    """Block-scaled matmul `a (..., M, K) x b (..., N, K) -> (..., M, N)` (b is the weight, transposed).

    Each operand is a `BlockScaledArray` quantized along K, or a dense float array. A dense operand with
    `a_format=`/`b_format=` is quantized inside (MX formats with `rounding=`, default "rceil") and gets a
    straight-through gradient. Runs the Triton kernel for the target (`target=None` detects it: "sm_100",
    "sm_90", "gfx950"; naming one lets you lower for hardware you don't have) and the jnp reference on CPU;
    see `explain`, which accepts and rejects exactly the same operands and targets. Works under jit, vmap
    (one launch) and grad (float32 backward). Every check runs before any compute, at trace time under jit.

    `transpose_out=True` returns the product transposed, (..., N, M), with the same bits: the Hopper block
    FP8 kernel writes it so from its epilogue (no transpose pass; a (K, N) weight's gradient uses this),
    any other path transposes after the product.
    """
    if jnp.dtype(out_dtype) not in DTYPE_NAMES:
        raise ValueError(f"out_dtype must be bfloat16, float16 or float32, got {jnp.dtype(out_dtype)}")
    target = validation.check_target(target)
    if not isinstance(a, BlockScaledArray):
        a = jnp.asarray(a)
    if not isinstance(b, BlockScaledArray):
        b = jnp.asarray(b)
    s = _Static(jnp.dtype(out_dtype), a_format, b_format, rounding, target, config, bool(transpose_out))
    qa_shape = jax.eval_shape(lambda x: _maybe_quantize(x, a_format, rounding, "a"), a)
    qb_shape = jax.eval_shape(lambda x: _maybe_quantize(x, b_format, rounding, "b"), b)
    validation.check_matmul_operands(qa_shape, qb_shape)
    return _matmul(a, b, s)


def explain(a: Operand | FormatLike, b: Operand | FormatLike, *, target: Optional[str] = None,
            rows: Optional[int] = None) -> backends.Choice:
    """Which path runs for this pair: `Choice(target, path, kernel, why)`, path one of native / upcast /
    reference. `a`/`b` are operands or format names ("mxfp8", "nvfp4", "bf16", ...). `rows`: activation
    rows (batch * M) against an unbatched weight, which can pick a decode kernel; by default the rows of
    `a` when `a` and `b` are unbatched operands, else a large problem.

    Raises exactly where `matmul` would (the same `validation.check_matmul_operands` and `check_target`):
    an incompatible pair, an inconsistent `BlockScaledArray`, an unknown explicit target.
    """
    return _explain(a, b, validation.check_target(target) or backends.detect_target(), rows)


def _explain(a, b, target: str, rows: Optional[int] = None,
             names_nk: Optional[tuple[int, int]] = None) -> backends.Choice:
    """`names_nk`: (N, K) that dispatch sees for format names (whose stand-ins have no N and one block of K), for
    size-dependent entries."""
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, BlockScaledArray):
            validation.check_block_scaled(x, name)  # before reading its shape for the stand-in's K
    k = _explain_k(a, b)
    qa, qb = _abstract(a, "a", k), _abstract(b, "b", k)
    validation.check_matmul_operands(qa, qb)
    n = None
    if not _is_name(a) and not _is_name(b) and len(b.shape) == 2:
        n = b.shape[0]  # after validation: an inconsistent operand has no trusted shape
        if rows is None:
            rows = math.prod(a.shape[:-1])
    elif _is_name(a) and _is_name(b) and names_nk is not None:
        n, k = names_nk
    return backends.choose(target, operand_kind(qa, "a"), operand_kind(qb, "b"), rows=rows, n=n, k=k)


def _is_name(x) -> bool:
    return not (isinstance(x, BlockScaledArray) or hasattr(x, "dtype"))


def _block_of(x, side: str) -> int:
    if isinstance(x, str) and x.lower() in _DENSE_NAMES:
        return 1
    return format_for_side(x, side).block


def _explain_k(a, b) -> int:
    """K of the stand-in operands for format names: an operand's own K, else one block of both formats."""
    for x in (a, b):
        if not _is_name(x):
            return x.shape[-1]
    return math.lcm(_block_of(a, "a"), _block_of(b, "b"))


def _abstract(x, side: str, k: int):
    """`x` itself, or for a format name the shapes of a one-row (1, k) operand of that format."""
    if not _is_name(x):
        return x
    return jax.eval_shape(lambda: quantize_operand(jnp.zeros((1, k), jnp.float32), x, side=side))


# explain_all's decode lines: (activations, weights), labelled by the weights alone unless two pairs share them.
_DECODE_PICKS = (("bf16", "mxfp4"), ("bf16", "nvfp4"), ("mxfp8", "mxfp8"), ("fp8_block", "fp8_block"),
                 ("bf16", "fp8_block"))
# The weight shape of explain_all's decode lines (issue #12's headline shape): some decode entries apply by N and K.
_DECODE_PICK_NK = (7168, 4096)
_DECODE_PICK_LABELS = {(a, b): b if [w for _, w in _DECODE_PICKS].count(b) == 1 else f"{a} x {b}"
                       for a, b in _DECODE_PICKS}

_EXPLAIN_PAIRS = (
    ("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8_e5m2"), ("mxfp6_e2m3", "mxfp6_e2m3"),
    ("mxfp6_e3m2", "mxfp6_e3m2"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"),
    ("bf16", "mxfp4"), ("bf16", "nvfp4"), ("fp8_block", "fp8_block"), ("bf16", "fp8_block"),
)


def explain_all(target: Optional[str] = None) -> str:
    """A table (a string: `print(jb.explain_all())`) of the path each common format pair takes on `target`
    (default: this machine)."""
    target = validation.check_target(target) or backends.detect_target()
    lines = [f"target: {target}"]
    for a, b in _EXPLAIN_PAIRS:
        c = _explain(a, b, target)
        lines.append(f"  {a:>11} x {b:<11} {c.path:<9} {c.kernel or '-':<18} {c.why}")
    for rows in (1, 16, backends.DECODE_MAX_ROWS):
        picks = ", ".join(f"{_DECODE_PICK_LABELS[a, b]}: "
                          f"{_explain(a, b, target, rows, names_nk=_DECODE_PICK_NK).kernel or 'reference'}"
                          for a, b in _DECODE_PICKS)
        lines.append(f"  {rows:>2} rows x one {_DECODE_PICK_NK[0]} x {_DECODE_PICK_NK[1]} weight: {picks}")
    lines.append("quantization (jb.quantize along the last axis, jb.quantize_with_transpose, the recipes):")
    by_quantizer: dict[str, list[str]] = {}
    for name, block in (("mxfp8", None), ("mxfp6_e2m3", None), ("mxfp4", None), ("nvfp4", None),
                        ("fp8_block", (1, 128)), ("fp8_block", (128, 128))):
        label = name if block is None else f"{name} {block[0]}x{block[1]}"
        by_quantizer.setdefault(quantizer(name, target=target, block=block), []).append(label)
    for how, labels in by_quantizer.items():
        lines.append(f"  {', '.join(labels)}: {how}")
    return "\n".join(lines)


def quantizer(fmt: FormatLike, target: Optional[str] = None, *, block: Optional[tuple[int, int]] = None) -> str:
    """Which quantizer `jb.quantize` (last axis) / `quantize_with_transpose` run for `fmt` on `target`
    (default: this machine): the one-pass kernel or the jnp quantizer, and why."""
    from . import quantize_primitive
    from .formats import get_format

    target = validation.check_target(target) or backends.detect_target()
    why_not = quantize_primitive.kernel_path(get_format(fmt, block=block))
    if target == "cpu" or not (target.startswith("sm_") or target.startswith("gfx")):
        return "jnp quantizer (XLA): no GPU kernel on this target"
    if why_not is not None:
        return f"jnp quantizer (XLA): {why_not}"
    fmt = get_format(fmt, block=block)
    side, cc = (fmt, "rceil"), primitive._compute_capability(target)

    def kernel_file(col) -> str:
        module = quantize_primitive.default_gluon_kernel((128, 128), "bfloat16", side, col, cc)
        if module is None:
            return "_triton/quantize_kernels.py"
        return f"the Gluon kernel _triton/{module.__name__.rsplit('.', 1)[-1]}.py"

    alone, paired = kernel_file((None, "rceil")), kernel_file(side)
    how = f"one-pass kernel ({alone}, bit-identical to the jnp quantizer)"
    if paired != alone:
        how += f"; with its transposed side (quantize_with_transpose, the recipes): {paired}"
    if fmt.name == "nvfp4" and "quantize_mx_gluon" in alone + paired:
        from ._triton.quantize_kernels import SHORT_PATH_TS

        lo, hi = (int(math.log2(v)) for v in SHORT_PATH_TS)
        how += (f"; nvfp4 there takes a short path for tensor scales in [2^{lo}, 2^{hi}] or 0, the general "
                "path for the others (same bits)")
    return how + "; the jnp quantizer in programs partitioned over several devices"
