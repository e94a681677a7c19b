"""Flax nnx layers: a block-scaled `Linear` and in-place quantization of a trained model for serving.

    model = MyModel(..., rngs=nnx.Rngs(0))   # made of jax_blockscale.nn.nnx.Linear(din, dout, recipe=...)
    ...train (master weights in param_dtype)...
    quantize_model(model)                    # every Linear's kernel -> BlockScaledArray, per its recipe
    y = nnx.jit(lambda m, x: m(x))(model, x)

The quantized state (`nnx.state(model)`) saves and restores with orbax like any nnx state. A kernel with
sharding metadata (`nnx.with_partitioning(init, ("embed", "mlp"))`) stays sharded the same way once
quantized: see `Linear.quantize_weights`. For Flax's own layer,
`flax.nnx.Linear(..., dot_general=jax_blockscale.dot_general(recipe))` works as well.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from .. import validation
from .._explicit_sharding import quantized_spec
from ..quantize import BlockScaledArray
from ..recipes import Recipe, RecipeLike, get_recipe, quantize_weight, quantized_dense

__all__ = ["Linear", "quantize_model"]

Initializer = Callable[..., jax.Array]


class Linear(nnx.Module):
    """`y = x @ kernel + bias` over the last axis with the recipe's block-scaled GEMMs.

    `kernel` is an `nnx.Param` holding the (in_features, out_features) master weight in `param_dtype`, or,
    after `quantize_weights()`, a `BlockScaledArray` (out_features, in_features) quantized along
    in_features in the recipe's weight format, each of its leaves an `nnx.Param`. `recipe` is a static
    attribute (a frozen `Recipe`).
    Input (..., in_features) -> output (..., out_features).
    """

    def __init__(self, in_features: int, out_features: int, *, recipe: RecipeLike = "mxfp8",
                 use_bias: bool = True, dtype: Optional[Any] = None, param_dtype: Any = jnp.float32,
                 kernel_init: Initializer = nnx.initializers.lecun_normal(),
                 bias_init: Initializer = nnx.initializers.zeros_init(), rngs: nnx.Rngs):
        self.in_features = in_features
        self.out_features = out_features
        self.recipe: Recipe = get_recipe(recipe)
        self.dtype = dtype
        self.kernel = nnx.Param(kernel_init(rngs.params(), (in_features, out_features), param_dtype))
        self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), param_dtype)) if use_bias else None

    @property
    def quantized(self) -> bool:
        """Whether the kernel is a pre-quantized `BlockScaledArray` (serving)."""
        return isinstance(self.kernel, BlockScaledArray)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        kernel = jax.tree.map(lambda p: p.get_value(), self.kernel, is_leaf=_is_variable)
        bias = self.bias.get_value() if self.bias is not None else None
        if isinstance(kernel, BlockScaledArray):
            validation.check_block_scaled(kernel, "kernel")
            dtype = self.dtype or jnp.result_type(inputs, *(() if bias is None else (bias,)))
            x, w, layout = jnp.asarray(inputs, dtype), kernel, "nk"
        else:
            x, kernel, bias = nnx.nn.dtypes.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
            w, layout = kernel, "kn"  # the (in, out) kernel as it is: no transpose of it or of its gradient
        y = quantized_dense(x, w, self.recipe, w_layout=layout)
        if bias is not None:
            y = y + jnp.asarray(bias, y.dtype)
        return y

    def quantize_weights(self, quantized: Optional[BlockScaledArray] = None) -> None:
        """Replaces the master kernel with its quantized form, in place (no-op if already quantized or
        the recipe keeps weights dense). Leading dims (stacked layers) are quantized per layer.

        `quantized`: a weight quantized elsewhere to use instead, (..., N, K) along K in the recipe's weight format
        (e.g. `jb.from_block_fp8` of a DeepSeek checkpoint's `weight` and `weight_scale_inv` for `w8a16_fp8`);
        checked against the kernel's (..., K, N) shape and the recipe before it replaces anything.

        Each leaf becomes an `nnx.Param` with the kernel's metadata. Sharding names follow the leaf's own
        storage: the kernel (..., K, N) named (*lead, k, n) gives values and scales, stored (..., N, K),
        the names (*lead, n, k), so a mesh axis on N still splits N (column parallel stays column parallel,
        no gather in the matmul), and nvfp4's per-matrix tensor scale the lead names only. With eager
        sharding (nnx's default) nnx places the leaves by those names under a mesh context; without one
        they are placed as the kernel lies (K split only into whole blocks).
        """
        if self.quantized or self.recipe.weight_format is None:
            if quantized is not None:
                state = "is already quantized" if self.quantized else "keeps its weights dense"
                raise ValueError(f"this Linear {state} (recipe {self.recipe.name!r}); it cannot take a quantized "
                                 f"weight")
            return
        value, metadata = self.kernel.get_value(), dict(self.kernel.get_metadata())
        if quantized is None:
            q = quantize_weight(value, self.recipe)
        else:
            _check_quantized(quantized, value.shape, self.recipe)
            q = quantized
        names = metadata.get("out_sharding")
        storage = lead = None
        if names is not None:
            if len(names) != value.ndim:
                raise ValueError(f"the kernel's out_sharding {names} does not name its {value.ndim} dims")
            *lead, k_name, n_name = names
            storage, lead = (*lead, n_name, k_name), tuple(lead)
            if metadata.get("eager_sharding") and metadata.get("mesh") is None and _no_mesh_context():
                # nnx would need the mesh and logical rules the kernel was created under: place the
                # leaves as the kernel itself lies instead.
                q, metadata["eager_sharding"] = _placed_like(value, q), False

        def param(leaf, leaf_names):
            if leaf is None:
                return None
            return nnx.Param(leaf, **(metadata if names is None else {**metadata, "out_sharding": leaf_names}))

        self.kernel = nnx.data(BlockScaledArray(param(q.values, storage), param(q.scales, storage), q.fmt,
                                                q.axis, q.length, param(q.tensor_scale, lead)))


def _check_quantized(q, kernel_shape: tuple[int, ...], recipe) -> None:
    """A weight quantized elsewhere must be what `quantize_weight(kernel, recipe)` would have made of this kernel."""
    if not isinstance(q, BlockScaledArray):
        raise ValueError(f"quantized must be a BlockScaledArray (e.g. jb.from_block_fp8(...)), got {type(q).__name__}")
    validation.check_block_scaled(q, "quantized")
    want_shape = (*kernel_shape[:-2], kernel_shape[-1], kernel_shape[-2])
    if q.fmt != recipe.weight_format or q.axis != -1 or tuple(q.shape) != want_shape:
        def what(fmt, shape, axis) -> str:
            tile = f" {fmt.tile[0]}x{fmt.tile[1]}" if hasattr(fmt, "tile") else ""
            return f"{fmt.name}{tile} of shape {tuple(shape)} along axis {axis}"

        raise ValueError(f"recipe {recipe.name!r} with a kernel of shape {tuple(kernel_shape)} (K, N) needs "
                         f"{what(recipe.weight_format, want_shape, -1)} (N, K), got {what(q.fmt, q.shape, q.axis)}")


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def _no_mesh_context() -> bool:
    return jax.sharding.get_abstract_mesh().empty


def _placed_like(kernel, q: BlockScaledArray) -> BlockScaledArray:
    """`q`, the quantized `kernel` (..., K, N), placed as the kernel is when it is a concrete array on a
    NamedSharding: N and lead dims as in the kernel, K (and fp8 tile rows) only where they split into
    whole blocks, the tensor scale on the lead dims. Unchanged otherwise (under a trace)."""
    if not isinstance(kernel, jax.Array) or isinstance(kernel, jax.core.Tracer):
        return q
    sharding = kernel.sharding
    if not isinstance(sharding, NamedSharding):
        return q
    entries = list(sharding.spec) + [None] * (kernel.ndim - len(sharding.spec))
    *lead, k_spec, n_spec = entries
    spec = quantized_spec(q.shape, PartitionSpec(*lead, n_spec, k_spec), q.fmt, sharding.mesh)

    def put(leaf, leaf_spec):
        return None if leaf is None else jax.device_put(leaf, NamedSharding(sharding.mesh, leaf_spec))

    return BlockScaledArray(put(q.values, spec), put(q.scales, spec), q.fmt, q.axis, q.length,
                            put(q.tensor_scale, PartitionSpec(*lead)))


def quantize_model(model: nnx.Module) -> nnx.Module:
    """Calls `quantize_weights()` on every block-scaled `Linear` in `model`, each with its own recipe
    (mixed recipes work; other modules are untouched). Mutates and returns `model`."""
    for _, module in nnx.iter_modules(model):
        if isinstance(module, Linear):
            module.quantize_weights()
    return model
