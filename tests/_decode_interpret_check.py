"""Runs the decode kernel (`_triton/decode.py`) in Triton's interpreter through the whole GPU path of
`jb.matmul`: dispatch, the primitive's canonicalization (K padding, batch folding), the launcher's
workspace / zeroed outputs, and the kernel; compared against the jnp reference on XLA:CPU.

Run by tests/test_decode_interpret.py in a subprocess (TRITON_INTERPRET=1 must be set before
triton.language is imported). Prints one JSON line per case.

How: the primitive's CPU lowering is replaced by its GPU one (`primitive._kernel_impl` for target sm_90),
and jax-triton's `triton_call` (and `jt.call`'s primitive) by a host callback that runs the kernel in the
interpreter. A case with
"asm" runs the inline-PTX fp4 decode through tests/_ptx_emulator.py (compute capability 90); without it
the launcher gets none, so the fp32 decode of `upcast.py` runs. Outputs the
launcher does not list as zeroed start as NaN / 0x5A5A5A5A, so a kernel that relied on them would show.
XLA:CPU runs host callbacks on threads that flush float32 subnormals (MXCSR FTZ/DAZ), which would zero
e2m1's 0.5 and every fp6 subnormal before the kernel's exact 2**126 multiply; so the interpreter runs
on a thread started here, before XLA, with the default IEEE environment (a GPU keeps subnormals too).
"""

import concurrent.futures
import dataclasses
import functools
import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.interpreters import mlir  # noqa: E402

import jax_blockscale as jb  # noqa: E402
import _ptx_emulator  # noqa: E402
from _interpret import run  # noqa: E402
from jax_blockscale import primitive  # noqa: E402
from jax_blockscale._triton import jt  # noqa: E402
from jax_blockscale._triton.problem import TileConfig  # noqa: E402

# One worker created now, from the main thread: threads inherit their creator's floating-point control.
_IEEE_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=1)
_IEEE_THREAD.submit(lambda: None).result()

TARGET = "sm_90"
# The decode entry is opt-in on sm_90 (backends: slower than the older paths there, measured); this harness
# checks the decode kernel as dispatch would run it, so it turns the entry on.
from jax_blockscale import backends as _backends  # noqa: E402

_backends.KERNEL_TABLE[TARGET] = tuple(dataclasses.replace(e, opt_in=None) if e.module == "decode" else e
                                       for e in _backends.KERNEL_TABLE[TARGET])
_COMPUTE_CAPABILITY = [None]  # per case: 90 runs the PTX decode (emulated), None the fp32 one
_ptx_emulator.install()
LAUNCHES = []  # (kernel name, constexprs) of every interpreted launch, for the caller to check


class _InterpretedJaxTriton:
    """Stands in for the jax_triton module: `triton_call` runs the kernel on the host, in the interpreter."""

    @staticmethod
    def triton_call(*args, kernel, out_shape, grid, zeroed_outputs=(), name="", num_warps=4, num_stages=3,
                    compute_capability=None, **constexprs):
        del num_warps, num_stages, compute_capability
        out_shape = tuple(out_shape)
        LAUNCHES.append(dict(name=name, grid=list(grid), **{k: v for k, v in constexprs.items()
                                                            if isinstance(v, (bool, int, str))}))

        def host(*arrays):
            outs = []
            for i, s in enumerate(out_shape):
                if i in zeroed_outputs:
                    outs.append(np.zeros(s.shape, s.dtype))
                elif jnp.issubdtype(s.dtype, jnp.floating):
                    outs.append(np.full(s.shape, np.nan, s.dtype))
                else:
                    outs.append(np.full(s.shape, 0x5A5A5A5A, s.dtype))
            ins = [np.ascontiguousarray(np.asarray(a)) for a in arrays]
            _IEEE_THREAD.submit(run, kernel, tuple(grid), *ins, *outs, **constexprs).result()
            return tuple(outs)

        return jax.pure_callback(host, out_shape, *args)


jt.jax_triton = lambda: _InterpretedJaxTriton


def _interpreted_call_lowering(ctx, *args, kernel, out_avals, grid, num_warps, num_stages, compute_capability,
                               target, name, constexprs):
    """`jt.call`'s primitive (the launchers that use it, e.g. block_fp8.run_gemm) on the CPU: the same host
    callback as `triton_call` above."""
    del target
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in out_avals]

    def fn(*arrays):
        return list(_InterpretedJaxTriton.triton_call(
            *arrays, kernel=kernel, out_shape=shapes, grid=grid, name=name, num_warps=num_warps,
            num_stages=num_stages, compute_capability=compute_capability, **dict(constexprs)))

    return mlir.lower_fun(fn, multiple_results=True)(ctx, *args)


mlir.register_lowering(jt.triton_call_p, _interpreted_call_lowering, platform="cpu")


def _interpreted_lowering(ctx, *args, target, **params):
    del target
    fn = functools.partial(primitive._kernel_impl, target=TARGET, compute_capability=_COMPUTE_CAPABILITY[0],
                           **params)
    return mlir.lower_fun(fn, multiple_results=False)(ctx, *args)


mlir.register_lowering(primitive.blockscaled_matmul_p, _interpreted_lowering, platform="cpu")


def _operands(case):
    rng = np.random.default_rng(case["seed"])
    batch, m, n, k = case["batch"], case["m"], case["n"], case["k"]
    a = rng.standard_normal((*batch, m, k)).astype(np.float32) * case.get("a_gain", 1.0)
    b = rng.standard_normal((n, k)).astype(np.float32) * case.get("b_gain", 1.0) / np.sqrt(k)
    a = jnp.asarray(a)
    a = a.astype(jnp.bfloat16) if case["fa"] == "bf16" else jb.quantize_operand(a, case["fa"], side="a")
    return a, jb.quantize_operand(jnp.asarray(b), case["fb"], side="b")


def run_case(case):
    a, b = _operands(case)
    config = TileConfig(**case["config"]) if case.get("config") else None
    out_dtype = jnp.dtype(case.get("out_dtype", "bfloat16"))
    kernel = jb.explain(a, b, target=TARGET).kernel
    LAUNCHES.clear()
    # "asm": the PTX decode (emulated) needs sm_90; "hopper": a Hopper-only launch option (TileConfig.widen_first)
    _COMPUTE_CAPABILITY[0] = 90 if case.get("asm") or case.get("hopper") else None
    out = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype, config=config))(a, b)
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    out64, ref64 = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    err = float(np.linalg.norm(out64 - ref64) / max(np.linalg.norm(ref64), 1e-30))
    return dict(case=case, kernel=kernel, launches=list(LAUNCHES), rel_err=err,
                finite=bool(np.isfinite(out64).all()), shape=list(out.shape), dtype=str(out.dtype),
                bits=np.asarray(out).view(np.uint8).tobytes().hex() if case.get("bits") else None)


if __name__ == "__main__":
    for case in json.loads(sys.argv[1]):
        print(json.dumps(run_case(case)), flush=True)
