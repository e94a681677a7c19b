"""Meshes with Explicit axes ("sharding in types"): the shardings jax cannot infer for this library's ops.

On such a mesh every array's type carries its sharding, and jax's typing rules reject three things this
library does: a dot whose contraction is sharded on both sides (the backward GEMMs: the output sharding is
ambiguous), a reshape that splits a sharded dim into blocks (quantization and dequantization), and a
`custom_vjp` cotangent whose sharding differs from its primal operand's. The helpers here state those
shardings, chosen as the Auto-mesh path ends up with them:

- quantization runs with the mesh axes switched to Auto (`jax.sharding.auto_axes`), from the input resharded
  so that every shard holds whole blocks (and whole rows of 2-D fp8 tiles); values and scales come out with
  that sharding, the nvfp4 tensor scale replicated. A dim that cannot be split into whole blocks is
  replicated, as `partitioning` gathers it for the matmul anyway.
- dequantization likewise, with the result sharded as the values (K only when it has no padding).
- a dense NT dot gets the output sharding of the primitive: batch and M from a, N from b; a gradient gets
  its primal operand's sharding.

Every helper is the plain operation when no operand is typed on a mesh with Explicit axes (Auto meshes,
no mesh, or all-Manual axes inside `shard_map`), so nothing changes there.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from .formats import BlockFP8Format, Format
from .quantize import BlockScaledArray, dequantize as _dequantize

__all__ = ["dequantize", "explicit_sharding", "grad_sharding", "like", "nt_dot", "nt_out_sharding", "quantize",
           "quantized_spec"]


def explicit_sharding(x) -> Optional[NamedSharding]:
    """The NamedSharding in `x`'s type if its mesh has an Explicit axis, else None."""
    leaf = x.values if isinstance(x, BlockScaledArray) else x
    sharding = getattr(jax.typeof(leaf), "sharding", None)
    if not isinstance(sharding, NamedSharding) or sharding.mesh.empty:
        return None
    if not any(t == AxisType.Explicit for t in sharding.mesh.axis_types):
        return None
    return sharding


def _explicit_axes(mesh) -> tuple[str, ...]:
    # Only these switch to Auto: inside a shard_map over some axes, the Manual ones must stay Manual.
    return tuple(a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit)


def _axes(spec: PartitionSpec, dim: int) -> tuple[str, ...]:
    entry = spec[dim] if dim < len(spec) else None
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _entries(spec: PartitionSpec, ndim: int) -> list[tuple[str, ...]]:
    return [_axes(spec, d) for d in range(ndim)]


def _pspec(entries: Sequence[tuple[str, ...]]) -> PartitionSpec:
    return PartitionSpec(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in entries])


def _fit(axes: tuple[str, ...], units: int, mesh) -> tuple[str, ...]:
    """The longest prefix of `axes` that splits `units` whole units evenly."""
    while axes and units % math.prod(mesh.shape[a] for a in axes):
        axes = axes[:-1]
    return axes


def _whole(axes: tuple[str, ...], size: int, unit: int, mesh) -> tuple[str, ...]:
    return _fit(axes, size // unit, mesh) if size % unit == 0 else ()


def quantized_spec(shape: Sequence[int], spec: PartitionSpec, fmt: Format, mesh) -> PartitionSpec:
    """Sharding of values and scales of `x` (sharded `spec`) quantized along its last axis in `fmt`.

    K keeps the mesh axes that split it into whole blocks without padding, the rows of 2-D fp8 tiles the
    axes that split them into whole tiles (the units `partitioning` shards); other dims keep theirs.
    """
    entries = _entries(spec, len(shape))
    entries[-1] = _whole(entries[-1], shape[-1], fmt.block, mesh)
    if isinstance(fmt, BlockFP8Format) and fmt.tile[0] > 1 and len(shape) >= 2:
        entries[-2] = _whole(entries[-2], shape[-2], fmt.tile[0], mesh)
    return _pspec(entries)


def quantize(fn: Callable[[jax.Array], BlockScaledArray], x: jax.Array, fmt: Format) -> BlockScaledArray:
    """`fn(x)`, a quantization of `x` along its last axis in `fmt`, typed on an Explicit mesh."""
    sharding = explicit_sharding(x)
    if sharding is None:
        return fn(x)
    mesh = sharding.mesh
    spec = quantized_spec(x.shape, sharding.spec, fmt, mesh)
    # Whole blocks on every device before quantizing: then the block reductions stay local.
    x = jax.sharding.reshard(x, NamedSharding(mesh, spec))
    out = jax.eval_shape(fn, jax.ShapeDtypeStruct(x.shape, x.dtype))
    shardings = jax.tree_util.tree_map(
        lambda leaf: NamedSharding(mesh, spec if leaf.ndim else PartitionSpec()), out)
    return jax.sharding.auto_axes(fn, axes=_explicit_axes(mesh), out_sharding=shardings)(x)


def dequantize(q: BlockScaledArray, dtype) -> jax.Array:
    """`jax_blockscale.dequantize(q, dtype)`, typed on an Explicit mesh like `q.values`."""
    sharding = explicit_sharding(q)
    if sharding is None:
        return _dequantize(q, dtype)
    entries = _entries(sharding.spec, q.values.ndim)
    axis = q.axis % q.values.ndim
    if q.length != q.padded_length:
        entries[axis] = ()  # the padding is sliced off the last shard: the logical K is not split evenly
    out = NamedSharding(sharding.mesh, _pspec(entries))
    return jax.sharding.auto_axes(lambda t: _dequantize(t, dtype), axes=_explicit_axes(sharding.mesh),
                                  out_sharding=out)(q)


def nt_out_sharding(a, b) -> Optional[NamedSharding]:
    """Sharding of `a (..., M, K) x b (..., N, K) -> (..., M, N)` on an Explicit mesh, else None: batch
    dims and M as in `a` (batch dims `a` lacks as in `b`), N as in `b` unless those axes are taken."""
    sa, sb = explicit_sharding(a), explicit_sharding(b)
    if sa is None and sb is None:
        return None
    shape_a, shape_b = tuple(a.shape), tuple(b.shape)
    ea = _entries(sa.spec, len(shape_a)) if sa is not None else [()] * len(shape_a)
    eb = _entries(sb.spec, len(shape_b)) if sb is not None else [()] * len(shape_b)
    rank = max(len(shape_a), len(shape_b))
    out: list[tuple[str, ...]] = []
    for d in range(rank - 2):
        da, db = d - (rank - len(shape_a)), d - (rank - len(shape_b))
        from_a = ea[da] if da >= 0 and shape_a[da] != 1 else ()
        from_b = eb[db] if db >= 0 and shape_b[db] != 1 else ()
        out.append(from_a or from_b)
    out.append(ea[-2])
    out.append(eb[-2])
    used: set[str] = set()
    for d, axes in enumerate(out):  # an axis shards one output dim at most: first come, first kept
        out[d] = () if used & set(axes) else axes
        used.update(out[d])
    mesh = (sa or sb).mesh
    return NamedSharding(mesh, _pspec(out))


def nt_dot(a: jax.Array, b: jax.Array, out_sharding: Optional[NamedSharding] = None, **kwargs) -> jax.Array:
    """`einsum("...mk,...nk->...mn")` that states its output sharding on an Explicit mesh
    (`out_sharding`, or `nt_out_sharding`); `kwargs` go to `jnp.einsum`."""
    if out_sharding is None:
        out_sharding = nt_out_sharding(a, b)
    return jnp.einsum("...mk,...nk->...mn", a, b, out_sharding=out_sharding, **kwargs)


def grad_sharding(primal, g, shape: Sequence[int]) -> Optional[NamedSharding]:
    """Sharding of a gradient of `shape` w.r.t. `primal` before its broadcast dims are summed away.

    `shape` is the primal's with the upstream gradient `g`'s batch dims (`g` is (*batch, M, N)): leading
    dims the primal lacks and size-1 dims it broadcast. Those are sharded as in `g`, so that their sum is
    one all-reduce, the others as in the primal. None off Explicit meshes.
    """
    sp = explicit_sharding(primal)
    if sp is None:
        return None
    lead = len(shape) - primal.ndim
    entries = [()] * lead + _entries(sp.spec, primal.ndim)
    sg = explicit_sharding(g)
    if sg is not None:
        used = {a for e in entries for a in e}
        for d in range(len(shape) - 2):
            summed = d < lead or (primal.shape[d - lead] == 1 and shape[d] != 1)
            axes = _axes(sg.spec, d)
            if summed and not used & set(axes):
                entries[d] = axes
                used.update(axes)
    return NamedSharding(sp.mesh, _pspec(entries))


def like(ct: jax.Array, sharding: Optional[NamedSharding]) -> jax.Array:
    """`ct` resharded to `sharding` (a primal operand's, from `explicit_sharding`: a `custom_vjp` cotangent
    must have exactly its primal's sharding on an Explicit mesh); unchanged when None."""
    return ct if sharding is None else jax.sharding.reshard(ct, sharding)
