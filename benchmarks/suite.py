"""Hopper speed suite (issue #4): every format against every baseline this machine has, one command.

    python -m benchmarks.suite --quick                      # the issue's headline cases, < 10 min on an H200
    python -m benchmarks.suite --resume                     # the whole sweep; rerun until nothing is left
    python -m benchmarks.suite --shapes deepseek --formats fp8_block,mxfp8 --time-budget 500
    python -m benchmarks.suite --list --quick               # what would run
    python -m benchmarks.suite --shapes 1x7168x2048,llama   # groups, case names, or new MxNxK shapes
    python -m benchmarks.suite --smoke --out /tmp/s         # tiny shapes, runs on a CPU (the jnp reference)
    CUDA_VISIBLE_DEVICES=0 python -m benchmarks.suite --shapes square,llama,decode_fp8 --tag part0 &
    CUDA_VISIBLE_DEVICES=1 python -m benchmarks.suite --shapes deepseek --no-ceilings --tag part1
    python -m benchmarks.suite --merge benchmarks/results/suite_*_part[01].csv   # one sweep from two GPUs

What runs, per shape (M, N, K), a (M, K) x b (N, K) -> (M, N) bf16:

- ours: `jb.matmul` on operands quantized beforehand by `jb.quantize_operand` (quantization is not
  timed) for fp8_block (DeepSeek 1x128 activations, 128x128 weights), mxfp8, mxfp4, nvfp4, mxfp8 x mxfp4,
  bf16 x mxfp4 (w4a16) and bf16 x nvfp4; `path` says which kernel ran (`jb.explain`).
- baselines (benchmarks/_baselines.py, benchmarks/_torch.py): XLA bf16 dot, XLA FP8 per-tensor,
  XLA dequantize-to-bf16 + dot of our operands, `jax.nn.scaled_matmul` (mxfp8), and PyTorch cuBLAS blockwise
  FP8 (fp8_block) when torch with CUDA imports. One that is missing or fails here is an 'n/a' row with the
  error in `note`; it never stops the run.
- quantization of a bf16 8192 x 8192 tensor to mxfp8, nvfp4 and fp8 1x128, in GB/s and against one XLA
  elementwise pass over the same tensor; and the machine's ceilings, measured first: XLA bf16 and fp8
  matmul TFLOP/s at 8192^3, copy GB/s on 1 GiB and read-only GB/s (a max over the same tensor). The target
  table says what meeting each target takes on its hardest shape against the ceiling that bounds it.

Every result is checked before it is timed: ours against `jb.reference.matmul` on the same quantized
operands, each baseline against the float32 dot of its dequantized operands (relative Frobenius error
< 1e-2); a failing check is a 'check_failed' row and is not timed. Timing, the same for every
implementation: R distinct operand sets (> 128 MB together, so nothing is served from L2) in one jit (or
one CUDA graph for torch), back-to-back calls, median over samples (`median_us`, the wall-clock column;
benchmarks/_timing.py); then, on a GPU (--kernel-time), a few more calls inside a profiler trace whose
CUPTI kernel durations are summed per matmul (`kernel_us`, the primary time, free of host launch gaps;
`kernels` lists the top kernels; benchmarks/_kernel_time.py).

Outputs in --out (default benchmarks/results): suite_<device>_<date>.csv, .png and .md (the issue's
target rows, met or not, and per-shape speedups, ready for the README). The CSV is rewritten after every
row, so a killed run keeps what it finished. Runs on the same device and date merge into one CSV: the
full sweep (41 shapes x 7 formats, about 700 rows) is longer than one device command (10 min), so
--time-budget (default 480 s) stops starting new work once spent, and the same command with --resume
skips every row already done; or split the sweep with --shapes / --formats.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax: torch shares the GPU

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_blockscale as jb  # noqa: E402

from . import _baselines as bl  # noqa: E402
from . import _report  # noqa: E402
from ._cases import FORMATS, Case, Mode, full_cases, quick_cases, select, smoke_cases  # noqa: E402,F401
from ._timing import TimingConfig, choose_repeats, tree_nbytes  # noqa: E402
from ._torch import torch_blockwise  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMPLS = ("xla_bf16", "xla_fp8_tensor", "ours", "xla_dequant", "jax_scaled_matmul", "torch_blockwise",
         "quantize", "xla_elementwise", "xla_copy", "xla_read")
QUANT_BASE = {"mxfp8": "mxfp8", "nvfp4": "nvfp4", "fp8_1x128": "fp8_block"}  # for --formats


def kernel_time_wanted(args: argparse.Namespace) -> bool:
    """--kernel-time / --no-kernel-time, else on exactly when there is a GPU (a CPU trace has no kernels)."""
    return args.kernel_time if args.kernel_time is not None else jax.default_backend() == "gpu"


def mode(args: argparse.Namespace) -> Mode:
    kt = kernel_time_wanted(args)
    if args.smoke:  # fixed R = 2 and three samples: the point is that every path runs, not the numbers
        cfg = TimingConfig(fixed_repeats=2, target_sample_s=0.0, min_samples=3, max_samples=3, sample_budget_s=0.0,
                           kernel_time=kt)
        return Mode(smoke_cases(), (256, 512), 256, (256, 1024), cfg)
    cfg = TimingConfig(flush_bytes=args.flush_mb << 20, mem_budget=int(args.mem_budget_gb * 2**30), kernel_time=kt)
    return Mode(quick_cases() if args.quick else full_cases(), (8192, 8192), 8192, (16384, 32768), cfg)


class Run:
    """Rows so far (merged with the day's CSV), the budget, and where everything is written."""

    def __init__(self, args: argparse.Namespace, cfg: TimingConfig):
        self.cfg, self.impls = cfg, set(args.impls.split(",")) if args.impls else set(IMPLS)
        device = jax.devices()[0].device_kind
        date = datetime.date.today().isoformat()
        self.meta = dict(device=device, date=date, jax=jax.__version__, target=jb.detect_target())
        self.stem = output_stem(args.out, device, date, args.tag)
        self.csv = self.stem.with_suffix(".csv")
        self.rows = {} if args.fresh else _report.load(self.csv)
        self.resume = args.resume
        self.start, self.budget = time.perf_counter(), args.time_budget
        self.skipped: list[str] = []

    def expired(self) -> bool:
        return self.budget is not None and time.perf_counter() - self.start > self.budget

    def todo(self, case: str, fmt: str, impl: str) -> bool:
        """Selected by --impls, and (with --resume) not already in the CSV with a final status."""
        if impl not in self.impls:
            return False
        done = self.rows.get((case, fmt, impl), {}).get("status") in ("ok", "n/a", "check_failed")
        return not (self.resume and done)

    def unit(self, case: str, fmt: str, impl: str, work: Callable[[], dict]) -> None:
        """Runs one timing unit (one CSV row) unless it is not wanted or the time budget is spent."""
        if not self.todo(case, fmt, impl):
            return
        if self.expired():
            self.skipped.append(f"{case} {fmt} {impl}")
            return
        row = work()
        self.rows[_report.key(row)] = row
        _report.write(self.csv, self.rows)  # after every unit: a killed run keeps what it finished
        print(f"  {row['case']:>16} {row['format']:>12} {row['impl']:>18} {row['status']:>12} "
              f"{row['kernel_us'] or '-':>9} us kernel {row['median_us'] or '-':>9} us wall "
              f"{row['tflops'] or row['gbps'] or '-':>8} "
              f"{row['path']} {row['note'][:100]}", flush=True)


def output_stem(out: str, device: str, date: str, tag: str) -> pathlib.Path:
    """out/suite_<device>_<date>[_<tag>] (the CSV, PNG and MD share it); creates `out`."""
    slug = re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_")
    path = pathlib.Path(out)
    path.mkdir(parents=True, exist_ok=True)
    return path / f"suite_{slug}_{date}{'_' + tag if tag else ''}"


@dataclasses.dataclass(frozen=True)
class Site:
    """Where a row belongs: its case, group, (M, N, K), and what one operation computes and writes."""

    case: str
    group: str
    mnk: tuple[int, int, int]
    flops: float
    out_bytes: int


def _num(v: float, digits: int = 4) -> str:
    return "" if not math.isfinite(v) else f"{v:.{digits}g}"


def make_row(run: Run, site: Site, fmt: str, ab: tuple[str, str], o: bl.Outcome, operand_bytes: int) -> dict:
    """One CSV row. The primary time is the kernel time where the profile has one, else the wall clock
    (`median_us`, always filled for a timed row); TFLOP/s and GB/s come from the primary time."""
    wall = o.timing.median_s if o.timing else math.nan
    kp = o.kernel
    kernel = kp.kernel_s if kp is not None and kp.ok else math.nan
    t = kernel if math.isfinite(kernel) else wall
    nbytes = operand_bytes + site.out_bytes
    m, n, k = site.mnk
    note = o.note
    if kp is not None and not kp.ok and o.status == "ok":
        note = "; ".join(x for x in (note, f"no kernel time: {kp.note}") if x)
    return dict(run.meta, case=site.case, group=site.group, format=fmt, a_format=ab[0], b_format=ab[1],
                M=m, N=n, K=k, impl=o.impl, status=o.status,
                R=o.timing.repeats if o.timing else "", calls=o.timing.calls if o.timing else "",
                samples=o.timing.samples if o.timing else "", median_us=_num(wall * 1e6),
                min_us=_num(o.timing.min_s * 1e6) if o.timing else "",
                tflops=_num(site.flops / t / 1e12) if site.flops else "", gbps=_num(nbytes / t / 1e9),
                bytes=nbytes, path=o.path, rel_err=_num(o.rel_err, 3), max_rel_err=_num(o.max_rel_err, 3),
                kernel_us=_num(kernel * 1e6), memcpy_us=_num(kp.memcpy_s * 1e6) if kp else "",
                kernel_launches=_num(kp.launches, 3) if kp else "",
                time_basis=("kernel" if math.isfinite(kernel) else "wall") if o.timing else "",
                kernels=kp.summary() if kp is not None and kp.ok else "", note=note)


def _guarded(impl: str, work: Callable[[], bl.Outcome]) -> bl.Outcome:
    """Any exception outside the check/timing (operand building, out of memory) becomes an 'error' row."""
    try:
        return work()
    except Exception as e:  # noqa: BLE001
        return bl.Outcome(impl, "error", note=bl.short(e))


def jax_row(run: Run, site: Site, fmt: str, ab: tuple[str, str], impl: str, op: Callable, sets: list,
            ref: Callable, **kw) -> dict:
    """Check and time one JAX implementation (`bl.run_jax`) and make its row."""
    o = _guarded(impl, lambda: bl.run_jax(impl, op, sets, ref, run.cfg, **kw))
    return make_row(run, site, fmt, ab, o, tree_nbytes(sets[0]))


def _explain(qa, qb) -> str:
    c = jb.explain(qa, qb)
    return f"{c.path}:{c.kernel}" if c.kernel else c.path


NF = _report.NO_FORMAT


def run_ceilings(run: Run, md: Mode) -> None:
    """XLA bf16 and fp8 matmul TFLOP/s at M = N = K = ceiling_mnk, copy and read-only GB/s."""
    s, keys = md.ceiling_mnk, jax.random.split(jax.random.key(0), 2)
    site = Site("ceiling", "ceiling", (s, s, s), 2.0 * s ** 3, s * s * 2)
    if run.todo("ceiling", NF, "xla_bf16") or run.todo("ceiling", NF, "xla_fp8_tensor"):
        dense = [bl.dense_pair(k, s, s, s) for k in keys]
        run.unit("ceiling", NF, "xla_bf16", lambda: jax_row(
            run, site, NF, ("bf16", "bf16"), "xla_bf16", bl.xla_bf16, dense, bl.xla_bf16_ref))
        fp8 = [bl.fp8_tensor_operands(x, w) for x, w in dense]
        run.unit("ceiling", NF, "xla_fp8_tensor", lambda: jax_row(
            run, site, NF, ("e4m3", "e4m3"), "xla_fp8_tensor", bl.xla_fp8_tensor, fp8, bl.xla_fp8_tensor_ref))
        del dense, fp8
    if run.todo("ceiling", NF, "xla_copy") or run.todo("ceiling", NF, "xla_read"):
        rows, cols = md.copy_shape
        xs = [(jax.random.normal(k, (rows, cols), jnp.bfloat16),) for k in keys]
        copy = Site("ceiling", "ceiling", (rows, 0, cols), 0.0, rows * cols * 2)
        run.unit("ceiling", NF, "xla_copy", lambda: jax_row(
            run, copy, NF, ("bf16", "bf16"), "xla_copy", bl.xla_copy, xs, bl.xla_copy_ref))
        read = Site("ceiling", "ceiling", (rows, 0, cols), 0.0, 4)
        run.unit("ceiling", NF, "xla_read", lambda: jax_row(
            run, read, NF, ("bf16", "bf16"), "xla_read", bl.xla_read, xs, bl.xla_read_ref))


def run_quant(run: Run, md: Mode, formats: Optional[set[str]]) -> None:
    """bf16 (rows, cols) -> each quantization format, and one XLA elementwise pass, in GB/s."""
    rows, cols = md.quant_shape
    case, nb = f"quant_{rows}x{cols}", rows * cols * 2
    names = [n for n in bl.QUANT_FORMATS if not formats or n in formats or QUANT_BASE[n] in formats]
    if not (run.todo(case, NF, "xla_elementwise") or any(run.todo(case, n, "quantize") for n in names)):
        return
    r = choose_repeats(nb, 3 * nb, run.cfg)
    xs = [(jax.random.normal(k, (rows, cols), jnp.bfloat16),) for k in jax.random.split(jax.random.key(1), r)]
    elementwise = Site(case, "quant", (rows, 0, cols), 0.0, nb)
    run.unit(case, NF, "xla_elementwise", lambda: jax_row(
        run, elementwise, NF, ("bf16", "bf16"), "xla_elementwise", bl.xla_elementwise, xs, bl.xla_elementwise_ref))
    for name in names:
        op = bl.quantize_op(name)
        written = Site(case, "quant", (rows, 0, cols), 0.0, tree_nbytes(jax.eval_shape(op, xs[0][0])))
        run.unit(case, name, "quantize", lambda op=op, name=name, site=written: jax_row(
            run, site, name, ("bf16", name), "quantize", op, xs, bl.quantize_ref, tol=bl.QUANT_TOL[name],
            post=bl.dequantize_f32, path=name))


def _case_impls(case: Case) -> list[tuple[str, str]]:
    """Every (format, impl) row a case produces."""
    out = [(NF, "xla_bf16"), (NF, "xla_fp8_tensor")]
    for f in case.formats:
        out += [(f, "ours"), (f, "xla_dequant")]
        out += [(f, "jax_scaled_matmul")] if f == "mxfp8" else []
        out += [(f, "torch_blockwise")] if f == "fp8_block" else []
    return out


def run_case(run: Run, case: Case) -> None:
    """One shape: the format-independent baselines, then each format (`run_format`)."""
    if not any(run.todo(case.name, f, i) for f, i in _case_impls(case)):
        return
    if run.expired():
        run.skipped.append(case.name)
        return
    m, n, k = case.m, case.n, case.k
    # R from the smallest footprint (fp4 x fp4) so that every implementation's sets exceed the flush size
    r = choose_repeats(int((m * k + n * k) * 0.5625), (m * k + n * k) * 4 + m * n * 2, run.cfg)
    dense = [bl.dense_pair(key, m, n, k) for key in jax.random.split(jax.random.key(m * 1_000_003 + n * 1009 + k), r)]
    site = Site(case.name, "+".join(case.groups), (m, n, k), 2.0 * m * n * k, m * n * 2)
    run.unit(case.name, NF, "xla_bf16", lambda: jax_row(
        run, site, NF, ("bf16", "bf16"), "xla_bf16", bl.xla_bf16, dense, bl.xla_bf16_ref))
    if run.todo(case.name, NF, "xla_fp8_tensor"):
        fp8 = [bl.fp8_tensor_operands(x, w) for x, w in dense]
        run.unit(case.name, NF, "xla_fp8_tensor", lambda: jax_row(
            run, site, NF, ("e4m3", "e4m3"), "xla_fp8_tensor", bl.xla_fp8_tensor, fp8, bl.xla_fp8_tensor_ref))
        del fp8
    for fmt in case.formats:
        if any(run.todo(case.name, fmt, i) for f, i in _case_impls(case) if f == fmt):
            run_format(run, site, fmt, dense)


def run_format(run: Run, site: Site, fmt: str, dense: list) -> None:
    """Ours, XLA dequant + dot, and (mxfp8) jax.nn.scaled_matmul / (fp8_block) torch, on the same operands."""
    ab = FORMATS[fmt]
    try:
        q = [bl.quantized_pair(x, w, *ab) for x, w in dense]
    except Exception as e:  # noqa: BLE001 - e.g. out of memory: record it, go on with the next format
        failed = bl.Outcome("ours", "error", note=f"quantizing the operands: {bl.short(e)}")
        run.unit(site.case, fmt, "ours", lambda: make_row(run, site, fmt, ab, failed, 0))
        return
    path = _explain(*q[0])
    run.unit(site.case, fmt, "ours", lambda: jax_row(run, site, fmt, ab, "ours", bl.ours, q, bl.ours_ref, path=path))
    run.unit(site.case, fmt, "xla_dequant", lambda: jax_row(
        run, site, fmt, ab, "xla_dequant", bl.xla_dequant, q, bl.ours_ref, path="dequantize+dot"))
    if fmt == "mxfp8":
        run.unit(site.case, fmt, "jax_scaled_matmul", lambda: make_row(
            run, site, fmt, ab, _scaled_matmul(q, run.cfg), tree_nbytes(q[0])))
    if fmt == "fp8_block":
        run.unit(site.case, fmt, "torch_blockwise", lambda: make_row(run, site, fmt, ab, _guarded(
            "torch_blockwise", lambda: torch_blockwise(q, jax.jit(bl.ours_ref)(*q[0]), run.cfg)), tree_nbytes(q[0])))


def _scaled_matmul(q: list, cfg: TimingConfig) -> bl.Outcome:
    why = bl.scaled_matmul_unavailable()
    if why:
        return bl.Outcome("jax_scaled_matmul", "n/a", note=why)
    return _guarded("jax_scaled_matmul", lambda: bl.run_jax(
        "jax_scaled_matmul", bl.jax_scaled_matmul, q, bl.ours_ref, cfg, path="jax.nn.scaled_matmul",
        na_on_error=True))


def report(stem: pathlib.Path, rows: dict, meta: dict) -> tuple[pathlib.Path, pathlib.Path]:
    """Writes stem.csv, .png and .md from `rows` and prints the target table."""
    from ._plot import plot  # matplotlib only once there is something to draw
    csv_path, png, md = stem.with_suffix(".csv"), stem.with_suffix(".png"), stem.with_suffix(".md")
    _report.write(csv_path, rows)
    plot(rows, png, f"jax_blockscale speed suite: {meta['device']}, {meta['date']}")
    md.write_text(_report.summary_markdown(rows, meta, csv_path.name, png.name))
    print("\nIssue #4 targets (speedup = baseline time / ours):")
    print(_report.text_table(_report.TARGET_HEADER, _report.target_lines(rows)))
    lines = _report.shape_lines(rows)
    if len(lines) <= 60:  # the full sweep's table is for the .md file, not the terminal
        print("\nPer shape (ours):")
        print(_report.text_table(_report.SHAPE_HEADER, lines))
    statuses = [r["status"] for r in rows.values()]
    print("\nrows: " + ", ".join(f"{s} {statuses.count(s)}" for s in sorted(set(statuses))))
    return png, md


def merge(paths: list[str], out: str, tag: str) -> dict:
    """One CSV/PNG/MD from several (parts of a sweep run at once on several GPUs of one kind, one day)."""
    rows: dict = {}
    for path in paths:
        part = _report.load(pathlib.Path(path))
        if not part:
            raise SystemExit(f"--merge: {path} is missing or empty")
        rows.update(part)
    first = next(iter(rows.values()))
    meta = {k: first[k] for k in ("device", "date", "jax", "target")}
    mixed = {(r["device"], r["date"]) for r in rows.values()} - {(meta["device"], meta["date"])}
    if mixed:
        raise SystemExit(f"--merge: rows from more than one device/date: {sorted(mixed)}")
    stem = output_stem(out, meta["device"], meta["date"], tag)
    png, md = report(stem, rows, meta)
    print(f"\nwrote {stem.with_suffix('.csv')}\n      {png}\n      {md}")
    return rows


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.suite", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8192^3 per format, the decode targets, quantization")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, R = 2: checks every path runs (CPU)")
    p.add_argument("--formats", help=f"comma-separated subset of {','.join(FORMATS)}")
    p.add_argument("--shapes", help="comma-separated groups (square, deepseek, llama, decode_fp8, decode_fp4, "
                                    "quant), case names MxNxK, or new MxNxK shapes")
    p.add_argument("--impls", help=f"comma-separated subset of {','.join(IMPLS)} (default: all)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--tag", default="", help="suffix for the output file names")
    p.add_argument("--fresh", action="store_true", help="do not merge with today's CSV for this device")
    p.add_argument("--resume", action="store_true",
                   help="skip rows today's CSV already has (ok, n/a or check_failed): rerun the same command "
                        "until the budget no longer runs out")
    p.add_argument("--no-ceilings", action="store_true", help="skip the ceiling measurements")
    p.add_argument("--kernel-time", dest="kernel_time", action="store_true", default=None,
                   help="also sum CUPTI kernel durations per matmul (a profiler trace per row) and make them the "
                        "primary time, wall clock beside (default: on when there is a GPU)")
    p.add_argument("--no-kernel-time", dest="kernel_time", action="store_false", help="wall clock only")
    p.add_argument("--list", action="store_true", help="print the selected shapes and formats, run nothing")
    p.add_argument("--merge", nargs="+", metavar="CSV",
                   help="run nothing: combine these CSVs (parts of one sweep, e.g. one per GPU run at once) into "
                        "one CSV, PNG and MD in --out (named by their device and date, plus --tag)")
    p.add_argument("--time-budget", type=float, default=480.0,
                   help="seconds; no new work starts after this (the device allows 10 min per command)")
    p.add_argument("--flush-mb", type=int, default=128, help="operand MB the R sets of a case must exceed")
    p.add_argument("--mem-budget-gb", type=float, default=16.0, help="memory all R sets may take")
    a = p.parse_args(argv)
    for name, allowed in (("formats", FORMATS), ("impls", IMPLS)):
        bad = set((getattr(a, name) or "").split(",")) - set(allowed) - {""}
        if bad:
            p.error(f"unknown --{name} {sorted(bad)}; choose from {','.join(allowed)}")
    return a


def main(argv: Optional[list[str]] = None) -> dict:
    args = parse(argv)
    if args.merge:
        return merge(args.merge, args.out, args.tag)
    md = mode(args)
    formats = set(args.formats.split(",")) if args.formats else None
    cases = select(md.cases, args.shapes, formats)
    want_quant = not args.shapes or "quant" in args.shapes.split(",")
    if args.list:
        for c in cases:
            print(f"{c.name:>18}  {'+'.join(c.groups):<22} {','.join(c.formats)}")
        print(f"{len(cases)} shapes, {sum(len(c.formats) for c in cases)} (shape, format) pairs; quantization "
              f"{'yes' if want_quant else 'no'}")
        return {}
    run = Run(args, md.timing)
    print(f"jax {jax.__version__}, {run.meta['device']} (target {run.meta['target']}); {len(cases)} shapes, "
          f"quantization {'yes' if want_quant else 'no'}; budget {args.time_budget:g} s; writing {run.csv}",
          flush=True)
    if not args.no_ceilings:
        run_ceilings(run, md)
    if want_quant:
        run_quant(run, md, formats)
    for case in cases:
        run_case(run, case)
    png, summary = report(run.stem, run.rows, run.meta)
    if run.skipped:
        print(f"\ntime budget spent: {len(run.skipped)} units not run, e.g. {run.skipped[:5]}; rerun the same "
              f"command with --resume to do the rest (results merge into the same CSV)")
    print(f"\nwrote {run.csv}\n      {png}\n      {summary}")
    return run.rows


if __name__ == "__main__":
    main(sys.argv[1:])
