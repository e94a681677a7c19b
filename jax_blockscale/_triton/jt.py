"""Thin access to jax-triton, and the one way every launcher calls a Triton kernel (`call`).

jax-triton imports only with a GPU jaxlib (or the jax-cuda plugin) and sets TRITON_CACHE_DIR="" on import,
which turns Triton's on-disk cache off for the whole process; we put the previous value back.

`call` binds an in-project primitive whose lowering depends on the platform: for `cuda` it is jax-triton's
own lowering (the compute capability comes from the target); for `rocm` it is `launch.hip_lowering`,
because jax-triton's ROCm lowering asks device 0 for its architecture and so fails without an AMD GPU.
The architecture comes from the target the program is lowered for (`lowering_target`, which the matmul
primitive's GPU lowering sets from its `target=`), and only without one from the ROCm device in hand.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import zlib
from typing import Any, Iterator, Optional

import jax
from jax.extend.core import Primitive
from jax.interpreters import mlir

from . import launch
from .compile import triton_pointer_type

__all__ = ["call", "jax_triton", "lowered_kernels", "lowered_amdgcn", "lowering_target",
           "triton_pointer_type"]

_LOWERING_TARGET: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "jax_blockscale_lowering_target", default=None)


@contextlib.contextmanager
def lowering_target(target: Optional[str]) -> Iterator[None]:
    """Kernels that `call` binds inside this block lower for `target` (e.g. "gfx950") on ROCm."""
    token = _LOWERING_TARGET.set(target)
    try:
        yield
    finally:
        _LOWERING_TARGET.reset(token)


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


triton_call_p = Primitive("jax_blockscale_triton_call")
triton_call_p.multiple_results = True
# Outside jit (a launcher called eagerly), as jax-triton's primitive: compiled and run as its own program.
triton_call_p.def_impl(functools.partial(jax._src.dispatch.apply_primitive, triton_call_p))


@triton_call_p.def_abstract_eval
def _abstract_eval(*avals, out_avals, **_):
    return list(out_avals)


def call(kernel, *args: jax.Array, out_shape, grid, num_warps: int, num_stages: int,
         compute_capability: int | None, name: str = "", **constexprs: Any) -> Any:
    """Launches `kernel(*args, *outs, **constexprs)` on `grid`: outputs follow all inputs in the kernel
    signature, shapes/strides are constexprs (jax-triton does not divisibility-specialize scalar ints).
    `out_shape` is a ShapeDtypeStruct or a pytree of them; the result has the same structure."""
    if callable(grid):
        grid = grid(constexprs)
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    if len(grid) > 3:
        raise ValueError(f"a Triton grid has at most 3 dims, got {grid}")
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    flat_shapes, tree = jax.tree.flatten(out_shape)
    outs = triton_call_p.bind(
        *args, kernel=kernel, out_avals=tuple(jax.core.ShapedArray(s.shape, s.dtype) for s in flat_shapes),
        grid=grid, num_warps=num_warps, num_stages=num_stages, compute_capability=compute_capability,
        target=_LOWERING_TARGET.get(), name=name, constexprs=tuple(sorted(constexprs.items())),
    )
    return jax.tree.unflatten(tree, outs)


def _cuda_lowering(ctx, *args, kernel, out_avals, grid, num_warps, num_stages, compute_capability, target,
                   name, constexprs):
    del target  # the compute capability says it for CUDA
    def launch_with_jax_triton(*arrays):
        return jax_triton().triton_call(
            *arrays, kernel=kernel, out_shape=[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals],
            grid=grid, name=name, num_warps=num_warps, num_stages=num_stages,
            compute_capability=compute_capability, **dict(constexprs))
    return mlir.lower_fun(launch_with_jax_triton, multiple_results=True)(ctx, *args)


def _device_arch() -> str:
    try:
        device = jax.devices("rocm")[0]
    except RuntimeError:
        raise ValueError("lowering a Triton kernel for rocm without a ROCm device needs its architecture: "
                         "pass target= (e.g. 'gfx950') to the matmul") from None
    from ..backends import detect_target

    return detect_target(device)


def _rocm_lowering(ctx, *args, kernel, out_avals, grid, num_warps, num_stages, compute_capability, target,
                   name, constexprs):
    del out_avals, compute_capability  # ctx.avals_out holds the results; ROCm has no compute capability
    return launch.hip_lowering(ctx, *args, kernel=kernel, grid=grid, num_warps=num_warps,
                               num_stages=num_stages, arch=target or _device_arch(), name=name,
                               constexprs=constexprs)


mlir.register_lowering(triton_call_p, _cuda_lowering, platform="cuda")
mlir.register_lowering(triton_call_p, _rocm_lowering, platform="rocm")


def lowered_kernels(lowered) -> list[bytes]:
    """The serialized kernel calls of every Triton custom call in a `jax.jit(...).lower()` or an MLIR
    module: PTX inside for `cuda`, the hsaco file's path for `rocm` (`lowered_amdgcn` reads its assembly).

    Lets CPU tests check the instructions of a lowered program without a GPU.
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

    # A jax `Lowered`, or an MLIR module (e.g. the per-device program a partitioning callback built).
    module = lowered.compiler_ir("stablehlo") if hasattr(lowered, "compiler_ir") else lowered
    walk(module.operation)
    return found


def lowered_amdgcn(lowered) -> list[str]:
    """The AMDGCN of every Triton custom call in a program (or module) lowered for `rocm` in this process."""
    return [launch.hip_assembly(k) for k in lowered_kernels(lowered)]
