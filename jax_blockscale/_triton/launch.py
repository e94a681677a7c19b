"""Calling Triton kernels that need global scratch memory (device-side TMA descriptors) from JAX.

jax-triton 0.3.1 compiles a kernel and passes XLA buffers for its pointer arguments, but Triton 3.6 kernels
also take two implicit trailing pointers, `global_scratch` and `profile_scratch`, which it leaves null. A
kernel that builds a TMA descriptor in the kernel (`tl.make_tensor_descriptor`) writes the 128-byte
descriptor to global scratch first (a TMA unit reads descriptors from memory), so under jax-triton it
writes through a null pointer. jaxlib 0.11 can allocate scratch itself but 0.10 cannot, and neither
version's jax-triton asks for it.

This module is the thin extension that fixes it for both: its own primitive whose lowering compiles the
kernel with Triton (and Triton's on-disk cache), then passes XLA-allocated buffers *for* the implicit
scratch arguments, as two extra outputs of the custom call that the caller never sees. Triton indexes
global scratch per program (`base + linear_program_id * size`), so the buffer holds one slice per program.
The custom call itself is the same `triton_kernel_call` that jax-triton emits; only the parameter list
differs.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from . import jt

__all__ = ["scratch_call", "needs_scratch"]

# The custom call target jaxlib registers for Triton kernels (jax-triton uses the same one).
_CUSTOM_CALL_TARGET = "triton_kernel_call"
_POINTER_ALIGN = 16  # XLA buffers are at least 16-byte aligned; Triton's TMA needs exactly that.

scratch_call_p = Primitive("jax_blockscale_triton_scratch_call")
scratch_call_p.multiple_results = True


@scratch_call_p.def_abstract_eval
def _abstract_eval(*avals, out_shapes, **_):
    return [jax.core.ShapedArray(s.shape, s.dtype) for s in out_shapes]


def scratch_call(kernel, *args: jax.Array, out_shape: jax.ShapeDtypeStruct, grid: Sequence[int],
                 num_warps: int, num_stages: int, compute_capability: int, name: str,
                 **constexprs: Any) -> jax.Array:
    """Launches `kernel(*args, out, **constexprs)` on `grid` with its global scratch provided.

    Same conventions as `jt.call`: every argument is an array (pointer), the single output follows the
    inputs, everything else is a constexpr. CUDA only.
    """
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    (out,) = scratch_call_p.bind(
        *args, out_shapes=(jax.ShapeDtypeStruct(out_shape.shape, out_shape.dtype),), kernel=kernel, grid=grid,
        num_warps=num_warps, num_stages=num_stages, compute_capability=compute_capability, name=name,
        constexprs=tuple(sorted(constexprs.items())),
    )
    return out


@functools.lru_cache(maxsize=None)
def _compile(kernel, signature: tuple, constexprs: tuple, num_warps: int, num_stages: int,
             compute_capability: int):
    from .compile import compile_kernel

    return compile_kernel(kernel, target=f"sm_{compute_capability}", signature=dict(signature),
                          constexprs=dict(constexprs), num_warps=num_warps, num_stages=num_stages)


def needs_scratch(compiled) -> tuple[int, int]:
    """(global scratch bytes per program, profile scratch bytes per program) of a compiled kernel."""
    md = compiled.metadata
    return int(md.global_scratch_size or 0), int(getattr(md, "profile_scratch_size", 0) or 0)


def _scratch_bytes(per_program: int, grid: tuple[int, int, int]) -> int:
    # At least one aligned word, so the pointer is valid even for kernels that need none.
    return max(per_program * int(np.prod(grid)), 128)


def _lowering(ctx, *args, out_shapes, kernel, grid, num_warps, num_stages, compute_capability, name,
              constexprs):
    from jax._src.lib import gpu_triton

    in_avals = ctx.avals_in
    signature = tuple((arg, jt.triton_pointer_type(aval.dtype))
                      for arg, aval in zip(kernel.arg_names, list(in_avals) + list(ctx.avals_out)))
    compiled = _compile(kernel, signature, constexprs, num_warps, num_stages, compute_capability)
    global_bytes, profile_bytes = needs_scratch(compiled)
    scratch_shapes = [jax.core.ShapedArray((_scratch_bytes(b, grid),), jnp.uint8)
                      for b in (global_bytes, profile_bytes)]

    triton_kernel = gpu_triton.TritonKernel(
        compiled.metadata.name, num_warps, 1, compiled.metadata.shared, compiled.asm["ptx"],
        compiled.asm.get("ttir", ""), compute_capability,
    )
    n_params = len(in_avals) + len(ctx.avals_out) + len(scratch_shapes)
    params = [gpu_triton.create_array_parameter(0, _POINTER_ALIGN) for _ in range(n_params)]
    call = gpu_triton.TritonKernelCall(triton_kernel, grid[0], grid[1], grid[2], params)
    rule = jax.ffi.ffi_lowering(
        _CUSTOM_CALL_TARGET, api_version=2,
        backend_config=zlib.compress(call.to_proto(name or compiled.metadata.name, b"")),
    )
    lowering_ctx = ctx.replace(avals_out=list(ctx.avals_out) + scratch_shapes)
    results = rule(lowering_ctx, *args)
    return results[: len(ctx.avals_out)]


mlir.register_lowering(scratch_call_p, _lowering, platform="cuda")
