"""The oracle: dequantize both operands to float32 and contract at HIGHEST precision.

Used by the tests, by the CPU lowering of the matmul primitive and by every backend without a kernel.
"""

from __future__ import annotations

from typing import Union

import jax
import jax.numpy as jnp
from jax import lax

from .quantize import BlockScaledArray, dequantize
from .validation import check_block_scaled, check_operands

__all__ = ["matmul", "Operand", "operand_shape"]

Operand = Union[BlockScaledArray, jax.Array]

_DENSE = (jnp.float32, jnp.bfloat16, jnp.float16)


def operand_shape(x: Operand) -> tuple[int, ...]:
    return tuple(x.shape)


def _as_float32(x: Operand, name: str) -> jax.Array:
    if isinstance(x, BlockScaledArray):
        if x.axis != -1:
            raise ValueError(
                f"{name} is quantized along axis {x.axis}; the matmul contracts the last axis, so quantize "
                f"{name} with axis=-1 (the contraction axis)"
            )
        return dequantize(x, jnp.float32)
    x = jnp.asarray(x)
    if x.dtype not in _DENSE:
        raise TypeError(
            f"{name} must be a BlockScaledArray or a float32/bfloat16/float16 array, got {x.dtype}"
        )
    return x.astype(jnp.float32)


def matmul(a: Operand, b: Operand, out_dtype=jnp.float32) -> jax.Array:
    """a (..., M, K) x b (..., N, K) -> (..., M, N), each operand quantized along K or dense.

    Any pair of formats is accepted, mixed ones included; batch dims of a and b broadcast.
    """
    for name, x in (("a", a), ("b", b)):
        if isinstance(x, BlockScaledArray):
            check_block_scaled(x, name)
    check_operands(a, b)
    af, bf = _as_float32(a, "a"), _as_float32(b, "b")
    out = jnp.einsum("...mk,...nk->...mn", af, bf, precision=lax.Precision.HIGHEST,
                     preferred_element_type=jnp.float32)
    return out.astype(out_dtype)
