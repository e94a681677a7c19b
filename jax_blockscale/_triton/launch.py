"""Emitting jaxlib's Triton custom call from an in-process `triton.compile`, without asking a device.

Two uses, both the same `triton_kernel_call` custom call that jax-triton emits (only how the kernel is
compiled and which parameters it gets differ):

1. **Global scratch (CUDA).** jax-triton 0.3.1 compiles a kernel and passes XLA buffers for its pointer
   arguments, but Triton 3.6 kernels also take two implicit trailing pointers, `global_scratch` and
   `profile_scratch`, which it leaves null. A kernel that builds a TMA descriptor in the kernel
   (`tl.make_tensor_descriptor`) writes the 128-byte descriptor to global scratch first (a TMA unit reads
   descriptors from memory), so under jax-triton it writes through a null pointer. jaxlib 0.11 can allocate
   scratch itself but 0.10 cannot, and neither version's jax-triton asks for it. `scratch_call` passes
   XLA-allocated buffers *for* the implicit scratch arguments, as two extra outputs of the custom call that
   the caller never sees. Triton indexes global scratch per program (`base + linear_program_id * size`), so
   the buffer holds one slice per program.
2. **ROCm without a device.** jax-triton's ROCm lowering asks device 0 for its architecture, so a program
   cannot be lowered for `rocm` on a machine without an AMD GPU. `hip_lowering` compiles for the
   architecture it is given (the `target=` of the matmul) and emits the call jaxlib's HIP runtime expects:
   the kernel's `ptx` field holds the *path* of an hsaco file, which jaxlib reads, loads and deletes on the
   first launch (jaxlib/gpu/triton_kernels.cc, `GetModuleImage`).
"""

from __future__ import annotations

import functools
import os
import tempfile
import zlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from .compile import compile_kernel, triton_pointer_type

__all__ = ["scratch_call", "needs_scratch", "hip_lowering", "hip_assembly"]

# The custom call target jaxlib registers for Triton kernels (jax-triton uses the same one).
_CUSTOM_CALL_TARGET = "triton_kernel_call"
_POINTER_ALIGN = 16  # XLA buffers are at least 16-byte aligned; Triton's TMA needs exactly that.

scratch_call_p = Primitive("jax_blockscale_triton_scratch_call")
scratch_call_p.multiple_results = True


@scratch_call_p.def_abstract_eval
def _abstract_eval(*avals, out_shapes, **_):
    return [jax.core.ShapedArray(s.shape, s.dtype) for s in out_shapes]


def scratch_call(kernel, *args: jax.Array, out_shape, grid: Sequence[int],
                 num_warps: int, num_stages: int, compute_capability: int, name: str,
                 maxnreg: int = 0, zeroed_outputs: Sequence[int] = (), **constexprs: Any):
    """Launches `kernel(*args, *outs, **constexprs)` on `grid` with its global scratch provided.

    Same conventions as `jt.call`: every argument is an array (pointer), the outputs follow the inputs,
    everything else is a constexpr. `out_shape`: one ShapeDtypeStruct (returns one array) or a sequence of
    them (returns a list). CUDA only. `maxnreg` > 0 caps registers per thread (PTX `.maxnreg`), e.g. so
    that two programs fit on one SM. `zeroed_outputs`: indices of outputs that start as zeros (split-K
    counters, atomic accumulators): jaxlib's Triton call memsets them before the launch, as jax-triton's
    `zeroed_outputs` does.
    """
    single = isinstance(out_shape, jax.ShapeDtypeStruct)
    shapes = (out_shape,) if single else tuple(out_shape)
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    outs = scratch_call_p.bind(
        *args, out_shapes=tuple(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in shapes), kernel=kernel,
        grid=grid, num_warps=num_warps, num_stages=num_stages, compute_capability=compute_capability,
        name=name, maxnreg=int(maxnreg), zeroed_outputs=tuple(int(i) for i in zeroed_outputs),
        constexprs=tuple(sorted(constexprs.items())),
    )
    return outs[0] if single else list(outs)


def _signature(kernel, avals) -> tuple:
    return tuple((arg, triton_pointer_type(aval.dtype)) for arg, aval in zip(kernel.arg_names, avals))


@functools.lru_cache(maxsize=None)
def _compile(kernel, signature: tuple, constexprs: tuple, num_warps: int, num_stages: int, target: str,
             maxnreg: int = 0):
    options = {"maxnreg": maxnreg} if maxnreg else {}
    return compile_kernel(kernel, target=target, signature=dict(signature), constexprs=dict(constexprs),
                          num_warps=num_warps, num_stages=num_stages, **options)


def needs_scratch(compiled) -> tuple[int, int]:
    """(global scratch bytes per program, profile scratch bytes per program) of a compiled kernel.

    Triton's AMD backend has no global scratch (its metadata has no such field): 0 there."""
    md = compiled.metadata
    return int(getattr(md, "global_scratch_size", 0) or 0), int(getattr(md, "profile_scratch_size", 0) or 0)


def _scratch_bytes(per_program: int, grid: tuple[int, int, int]) -> int:
    # At least one aligned word, so the pointer is valid even for kernels that need none.
    return max(per_program * int(np.prod(grid)), 128)


def _gpu_triton():
    """jaxlib's Triton call serializer. It is the HIP build on a ROCm machine and the CUDA build elsewhere:
    both write the same `jax_triton.TritonAnyKernelCall` proto, and neither needs a device to do it."""
    from jax._src.lib import gpu_triton

    if not hasattr(gpu_triton, "TritonKernel"):
        raise ImportError(
            "serializing a Triton kernel call needs jaxlib's gpu_triton from a GPU plugin: "
            "jax-cuda13-plugin (installs on any machine) or jax-rocm7-plugin with the ROCm runtime")
    return gpu_triton


def _emit(ctx, args, compiled, *, binary: str, compute_capability: int, num_warps: int,
          grid: tuple[int, int, int], name: str, scratch_shapes: Sequence[jax.core.ShapedArray],
          zeroed_outputs: Sequence[int] = ()):
    """The custom call launching `compiled` (loaded from `binary`) on `grid`: every operand and result is a
    16-byte-aligned pointer; `scratch_shapes` become extra results the caller never sees; the results
    `zeroed_outputs` are zero-filled before the launch."""
    gpu_triton = _gpu_triton()
    # A warp-specialized kernel runs more warps than it was asked for (Triton 3.6 adds the producer and
    # consumer partitions and records the total in metadata.num_warps); launching with the requested count
    # fails with CUDA_ERROR_INVALID_VALUE (the PTX's .reqntid differs), as measured on an H100.
    num_warps = max(num_warps, int(getattr(compiled.metadata, "num_warps", num_warps) or num_warps))
    triton_kernel = gpu_triton.TritonKernel(
        compiled.metadata.name, num_warps, 1, compiled.metadata.shared, binary,
        compiled.asm.get("ttir", ""), compute_capability,
    )
    n_params = len(ctx.avals_in) + len(ctx.avals_out) + len(scratch_shapes)
    zero_bytes = [0] * n_params
    for i in zeroed_outputs:
        aval = ctx.avals_out[i]
        zero_bytes[len(ctx.avals_in) + i] = int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize
    params = [gpu_triton.create_array_parameter(b, _POINTER_ALIGN) for b in zero_bytes]
    call = gpu_triton.TritonKernelCall(triton_kernel, grid[0], grid[1], grid[2], params)
    rule = jax.ffi.ffi_lowering(
        _CUSTOM_CALL_TARGET, api_version=2,
        backend_config=zlib.compress(call.to_proto(name or compiled.metadata.name, b"")),
    )
    lowering_ctx = ctx.replace(avals_out=list(ctx.avals_out) + list(scratch_shapes))
    results = rule(lowering_ctx, *args)
    return results[: len(ctx.avals_out)]


def _lowering(ctx, *args, out_shapes, kernel, grid, num_warps, num_stages, compute_capability, name,
              maxnreg, zeroed_outputs, constexprs):
    signature = _signature(kernel, list(ctx.avals_in) + list(ctx.avals_out))
    compiled = _compile(kernel, signature, constexprs, num_warps, num_stages, f"sm_{compute_capability}",
                        maxnreg)
    scratch_shapes = [jax.core.ShapedArray((_scratch_bytes(b, grid),), jnp.uint8)
                      for b in needs_scratch(compiled)]
    # jaxlib assembles this PTX itself (stream_executor::CompileGpuAsm: libnvptxcompiler or the CUDA
    # installation's ptxas, default options), not with Triton's bundled ptxas; the CPU tests' ptxas reports
    # (spills, wgmma serialization) come from Triton's, a proxy for the machine code that runs.
    return _emit(ctx, args, compiled, binary=compiled.asm["ptx"], compute_capability=compute_capability,
                 num_warps=num_warps, grid=grid, name=name, scratch_shapes=scratch_shapes,
                 zeroed_outputs=zeroed_outputs)


mlir.register_lowering(scratch_call_p, _lowering, platform="cuda")


# hsaco path -> AMDGCN text of every kernel compiled here for ROCm, so CPU tests can read the instructions
# of a lowered program (the custom call itself only names the file).
_HIP_ASSEMBLY: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def _hip_binary(kernel, signature: tuple, constexprs: tuple, num_warps: int, num_stages: int, arch: str):
    """The compiled kernel and the hsaco file jaxlib will load it from: one file per kernel per process,
    as jax-triton does. A name shared between processes would race, because jaxlib deletes the file once
    it has read it; within a process jaxlib keeps the loaded module keyed by this path."""
    compiled = _compile(kernel, signature, constexprs, num_warps, num_stages, arch)
    fd, path = tempfile.mkstemp(prefix=f"{compiled.metadata.name}-{arch}-", suffix=".hsaco")
    with os.fdopen(fd, "wb") as f:
        f.write(compiled.asm["hsaco"])
    _HIP_ASSEMBLY[path] = compiled.asm["amdgcn"]
    return compiled, path


def hip_lowering(ctx, *args, kernel, grid: tuple[int, int, int], num_warps: int, num_stages: int, arch: str,
                 name: str, constexprs: tuple):
    """Lowers `kernel(*args, *outs, **constexprs)` for ROCm `arch` (e.g. "gfx950") with no device."""
    if not arch.startswith("gfx"):
        raise ValueError(f"lowering for rocm needs a gfx architecture, got target {arch!r}")
    signature = _signature(kernel, list(ctx.avals_in) + list(ctx.avals_out))
    compiled, path = _hip_binary(kernel, signature, constexprs, num_warps, num_stages, arch)
    # jaxlib passes null for the implicit scratch pointers; buffers only if the kernel would use them.
    scratch_shapes = [jax.core.ShapedArray((_scratch_bytes(b, grid),), jnp.uint8)
                      for b in needs_scratch(compiled)] if any(needs_scratch(compiled)) else []
    # compute_capability only keys jaxlib's HIP module cache (next to the path): nothing reads it as an arch.
    return _emit(ctx, args, compiled, binary=path, compute_capability=0, num_warps=num_warps, grid=grid,
                 name=name, scratch_shapes=scratch_shapes)


def hip_assembly(serialized_call: bytes) -> str:
    """The AMDGCN of the kernel a (decompressed) ROCm `triton_kernel_call` backend config names."""
    found = [asm for path, asm in _HIP_ASSEMBLY.items() if path.encode() in serialized_call]
    if len(found) != 1:
        raise KeyError("the call names no hsaco file compiled by this process")
    return found[0]
