"""Flax nnx layers: a block-scaled `Linear` and in-place quantization of a trained model for serving.

    model = MyModel(..., rngs=nnx.Rngs(0))   # made of jax_blockscale.nn.nnx.Linear(din, dout, recipe=...)
    ...train (master weights in param_dtype)...
    quantize_model(model)                    # every Linear's kernel -> BlockScaledArray, per its recipe
    y = nnx.jit(lambda m, x: m(x))(model, x)

The quantized state (`nnx.state(model)`) saves and restores with orbax like any nnx state. For Flax's own
layer, `flax.nnx.Linear(..., dot_general=jax_blockscale.dot_general(recipe))` works as well.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from flax import nnx

from ..quantize import BlockScaledArray
from ..recipes import Recipe, RecipeLike, get_recipe, quantize_weight, quantized_dense

__all__ = ["Linear", "quantize_model"]

Initializer = Callable[..., jax.Array]


class Linear(nnx.Module):
    """`y = x @ kernel + bias` over the last axis with the recipe's block-scaled GEMMs.

    `kernel` is an `nnx.Param` holding the (in_features, out_features) master weight in `param_dtype`, or,
    after `quantize_weights()`, a `BlockScaledArray` (out_features, in_features) quantized along
    in_features in the recipe's weight format. `recipe` is a static attribute (a frozen `Recipe`).
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
        return isinstance(self.kernel.get_value(), BlockScaledArray)

    def __call__(self, inputs: jax.Array) -> jax.Array:
        kernel = self.kernel.get_value()
        bias = self.bias.get_value() if self.bias is not None else None
        if isinstance(kernel, BlockScaledArray):
            dtype = self.dtype or jnp.result_type(inputs, *(() if bias is None else (bias,)))
            x, w_t = jnp.asarray(inputs, dtype), kernel
        else:
            x, kernel, bias = nnx.nn.dtypes.promote_dtype((inputs, kernel, bias), dtype=self.dtype)
            w_t = kernel.T
        y = quantized_dense(x, w_t, self.recipe)
        if bias is not None:
            y = y + jnp.asarray(bias, y.dtype)
        return y

    def quantize_weights(self) -> None:
        """Replaces the master kernel with its quantized form, in place (no-op if already quantized or
        the recipe keeps weights dense). Leading dims (stacked layers) are quantized per layer."""
        if self.quantized or self.recipe.weight_format is None:
            return
        self.kernel = nnx.Param(quantize_weight(self.kernel.get_value(), self.recipe))


def quantize_model(model: nnx.Module) -> nnx.Module:
    """Calls `quantize_weights()` on every block-scaled `Linear` in `model`, each with its own recipe
    (mixed recipes work; other modules are untouched). Mutates and returns `model`."""
    for _, module in nnx.iter_modules(model):
        if isinstance(module, Linear):
            module.quantize_weights()
    return model
