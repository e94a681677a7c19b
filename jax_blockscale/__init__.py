"""jax_blockscale: block-scaled (MX, NVFP4, DeepSeek FP8) matrix multiplication for JAX."""

from . import formats, layouts, reference
from .formats import FORMAT_NAMES, get_format
from .quantize import BlockScaledArray, dequantize, from_block_fp8, nvfp4_tensor_scale, quantize

__all__ = [
    "BlockScaledArray",
    "FORMAT_NAMES",
    "dequantize",
    "formats",
    "from_block_fp8",
    "get_format",
    "layouts",
    "nvfp4_tensor_scale",
    "quantize",
    "reference",
]

from .api import explain, explain_all, matmul, quantize_operand, quantizer
from .backends import detect_target
from .quantize_primitive import quantize_with_transpose

__all__ += ["detect_target", "explain", "explain_all", "matmul", "quantize_operand", "quantize_with_transpose", "quantizer"]

from .dot_general import BlockScaledDotGeneral, dot_general
from .recipes import (RECIPE_NAMES, RECIPES, Recipe, checkpoint_policy, get_recipe, quantize_weight, quantized_dense,
                      recipe_matmul)

__all__ += ["BlockScaledDotGeneral", "RECIPE_NAMES", "RECIPES", "Recipe", "checkpoint_policy", "dot_general",
            "get_recipe", "quantize_weight", "quantized_dense", "recipe_matmul"]
