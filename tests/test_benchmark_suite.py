"""`python -m benchmarks.suite --smoke` runs end to end on a CPU (the jnp reference path).

Every implementation that exists on a CPU must produce a row that passed its correctness check and has a
finite time; the ones that need a GPU (jax.nn.scaled_matmul's cuDNN lowering, torch's cuBLAS blockwise
FP8) must be 'n/a' rows that say why, not a crash. The CSV, PNG and markdown summary must be written.
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

from benchmarks import suite  # noqa: E402

CPU_IMPLS = {"xla_bf16", "xla_fp8_tensor", "ours", "xla_dequant", "quantize", "xla_elementwise", "xla_copy"}
GPU_ONLY = {"jax_scaled_matmul", "torch_blockwise"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    suite.main(["--smoke", "--fresh", "--out", str(out)])
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
