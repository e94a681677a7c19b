"""`dot_general(recipe)`: a drop-in for `jax.lax.dot_general` that runs a recipe's block-scaled GEMMs.

Pass it where Flax takes a `dot_general` (`flax.linen.Dense`, `flax.linen.DenseGeneral`,
`flax.nnx.Linear`, `flax.nnx.LinearGeneral`) or call it at any `jax.lax.dot_general` call site. Any
`dimension_numbers` map to the recipe's `(*B, M, K) x (*B, N, K)` form with jnp transposes and reshapes:
batch dims lead, the lhs free dims fold into M, the rhs free dims into N, the contracting dims into K (so
MX blocks run along the flattened contraction). The result has dot_general's layout,
`(*batch, *lhs_free, *rhs_free)`, and the recipe's forward and backward (`jax_blockscale.recipes`).

Semantics that differ from `jax.lax.dot_general`, on purpose:
- `precision` is ignored: the recipe decides the arithmetic.
- `preferred_element_type` sets the output dtype (float32/bfloat16/float16); by default it is the promoted
  input dtype, as in `jax.lax.dot_general`.
- A layout with no contracting dim (an outer product) has nothing to quantize along and falls back to
  `jax.lax.dot_general`; so do integer operands. Everything else runs the recipe or raises at trace time.
- The rhs may be a pre-quantized `BlockScaledArray` whose quantized axis is the single contracting dim
  (e.g. `quantize_weight`'s (N, K) along K, called with contracting dims ((lhs_k,), (1,))); the lhs must be
  dense.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from . import validation
from .formats import BlockFP8Format
from .quantize import BlockScaledArray
from .recipes import Recipe, RecipeLike, get_recipe, recipe_matmul

__all__ = ["BlockScaledDotGeneral", "dot_general"]

DimensionNumbers = tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], Sequence[int]]]


def _canonical(dims: Sequence[int], ndim: int, what: str) -> tuple[int, ...]:
    out = tuple(int(d) % ndim if -ndim <= int(d) < ndim else -1 for d in dims)
    if -1 in out or len(set(out)) != len(out):
        raise ValueError(f"dot_general: {what} dims {tuple(dims)} are out of range or repeated for rank {ndim}")
    return out


def _free(ndim: int, *used: tuple[int, ...]) -> tuple[int, ...]:
    taken = set().union(*used)
    return tuple(d for d in range(ndim) if d not in taken)


def _permute_quantized(q: BlockScaledArray, perm: tuple[int, ...]) -> BlockScaledArray:
    """Transposes a BlockScaledArray's dims; values and scales move together, the quantized axis with them."""
    nd = q.values.ndim
    axis = perm.index(q.axis % nd) - nd
    return BlockScaledArray(jnp.transpose(q.values, perm), jnp.transpose(q.scales, perm), q.fmt, axis,
                            q.length, q.tensor_scale)


def _rhs_quantized(q: BlockScaledArray, contract, batch, free) -> BlockScaledArray:
    """A pre-quantized rhs in (*batch, N, K) order: only whole-dim moves, K must be its quantized axis."""
    nd = q.values.ndim
    if len(contract) != 1 or contract[0] != q.axis % nd:
        raise ValueError(f"dot_general: a pre-quantized rhs ({q.fmt.name}, shape {q.shape}, quantized along "
                         f"axis {q.axis % nd}) must contract exactly its quantized axis; got contracting dims "
                         f"{contract}. Quantize the weight along the dim this layer contracts")
    if len(free) != 1:
        raise ValueError(f"dot_general: a pre-quantized rhs needs exactly one free (output-feature) dim, got "
                         f"{len(free)} for shape {q.shape}; quantize the kernel reshaped to (N, K)")
    if q.tensor_scale is not None and q.tensor_scale.ndim and batch:
        raise ValueError("dot_general: a batched nvfp4 rhs with per-batch tensor scales is not supported")
    tile_rows = q.fmt.tile[0] if isinstance(q.fmt, BlockFP8Format) else 1
    if tile_rows > 1 and free[0] != (nd - 1 if q.axis % nd == nd - 2 else nd - 2):
        # 2-D tiles span the quantized axis and the other of the last two dims: that one must be N.
        raise ValueError(f"dot_general: a pre-quantized {q.fmt.name} rhs with {q.fmt.tile} tiles must have "
                         f"its free (N) dim next to its quantized axis, the tiles' row axis")
    perm = tuple(batch) + tuple(free) + tuple(contract)
    return _permute_quantized(q, perm) if perm != tuple(range(nd)) else q


@dataclasses.dataclass(frozen=True)
class BlockScaledDotGeneral:
    """A `jax.lax.dot_general`-compatible callable bound to a recipe (see the module docstring)."""

    recipe: Recipe

    def __call__(self, lhs: jax.Array, rhs: Any, dimension_numbers: DimensionNumbers, precision=None,
                 preferred_element_type=None, out_sharding=None, **kwargs) -> jax.Array:
        """`lhs` (any rank) . `rhs` (any rank, or a pre-quantized BlockScaledArray) ->
        `(*batch, *lhs_free, *rhs_free)`. `precision` is ignored; `out_sharding` (Flax passes None) and
        other keyword arguments are accepted for signature compatibility and must be None."""
        del precision
        extra = {k: v for k, v in dict(kwargs, out_sharding=out_sharding).items() if v is not None}
        if extra:
            raise TypeError(f"jax_blockscale dot_general does not support {sorted(extra)}")
        if isinstance(lhs, BlockScaledArray):
            raise TypeError("dot_general: the lhs must be dense; the recipe quantizes activations itself")
        (lc, rc), (lb, rb) = dimension_numbers
        lhs = jnp.asarray(lhs)
        rhs_q = isinstance(rhs, BlockScaledArray)
        if rhs_q:
            validation.check_block_scaled(rhs, "rhs")
        rhs = rhs if rhs_q else jnp.asarray(rhs)
        l_nd, r_nd = lhs.ndim, len(rhs.shape)
        lc, lb = _canonical(lc, l_nd, "lhs contracting"), _canonical(lb, l_nd, "lhs batch")
        rc, rb = _canonical(rc, r_nd, "rhs contracting"), _canonical(rb, r_nd, "rhs batch")
        if len(lc) != len(rc) or len(lb) != len(rb):
            raise ValueError(f"dot_general: lhs and rhs need as many contracting ({lc} vs {rc}) and batch "
                             f"({lb} vs {rb}) dims")
        lshape, rshape = lhs.shape, tuple(rhs.shape)
        for a, b, what in ((lc, rc, "contracting"), (lb, rb, "batch")):
            if tuple(lshape[i] for i in a) != tuple(rshape[i] for i in b):
                raise ValueError(f"dot_general: {what} dims differ in size: lhs {lshape} dims {a}, rhs "
                                 f"{rshape} dims {b}")
        dense_fallback = not lc or not jnp.issubdtype(lhs.dtype, jnp.floating) or (
            not rhs_q and not jnp.issubdtype(rhs.dtype, jnp.floating))
        if dense_fallback or not self.recipe.quantizes:
            if rhs_q:
                raise ValueError(f"dot_general: recipe {self.recipe.name!r} cannot contract a pre-quantized "
                                 f"rhs in this layout")
            return lax.dot_general(lhs, rhs, ((lc, rc), (lb, rb)),
                                   preferred_element_type=preferred_element_type)

        lf, rf = _free(l_nd, lc, lb), _free(r_nd, rc, rb)
        batch = tuple(lshape[i] for i in lb)
        m_dims, n_dims = tuple(lshape[i] for i in lf), tuple(rshape[i] for i in rf)
        k = math.prod(lshape[i] for i in lc)
        x = jnp.transpose(lhs, lb + lf + lc).reshape(batch + (math.prod(m_dims), k))
        if rhs_q:
            w = _rhs_quantized(rhs, rc, rb, rf)
        else:
            w = jnp.transpose(rhs, rb + rf + rc).reshape(batch + (math.prod(n_dims), k))
        out = recipe_matmul(x, w, self.recipe, out_dtype=preferred_element_type)
        return out.reshape(batch + m_dims + n_dims)


def dot_general(recipe: RecipeLike) -> BlockScaledDotGeneral:
    """A `jax.lax.dot_general` replacement running `recipe` ("mxfp8", "nvfp4", "fp8_deepseek", "w4a8",
    "w4a16", "bf16", or a `Recipe`): `flax.linen.Dense(..., dot_general=jax_blockscale.dot_general("mxfp8"))`.
    """
    return BlockScaledDotGeneral(get_recipe(recipe))
