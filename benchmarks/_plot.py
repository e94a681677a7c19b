"""The suite's PNG: throughput (TFLOP/s) against the machine's ceilings, decode latency, quantization GB/s.

One color per format; ours is a solid line, the same format through XLA dequant + bf16 dot a dotted one,
the format-independent baselines (XLA bf16, XLA FP8 per-tensor) are black/gray dashed. Shapes are
categorical on x, sorted by (N, K, M).
"""

from __future__ import annotations

import math
import pathlib

import matplotlib

matplotlib.use("Agg")  # no display on the device machine or in CI
import matplotlib.pyplot as plt  # noqa: E402

from ._report import NO_FORMAT, Row, ceilings, fnum, primary_us  # noqa: E402

DECODE_MAX_M = 64  # M <= this goes to the latency panel
_PALETTE = plt.get_cmap("tab10").colors
_BASELINE_STYLE = {"xla_bf16": ("black", "D", "--"), "xla_fp8_tensor": ("dimgray", "v", "--")}


def _n(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def _cases(rows: list[Row], decode: bool) -> list[str]:
    seen = {}
    for r in rows:
        m = fnum(r, "M")
        if r["case"] not in ("ceiling",) and r["impl"] not in ("quantize", "xla_elementwise") and (
                (m <= DECODE_MAX_M) == decode):
            seen[r["case"]] = (fnum(r, "N"), fnum(r, "K"), m)
    return sorted(seen, key=seen.get)


def _series(rows: list[Row]) -> dict[tuple[str, str], dict]:
    """(impl, format) -> style, for every series with at least one timed point."""
    formats = sorted({r["format"] for r in rows if r["impl"] == "ours"})
    color = {f: _PALETTE[i % len(_PALETTE)] for i, f in enumerate(formats)}
    out = {}
    for r in rows:
        if r["status"] != "ok" or r["case"] == "ceiling" or r["impl"] in ("quantize", "xla_elementwise"):
            continue
        impl, fmt = r["impl"], r["format"]
        if impl in _BASELINE_STYLE:
            c, mk, ls = _BASELINE_STYLE[impl]
            style = dict(color=c, marker=mk, linestyle=ls, label=impl)
        elif impl == "ours":
            style = dict(color=color.get(fmt, "C0"), marker="o", linestyle="-", label=f"ours {fmt}")
        elif impl == "xla_dequant":
            style = dict(color=color.get(fmt, "C0"), marker="x", linestyle=":", label=f"xla_dequant {fmt}",
                         linewidth=1)
        else:
            style = dict(color=color.get(fmt, "C0"), marker="s" if impl == "torch_blockwise" else "^",
                         linestyle="-.", label=f"{impl} {fmt}")
        out[(impl, fmt)] = style
    return out


def _panel(ax, rows: list[Row], cases: list[str], field: str, series: dict) -> None:
    index = {(r["case"], r["impl"], r["format"]): r for r in rows if r["status"] == "ok"}
    def get(r: Row) -> float:  # "us": the row's primary time (kernel time where measured)
        return primary_us(r or None) if field == "us" else fnum(r, field)
    for (impl, fmt), style in series.items():
        ys = [get(index.get((c, impl, fmt), {})) for c in cases]
        if any(math.isfinite(y) for y in ys):
            ax.plot(range(len(cases)), ys, alpha=0.85, markersize=5, **{"linewidth": 1.5, **style})
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=60, ha="right", fontsize=7)
    ax.grid(True, alpha=0.3)


def _quant_panel(ax, rows: list[Row], copy_gbps: float) -> None:
    bars = [r for r in rows if r["impl"] in ("quantize", "xla_elementwise") and r["status"] == "ok"]
    labels = [f"{r['impl']}\n{r['format'] if r['format'] != NO_FORMAT else ''}\n{r['case']}" for r in bars]
    ax.bar(range(len(bars)), [fnum(r, "gbps") for r in bars],
           color=["tab:blue" if r["impl"] == "quantize" else "tab:gray" for r in bars])
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels(labels, fontsize=7)
    if math.isfinite(copy_gbps):
        ax.axhline(copy_gbps, color="black", linestyle=":", label=f"copy ceiling {_n(copy_gbps)} GB/s")
        ax.legend(fontsize=7)
    ax.set_ylabel("GB/s (read + written)")
    ax.set_title("Quantization from bf16 (device time)")
    ax.grid(True, axis="y", alpha=0.3)


def plot(rows: dict, path: pathlib.Path, title: str) -> None:
    rs = list(rows.values())
    series = _series(rs)
    big, small = _cases(rs, decode=False), _cases(rs, decode=True)
    width = max(12.0, 0.45 * max(len(big), len(small), 1) + 5)
    fig, axes = plt.subplots(3, 1, figsize=(width, 17), gridspec_kw=dict(height_ratios=[3, 3, 1.6]))
    c = ceilings(rows)

    _panel(axes[0], rs, big, "tflops", series)
    for name, color in (("bf16", "black"), ("fp8", "dimgray")):
        if math.isfinite(c[name]):
            axes[0].axhline(c[name], color=color, linestyle=":", linewidth=1.2,
                            label=f"{name} matmul ceiling {_n(c[name])} TFLOP/s (XLA)")
    axes[0].set_ylabel("TFLOP/s")
    axes[0].set_title(f"Throughput, M > {DECODE_MAX_M}")
    axes[0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))

    _panel(axes[1], rs, small, "us", series)
    axes[1].set_yscale("log")
    axes[1].set_ylabel("µs per matmul (log)")
    axes[1].set_title(f"Decode latency, M <= {DECODE_MAX_M} (lower is better)")

    _quant_panel(axes[2], rs, c["copy"])
    fig.suptitle(title, y=1.0)
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
