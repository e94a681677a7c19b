"""A/B (experiment, session 36): the Gluon block FP8 kernel with named-barrier partition sync against the
same kernel with mbarrier sync (the code before, `_triton/_bf8_mbarrier.py`, an untracked copy of the
previous commit's module), both against cuBLAS blockwise, in interleaved rounds.

    python -m benchmarks.block_fp8_sync_ab --rounds 5 [--shapes issue|suite|MxNxK,...]

Both rows run through `jb.matmul` with the kernel's default config; the mbarrier row swaps the module's
`launch` while its program is traced and compiled. Kernel names differ (`block_fp8_gluon_mbarrier`), so
the profile shows which ran.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import block_fp8_gluon as bg  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem  # noqa: E402

from . import _baselines as bl  # noqa: E402
from ._timing import TimingConfig  # noqa: E402
from ._torch import torch_blockwise  # noqa: E402
from .block_fp8_variants import SHAPES, SUITE_SHAPES, _interleaved, _kernel_us, _operands, summary  # noqa: E402


def _with_launch(launch, work):
    saved = bg.launch
    bg.launch = launch
    try:
        return work()
    finally:
        bg.launch = saved


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shapes", default="issue")
    ap.add_argument("--variants", default="named,mbarrier",
                    help="named (the module as it is) and untracked copies _triton/_bf8_<name>.py")
    a = ap.parse_args(argv)
    import importlib

    variants = {v: (bg.launch if v == "named" else importlib.import_module(f"jax_blockscale._triton._bf8_{v}").launch)
                for v in a.variants.split(",")}

    if a.shapes == "issue":
        shapes = SHAPES
    elif a.shapes == "suite":
        shapes = SUITE_SHAPES
    elif a.shapes == "rest":
        shapes = tuple(s for s in SUITE_SHAPES if s not in SHAPES)
    else:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in a.shapes.split(","))
    cfg = TimingConfig(min_samples=3, max_samples=8, sample_budget_s=0.25, kernel_time=True)
    print(f"block_fp8_sync_ab: {jax.devices()[0].device_kind}, {a.rounds} rounds", flush=True)
    start = time.perf_counter()
    rates: dict = {}
    for m, n, k in shapes:
        case, flops = f"{m}x{n}x{k}", 2.0 * m * n * k
        p = GemmProblem(1, False, m, n, k + (-k % 256), "block_fp8", "block_fp8", "bf16")
        config = bg.default_config(p)
        qs = _operands(m, n, k, cfg)
        ref0 = jax.jit(bl.ours_ref)(*qs[0])
        op = lambda x, w: jb.matmul(x, w, out_dtype=bl.BF16, config=config)  # noqa: E731
        rows = [("cuBLAS", lambda: torch_blockwise(qs, ref0, cfg))]
        rows += [(v, lambda launch=launch: _with_launch(launch, lambda: bl.run_jax("ours", op, qs, bl.ours_ref, cfg)))
                 for v, launch in variants.items()]
        timed = {}
        for label, work in rows:
            o = work()
            us = _kernel_us(o)
            tf = flops / us / 1e6 if math.isfinite(us) else math.nan
            rates.setdefault(label, {})[case] = tf
            kernels = o.kernel.summary(2) if o.kernel is not None else ""
            print(f"  {case:<18} {label:<10} {o.status:<6} kernel {us:9.1f} us {tf:7.1f} TF/s err {o.rel_err:.1e} "
                  f"{kernels[:100]} {o.note[:60]}", flush=True)
            if math.isfinite(us) and o.reprofile is not None:
                timed[label] = (us, o.reprofile)
        if a.rounds > 1 and "cuBLAS" in timed:
            _interleaved(case, flops, timed, a.rounds, rates)
        del qs, rows, timed
    print("\nkernel-time TF/s (x ratio to cuBLAS blockwise)\n" + summary(rates, shapes))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
