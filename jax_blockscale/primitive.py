"""The `blockscaled_matmul` JAX primitive: abstract eval, per-platform lowering, batching.

Operands (all arrays; absent scales/tensor scales are small dummies so the signature is fixed):
  a_values (*a_batch, M, Ka), a_scales (*a_batch, Ma, Ksa), a_ts (a_batch-broadcastable or ()),
  b_values (*b_batch, N, Kb), b_scales (*b_batch, Nb, Ksb), b_ts likewise,
with b_batch broadcastable against a_batch (numpy rules). Output (*broadcast(a_batch, b_batch), M, N), or
with `transpose_out` (*batch, N, M): the product transposed, which a kernel that can writes so in its
epilogue (`launcher.WRITES_TRANSPOSED`) and every other path transposes after the product.

Lowering: `cpu` (and any GPU target without a kernel) runs the jnp reference; `cuda`/`rocm` run the Triton
launcher that `backends.choose` picks, through jax-triton (imported only there).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jcore
from jax.interpreters import batching, mlir

from . import backends, reference
from ._triton import configs, jt
from ._triton.problem import DTYPE_NAMES, ELEMENTS_PER_BYTE, GemmProblem, TileConfig
from .formats import Format
from .quantize import BlockScaledArray, dequantize

__all__ = ["OperandSpec", "blockscaled_matmul_p", "bind"]

# Kernels tile K by up to 256 elements; padding K here (zeros, rarely needed) keeps them mask-free along K.
_K_ALIGN = 256


@dataclasses.dataclass(frozen=True)
class OperandSpec:
    """Static description of one operand: its format (None for dense), kind and logical K."""

    fmt: Optional[Format]
    kind: str
    length: int


blockscaled_matmul_p = jcore.Primitive("blockscaled_matmul")


def bind(a_values, a_scales, a_ts, b_values, b_scales, b_ts, *, a: OperandSpec, b: OperandSpec,
         out_dtype, target: Optional[str], config: Optional[TileConfig], transpose_out: bool = False):
    return blockscaled_matmul_p.bind(
        a_values, a_scales, a_ts, b_values, b_scales, b_ts,
        a=a, b=b, out_dtype=jnp.dtype(out_dtype), target=target, config=config,
        transpose_out=bool(transpose_out),
    )


def _batch_shapes(a_values, b_values):
    return a_values.shape[:-2], b_values.shape[:-2]


def _abstract_eval(a_values, a_scales, a_ts, b_values, b_scales, b_ts, *, a, b, out_dtype, target, config,
                   transpose_out):
    del a_scales, a_ts, b_scales, b_ts, a, target, config
    a_batch, b_batch = _batch_shapes(a_values, b_values)
    batch = jnp.broadcast_shapes(a_batch, b_batch)
    m, n = a_values.shape[-2], b_values.shape[-2]
    return jax.core.ShapedArray((*batch, *((n, m) if transpose_out else (m, n))), out_dtype)


blockscaled_matmul_p.def_abstract_eval(_abstract_eval)
blockscaled_matmul_p.def_impl(functools.partial(jax._src.dispatch.apply_primitive, blockscaled_matmul_p))


def _operand(values, scales, ts, spec: OperandSpec):
    """Primitive operands of one side back as what `reference.matmul` takes: a BlockScaledArray or dense."""
    if spec.fmt is None:
        return values
    # Both operands keep their zero padding along K (the same for every compatible pair).
    padded = values.shape[-1] * spec.fmt.elements_per_byte
    tensor_scale = None
    if spec.kind == "nvfp4":
        # Batched tensor scales (from vmap) align with the batch dims; give all three one batch shape so
        # dequantize applies them exactly as on the unbatched array.
        batch = jnp.broadcast_shapes(ts.shape, values.shape[:-2])
        values = jnp.broadcast_to(values, batch + values.shape[-2:])
        scales = jnp.broadcast_to(scales, batch + scales.shape[-2:])
        tensor_scale = jnp.broadcast_to(ts, batch)
    return BlockScaledArray(values, scales, spec.fmt, -1, padded, tensor_scale)


def _dequantized(values, scales, ts, spec: OperandSpec) -> jax.Array:
    x = _operand(values, scales, ts, spec)
    return dequantize(x, jnp.float32) if isinstance(x, BlockScaledArray) else x.astype(jnp.float32)


def reference_impl(a_values, a_scales, a_ts, b_values, b_scales, b_ts, *, a, b, out_dtype, transpose_out=False,
                   **_):
    """The oracle, `jax_blockscale.reference.matmul`, on primitive operands."""
    out = reference.matmul(_operand(a_values, a_scales, a_ts, a), _operand(b_values, b_scales, b_ts, b),
                           out_dtype=out_dtype)
    return jnp.swapaxes(out, -1, -2) if transpose_out else out


def _pad_last_to(x: jax.Array, size: int) -> jax.Array:
    pad = size - x.shape[-1]
    if pad == 0:
        return x
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)])


def _kernel_impl(a_values, a_scales, a_ts, b_values, b_scales, b_ts, *, a, b, out_dtype, target, config,
                 compute_capability, transpose_out=False, device_kind=None):
    """GPU path: canonicalize to the launcher contract (`_triton/problem.py`) and launch."""
    a_batch, b_batch = _batch_shapes(a_values, b_values)
    batch = jnp.broadcast_shapes(a_batch, b_batch)
    m, n = a_values.shape[-2], b_values.shape[-2]
    b_batched = any(d != 1 for d in b_batch)
    nb = int(np.prod(batch, dtype=np.int64))
    # Decode kernels apply to few activation rows against one (unbatched) weight.
    choice = backends.choose(target, a.kind, b.kind, rows=None if b_batched else nb * m, n=n,
                             k=a_values.shape[-1] * ELEMENTS_PER_BYTE.get(a.kind, 1),
                             kernel=config.kernel if config is not None else None,
                             configured=config is not None)
    if choice.path == "reference":
        return reference_impl(a_values, a_scales, a_ts, b_values, b_scales, b_ts, a=a, b=b,
                              out_dtype=out_dtype, transpose_out=transpose_out)
    launcher = choice.load()
    # One product, written transposed by the kernel where it can; else transposed below, after the product.
    kernel_transposes = transpose_out and nb == 1 and getattr(launcher, "WRITES_TRANSPOSED", False)

    def flat(x, lead):
        return x.reshape((lead,) + x.shape[len(x.shape) - 2:])

    if b_batched:
        a_values, a_scales = (jnp.broadcast_to(x, batch + x.shape[-2:]) for x in (a_values, a_scales))
        b_values, b_scales = (jnp.broadcast_to(x, batch + x.shape[-2:]) for x in (b_values, b_scales))
        b_values, b_scales = flat(b_values, nb), flat(b_scales, nb)
    else:
        b_values, b_scales = b_values.reshape(b_values.shape[-2:]), b_scales.reshape(b_scales.shape[-2:])
        a_values, a_scales = (jnp.broadcast_to(x, batch + x.shape[-2:]) for x in (a_values, a_scales))
    a_values, a_scales = flat(a_values, nb), flat(a_scales, nb)

    epb_a, epb_b = (ELEMENTS_PER_BYTE.get(s.kind, 1) for s in (a, b))
    k = a_values.shape[-1] * epb_a
    if k != b_values.shape[-1] * epb_b:
        raise ValueError(f"padded K differs between operands: {k} vs {b_values.shape[-1] * epb_b}")
    k_padded = k + (-k % _K_ALIGN)
    a_values = _pad_last_to(a_values, k_padded // epb_a)
    b_values = _pad_last_to(b_values, k_padded // epb_b)
    if a.fmt is not None:
        a_scales = _pad_last_to(a_scales, k_padded // a.fmt.block)
    if b.fmt is not None:
        b_scales = _pad_last_to(b_scales, k_padded // b.fmt.block)

    scalar_alpha = a_ts.ndim == 0 and b_ts.ndim == 0
    p = GemmProblem(batch=nb, b_batched=b_batched, m=m, n=n, k=k_padded, a_kind=a.kind, b_kind=b.kind,
                    out_dtype=DTYPE_NAMES[jnp.dtype(out_dtype)])
    cfg = config or configs.select(choice.kernel, launcher, p, target, device_kind)
    if getattr(launcher, "TAKES_TENSOR_SCALES", False):
        # The tensor scales go in as they are and are multiplied in the kernel: no XLA multiply kernel.
        ones = jnp.ones((1,), jnp.float32)
        ts = (a_ts, b_ts) if scalar_alpha else (ones, ones)
        out = launcher.launch(p, a_values, a_scales, b_values, b_scales, ones, config=cfg,
                              compute_capability=compute_capability, a_ts=ts[0], b_ts=ts[1])
    else:
        alpha = (a_ts * b_ts).astype(jnp.float32).reshape(1) if scalar_alpha else jnp.ones((1,), jnp.float32)
        kw = dict(transpose_out=True) if kernel_transposes else {}
        out = launcher.launch(p, a_values, a_scales, b_values, b_scales, alpha, config=cfg,
                              compute_capability=compute_capability, **kw)
    if kernel_transposes:
        out = out.reshape(batch + (n, m))
    else:
        out = out.reshape(batch + (m, n))
        if transpose_out:
            out = jnp.swapaxes(out, -1, -2)
    if not scalar_alpha:
        ts = jnp.broadcast_to(a_ts, batch) * jnp.broadcast_to(b_ts, batch)
        out = (out.astype(jnp.float32) * ts[..., None, None]).astype(out_dtype)
    return out


def _compute_capability(target: str) -> Optional[int]:
    if target.startswith("sm_"):
        return int(target[3:])
    return None


def _gpu_lowering(ctx, *args, target, **params):
    device = _lowering_device(ctx)
    if target is None:
        if device is None:
            raise ValueError(f"cannot detect the {ctx.module_context.platforms[0]} target without a device; "
                             "pass target= (e.g. 'sm_90', 'sm_100')")
        target = backends.detect_target(device)
    # The tuned tables describe the device in hand, so they apply only when lowering for its own target.
    own = device is not None and backends.detect_target(device) == backends._normalize_target(target)
    fn = functools.partial(_kernel_impl, target=target, compute_capability=_compute_capability(target),
                           device_kind=device.device_kind if own else None, **params)
    # The kernels' ROCm lowering takes the architecture from here, not from a device (there may be none).
    with jt.lowering_target(backends._normalize_target(target)):
        return mlir.lower_fun(fn, multiple_results=False)(ctx, *args)


def _lowering_device(ctx) -> Optional[jax.Device]:
    # The module is lowered for the devices it will run on; jax.devices() of the lowering platform is the
    # best information available at lowering time (none when lowering for a GPU on a CPU-only machine).
    try:
        return jax.devices(ctx.module_context.platforms[0])[0]
    except RuntimeError:
        return None


def _cpu_lowering(ctx, *args, **params):
    params.pop("target"), params.pop("config")
    return mlir.lower_fun(functools.partial(reference_impl, **params), multiple_results=False)(ctx, *args)


mlir.register_lowering(blockscaled_matmul_p, _cpu_lowering, platform="cpu")
mlir.register_lowering(blockscaled_matmul_p, _gpu_lowering, platform="cuda")
mlir.register_lowering(blockscaled_matmul_p, _gpu_lowering, platform="rocm")


def _batching_rule(args, dims, **params):
    """vmap in one launch, whatever is batched.

    Batched activations with an unbatched weight keep the weight as it is, so the lowering folds the batch
    into M; a batched weight gives both sides a leading batch dim and the lowering uses a batched grid.
    Batch dims of the two sides broadcast like numpy's, so each side gets its new dim at the front,
    padded with singleton dims to line up with the other side.
    """
    size = next(x.shape[d] for x, d in zip(args, dims) if d is not None)
    # batch ranks of each side's values, not counting the dim being mapped
    a_rank = args[0].ndim - 2 - (dims[0] is not None)
    b_rank = args[3].ndim - 2 - (dims[3] is not None)
    b_mapped = any(d is not None for d in dims[3:])
    rank = max(a_rank, b_rank)

    def side(xs, ds, own_rank, mapped):
        values, scales, ts = xs
        if not mapped:
            if ts.ndim:  # a tensor scale aligns with the batch dims: give it the new (singleton) dim too
                ts = ts.reshape((1,) * (rank + 1 - ts.ndim) + ts.shape)
            return values, scales, ts

        def front(x, d, matrix_dims):
            if d is None:
                x = jnp.broadcast_to(x, (size,) + x.shape)
            else:
                x = jnp.moveaxis(x, d, 0)
            # singleton dims after the new one so this side's batch dims right-align with the other's
            missing = rank + 1 + matrix_dims - x.ndim
            return x.reshape(x.shape[:1] + (1,) * missing + x.shape[1:])

        values, scales = front(values, ds[0], 2), front(scales, ds[1], 2)
        if ds[2] is not None or ts.ndim:
            ts = front(ts, ds[2], 0)
        return values, scales, ts

    a_side = side(args[:3], dims[:3], a_rank, True)
    b_side = side(args[3:], dims[3:], b_rank, b_mapped)
    return blockscaled_matmul_p.bind(*a_side, *b_side, **params), 0


batching.primitive_batchers[blockscaled_matmul_p] = _batching_rule
