"""The suite's outputs: the CSV (merged across runs of one day), speedup ratios, and the target summary.

A row's primary time is `kernel_us` (the sum of its CUPTI kernel durations per operation, see
`_kernel_time`) where it has one, else `median_us` (the harness's back-to-back time, always there as the
wall-clock column). A ratio compares two rows on the same basis: kernel time when both have it, else both
wall clock. TFLOP/s and GB/s are computed from the primary time.

Ratios are speedups: baseline time / our time, so > 1 means ours is faster (for quantization: the time of
one XLA elementwise pass over the same tensor / the quantization time). Runs of the same device and date
merge into one CSV (a later row replaces an earlier one with the same case, format and impl), so a sweep
too long for one device command can be split with --shapes / --formats and still yields one file.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import pathlib
from typing import Callable, Optional

FIELDS = ["device", "date", "jax", "target", "case", "group", "format", "a_format", "b_format", "M", "N", "K",
          "impl", "status", "R", "calls", "samples", "median_us", "min_us", "tflops", "gbps", "bytes", "path",
          "rel_err", "max_rel_err", "ratio_vs_xla_bf16", "ratio_vs_xla_fp8_tensor", "ratio_vs_xla_dequant",
          "ratio_vs_jax_scaled_matmul", "ratio_vs_torch_blockwise", "ratio_vs_xla_elementwise", "kernel_us",
          "memcpy_us", "kernel_launches", "time_basis", "kernels", "note"]
SHAPE_BASELINES = ("xla_bf16", "xla_fp8_tensor")  # one row per case, format "-"
FORMAT_BASELINES = ("xla_dequant", "jax_scaled_matmul", "torch_blockwise")  # one row per case and format
NO_FORMAT = "-"

Row = dict


def fnum(row: Row, key: str) -> float:
    """A numeric field of a row read from CSV or built in memory; NaN when empty."""
    try:
        v = row.get(key, "")
        return float(v) if v not in ("", None) else math.nan
    except (TypeError, ValueError):
        return math.nan


def key(row: Row) -> tuple[str, str, str]:
    return str(row["case"]), str(row["format"]), str(row["impl"])


def load(path: pathlib.Path) -> dict[tuple, Row]:
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {key(r): r for r in csv.DictReader(f)}


def primary_us(r: Optional[Row]) -> float:
    """Kernel time where the row has it, else the wall-clock median; NaN for a row that is not 'ok'."""
    if r is None or r.get("status") != "ok":
        return math.nan
    k = fnum(r, "kernel_us")
    return k if math.isfinite(k) and k > 0 else fnum(r, "median_us")


def _ok_time(rows: dict[tuple, Row], k: tuple) -> float:
    return primary_us(rows.get(k))


def ratio(base: Optional[Row], ours: Optional[Row]) -> float:
    """base time / our time, both kernel time if both rows have it, else both wall clock."""
    if base is None or ours is None or base.get("status") != "ok" or ours.get("status") != "ok":
        return math.nan
    for field in ("kernel_us", "median_us"):
        b, o = fnum(base, field), fnum(ours, field)
        if math.isfinite(b) and math.isfinite(o) and b > 0 and o > 0:
            return b / o
    return math.nan


def add_ratios(rows: dict[tuple, Row]) -> None:
    """Fill ratio_vs_* of our rows and of quantization rows (in place)."""
    for k, r in rows.items():
        baselines = {"ours": SHAPE_BASELINES + FORMAT_BASELINES, "quantize": ("xla_elementwise",)}.get(k[2], ())
        for b in baselines:
            r[f"ratio_vs_{b}"] = _fmt(ratio(rows.get(_baseline_key(r, b)), r), 3)


def _baseline_key(r: Row, baseline: str) -> tuple[str, str, str]:
    """Where `baseline` is on r's case: per format for FORMAT_BASELINES, else the case's one row."""
    return str(r["case"]), (str(r["format"]) if baseline in FORMAT_BASELINES else NO_FORMAT), baseline


def _baseline_us(rows: dict[tuple, Row], r: Row, baseline: str) -> float:
    return _ok_time(rows, _baseline_key(r, baseline))


def _fmt(v: float, digits: int) -> str:
    return "" if v is None or not math.isfinite(v) else f"{v:.{digits}g}"


def write(path: pathlib.Path, rows: dict[tuple, Row]) -> None:
    add_ratios(rows)
    tmp = path.with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows.values():
            w.writerow(r)
    tmp.replace(path)  # a run killed mid-write keeps the previous complete file


# ---- issue #4 targets ------------------------------------------------------------------------------

FP4_WEIGHTS = ("mxfp4", "nvfp4", "mxfp8xmxfp4", "bf16xmxfp4", "bf16xnvfp4")
MX_UPCAST = ("mxfp8", "mxfp4", "nvfp4", "mxfp8xmxfp4", "bf16xmxfp4", "bf16xnvfp4")


@dataclasses.dataclass(frozen=True)
class Target:
    """One row of the issue's target table: our `formats` against `baseline` on the shapes `where` holds.

    `minimum` is the speedup (baseline time / ours) every such shape must reach; with `max_us` the target
    is instead an absolute device time per matmul (the baseline is then shown for context only). The
    thresholds are issue #4's table. `bound` names the measured ceiling that meeting the target is held
    against (`implied`): "fp8" or "bf16" (XLA matmul TFLOP/s), "read" or "copy" (GB/s of bytes moved).
    """

    name: str
    formats: tuple[str, ...]
    baseline: str
    minimum: float
    where: Callable[[int, int, int], bool]
    impl: str = "ours"
    max_us: Optional[float] = None
    bound: str = ""


def _decode_fp8(m: int, n: int, k: int) -> bool:
    return m in (1, 16, 64) and n == 7168 and k in (2048, 4096, 7168)


def _decode_fp4(m: int, n: int, k: int) -> bool:
    return m <= 64 and n == 7168 and k == 4096


def _square(m: int, n: int, k: int) -> bool:
    return (m, n, k) == (8192, 8192, 8192)


def _large(m: int, n: int, k: int) -> bool:
    return min(m, n, k) >= 2048


TARGETS = (
    Target("block FP8, M,N,K >= 2048", ("fp8_block",), "torch_blockwise", 1.1, _large, bound="fp8"),
    Target("block FP8 decode, M in {1,16,64} N=7168 K=2k/4k/7k", ("fp8_block",), "torch_blockwise", 2.0,
           _decode_fp8, bound="read"),
    # Hopper has no MX MMA: these run bf16 MMAs, so the bf16 matmul rate is their ceiling.
    Target("MX/nvfp4 8192^3", MX_UPCAST, "xla_dequant", 1.15, _square, bound="bf16"),
    Target("fp4 weights decode, M<=64 N=7168 K=4096 (<= 8 us)", FP4_WEIGHTS, "xla_bf16", 0.0, _decode_fp4,
           max_us=8.0, bound="read"),
    # quantization rows: M x K is the tensor, N = 0
    Target("quantize 8192x8192 vs one elementwise pass", ("mxfp8", "nvfp4", "fp8_1x128"), "xla_elementwise",
           0.8, lambda m, n, k: (m, k) == (8192, 8192), impl="quantize", bound="copy"),
)



def implied(rows: dict[tuple, Row], t: Target) -> str:
    """What meeting `t` takes on its hardest shape, as a rate and a share of the measured `t.bound` ceiling:
    the time the target allows (baseline time / minimum, or max_us), turned into TFLOP/s (2MNK) or GB/s
    (the row's bytes: operands and output, or for quantization the tensor read and the codes written)."""
    ceiling = ceilings(rows).get(t.bound, math.nan)
    unit = "TFLOP/s" if t.bound in ("fp8", "bf16") else "GB/s"
    hardest = None
    for r in _matching(rows, t):
        allowed_us = t.max_us if t.max_us is not None else _baseline_us(rows, r, t.baseline) / t.minimum
        if unit == "TFLOP/s":
            rate = 2 * fnum(r, "M") * fnum(r, "N") * fnum(r, "K") / allowed_us / 1e6
        else:
            rate = fnum(r, "bytes") / allowed_us / 1e3
        if math.isfinite(rate) and (hardest is None or rate > hardest[0]):
            hardest = (rate, r)
    if hardest is None or not math.isfinite(ceiling):
        return ""
    rate, r = hardest
    return f"{rate:.4g} {unit} = {100 * rate / ceiling:.0f}% of the {t.bound} ceiling ({r['format']} {r['case']})"


def _matching(rows: dict[tuple, Row], t: Target) -> list[Row]:
    out = []
    for r in rows.values():
        if r["impl"] != t.impl or r["format"] not in t.formats:
            continue
        m, n, k = (int(v) if math.isfinite(v) else 0 for v in (fnum(r, d) for d in "MNK"))
        if t.where(m, n, k):
            out.append(r)
    return out


def target_lines(rows: dict[tuple, Row]) -> list[list[str]]:
    """Per target: [target, baseline, shapes, geomean, worst (where), minimum, met, implied]."""
    lines = []
    for t in TARGETS:
        if t.max_us is not None:
            lines.append(_time_target_line(rows, t))
            continue
        ratios = [(fnum(r, f"ratio_vs_{t.baseline}"), r) for r in _matching(rows, t)]
        have = [(v, r) for v, r in ratios if math.isfinite(v)]
        if not have:
            lines.append([t.name, t.baseline, f"0/{len(ratios)}", "", "", f"{t.minimum:g}x", "no data", ""])
            continue
        worst, wr = min(have, key=lambda p: p[0])
        geo = math.exp(sum(math.log(v) for v, _ in have) / len(have))
        met = "yes" if worst >= t.minimum and len(have) == len(ratios) else ("no" if worst < t.minimum
                                                                             else "partial data")
        lines.append([t.name, t.baseline, f"{len(have)}/{len(ratios)}", f"{geo:.2f}x",
                      f"{worst:.2f}x ({wr['format']} {wr['case']})", f"{t.minimum:g}x", met, implied(rows, t)])
    return lines


def _time_target_line(rows: dict[tuple, Row], t: Target) -> list[str]:
    """An absolute-time target: the slowest matching shape must take at most `max_us`."""
    times = [(primary_us(r), r) for r in _matching(rows, t)]
    have = [(v, r) for v, r in times if math.isfinite(v)]
    if not have:
        return [t.name, "-", f"0/{len(times)}", "", "", f"<= {t.max_us:g} us", "no data", ""]
    worst, wr = max(have, key=lambda p: p[0])
    speedups = [fnum(r, f"ratio_vs_{t.baseline}") for _, r in have]
    geo = [v for v in speedups if math.isfinite(v) and v > 0]
    context = f"{math.exp(sum(map(math.log, geo)) / len(geo)):.2f}x vs {t.baseline}" if geo else ""
    met = "yes" if worst <= t.max_us and len(have) == len(times) else "no"
    return [t.name, "time", f"{len(have)}/{len(times)}", context,
            f"{worst:.1f} us ({wr['format']} {wr['case']})", f"<= {t.max_us:g} us", met, implied(rows, t)]


def markdown_table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]
    return "\n".join(out)


def text_table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([fmt.format(*header), fmt.format(*("-" * w for w in widths))]
                     + [fmt.format(*map(str, line)) for line in lines])


TARGET_HEADER = ["target", "vs", "shapes", "geomean", "worst (where)", "needs", "met",
                 "meeting it takes (hardest shape)"]
SHAPE_HEADER = ["case", "format", "path", "ours us", "wall us", "TFLOP/s", "vs bf16", "vs fp8 tensor",
                "vs dequant", "vs torch blockwise", "vs jax scaled_matmul"]


def shape_lines(rows: dict[tuple, Row]) -> list[list[str]]:
    lines = []
    for r in rows.values():
        if r["impl"] != "ours":
            continue
        ratio = [(_fmt(fnum(r, f"ratio_vs_{b}"), 3) or "-") for b in
                 ("xla_bf16", "xla_fp8_tensor", "xla_dequant", "torch_blockwise", "jax_scaled_matmul")]
        us = _fmt(primary_us(r), 4) or r["status"]
        lines.append([r["case"], r["format"], r["path"], us, _fmt(fnum(r, "median_us"), 4) or "-",
                      _fmt(fnum(r, "tflops"), 3) or "-", *ratio])
    return lines


def quant_lines(rows: dict[tuple, Row], copy_gbps: float) -> list[list[str]]:
    lines = []
    for r in rows.values():
        if r["impl"] != "quantize":
            continue
        gbps = fnum(r, "gbps")
        lines.append([r["case"], r["format"], _fmt(primary_us(r), 4) or r["status"],
                      _fmt(fnum(r, "median_us"), 4) or "-", _fmt(gbps, 4) or "-",
                      _fmt(100 * gbps / copy_gbps, 3) or "-", _fmt(fnum(r, "ratio_vs_xla_elementwise"), 3) or "-"])
    return lines


def ceilings(rows: dict[tuple, Row]) -> dict[str, float]:
    """{'bf16': TFLOP/s, 'fp8': TFLOP/s, 'copy': GB/s, 'read': GB/s} from the ceiling rows (NaN if absent)."""
    def get(impl: str, field: str) -> float:
        r = rows.get(("ceiling", NO_FORMAT, impl))
        return fnum(r, field) if r and r.get("status") == "ok" else math.nan
    return {"bf16": get("xla_bf16", "tflops"), "fp8": get("xla_fp8_tensor", "tflops"),
            "copy": get("xla_copy", "gbps"), "read": get("xla_read", "gbps")}


def _kernel_rows(rows: dict[tuple, Row]) -> str:
    ok = [r for r in rows.values() if r.get("status") == "ok"]
    return f"{sum(math.isfinite(fnum(r, 'kernel_us')) for r in ok)} of {len(ok)}"


def summary_markdown(rows: dict[tuple, Row], meta: dict, csv_name: str, png_name: Optional[str]) -> str:
    c = ceilings(rows)
    size = rows.get(("ceiling", NO_FORMAT, "xla_bf16"), {}).get("M", "?")
    copy_mib = _fmt(fnum(rows.get(("ceiling", NO_FORMAT, "xla_copy"), {}), "bytes") / 2 / 2**20, 4) or "?"
    bad = [r for r in rows.values() if r["status"] not in ("ok",)]
    parts = [
        f"# Speed suite: {meta['device']}, {meta['date']} (jax {meta['jax']}, target {meta['target']})",
        "",
        f"Ceilings measured by XLA on this machine: bf16 matmul {_fmt(c['bf16'], 4) or '?'} TFLOP/s, fp8 matmul "
        f"{_fmt(c['fp8'], 4) or '?'} TFLOP/s (M = N = K = {size}), copy {_fmt(c['copy'], 4) or '?'} GB/s ({copy_mib} MiB read and written), read "
        f"{_fmt(c['read'], 4) or '?'} GB/s (the same tensor read once). Times are per matmul: kernel time "
        f"(the sum of its CUPTI kernel durations, benchmarks/_kernel_time.py) where the row has it "
        f"({_kernel_rows(rows)} rows), else the wall-clock median of back-to-back calls over R distinct operand "
        f"sets in one jit (benchmarks/_timing.py), which is the 'wall us' column. Ratios are "
        f"speedups, baseline time / our time: > 1 means ours is faster. Data: `{csv_name}`"
        + (f", plot: `{png_name}`." if png_name else "."),
        "",
        "## Issue #4 targets",
        "",
        markdown_table(TARGET_HEADER, target_lines(rows)),
        "",
        "## Per shape (ours)",
        "",
        markdown_table(SHAPE_HEADER, shape_lines(rows)),
    ]
    q = quant_lines(rows, c["copy"])
    if q:
        parts += ["", "## Quantization", "",
                  markdown_table(["case", "format", "us", "wall us", "GB/s (read + written)", "% of copy",
                                  "vs elementwise"], q)]
    if bad:
        parts += ["", "## Rows without a time", "",
                  markdown_table(["case", "format", "impl", "status", "note"],
                                 [[r["case"], r["format"], r["impl"], r["status"], r["note"][:160]] for r in bad])]
    return "\n".join(parts) + "\n"
