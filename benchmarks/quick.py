"""The headline numbers in one short device command: kernel time + wall clock + ratios, as markdown tables.

    python -m benchmarks.quick                        # all sections, < 4 min on an H100
    python -m benchmarks.quick --only decode,large    # sections: quant, decode, large
    python -m benchmarks.quick --tiny                 # tiny shapes: checks every path runs (CPU)

Sections (the cases of issues #4/#11/#13):

- quant: bf16 8192 x 8192 -> mxfp8, nvfp4, fp8 1x128, fp8 128x128 (`jb.quantize` with the format
  `jb.quantize_operand` picks), alone and with the transposed copy (`jb.quantize_with_transpose`, or two
  `jb.quantize` calls in one jit where the library has none, said in the note), against one XLA `x * 2`
  pass. Metric: GB/s counting the ideal bytes (input read once + every output written), relative to the
  x * 2 pass's GB/s (bf16 read + written).
- decode: M in {1, 16, 64}, N = 7168, K = 4096: XLA bf16 dot vs `jb.matmul` with bf16 x mxfp4, bf16 x nvfp4,
  mxfp8 x mxfp8, block FP8 (1x128 x 128x128 tiles from `quantize_operand`), and torch's cuBLAS blockwise
  FP8 on the same block-FP8 bytes; GB/s of the weight's values + scales.
- large: 8192^3 and 4096 x 7168 x 2048: block FP8 vs cuBLAS blockwise; mxfp8 / mxfp4 / nvfp4 vs XLA bf16
  and XLA dequantize + bf16 dot of the same operands; TFLOP/s.

Every row is checked against its reference before it is timed, and timed as the suite does (R distinct
operand sets, > 128 MB together, in one jit; `_baselines.run_jax`, `_torch.torch_blockwise`): wall clock
of back-to-back calls, then kernel time (CUPTI kernel durations per operation, `_kernel_time`). Ratios are
given on both bases; the kernel-time one is the number to quote. Writes quick_<device>_<date>.md/.csv.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax: torch shares the GPU

import argparse  # noqa: E402
import csv  # noqa: E402
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
from jax_blockscale.formats import format_for_side  # noqa: E402

from . import _baselines as bl  # noqa: E402
from ._cases import FORMATS  # noqa: E402
from ._timing import TimingConfig, choose_repeats, tree_nbytes  # noqa: E402
from ._torch import torch_blockwise  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
SECTIONS = ("quant", "decode", "large")
QUANT_FORMATS = {  # label -> (format for jb.quantize, check tolerance)
    "mxfp8": ("mxfp8", 0.06), "nvfp4": ("nvfp4", 0.25), "fp8 1x128": (format_for_side("fp8_block", "a"), 0.06),
    "fp8 128x128": (format_for_side("fp8_block", "b"), 0.06)}
DECODE_FORMATS = ("bf16xmxfp4", "bf16xnvfp4", "mxfp8", "fp8_block")
LARGE_MX = ("mxfp8", "mxfp4", "nvfp4")


@dataclasses.dataclass(frozen=True)
class Sizes:
    quant: tuple[int, int]
    decode_m: tuple[int, ...]
    decode_nk: tuple[int, int]
    large: tuple[tuple[int, int, int], ...]


FULL = Sizes((8192, 8192), (1, 16, 64), (7168, 4096), ((8192, 8192, 8192), (4096, 7168, 2048)))
TINY = Sizes((256, 512), (1, 16), (256, 512), ((256, 256, 512),))


@dataclasses.dataclass
class Row:
    """One timed implementation: its outcome and what its rate counts (bytes for GB/s, flops for TFLOP/s)."""

    section: str
    case: str
    label: str
    o: bl.Outcome
    nbytes: float = 0.0
    flops: float = 0.0

    def us(self, basis: str) -> float:
        if self.o.status != "ok" or self.o.timing is None:
            return math.nan
        if basis == "kernel":
            return self.o.kernel.kernel_s * 1e6 if self.o.kernel is not None and self.o.kernel.ok else math.nan
        return self.o.timing.median_s * 1e6


class Quick:
    """The run: configuration, the time budget, and the rows so far."""

    def __init__(self, cfg: TimingConfig, budget_s: float):
        self.cfg, self.budget, self.start = cfg, budget_s, time.perf_counter()
        self.rows: list[Row] = []
        self.skipped: list[str] = []

    def add(self, section: str, case: str, label: str, work: Callable[[], bl.Outcome], nbytes: float = 0.0,
            flops: float = 0.0) -> Optional[Row]:
        if time.perf_counter() - self.start > self.budget:
            self.skipped.append(f"{section} {case} {label}")
            return None
        try:
            o = work()
        except Exception as e:  # noqa: BLE001 - one failing row must not stop the run
            o = bl.Outcome(label, "error", note=bl.short(e))
        row = Row(section, case, label, o, nbytes, flops)
        self.rows.append(row)
        print(f"  {section:<6} {case:<16} {label:<28} {o.status:<12} kernel {_f(row.us('kernel'))} us  "
              f"wall {_f(row.us('wall'))} us  {o.note[:80]}", flush=True)
        return row


def _f(v: float, digits: int = 4) -> str:
    return f"{v:.{digits}g}" if math.isfinite(v) else "-"


def _sets(key: int, r: int, make: Callable[[jax.Array], tuple]) -> list[tuple]:
    return [make(k) for k in jax.random.split(jax.random.key(key), r)]


# ---- quant -------------------------------------------------------------------------------------------


def with_transpose(spec) -> tuple[Callable, str]:
    """x -> (quantize(x), quantize(x^T)) and how: the library's fused entry point, or two calls in one jit."""
    if hasattr(jb, "quantize_with_transpose"):
        return (lambda x: jb.quantize_with_transpose(x, spec)), "jb.quantize_with_transpose"
    return ((lambda x: (jb.quantize(x, spec, axis=-1), jb.quantize(jnp.swapaxes(x, -1, -2), spec, axis=-1))),
            "two jb.quantize calls (jb has no quantize_with_transpose)")


def _both_dequantized(out) -> jax.Array:
    q, qt = out
    return jnp.stack([jb.dequantize(q, jnp.float32), jnp.swapaxes(jb.dequantize(qt, jnp.float32), -1, -2)])


def _both_ref(x: jax.Array) -> jax.Array:
    return jnp.stack([x.astype(jnp.float32)] * 2)


def run_quant(q: Quick, sizes: Sizes) -> None:
    rows, cols = sizes.quant
    case, nb = f"{rows}x{cols}", rows * cols * 2
    r = choose_repeats(nb, 5 * nb, q.cfg)
    xs = _sets(1, r, lambda k: (jax.random.normal(k, (rows, cols), jnp.bfloat16),))
    q.add("quant", case, "XLA x*2", lambda: bl.run_jax("xla_elementwise", bl.xla_elementwise, xs,
                                                         bl.xla_elementwise_ref, q.cfg), nbytes=2 * nb)
    for label, (spec, tol) in QUANT_FORMATS.items():
        op = lambda x, spec=spec: jb.quantize(x, spec)  # noqa: E731
        written = tree_nbytes(jax.eval_shape(op, xs[0][0]))
        q.add("quant", case, label, lambda op=op, tol=tol: bl.run_jax(
            "quantize", op, xs, bl.quantize_ref, q.cfg, tol=tol, post=bl.dequantize_f32), nbytes=nb + written)
        op2, how = with_transpose(spec)
        written2 = tree_nbytes(jax.eval_shape(op2, xs[0][0]))
        q.add("quant", case, f"{label} + transpose", lambda op2=op2, tol=tol, how=how: bl.run_jax(
            "quantize_t", op2, xs, _both_ref, q.cfg, tol=tol, post=_both_dequantized, note=how),
            nbytes=nb + written2)
    # nvfp4 with the tensor scale passed in (a calibrated or previous step's amax, as serving and delayed
    # scaling use it): the kernel alone, no amax reduction over x first.
    ts = float(jb.nvfp4_tensor_scale(xs[0][0]))
    op = lambda x: jb.quantize(x, "nvfp4", tensor_scale=ts)  # noqa: E731
    written = tree_nbytes(jax.eval_shape(op, xs[0][0]))
    q.add("quant", case, "nvfp4, tensor scale given", lambda: bl.run_jax(
        "quantize", op, xs, bl.quantize_ref, q.cfg, tol=QUANT_FORMATS["nvfp4"][1], post=bl.dequantize_f32),
        nbytes=nb + written)
    op2 = lambda x: jb.quantize_with_transpose(x, "nvfp4", tensor_scale=ts)  # noqa: E731
    written2 = tree_nbytes(jax.eval_shape(op2, xs[0][0]))
    q.add("quant", case, "nvfp4 + transpose, tensor scale given", lambda: bl.run_jax(
        "quantize_t", op2, xs, _both_ref, q.cfg, tol=QUANT_FORMATS["nvfp4"][1], post=_both_dequantized,
        note="jb.quantize_with_transpose(tensor_scale=)"), nbytes=nb + written2)


# ---- matmuls -----------------------------------------------------------------------------------------


def _dense(q: Quick, m: int, n: int, k: int) -> list[tuple]:
    r = choose_repeats(int((m * k + n * k) * 0.5625), (m * k + n * k) * 4 + m * n * 2, q.cfg)
    return [bl.dense_pair(key, m, n, k) for key in jax.random.split(jax.random.key(m * 7 + n * 11 + k), r)]


def _ours(q: Quick, section: str, case: str, fmt: str, qs: list, flops: float, nbytes: float) -> None:
    c = jb.explain(*qs[0])
    path = f"{c.path}:{c.kernel}" if c.kernel else c.path
    q.add(section, case, f"ours {fmt}", lambda: bl.run_jax("ours", bl.ours, qs, bl.ours_ref, q.cfg, path=path,
                                                           note=path), nbytes=nbytes, flops=flops)


def _torch(q: Quick, section: str, case: str, qs: list, flops: float, nbytes: float) -> None:
    q.add(section, case, "torch cuBLAS blockwise", lambda: torch_blockwise(qs, jax.jit(bl.ours_ref)(*qs[0]), q.cfg),
          nbytes=nbytes, flops=flops)


def run_decode(q: Quick, sizes: Sizes) -> None:
    n, k = sizes.decode_nk
    for m in sizes.decode_m:
        case, flops = f"{m}x{n}x{k}", 2.0 * m * n * k
        dense = _dense(q, m, n, k)
        q.add("decode", case, "XLA bf16", lambda: bl.run_jax("xla_bf16", bl.xla_bf16, dense, bl.xla_bf16_ref, q.cfg),
              nbytes=n * k * 2, flops=flops)
        for fmt in DECODE_FORMATS:
            qs = [bl.quantized_pair(x, w, *FORMATS[fmt]) for x, w in dense]
            wbytes = tree_nbytes(qs[0][1])
            if fmt == "bf16xmxfp4" and m == sizes.decode_m[0]:
                _same_size_read(q, case, n, wbytes, len(qs))
            _ours(q, "decode", case, fmt, qs, flops, wbytes)
            if fmt == "fp8_block":
                _torch(q, "decode", case, qs, flops, wbytes)
            del qs


def _same_size_read(q: Quick, case: str, n: int, nbytes: int, r: int) -> None:
    """The ceiling a weight-streaming kernel can approach at this size: XLA's row sum over float32 arrays
    of the mxfp4 weight's bytes in (n, bytes / 4n), as many distinct arrays as operand sets (launch and
    ramp-up are a large part of a ~16 MB read; the 1 GiB read rate is out of reach here)."""
    sets = [(jnp.full((n, nbytes // (4 * n)), float(i), jnp.float32),) for i in range(r)]
    row_sum = lambda x: jnp.sum(x, axis=1)  # noqa: E731
    q.add("decode", case, "XLA read of the mxfp4 bytes", lambda: bl.run_jax("xla_read", row_sum, sets, row_sum, q.cfg),
          nbytes=nbytes)


def run_large(q: Quick, sizes: Sizes) -> None:
    for m, n, k in sizes.large:
        case, flops = f"{m}x{n}x{k}", 2.0 * m * n * k
        dense = _dense(q, m, n, k)
        q.add("large", case, "XLA bf16", lambda: bl.run_jax("xla_bf16", bl.xla_bf16, dense, bl.xla_bf16_ref, q.cfg),
              flops=flops)
        qs = [bl.quantized_pair(x, w, *FORMATS["fp8_block"]) for x, w in dense]
        _ours(q, "large", case, "fp8_block", qs, flops, 0)
        _torch(q, "large", case, qs, flops, 0)
        del qs
        for fmt in LARGE_MX:
            qs = [bl.quantized_pair(x, w, *FORMATS[fmt]) for x, w in dense]
            _ours(q, "large", case, fmt, qs, flops, 0)
            q.add("large", case, f"XLA dequant+dot {fmt}", lambda qs=qs: bl.run_jax(
                "xla_dequant", bl.xla_dequant, qs, bl.ours_ref, q.cfg), flops=flops)
            del qs


# ---- report ------------------------------------------------------------------------------------------

def _find(rows: list[Row], section: str, case: str, label: str) -> Optional[Row]:
    return next((r for r in rows if (r.section, r.case, r.label) == (section, case, label)), None)


def _speedup(base: Optional[Row], row: Row, basis: str) -> float:
    """base time / row time on one basis (> 1: the row is faster)."""
    if base is None or base is row:
        return math.nan
    return base.us(basis) / row.us(basis)


def _quant_ratio(base: Optional[Row], row: Row, basis: str) -> float:
    """GB/s of the row (ideal bytes) relative to GB/s of the x*2 pass (its bf16 read + write)."""
    if base is None or base is row:
        return math.nan
    return (row.nbytes / row.us(basis)) / (base.nbytes / base.us(basis))


def comparisons(rows: list[Row], row: Row) -> list[tuple[str, float, float]]:
    """(against, kernel ratio, wall ratio) for each baseline that applies to `row`."""
    fmt = row.label.split(" ", 1)[1] if row.label.startswith("ours ") else ""
    out = []
    if row.section == "quant":
        base = _find(rows, "quant", row.case, "XLA x*2")
        if base is not row:
            out.append(("x*2 GB/s", _quant_ratio(base, row, "kernel"), _quant_ratio(base, row, "wall")))
        return out
    if not fmt:
        return out
    wanted = ["XLA bf16"]
    wanted += ["torch cuBLAS blockwise"] if fmt == "fp8_block" else []
    wanted += [f"XLA dequant+dot {fmt}"] if row.section == "large" and fmt in LARGE_MX else []
    for label in wanted:
        base = _find(rows, row.section, row.case, label)
        if base is not None:
            out.append((label, _speedup(base, row, "kernel"), _speedup(base, row, "wall")))
    return out


def _rate(row: Row) -> str:
    """TFLOP/s (large) or GB/s from the kernel time; from the wall clock, said so, where there is none."""
    basis = "kernel" if math.isfinite(row.us("kernel")) else "wall"
    us = row.us(basis)
    if not math.isfinite(us):
        return "-"
    tail = "" if basis == "kernel" else " (wall)"
    if row.section == "large":
        return _f(row.flops / us / 1e6) + " TFLOP/s" + tail if row.flops else "-"
    return _f(row.nbytes / us / 1e3) + " GB/s" + tail if row.nbytes else "-"


def _vs(b: str, kernel: float, wall: float) -> str:
    return f"{b}: {_f(kernel, 3)}x (wall {_f(wall, 3)}x)" if math.isfinite(kernel) else f"{b}: wall {_f(wall, 3)}x"


def section_table(rows: list[Row], section: str) -> str:
    head = ["case", "impl", "status", "kernel µs", "wall µs", "rate", "vs: kernel (wall)", "top kernels", "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.section != section:
            continue
        vs = "; ".join(_vs(b, kr, wr) for b, kr, wr in comparisons(rows, r)) or "-"
        top = r.o.kernel.summary(2, 40) if r.o.kernel is not None and r.o.kernel.ok else "-"
        note = r.o.note.replace("|", "/")[:90]
        lines.append(f"| {r.case} | {r.label} | {r.o.status} | {_f(r.us('kernel'))} | {_f(r.us('wall'))} | "
                     f"{_rate(r)} | {vs} | {top} | {note} |")
    return "\n".join(lines)


TITLES = {"quant": "Quantization (rate: ideal bytes = input once + outputs; vs: GB/s relative to x*2's)",
          "decode": "Decode (rate: weight values + scales GB/s; vs: speedup, baseline time / ours)",
          "large": "Large GEMMs (vs: speedup, baseline time / ours)"}


def markdown(q: Quick, meta: dict) -> str:
    parts = [f"# quick: {meta['device']}, {meta['date']} (jax {meta['jax']}, {meta['torch']}, target "
             f"{meta['target']})", "",
             "Kernel time = sum of CUPTI kernel durations per operation (benchmarks/_kernel_time.py); wall = "
             "median of back-to-back calls over R distinct operand sets in one jit. Ratios on both bases, "
             "kernel (wall); > 1 favours the row."]
    for s in SECTIONS:
        if any(r.section == s for r in q.rows):
            parts += ["", f"## {TITLES[s]}", "", section_table(q.rows, s)]
    if q.skipped:
        parts += ["", f"Time budget spent: not run: {', '.join(q.skipped)}"]
    return "\n".join(parts) + "\n"


def write(q: Quick, meta: dict, out: str) -> tuple[pathlib.Path, pathlib.Path]:
    slug = re.sub(r"[^a-z0-9]+", "_", meta["device"].lower()).strip("_")
    d = pathlib.Path(out)
    d.mkdir(parents=True, exist_ok=True)
    stem = d / f"quick_{slug}_{meta['date']}"
    stem.with_suffix(".md").write_text(markdown(q, meta))
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["section", "case", "impl", "status", "kernel_us", "wall_us", "memcpy_us", "kernel_launches",
                    "bytes", "flops", "rel_err", "vs", "kernels", "note"])
        for r in q.rows:
            kp = r.o.kernel
            vs = "; ".join(f"{b}: {_f(kr, 4)} kernel {_f(wr, 4)} wall" for b, kr, wr in comparisons(q.rows, r))
            w.writerow([r.section, r.case, r.label, r.o.status, _f(r.us("kernel"), 6), _f(r.us("wall"), 6),
                        _f(kp.memcpy_s * 1e6) if kp else "-", _f(kp.launches) if kp else "-", r.nbytes, r.flops,
                        _f(r.o.rel_err, 3), vs, kp.summary(5) if kp is not None and kp.ok else "", r.o.note])
    return stem.with_suffix(".md"), stem.with_suffix(".csv")


def _torch_version() -> str:
    try:
        import torch
        return f"torch {torch.__version__}" + ("" if torch.cuda.is_available() else " (no CUDA)")
    except Exception:  # noqa: BLE001
        return "no torch"


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quick", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help=f"comma-separated sections of {','.join(SECTIONS)} (default: all)")
    p.add_argument("--tiny", action="store_true", help="tiny shapes, R = 2, few samples: every path runs (CPU)")
    p.add_argument("--time-budget", type=float, default=225.0, help="seconds; no new row starts after this")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)
    bad = set((a.only or "").split(",")) - set(SECTIONS) - {""}
    if bad:
        p.error(f"unknown --only {sorted(bad)}; choose from {','.join(SECTIONS)}")
    return a


def main(argv: Optional[list[str]] = None) -> Quick:
    a = parse(argv)
    sections = [s for s in SECTIONS if not a.only or s in a.only.split(",")]
    if a.tiny:
        cfg = TimingConfig(fixed_repeats=2, target_sample_s=0.0, min_samples=2, max_samples=2, sample_budget_s=0.0,
                           kernel_time=True)
        sizes = TINY
    else:  # fewer samples than the suite: the kernel time is the number, the wall clock is context
        cfg = TimingConfig(min_samples=3, max_samples=10, sample_budget_s=0.3, kernel_time=True)
        sizes = FULL
    meta = dict(device=jax.devices()[0].device_kind, date=datetime.date.today().isoformat(), jax=jax.__version__,
                torch=_torch_version(), target=jb.detect_target())
    print(f"quick: {meta['device']} (target {meta['target']}), jax {meta['jax']}, {meta['torch']}; sections "
          f"{','.join(sections)}; budget {a.time_budget:g} s", flush=True)
    q = Quick(cfg, a.time_budget)
    runners = {"quant": run_quant, "decode": run_decode, "large": run_large}
    for s in sections:
        runners[s](q, sizes)
    text = markdown(q, meta)
    print("\n" + text)
    md, csv_path = write(q, meta, a.out)
    print(f"wrote {md}\n      {csv_path}\ntotal {time.perf_counter() - q.start:.0f} s")
    return q


if __name__ == "__main__":
    main(sys.argv[1:])
