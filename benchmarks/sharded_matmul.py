"""The block-scaled matmul sharded over GPUs: each partitioning case against the unsharded run.

    python benchmarks/sharded_matmul.py                          # all GPUs of the host, M = N = K = 8192
    python benchmarks/sharded_matmul.py --formats mxfp8,fp8_block --m 16384

Cases, on a 1-D mesh ("x") of every GPU: data parallel (activations split on M, weight replicated),
column parallel (weight split on N), row parallel (K split on both operands; partial products all-reduced,
or reduce-scattered into an N-split output), and, with 4 or more GPUs, data x model on a 2-D mesh. For
each: the sharded output against the unsharded Triton run (max |diff| / max |ref|) and the jnp reference
(relative Frobenius error), the collectives in the compiled HLO (an all-gather would mean an operand was
gathered), the step time (wall clock around a jitted call, median of --iters after --warmup), and the
per-device kernel time from a profiler trace: the compute kernels (the GEMM and the small kernels around
it) and the NCCL kernels of one step on each GPU, read from the device planes of `jax.profiler`. Prints a
table, writes a CSV under benchmarks/results/. Without at least 2 GPUs it says so and exits 0.

Step time is wall clock, so it includes launching the program (on the H200 x2 run, step minus kernel
time was about 0.7 ms on one GPU and 1 ms on two): at 8192^3 the per-device kernel columns show the split
more directly than the step-time ratio. Row
parallel sums float32 partial products (twice the bytes of bf16) so that the output rounds once.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import glob
import pathlib
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORMATS = {"mxfp8": ("mxfp8", "mxfp8"), "mxfp4": ("mxfp4", "mxfp4"), "nvfp4": ("nvfp4", "nvfp4"),
           "fp8_block": ("fp8_block", "fp8_block"), "bf16xmxfp4": ("bf16", "mxfp4")}
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def cases(n: int) -> list[tuple[str, tuple[int, ...], tuple[str, ...], P, P, P]]:
    """(name, mesh shape, axis names, a spec, b spec, out spec); the spec of values and scales alike."""
    one = ((n,), ("x",))
    out = [
        ("data_parallel", *one, P("x", None), P(), P("x", None)),
        ("column_parallel", *one, P(), P("x", None), P(None, "x")),
        ("row_parallel_psum", *one, P(None, "x"), P(None, "x"), P()),
        ("row_parallel_reduce_scatter", *one, P(None, "x"), P(None, "x"), P(None, "x")),
    ]
    if n >= 4:
        two = ((n // 2, 2), ("data", "model"))
        out += [("2d_data_x_column", *two, P("data", None), P("model", None), P("data", "model")),
                ("2d_data_x_row", *two, P("data", "model"), P(None, "model"), P("data", None))]
    return out


def quantized(x, fmt: str, side: str):
    if fmt == "bf16":
        return x.astype(jnp.bfloat16)
    if fmt == "fp8_block":
        return jb.quantize(x, fmt, block=(1, 128) if side == "a" else (128, 128))
    return jb.quantize(x, fmt)


def place(x, mesh, spec):
    def leaf(t):
        return jax.device_put(t, NamedSharding(mesh, spec if t.ndim else P()))
    return jax.tree_util.tree_map(leaf, x)


def step_time_ms(fn, args, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_times_ms(fn, args, iters: int) -> dict[int, dict[str, float]]:
    """Per GPU, the mean per step of its kernels' device time: {'compute': ms, 'nccl': ms}.

    Kernel executions are the events on a device plane's "Stream" lines; NCCL kernels are named nccl*,
    'compute' is every other kernel of the step (the GEMM and the small scale/convert kernels around it).
    """
    from jax.profiler import ProfileData
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(iters):
                jax.block_until_ready(fn(*args))
        files = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)
        planes = [p for f in files for p in ProfileData.from_file(f).planes]
    out: dict[int, dict[str, float]] = {}
    for plane in planes:
        match = re.match(r"/device:GPU:(\d+)", plane.name)
        if not match:
            continue
        totals = defaultdict(float)
        for line in plane.lines:
            if not line.name.startswith("Stream"):
                continue
            for ev in line.events:
                kind = "nccl" if "nccl" in ev.name.lower() else "compute"
                totals[kind] += ev.duration_ns / 1e6 / iters
        out[int(match.group(1))] = dict(totals)
    if not out:  # say what the trace held instead, so the parsing can be fixed
        print("no GPU kernel events in the trace; planes:",
              {p.name: [line.name for line in p.lines][:6] for p in planes}, file=sys.stderr)
    return out


def collectives(compiled_text: str) -> str:
    found = sorted(set(re.findall(r"\b(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", compiled_text)))
    return "+".join(found) or "none"


def run(args) -> list[dict]:
    devices = jax.devices()
    n = min(len(devices), args.devices) if args.devices else len(devices)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((args.m, args.k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((args.n, args.k)), jnp.float32)
    rows = []
    for name in args.formats.split(","):
        fa, fb = FORMATS[name]
        a, b = quantized(x, fa, "a"), quantized(w, fb, "b")
        mm = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.bfloat16))
        a1, b1 = jax.device_put((a, b), devices[0])
        base = mm(a1, b1)
        ref = jb.reference.matmul(a1, b1, out_dtype=jnp.float32)
        ref_norm = float(jnp.linalg.norm(ref))
        base_max = float(jnp.max(jnp.abs(base.astype(jnp.float32))))
        base_ms = step_time_ms(mm, (a1, b1), args.warmup, args.iters)
        base_k = kernel_times_ms(mm, (a1, b1), args.profile_iters).get(devices[0].id, {})
        rows.append(dict(format=name, case="unsharded (1 GPU)", devices=1, collectives="none", step_ms=base_ms,
                         speedup=1.0, compute_ms_per_device=_fmt([base_k.get("compute", float("nan"))]),
                         nccl_ms_per_device=_fmt([base_k.get("nccl", 0.0)]),
                         rel_err_vs_reference=float(jnp.linalg.norm(base.astype(jnp.float32) - ref)) / ref_norm,
                         max_diff_vs_unsharded=0.0, explain=jb.explain(a, b).path))
        print(_row_text(rows[-1]), flush=True)
        for case, shape, names, a_spec, b_spec, out_spec in cases(n):
            mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices[:n])
            fn = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.bfloat16),
                         out_shardings=NamedSharding(mesh, out_spec))
            sa, sb = place(a, mesh, a_spec), place(b, mesh, b_spec)
            colls = collectives(fn.lower(sa, sb).compile().as_text())
            out = fn(sa, sb)
            full = jax.device_put(out, devices[0]).astype(jnp.float32)
            ms = step_time_ms(fn, (sa, sb), args.warmup, args.iters)
            k = kernel_times_ms(fn, (sa, sb), args.profile_iters)
            ids = [d.id for d in devices[:n]]
            rows.append(dict(
                format=name, case=case, devices=n, collectives=colls, step_ms=ms, speedup=base_ms / ms,
                compute_ms_per_device=_fmt([k.get(i, {}).get("compute", float("nan")) for i in ids]),
                nccl_ms_per_device=_fmt([k.get(i, {}).get("nccl", 0.0) for i in ids]),
                rel_err_vs_reference=float(jnp.linalg.norm(full - ref)) / ref_norm,
                max_diff_vs_unsharded=float(jnp.max(jnp.abs(full - base.astype(jnp.float32)))) / base_max,
                explain=jb.explain(a, b).path))
            print(_row_text(rows[-1]), flush=True)
    return rows


def _fmt(values) -> str:
    return "/".join(f"{v:.3f}" for v in values)


HEADER = (f"{'format':<11} {'case':<28} {'dev':>3} {'collectives':<24} {'step ms':>8} {'x':>5} "
          f"{'compute ms/dev':>16} {'nccl ms/device':>16} {'rel err':>8} {'vs 1 GPU':>8}")


def _row_text(r: dict) -> str:
    return (f"{r['format']:<11} {r['case']:<28} {r['devices']:>3} {r['collectives']:<24} {r['step_ms']:>8.3f} "
            f"{r['speedup']:>5.2f} {r['compute_ms_per_device']:>16} {r['nccl_ms_per_device']:>16} "
            f"{r['rel_err_vs_reference']:>8.1e} {r['max_diff_vs_unsharded']:>8.1e}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--devices", type=int, default=0, help="GPUs to use (default: all)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--profile-iters", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = parser.parse_args(argv)

    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if len(gpus) < 2:
        print(f"sharded_matmul needs at least 2 GPUs; this machine has {len(gpus)} "
              f"(backend {jax.default_backend()}). The CPU checks are tests/test_sharding.py.")
        return 0
    kind = gpus[0].device_kind
    print(f"{len(gpus)} x {kind}, jax {jax.__version__}, M N K = {args.m} {args.n} {args.k}, bf16 output")
    print(HEADER)
    rows = run(args)
    print("\n" + HEADER)
    for r in rows:
        print(_row_text(r))
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = re.sub(r"[^a-z0-9]+", "_", kind.lower()).strip("_")
    which = "" if args.formats == ",".join(FORMATS) else "_" + args.formats.replace(",", "-")
    path = out_dir / f"sharded_matmul_{tag}_x{len(gpus)}_{args.m}x{args.n}x{args.k}{which}.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path} ({datetime.datetime.now().isoformat(timespec='seconds')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
