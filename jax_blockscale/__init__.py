"""jax_blockscale: block-scaled (MX, NVFP4, DeepSeek FP8) matrix multiplication for JAX."""

from . import formats, layouts, reference
from .formats import FORMAT_NAMES, get_format
from .quantize import BlockScaledArray, dequantize, quantize

__all__ = [
    "BlockScaledArray",
    "FORMAT_NAMES",
    "dequantize",
    "formats",
    "get_format",
    "layouts",
    "quantize",
    "reference",
]

from .api import explain, explain_all, matmul
from .backends import detect_target

__all__ += ["detect_target", "explain", "explain_all", "matmul"]
