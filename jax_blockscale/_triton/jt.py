"""Thin access to jax-triton: imported lazily, inside GPU lowering only.

jax-triton imports only with a GPU jaxlib (or the jax-cuda plugin) and sets TRITON_CACHE_DIR="" on import,
which turns Triton's on-disk cache off for the whole process; we put the previous value back.
"""

from __future__ import annotations

import functools
import os
import zlib
from typing import Any

import jax
import jax.numpy as jnp

_TRITON_TYPES = {
    jnp.dtype(jnp.bfloat16): "*bf16",
    jnp.dtype(jnp.float16): "*fp16",
    jnp.dtype(jnp.float32): "*fp32",
    jnp.dtype(jnp.float8_e4m3fn): "*fp8e4nv",
    jnp.dtype(jnp.float8_e5m2): "*fp8e5",
    jnp.dtype(jnp.uint8): "*u8",
}


@functools.lru_cache(maxsize=None)
def jax_triton():
    """Imports jax_triton, keeping the caller's TRITON_CACHE_DIR."""
    saved = os.environ.get("TRITON_CACHE_DIR")
    try:
        import jax_triton as jt
    except ImportError as e:  # pragma: no cover - depends on the install
        raise ImportError(
            "jax_blockscale's GPU kernels need jax-triton (pip install 'jax_blockscale[gpu]') and a GPU "
            f"jaxlib; the import failed: {e}"
        ) from e
    finally:
        if saved is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = saved
    return jt


def triton_pointer_type(dtype) -> str:
    """The Triton signature string for a pointer to `dtype` (as jax-triton names it)."""
    return _TRITON_TYPES[jnp.dtype(dtype)]


def call(kernel, *args: jax.Array, out_shape, grid, num_warps: int, num_stages: int,
         compute_capability: int | None, name: str = "", **constexprs: Any) -> Any:
    """jax_triton.triton_call with our conventions: outputs follow all inputs in the kernel signature,
    shapes/strides are constexprs (scalar ints are not divisibility-specialized by jax-triton)."""
    return jax_triton().triton_call(
        *args,
        kernel=kernel,
        out_shape=out_shape,
        grid=grid,
        name=name,
        num_warps=num_warps,
        num_stages=num_stages,
        compute_capability=compute_capability,
        **constexprs,
    )


def lowered_kernels(lowered) -> list[bytes]:
    """The serialized kernel calls (PTX inside) of every Triton custom call in a `jax.jit(...).lower()`.

    Lets CPU tests check the instructions of a program lowered for `cuda` without a GPU.
    """
    found: list[bytes] = []

    def walk(op):
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name == "stablehlo.custom_call" and "triton" in str(
                        inner.attributes["call_target_name"]
                    ):
                        found.append(zlib.decompress(bytes(inner.attributes["backend_config"].value_bytes)))
                    walk(inner.operation)

    walk(lowered.compiler_ir("stablehlo").operation)
    return found
