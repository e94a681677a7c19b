"""Running this package's Triton kernels on the CPU, through Triton's interpreter, on numpy arrays.

The interpreter executes a kernel's Python body with numpy (IEEE float32/float64, no flush to zero) and
reads and writes memory through raw pointers. It asks its tensor arguments for torch's storage API only
to copy device memory to the host and back; `NumpyTensor` answers that API for a host numpy array, so no
torch is needed. Kernels without `tl.dot_scaled` / wgmma run this way (the quantization kernels do).
"""

from __future__ import annotations

import functools
import types

import numpy as np


class _Storage:
    def __init__(self, array: np.ndarray):
        self.array = array

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def cpu(self) -> "_Storage":
        return self  # already host memory

    def copy_(self, other) -> None:
        pass  # the interpreter wrote through the pointer already


class NumpyTensor:
    """A C-contiguous numpy array seen by Triton's interpreter as a tensor argument."""

    def __init__(self, array: np.ndarray):
        if not array.flags.c_contiguous:
            raise ValueError("kernels read row-major memory: pass a C-contiguous array")
        self.array = array
        self.dtype = array.dtype  # str(dtype) names the Triton pointer type ("bfloat16" -> *bf16)

    def data_ptr(self) -> int:
        return self.array.ctypes.data

    def untyped_storage(self) -> _Storage:
        return _Storage(self.array)

    def new_empty(self, *args, **kwargs) -> "NumpyTensor":
        return NumpyTensor(self.array)

    def set_(self, storage: _Storage, offset, size, stride) -> "NumpyTensor":
        self.array = storage.array
        return self

    def storage_offset(self) -> int:
        return 0

    def size(self):
        return self.array.shape

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def copy_(self, other) -> None:
        pass


@functools.lru_cache(maxsize=None)
def interpreted(kernel):
    """`kernel` (a triton.jit function) as Triton's interpreter runs it, whatever TRITON_INTERPRET says.

    The kernel and the @triton.jit helpers of its module are re-bound to one copy of the module's globals
    in which every helper is interpreted too (the compiled JITFunction objects refuse host calls). Helpers
    must live in the kernel's module (or be imported into it by name).
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    globs = dict(kernel.fn.__globals__)

    def rebind(fn):
        return types.FunctionType(fn.__code__, globs, fn.__name__, fn.__defaults__, fn.__closure__)

    for name, value in list(globs.items()):
        if isinstance(value, JITFunction):
            globs[name] = InterpretedFunction(rebind(value.fn))
    return InterpretedFunction(rebind(kernel.fn))


def run(kernel, grid, *arrays: np.ndarray, **constexprs) -> None:
    """Launches `kernel[grid](*arrays, **constexprs)` in the interpreter; outputs are written in place."""
    interpreted(kernel)[grid](*(NumpyTensor(a) for a in arrays), **constexprs)
