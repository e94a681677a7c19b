"""Multi-device partitioning of the `blockscaled_matmul` primitive (`bind`, same contract as
`primitive.bind`).

Structure, outside in:

- `jax.custom_batching.custom_vmap`: `custom_partitioning` has no batching rule, so vmap would fail on it.
  The vmap rule evaluates the primitive's own batching rule (traced with `jax.vmap(primitive.bind)`) and
  re-binds the batched operands through this module, so a vmapped matmul is still one partitioned call.
- `jax.experimental.custom_partitioning` around the primitive. Its Shardy rule (`_sdy_rule`) is an einsum
  over factors: batch dims `b0..`, rows `m` (a and its scales), rows `n` (b and its scales), contraction `k`
  (a reduction factor). Values and scales have different K sizes, so `k` counts quantization blocks: the
  values' K dim is the compound factor (k, elements-per-block) with the minor part unshardable, and the
  scales' K dim is `k` itself. 128-row weight tiles (fp8_block) make N the compound (n, 128) likewise.
  So Shardy only proposes shardings that keep whole blocks, and scales shard with their values.
- `_partition` (XLA's SPMD partitioner calls it with the shardings Shardy or GSPMD chose) makes the
  operand shardings consistent (`_plan`), runs `primitive.bind` on the local shards and, when K is
  sharded, sums the float32 partial products: `psum`, or `psum_scatter` when the requested output
  sharding splits an output dim over the K mesh axes (row parallel with a sharded output). `_infer` is the
  GSPMD callback (jax_use_shardy_partitioner=False).
- A sharding that would split a quantization block across devices (K, or the rows of 128x128 fp8 tiles)
  is never computed in pieces: that dim is gathered instead, with a `BlockSplitWarning` that names a
  sharding that works. Such shardings also arise inside valid programs (fp8_deepseek's wgrad quantizes
  along the tokens, which data parallelism splits), so they are not an error.

Under `jax.grad`, `api.matmul`'s custom_vjp owns differentiation: the forward runs through here, the
backward's einsums are partitioned by XLA itself (on meshes with Explicit axes they state their output
shardings: `_explicit_sharding`). Inside `shard_map` (all axes manual) custom_partitioning lowers the plain
primitive on the local blocks. With a single device it lowers the primitive directly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap
from jax.experimental.custom_partitioning import (ArrayMapping, CompoundFactor, SdyShardingRule,
                                                  custom_partitioning)
from jax.extend import core as jcore
from jax.extend.mlir import ir
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from . import primitive
from ._triton.problem import TileConfig
from .formats import BlockFP8Format
from .primitive import OperandSpec

__all__ = ["BlockSplitWarning", "bind"]

_A_VALUES, _A_SCALES, _A_TS, _B_VALUES, _B_SCALES, _B_TS, _OUT = range(7)


@dataclasses.dataclass(frozen=True)
class _Params:
    """The primitive's static parameters, hashable (a static argument of custom_partitioning)."""

    a: OperandSpec
    b: OperandSpec
    out_dtype: jnp.dtype
    target: Optional[str]
    config: Optional[TileConfig]
    transpose_out: bool = False  # the result is (.., N, M)

    def kwargs(self) -> dict:
        return dict(a=self.a, b=self.b, out_dtype=self.out_dtype, target=self.target, config=self.config,
                    transpose_out=self.transpose_out)


def bind(a_values, a_scales, a_ts, b_values, b_scales, b_ts, *, a: OperandSpec, b: OperandSpec,
         out_dtype, target: Optional[str], config: Optional[TileConfig], transpose_out: bool = False
         ) -> jax.Array:
    """`primitive.bind` that XLA partitions over a mesh instead of gathering its operands."""
    params = _Params(a, b, jnp.dtype(out_dtype), target, config, bool(transpose_out))
    ops = (a_values, a_scales, a_ts, b_values, b_scales, b_ts)
    out = _vmappable(params)(*ops)
    sharding = _explicit_result_sharding(params, ops, out)
    return out if sharding is None else jax.sharding.reshard(out, sharding)


def _explicit_result_sharding(params: _Params, ops, out) -> Optional[NamedSharding]:
    """On a mesh with Explicit axes shardings are part of the types: give the result the sharding the
    partitioner produces (the primitive's abstract eval knows no shardings). None on Auto meshes."""
    types = [jax.typeof(x) for x in ops]
    mesh = types[_A_VALUES].sharding.mesh
    if mesh.empty or not any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
        return None
    g = _geometry(params, [t.shape for t in types] + [out.shape])
    return NamedSharding(mesh, _plan(g, mesh, [t.sharding.spec for t in types], None, warn=False).result)


def _vmappable(params: _Params) -> custom_vmap:
    fn = custom_vmap(lambda *ops: _partitioned(*ops, params))

    @fn.def_vmap
    def rule(axis_size, in_batched, *ops):
        del axis_size
        return _batched(params, ops, in_batched), True

    return fn


def _batched(params: _Params, ops: Sequence[jax.Array], in_batched: Sequence[bool]) -> jax.Array:
    """The primitive's batching rule with its final bind redirected to `bind`.

    Tracing `jax.vmap(primitive.bind)` records the rule's operand rearrangement (batch dims to the front,
    singleton dims so both sides broadcast, an unbatched weight left alone) ending in one primitive
    equation. Replaying the rearrangement and sending that equation's operands through `bind` keeps one
    source of truth for batching.
    """
    inner = functools.partial(primitive.bind, **params.kwargs())
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in ops]
    closed = jax.make_jaxpr(jax.vmap(inner, in_axes=[0 if b else None for b in in_batched]))(*avals)
    *prep, last = closed.jaxpr.eqns
    if last.primitive is not primitive.blockscaled_matmul_p or last.outvars != closed.jaxpr.outvars:
        raise NotImplementedError("the primitive's batching rule no longer ends in one primitive call")
    rearrange = closed.jaxpr.replace(eqns=prep, outvars=list(last.invars), effects=jcore.no_effects)
    operands = jcore.jaxpr_as_fun(jcore.ClosedJaxpr(rearrange, closed.consts))(*ops)
    return bind(*operands, **last.params)


def _local_matmul(a_values, a_scales, a_ts, b_values, b_scales, b_ts, params: _Params) -> jax.Array:
    return primitive.bind(a_values, a_scales, a_ts, b_values, b_scales, b_ts, **params.kwargs())


_partitioned = custom_partitioning(_local_matmul, static_argnums=(6,))


# ------------------------------------------------------------------------------------------ geometry


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """Which logical factor each dim of the 6 operands and the result carries.

    `dims[i][d]` is `(factor, per_unit)`: the dim holds `units[factor] * per_unit` entries (per_unit > 1
    for values' K, whose unit is a block, and for rows of 2-D fp8 tiles), or `(None, 1)` for a dim that
    never shards (a broadcast size-1 batch dim, a dense operand's dummy scale). Factors: `b0..` (output
    batch positions), `m`, `n`, `k` (K in blocks). `exact` factors must split into whole units.
    """

    dims: tuple[tuple[tuple[Optional[str], int], ...], ...]
    units: tuple[tuple[str, int], ...]
    exact: frozenset
    unshardable: frozenset  # rows whose tiles do not divide them: replicate
    block: int  # elements of K per unit of k

    def unit(self, f: str) -> int:
        return dict(self.units)[f]

    @property
    def order(self) -> tuple[str, ...]:
        """Factors in the priority order of `_plan`: batch, rows of a, rows of b, contraction."""
        return tuple(f for f, _ in self.units)


def _row_tile(spec: OperandSpec) -> int:
    return spec.fmt.tile[0] if isinstance(spec.fmt, BlockFP8Format) else 1


def _geometry(p: _Params, shapes: Sequence[tuple[int, ...]]) -> _Geometry:
    av, asc, ats, bv, bsc, bts, out = (tuple(s) for s in shapes)
    batch = out[:-2]
    dims: list = [None] * 7
    units = {f"b{i}": n for i, n in enumerate(batch)}

    def lead(shape, matrix_dims):
        # Batch dims right-align with the output's (numpy broadcasting, as in the primitive).
        rank = len(shape) - matrix_dims
        off = len(batch) - rank
        return [(f"b{off + j}", 1) if n == batch[off + j] else (None, 1) for j, n in enumerate(shape[:rank])]

    quantized = asc if p.a.fmt is not None else bsc
    nblocks = quantized[-1]
    block = av[-1] * (p.a.fmt.elements_per_byte if p.a.fmt else 1) // nblocks
    exact, unshardable = {"k"}, set()
    for side, spec, vals, scales, ts, f in ((0, p.a, av, asc, ats, "m"), (3, p.b, bv, bsc, bts, "n")):
        rows, tile = vals[-2], _row_tile(spec)
        if tile > 1:
            exact.add(f)
            if rows % tile:
                unshardable.add(f)
        per = tile if tile > 1 and f not in unshardable else 1
        units[f] = rows // per
        scale_rows = (None, 1) if f in unshardable else (f, 1)
        scale_k = ("k", 1) if spec.fmt is not None else (None, 1)
        dims[side] = (*lead(vals, 2), (f, per), ("k", vals[-1] // nblocks))
        dims[side + 1] = (*lead(scales, 2), scale_rows, scale_k)
        dims[side + 2] = tuple(lead(ts, 0))
    units["k"] = nblocks
    per_m, per_n = dims[_A_VALUES][-2][1], dims[_B_VALUES][-2][1]
    rows_cols = (("n", per_n), ("m", per_m)) if p.transpose_out else (("m", per_m), ("n", per_n))
    dims[_OUT] = (*lead(out, 2), *rows_cols)
    return _Geometry(tuple(dims), tuple(units.items()), frozenset(exact), frozenset(unshardable), block)


# ------------------------------------------------------------------------------------- the Shardy rule


def _sdy_rule(params: _Params, mesh, value_types, result_types) -> SdyShardingRule:
    del mesh
    shapes = [tuple(ir.RankedTensorType(t).shape) for t in (*value_types, *result_types)]
    g = _geometry(params, shapes)
    sizes: dict[str, int] = {}
    replicate: dict[str, None] = {}  # in order of first use: Shardy wants special factors sorted
    mappings = []
    for i, array_dims in enumerate(g.dims):
        mapping = []
        for d, (f, per) in enumerate(array_dims):
            if f is None:
                name = f"p{i}x{d}"  # its own factor, never sharded
                replicate[name] = None
                mapping.append(name)
            elif per > 1:
                sub = f"{f}x{per}"  # elements within one block or tile: never split
                replicate.update({f: None} if f in g.unshardable else {})
                replicate[sub] = None
                if g.unit(f) == 1:  # Shardy rejects size-1 parts of a compound factor
                    mapping.append(sub)
                else:
                    sizes[sub] = per
                    mapping.append(CompoundFactor(f, sub))
            else:
                replicate.update({f: None} if f in g.unshardable else {})
                mapping.append(f)
        mappings.append(ArrayMapping(*mapping))
    return SdyShardingRule(tuple(mappings[:6]), (mappings[_OUT],), reduction_factors=("k",),
                           need_replication_factors=tuple(replicate), **sizes)


# --------------------------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class _Plan:
    operands: tuple[PartitionSpec, ...]
    result: PartitionSpec
    k_axes: tuple[str, ...]
    scatters: tuple[tuple[int, tuple[str, ...]], ...]  # (output dim, mesh axes) reduce-scattered there


def _axes(spec: PartitionSpec, dim: int) -> tuple[str, ...]:
    entry = spec[dim] if dim < len(spec) else None
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else tuple(entry)


def _pspec(entries: Sequence[tuple[str, ...]]) -> PartitionSpec:
    return PartitionSpec(*[None if not e else e[0] if len(e) == 1 else tuple(e) for e in entries])


class BlockSplitWarning(UserWarning):
    """A sharding would split a quantization block or fp8 tile, so that dim is gathered instead."""


def _usable(g: _Geometry, f: str, axes: tuple[str, ...], mesh) -> tuple[str, ...]:
    """The longest prefix of `axes` that splits `f` into whole blocks / tiles on every device."""
    if f in g.unshardable:
        return ()
    if f not in g.exact:
        return axes  # uneven rows or batch: XLA pads the last shard, whose extra rows are dropped
    while axes and g.unit(f) % math.prod(mesh.shape[a] for a in axes):
        axes = axes[:-1]
    return axes


def _split_message(g: _Geometry, f: str, axes: tuple[str, ...], kept: tuple[str, ...], mesh) -> str:
    n = math.prod(mesh.shape[a] for a in axes)
    dim = {"k": "K", "n": "N", "m": "M"}[f]
    if f in g.unshardable:
        what = f"its fp8_block tiles do not divide {dim}"
    elif f == "k":
        what = (f"K is {g.unit('k')} quantization blocks of {g.block} elements, "
                f"{g.unit('k') * g.block / n:g} elements per device")
    else:
        what = f"{dim} is {g.unit(f)} fp8_block tiles of rows, {g.unit(f) / n:g} per device"
    good = [a for a, s in mesh.shape.items() if s > 1 and f not in g.unshardable and g.unit(f) % s == 0]
    fix = f"shard {dim} over {' or '.join(repr(a) for a in good)} or replicate it" if good else f"replicate {dim}"
    dropped = tuple(a for a in axes if a not in kept)
    return (f"blockscaled_matmul: {dim} is sharded over mesh axes {axes} ({n} devices), which would split a "
            f"quantization block ({what}); gathering {dim} over {dropped} instead, which moves the whole "
            f"operand. To avoid it, {fix} (PartitionSpec entry of that dim on the values and their scales).")


def _plan(g: _Geometry, mesh, operand_specs: Sequence[PartitionSpec],
          result_spec: Optional[PartitionSpec], warn: bool = True) -> _Plan:
    """Mesh axes of each factor: the operands' shardings, made consistent, then the output's request."""
    proposed: dict[str, tuple[str, ...]] = {}
    for i in (_A_VALUES, _B_VALUES, _A_SCALES, _B_SCALES, _A_TS, _B_TS):
        for d, (f, _) in enumerate(g.dims[i]):
            if f is not None and f not in proposed and _axes(operand_specs[i], d):
                proposed[f] = _axes(operand_specs[i], d)
    used: set[str] = set()
    final: dict[str, tuple[str, ...]] = {}
    for f in g.order:  # an axis already taken by an earlier factor is gathered for this one
        axes = tuple(a for a in proposed.get(f, ()) if a not in used)
        kept = _usable(g, f, axes, mesh)
        if kept != axes and warn:
            # Never a wrong answer: a block split across devices is gathered, not computed in pieces.
            warnings.warn(_split_message(g, f, axes, kept, mesh), BlockSplitWarning, stacklevel=2)
        if kept:
            final[f] = kept
            used.update(kept)
    k_axes = final.get("k", ())
    scatters = []
    if result_spec is not None:
        for d, (f, _) in enumerate(g.dims[_OUT]):
            have, want = final.get(f, ()), _axes(result_spec, d)
            extra = want[len(have):]
            if f is None or not extra or want[:len(have)] != have:
                continue  # anything else is resharded by XLA after the matmul
            size = g.unit(f) * g.dims[_OUT][d][1]
            if (set(extra) <= set(k_axes) - {a for _, s in scatters for a in s}
                    and size % math.prod(mesh.shape[a] for a in want) == 0):
                scatters.append((d, extra))  # a partial sum that the output wants split: reduce-scatter
            elif not used & set(extra) and _usable(g, f, want, mesh) == want:
                final[f] = want  # free: the operands are sliced locally
                used.update(extra)
    operands = tuple(_pspec([final.get(f, ()) if f else () for f, _ in dims]) for dims in g.dims[:6])
    out = [final.get(f, ()) if f else () for f, _ in g.dims[_OUT]]
    for d, axes in scatters:
        out[d] = out[d] + axes
    return _Plan(operands, _pspec(out), k_axes, tuple(scatters))


# ---------------------------------------------------------------------------- partitioner callbacks


def _specs(mesh, shapes) -> Optional[list[PartitionSpec]]:
    shardings = [s.sharding for s in shapes]
    if mesh.empty or not all(isinstance(s, NamedSharding) for s in shardings):
        return None  # no mesh names the axes (GSPMDSharding without a mesh): run replicated, still correct
    return [s.spec for s in shardings]


def _shapes(arg_shapes, result_shape) -> list[tuple[int, ...]]:
    return [tuple(s.shape) for s in (*arg_shapes, result_shape)]


def _flat_mesh(arg_shapes) -> jax.sharding.Mesh:
    """A 1-D mesh over the operands' devices, for shardings that come without a mesh."""
    devices = sorted(arg_shapes[0].sharding.device_set, key=lambda d: d.id)
    return jax.sharding.Mesh(np.array(devices), ("devices",))


def _epb(spec: OperandSpec) -> int:
    return spec.fmt.elements_per_byte if spec.fmt is not None else 1


def _partition(params: _Params, mesh, arg_shapes, result_shape):
    g = _geometry(params, _shapes(arg_shapes, result_shape))
    specs = _specs(mesh, (*arg_shapes, result_shape))
    if specs is None:
        mesh = _flat_mesh(arg_shapes)
        plan = _Plan(tuple(PartitionSpec() for _ in range(6)), PartitionSpec(), (), ())
    else:
        plan = _plan(g, mesh, specs[:6], specs[6])

    def lower_fn(a_values, a_scales, a_ts, b_values, b_scales, b_ts):
        # The local K is a whole number of blocks (checked in _plan); the padding sits in the last shard.
        a = dataclasses.replace(params.a, length=a_values.shape[-1] * _epb(params.a))
        b = dataclasses.replace(params.b, length=b_values.shape[-1] * _epb(params.b))
        # Partial products are summed in float32, so a sharded K rounds to out_dtype once, as unsharded.
        local_dtype = jnp.float32 if plan.k_axes else params.out_dtype
        out = primitive.bind(a_values, a_scales, a_ts, b_values, b_scales, b_ts, a=a, b=b,
                             out_dtype=local_dtype, target=params.target, config=params.config,
                             transpose_out=params.transpose_out)
        summed: set[str] = set()
        for dim, axes in plan.scatters:
            out = jax.lax.psum_scatter(out, axes, scatter_dimension=dim, tiled=True)
            summed.update(axes)
        rest = tuple(a for a in plan.k_axes if a not in summed)
        if rest:
            out = jax.lax.psum(out, rest)
        return out.astype(params.out_dtype)

    arg_shardings = tuple(NamedSharding(mesh, s) for s in plan.operands)
    return mesh, _untyped_trace(lower_fn), NamedSharding(mesh, plan.result), arg_shardings


def _untyped_trace(lower_fn):
    """`lower_fn`, traced on the local blocks without sharding types.

    XLA's partitioner calls `_partition` while compiling, and jax (0.11) then traces `lower_fn` under the
    abstract mesh of the caller's `jax.set_mesh`. With Explicit axes every op in it would carry a sharding
    constraint, which the partitioner, having already run, leaves in the program: the GPU compiler then
    finds no implementation for the `Sharding` custom call, and the all-reduce's reducer no reduction kind
    (an abort). The axes are switched to Auto and the operands cast to them (no op is emitted for that);
    the result stays Auto-typed: only its shape and dtype are compared with the partitioned result's.
    """
    @functools.wraps(lower_fn)
    def traced(*operands):
        mesh = jax.sharding.get_abstract_mesh()
        explicit = {a: AxisType.Auto for a, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Explicit}
        if not explicit:
            return lower_fn(*operands)
        with jax.sharding.use_abstract_mesh(mesh.update_axis_types(explicit)):
            return lower_fn(*jax.sharding.reshard(operands, PartitionSpec()))
    return traced


def _infer(params: _Params, mesh, arg_shapes, result_shape):
    """GSPMD only (Shardy uses `_sdy_rule`): the output sharding that the operands' shardings imply."""
    specs = _specs(mesh, arg_shapes)
    if specs is None:
        return NamedSharding(_flat_mesh(arg_shapes), PartitionSpec())
    g = _geometry(params, _shapes(arg_shapes, result_shape))
    return NamedSharding(mesh, _plan(g, mesh, specs, None, warn=False).result)


_partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer, sharding_rule=_sdy_rule)
