"""Flax linen layers: a block-scaled `Dense` and the conversion of a trained tree for serving.

Training keeps high-precision master weights (`param_dtype`, float32 by default) exactly as
`flax.linen.Dense` does; every call quantizes them per the recipe. For serving, `quantize_params` turns each
block-scaled `Dense` kernel into a `BlockScaledArray` (quantize once, serve many); the same module then runs
on the quantized tree, which saves and restores with a standard (orbax) checkpointer as any pytree.

    model = MLP(...)                      # built from jax_blockscale.nn.linen.Dense(features, recipe="mxfp8")
    variables = model.init(key, x)
    ...train...
    served = quantize_params(model, variables, x)     # kernels -> BlockScaledArray, per layer's recipe
    y = jax.jit(model.apply)(served, x)

Layers may mix recipes; plain `flax.linen.Dense` layers are left alone. For an unmodified Flax layer use
`flax.linen.Dense(..., dot_general=jax_blockscale.dot_general(recipe))` instead.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.core import meta
from flax.linen.dtypes import promote_dtype

from .. import validation
from ..quantize import BlockScaledArray
from ..recipes import RecipeLike, get_recipe, quantize_weight, quantized_dense

__all__ = ["Dense", "quantize_params"]

Initializer = Callable[..., jax.Array]


class Dense(nn.Module):
    """`y = x @ kernel + bias` over the last axis, with the recipe's block-scaled GEMMs.

    Attributes:
      features: output size N.
      recipe: a recipe name ("mxfp8", "nvfp4", "fp8_deepseek", "w4a8", "w4a16", "bf16") or a `Recipe`.
      use_bias: add a bias (kept high precision, never quantized).
      dtype: computation dtype of the dense operands (None: promoted from the input and params).
      param_dtype: dtype of the master weights.
      kernel_init, bias_init: as in `flax.linen.Dense`; the kernel is (K, N).

    Param tree: `kernel` (K, N) in `param_dtype` while training, or, after `quantize_params`, a
    `BlockScaledArray` (N, K) quantized along K in the recipe's weight format (the layout the matmul reads,
    so serving does no transpose; a partitioned kernel's leaves are each boxed, see `quantize_params`).
    Input (..., K) -> output (..., N).
    """

    features: int
    recipe: RecipeLike = "mxfp8"
    use_bias: bool = True
    dtype: Optional[Any] = None
    param_dtype: Any = jnp.float32
    kernel_init: Initializer = nn.initializers.lecun_normal()
    bias_init: Initializer = nn.initializers.zeros_init()

    @nn.compact
    def __call__(self, inputs: jax.Array) -> jax.Array:
        recipe = get_recipe(self.recipe)
        k = jnp.shape(inputs)[-1]
        kernel = None
        if self.has_variable("params", "kernel"):
            kernel = meta.unbox(self.get_variable("params", "kernel"))
        if not isinstance(kernel, BlockScaledArray):
            # A quantized kernel skips self.param: Flax would compare its leaves with the (K, N) init shape.
            kernel = self.param("kernel", self.kernel_init, (k, self.features), self.param_dtype)
        bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype) if self.use_bias else None
        if isinstance(kernel, BlockScaledArray):
            validation.check_block_scaled(kernel, "/".join(("kernel",) if not self.path else (*self.path, "kernel")))
            if kernel.shape[-2:] != (self.features, k):
                raise ValueError(f"{self.path}: the quantized kernel is {kernel.shape}, expected "
                                 f"(features, in_features) = {(self.features, k)}")
            dtype = self.dtype or jnp.result_type(inputs, *(() if bias is None else (bias,)))
            x = jnp.asarray(inputs, dtype)
            w, layout = kernel, "nk"
        else:
            x, kernel, bias = promote_dtype(inputs, kernel, bias, dtype=self.dtype)
            w, layout = kernel, "kn"  # the (in, out) kernel as it is: no transpose of it or of its gradient
        y = quantized_dense(x, w, recipe, w_layout=layout)
        if bias is not None:
            y = y + jnp.asarray(bias, y.dtype)
        return y


def _get(tree: dict, path: tuple[str, ...]):
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value) -> dict:
    """A copy of the nested dict `tree` with `path` replaced (the input is not modified)."""
    if not path:
        return value
    out = dict(tree)
    out[path[0]] = _set(tree[path[0]], path[1:], value)
    return out


def _boxed_like(box: meta.Partitioned, q: BlockScaledArray) -> BlockScaledArray:
    """`q` with each leaf boxed like the float kernel's `box`, under names of the leaf's own layout.

    The kernel (..., K, N) is named (*lead, k, n); values (..., N, K) and scales (..., N / tile rows,
    K / block) are stored transposed, so they are named (*lead, n, k) and a mesh axis on the kernel's N
    splits their N (column parallel stays column parallel). nvfp4's tensor scale, one per matrix, gets the
    lead names only: replicated for a single layer.
    """
    if len(box.names) != q.ndim:
        raise ValueError(f"the kernel's partition names {box.names} do not name its {q.ndim} dims")
    *lead, k_name, n_name = box.names
    names = (*lead, n_name, k_name)
    ts = None if q.tensor_scale is None else box.replace(value=q.tensor_scale, names=tuple(lead))
    return BlockScaledArray(box.replace(value=q.values, names=names), box.replace(value=q.scales, names=names),
                            q.fmt, q.axis, q.length, ts)


def quantize_params(module: nn.Module, variables: dict, *args, method=None, **kwargs) -> dict:
    """A copy of `variables` whose block-scaled `Dense` kernels are `BlockScaledArray`s, each in its own
    layer's recipe weight format (mixed recipes work; bf16 layers and other modules are untouched).

    `args`/`kwargs` are sample inputs for `module.apply` (only their shapes matter: the layers are found by
    tracing one call abstractly). Kernels of scanned stacks (leading layer dims) are quantized per layer.
    A kernel with partitioning metadata (`nn.with_logical_partitioning`, `nn.with_partitioning`) gives
    each leaf of its quantized form a box whose names follow that leaf's (N, K) storage, so
    `nn.get_partition_spec` shards the served weight as it sharded the float kernel.
    """
    recipes: dict[tuple[str, ...], Any] = {}

    def record(next_fun, call_args, call_kwargs, context):
        mod = context.module
        if isinstance(mod, Dense) and context.method_name == "__call__":
            recipes[tuple(mod.path)] = get_recipe(mod.recipe)
        return next_fun(*call_args, **call_kwargs)

    with nn.intercept_methods(record):
        jax.eval_shape(lambda v: module.apply(v, *args, method=method, **kwargs), variables)

    params = variables["params"]
    for path, recipe in recipes.items():
        if recipe.weight_format is None:
            continue
        kernel = _get(params, path + ("kernel",))
        if isinstance(kernel, BlockScaledArray):
            continue
        if isinstance(kernel, meta.Partitioned):
            q = _boxed_like(kernel, quantize_weight(kernel.value, recipe))
        elif isinstance(kernel, meta.AxisMetadata):
            # Metadata of an unknown kind cannot be mapped onto the transposed storage: kept whole.
            q = kernel.replace_boxed(quantize_weight(kernel.unbox(), recipe))
        else:
            q = quantize_weight(kernel, recipe)
        params = _set(params, path + ("kernel",), q)
    return {**variables, "params": params}
