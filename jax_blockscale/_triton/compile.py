"""Cross-compilation of kernels for targets this machine may not have (used by tests and `explain`).

Triton compiles for any target on a CPU: `target="sm_100"` gives sm_100a PTX, `"gfx950"` AMDGCN,
`"sm_90"` sm_90a PTX. The compiled text lets tests assert that the native instruction is used.
"""

from __future__ import annotations

import inspect

from typing import Any, Mapping

import jax.numpy as jnp

TARGETS = ("sm_90", "sm_100", "gfx950")

# Triton's names for the element types of pointer arguments (as jax-triton names them).
_TRITON_TYPES = {
    jnp.dtype(jnp.bfloat16): "*bf16",
    jnp.dtype(jnp.float16): "*fp16",
    jnp.dtype(jnp.float32): "*fp32",
    jnp.dtype(jnp.float8_e4m3fn): "*fp8e4nv",
    jnp.dtype(jnp.float8_e5m2): "*fp8e5",
    jnp.dtype(jnp.uint8): "*u8",
    jnp.dtype(jnp.int8): "*i8",
    jnp.dtype(jnp.int32): "*i32",
    jnp.dtype(jnp.uint32): "*u32",
}


def triton_pointer_type(dtype) -> str:
    """The Triton signature string for a pointer to `dtype`."""
    return _TRITON_TYPES[jnp.dtype(dtype)]


def gpu_target(target: str):
    from triton.backends.compiler import GPUTarget

    if target.startswith("sm_"):
        return GPUTarget("cuda", int(target[3:]), 32)
    if target.startswith("gfx"):
        return GPUTarget("hip", target, 64)
    raise ValueError(f"unknown target {target!r}; expected one of {TARGETS}")


def compile_kernel(
    kernel,
    *,
    target: str,
    signature: Mapping[str, str],
    constexprs: Mapping[str, Any],
    num_warps: int = 4,
    num_stages: int = 3,
    **options: Any,
):
    """Compiles `kernel` for `target`; returns the triton CompiledKernel (`.asm` holds ptx/amdgcn)."""
    import triton
    from triton.compiler import ASTSource

    if getattr(kernel, "is_gluon", lambda: False)():  # a @gluon.jit kernel: its own front end
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource

    # constexpr parameters with defaults take them when not named (as a launch through jax-triton does)
    constexprs = {**{q.name: q.default for q in kernel.params if q.is_constexpr and q.name not in constexprs
                     and q.default is not inspect.Parameter.empty}, **constexprs}
    full_signature = dict(signature)
    full_signature.update({name: "constexpr" for name in constexprs})
    # jax-triton promises Triton 16-byte-aligned buffers; say the same here so the compiled code (vector
    # loads, cp.async pipelining) is what runs under jax, not a byte-load variant.
    attrs = {(i,): [["tt.divisibility", 16]] for i, ty in enumerate(full_signature.values())
             if ty.startswith("*")}
    src = ASTSource(fn=kernel, signature=full_signature, constexprs=dict(constexprs), attrs=attrs)
    return triton.compile(
        src, target=gpu_target(target), options=dict(num_warps=num_warps, num_stages=num_stages, **options)
    )


def assembly(compiled) -> str:
    """The target assembly text: PTX for CUDA, AMDGCN for HIP."""
    return compiled.asm.get("ptx") or compiled.asm["amdgcn"]
