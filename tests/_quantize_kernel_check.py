"""Runs the quantization kernel in Triton's interpreter (TRITON_INTERPRET=1) and counts mismatching
codes/scales against the jnp quantizer on XLA:CPU. Run by tests/test_quantize_kernel.py in a subprocess
(the interpreter must be chosen before triton.language is imported). Prints one JSON line per case."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

import _ptx_emulator  # noqa: E402
from _exact_fma import install as install_exact_fma  # noqa: E402
from _interpret import NumpyTensor  # noqa: E402
from _quant_inputs import special_input  # noqa: E402
from jax_blockscale import get_format  # noqa: E402
from jax_blockscale._triton import quantize_kernels as qk  # noqa: E402
from jax_blockscale.quantize import nvfp4_tensor_scale  # noqa: E402
from jax_blockscale.quantize_primitive import _reference  # noqa: E402

DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "f16": np.float16}


def fmt(spec):
    if spec is None:
        return None
    name, block = spec
    return get_format(name, block=tuple(block) if block else None)


def run_case(case):
    rng = np.random.default_rng(case["seed"])
    x = special_input(rng, tuple(case["shape"]), DTYPES[case["dtype"]], subnormals=False)
    row, col, rounding = fmt(case["row"]), fmt(case["col"]), case["rounding"]
    ts = np.ones(2, np.float32)
    if row is not None and row.name == "nvfp4":
        ts[0] = float(nvfp4_tensor_scale(jnp.asarray(x)))
    if col is not None and col.name == "nvfp4":
        ts[1] = float(nvfp4_tensor_scale(jnp.asarray(np.swapaxes(x, -1, -2))))
    b = int(np.prod(x.shape[:-2], dtype=np.int64))
    p = qk.plan(b, x.shape[-2], x.shape[-1], qk.Side(row, rounding), qk.Side(col, rounding),
                col_mode=case.get("col_mode"), div=case.get("div", "f32"), cvt=case.get("cvt", "int"),
                t_words=case.get("t_words"), strips=case.get("strips"),
                tile=tuple(case["tile"]) if "tile" in case else None)
    got = [np.zeros(shape, dtype) for shape, dtype in p.out_shapes]
    args = [x.reshape((b,) + x.shape[-2:]), ts] + got
    qk.quantize_kernel[p.grid](*(NumpyTensor(a) for a in args), **p.constexprs)
    want = jax.jit(lambda x, ts: _reference(x, ts, row=(row, rounding), col=(col, rounding)))(x, ts)
    mismatches = []
    for w, g in zip(want, got):
        w = np.asarray(w)
        if w.shape != g.shape:
            mismatches.append(f"shape {w.shape} vs {g.shape}")
            continue
        view = np.uint32 if w.dtype == np.float32 else np.uint8
        mismatches.append(int((w.view(view) != g.view(view)).sum()))
    return dict(case=case, mismatches=mismatches, elements=int(x.size))


if __name__ == "__main__":
    install_exact_fma()  # the interpreter's tl.fma rounds twice; the kernel's float32 quotient needs one
    # cvt="hw" cases: the fp8 conversion's inline PTX, emulated; its packs of 4 taken along the blocked views'
    # last axis (the encoder is elementwise, so any grouping the GPU's layout picks gives the same codes)
    _ptx_emulator.install(pack_axis=-1)
    for case in json.loads(sys.argv[1]):
        print(json.dumps(run_case(case)), flush=True)
