"""`python -m benchmarks.suite --smoke` runs end to end on a CPU (the jnp reference path).

Every implementation that exists on a CPU must produce a row that passed its correctness check and has a
finite time; the ones that need a GPU (jax.nn.scaled_matmul's cuDNN lowering, torch's cuBLAS blockwise
FP8) must be 'n/a' rows that say why, not a crash. The CSV, PNG and markdown summary must be written.
The smoke run asks for kernel time: on a CPU the profiler trace runs and finds no GPU kernels, so every
row falls back to wall clock and says so.
"""

import csv
import math
import pathlib
import sys

import pytest

pytest.importorskip("matplotlib")

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `pytest` (unlike `python -m pytest`) does not put the repo root on the path
    sys.path.insert(0, str(ROOT))

from benchmarks import _report, suite  # noqa: E402

CPU_IMPLS = {"xla_bf16", "xla_fp8_tensor", "ours", "xla_dequant", "quantize", "xla_elementwise", "xla_copy",
             "xla_read"}
GPU_ONLY = {"jax_scaled_matmul", "torch_blockwise"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    suite.main(["--smoke", "--fresh", "--kernel-time", "--out", str(out)])
    (path,) = out.glob("suite_*.csv")
    with open(path, newline="") as f:
        return out, path, list(csv.DictReader(f))


def test_every_cpu_impl_checked_and_timed(smoke):
    _, _, rows = smoke
    assert CPU_IMPLS <= {r["impl"] for r in rows}
    for r in rows:
        if r["impl"] in GPU_ONLY:
            continue
        assert r["status"] == "ok", r
        assert math.isfinite(float(r["median_us"])) and float(r["median_us"]) > 0, r
        assert int(r["R"]) == 2 and int(r["samples"]) >= 3, r
        tol = 0.25 if r["impl"] == "quantize" else 1e-2
        assert float(r["rel_err"]) < tol, r


def test_kernel_time_columns(smoke):
    _, _, rows = smoke
    assert set(_report.FIELDS) <= set(rows[0])
    for r in rows:
        if r["status"] != "ok":
            continue
        if r["time_basis"] == "kernel":  # a GPU run
            assert float(r["kernel_us"]) > 0 and r["kernels"], r
        else:
            assert r["time_basis"] == "wall" and r["kernel_us"] == "" and "no kernel time" in r["note"], r


def test_ratios_compare_like_with_like():
    """Kernel time against kernel time when both rows have it; otherwise wall clock against wall clock,
    never one against the other."""
    def row(median, kernel=""):
        return {"status": "ok", "median_us": str(median), "kernel_us": str(kernel)}
    assert _report.ratio(row(30, 20), row(15, 5)) == 4.0
    assert _report.ratio(row(30, 20), row(15)) == 2.0
    assert _report.ratio(row(30), row(15, 5)) == 2.0
    assert _report.primary_us(row(30, 20)) == 20.0 and _report.primary_us(row(30)) == 30.0
    assert _report.ratio({"status": "n/a"}, row(15)) != _report.ratio({"status": "n/a"}, row(15))  # NaN


def test_gpu_only_baselines_are_na_with_a_reason(smoke):
    _, _, rows = smoke
    gpu_rows = [r for r in rows if r["impl"] in GPU_ONLY]
    assert {r["impl"] for r in gpu_rows} == GPU_ONLY
    for r in gpu_rows:
        assert r["status"] in ("ok", "n/a"), r
        assert r["status"] == "ok" or r["note"], r


def test_every_format_every_shape_with_ratios(smoke):
    _, _, rows = smoke
    ours = [r for r in rows if r["impl"] == "ours"]
    assert {(r["case"], r["format"]) for r in ours} == {
        (c.name, f) for c in suite.smoke_cases() for f in suite.FORMATS}
    for r in ours:
        for b in ("xla_bf16", "xla_fp8_tensor", "xla_dequant"):
            assert float(r[f"ratio_vs_{b}"]) > 0, (b, r)
    for r in rows:
        if r["impl"] == "quantize":
            assert float(r["gbps"]) > 0 and float(r["ratio_vs_xla_elementwise"]) > 0, r


def test_plot_and_summary_written(smoke):
    out, path, _ = smoke
    png, md = path.with_suffix(".png"), path.with_suffix(".md")
    assert png.stat().st_size > 10_000
    text = md.read_text()
    assert "Issue #4 targets" in text and "Per shape" in text and "Quantization" in text


def test_merge_joins_parts_into_one_report(smoke, tmp_path):
    """Two parts of a sweep (as two GPUs write them) merge into one CSV with every row, plus PNG and MD."""
    _, path, rows = smoke
    parts = []
    for i, half in enumerate((rows[::2], rows[1::2])):
        part = tmp_path / f"part{i}.csv"
        with open(part, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(half)
        parts.append(str(part))
    merged = suite.main(["--merge", *parts, "--out", str(tmp_path / "merged"), "--tag", "all"])
    assert set(merged) == {_report.key(r) for r in rows}
    (csv_path,) = (tmp_path / "merged").glob("suite_*_all.csv")
    assert len(_report.load(csv_path)) == len(rows)
    assert csv_path.with_suffix(".png").exists() and "Issue #4 targets" in csv_path.with_suffix(".md").read_text()


def test_target_states_what_meeting_it_takes():
    """1.1x a 1100 us cuBLAS time at 8192^3 allows 1000 us: 1100 TFLOP/s, 110% of a 1000 TFLOP/s fp8
    ceiling; <= 8 us for 16 MB of weights is 2000 GB/s, 50% of a 4000 GB/s read ceiling."""
    def row(case, fmt, impl, us, m=0, n=0, k=0, nbytes=0, **extra):
        return {"case": case, "format": fmt, "impl": impl, "status": "ok", "median_us": str(us), "M": str(m),
                "N": str(n), "K": str(k), "bytes": str(nbytes), "tflops": "", "gbps": "", **extra}
    big, dec = "8192x8192x8192", "16x7168x4096"
    rows = [row("ceiling", "-", "xla_fp8_tensor", 1, 8192, 8192, 8192, tflops="1000"),
            row("ceiling", "-", "xla_read", 1, gbps="4000"),
            row(big, "fp8_block", "ours", 1500, 8192, 8192, 8192),
            row(big, "fp8_block", "torch_blockwise", 1100, 8192, 8192, 8192),
            row(dec, "mxfp4", "ours", 30, 16, 7168, 4096, nbytes=16_000_000)]
    by_key = {_report.key(r): r for r in rows}
    _report.add_ratios(by_key)
    lines = {line[0]: line for line in _report.target_lines(by_key)}
    assert lines["block FP8, M,N,K >= 2048"][-1] == (
        "1100 TFLOP/s = 110% of the fp8 ceiling (fp8_block 8192x8192x8192)")
    assert lines["fp4 weights decode, M<=64 N=7168 K=4096 (<= 8 us)"][-1] == (
        "2000 GB/s = 50% of the read ceiling (mxfp4 16x7168x4096)")
