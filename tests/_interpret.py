"""Running this package's Triton kernels on the CPU, through Triton's interpreter, on numpy arrays.

The interpreter executes a kernel's Python body with numpy (IEEE float32/float64, no flush to zero) and
reads and writes memory through raw pointers. It asks its tensor arguments for torch's storage API only
to copy device memory to the host and back; `NumpyTensor` answers that API for a host numpy array, so no
torch is needed. Kernels without `tl.dot_scaled` / wgmma run this way (the quantization kernels do).
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
import subprocess
import sys
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


def _scalar_index(self) -> int:
    return int(np.asarray(self.handle.data).reshape(-1)[0])


def _patch_interpreter() -> None:
    """Two fixes to Triton 3.6's interpreter, for kernels whose loop bounds or dots it misreads.

    Scalar indices: it turns a scalar tensor into a Python int (a loop bound, `range(begin, end)` with a
    program-dependent begin) with `int(data)`, and its scalars are 1-element arrays, which NumPy >= 2.3
    refuses to convert; the patch reads the element instead.
    bf16 dots: it keeps bf16 tensors as their uint16 bits and `tl.dot` multiplies those integers; the
    patch widens bf16 operands to float32 first (exact), so the products are the values' products.
    """
    import triton.language as tl
    from triton.runtime import interpreter

    if getattr(interpreter, "_jax_blockscale_patched", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patch(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", _scalar_index)

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot

    def widened(handle):
        if handle.dtype == tl.bfloat16:
            bits = handle.data.astype(np.uint32) << 16
            return interpreter.TensorHandle(bits.view(np.float32), tl.float32)
        return handle

    def dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widened(a), widened(b), d, input_precision, max_num_imprecise_acc)

    interpreter._patch_lang_tensor = patch
    builder.create_dot = dot
    interpreter._jax_blockscale_patched = True


@functools.lru_cache(maxsize=None)
def interpreted(kernel):
    """`kernel` (a triton.jit function) as Triton's interpreter runs it, whatever TRITON_INTERPRET says.

    The kernel and the @triton.jit helpers of its module are re-bound to one copy of the module's globals
    in which every helper is interpreted too (the compiled JITFunction objects refuse host calls). Helpers
    must live in the kernel's module (or be imported into it by name).
    """
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    _patch_interpreter()
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


def run_matmul_cases(cases: list[dict]) -> list[dict]:
    """Runs `jb.matmul` cases through the whole GPU path with the kernels in the interpreter
    (tests/_decode_interpret_check.py, in a subprocess: TRITON_INTERPRET must be set before triton.language is
    imported); one result dict per case, in order."""
    here = pathlib.Path(__file__).parent
    root = str(here.parent)
    env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(here / "_decode_interpret_check.py"), json.dumps(cases)],
                          capture_output=True, text=True, env=env, timeout=1200, cwd=root)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
