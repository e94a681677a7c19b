"""benchmarks/train_step.py: presets, the kernel-time report (GEMM / quantization / dequantize / other per step, ratios
vs bf16 on both bases, top kernels) and the CSV's new columns, on a CPU."""

import csv
import math
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import train_step  # noqa: E402
from benchmarks._kernel_time import DEQUANT, GEMM, OTHER, QUANT, DeviceEvent, aggregate, breakdown  # noqa: E402


def test_presets():
    a = train_step.parse(["--preset", "d4096"])
    assert train_step.PRESETS[a.preset] == dict(d_model=4096, layers=2, heads=32, seq=1024, batch=8, vocab=8192)
    assert train_step.PRESETS["d2048"] == dict(d_model=2048, layers=4, heads=16, seq=2048, batch=8, vocab=8192)
    assert train_step.parse(["--seq", "512"]).seq == 512 and train_step.parse([]).kernel_time is None


def _row(recipe, wall_ms, events, steps=2):
    kp = aggregate(events, calls=steps)
    split = breakdown(kp)
    return dict(recipe=recipe, remat_saves="-" if recipe == "bf16" else "weights", wall_s=wall_ms / 1e3, wall_min_s=wall_ms / 1e3, kernel_s=kp.kernel_s,
                gemm_s=split[GEMM], quant_s=split[QUANT], dequant_s=split[DEQUANT], other_s=split[OTHER],
                memcpy_s=kp.memcpy_s, profile=kp,
                paths="fprop dense", tokens_per_s=1000.0)


def test_report_breakdown_ratios_and_top_kernels():
    ms = 1e6  # ns per ms
    bf16 = _row("bf16", 100, [DeviceEvent("nvjet_hsh_256x128", 30 * ms), DeviceEvent("loop_add_fusion", 10 * ms)] * 2)
    fp8 = _row("fp8_deepseek", 150, [DeviceEvent("block_fp8_kernel", 40 * ms), DeviceEvent("quantize_rows", 8 * ms),
                                     DeviceEvent("loop_add_fusion", 12 * ms)] * 2)
    assert fp8["kernel_s"] == pytest.approx(60e-3) and fp8["gemm_s"] == pytest.approx(40e-3)
    assert fp8["quant_s"] == pytest.approx(8e-3) and fp8["other_s"] == pytest.approx(12e-3)
    text = train_step.report([bf16, fp8], "sm_90", top=2)
    line = next(ln for ln in text.splitlines() if ln.startswith("| fp8_deepseek"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:12] == ["fp8_deepseek", "weights", "nan", "150.00", "60.00", "40.00", "8.00", "0.00", "12.00",
                          "0.00", "1.500", "1.500"]  # no scratch size given: nan; no dequantize pass
    assert cells[12] == "1.250"  # GEMM-only bound: fp8's 40 ms GEMM + bf16's 10 ms other, over bf16's 40 ms
    assert "Top kernels, fp8_deepseek" in text and "| `block_fp8_kernel` | 40.000 | 1 | gemm | 66.7% |" in text
    assert "quantize_rows" not in text and text.count("| `loop_add_fusion`") == 2  # top=2: 8 ms is third
    assert "`quantize_rows` | 8.000 | 1 | quantization" in train_step.report([bf16, fp8], "sm_90", top=3)


def test_remat_saves_runs_each_quantizing_recipe_per_value(tmp_path):
    rows = train_step.main(["--recipes", "bf16,fp8_deepseek", "--remat-saves", "nothing,weights+inputs",
                            "--no-kernel-time", "--steps", "1", "--out", str(tmp_path)])
    assert [(r["recipe"], r["remat_saves"]) for r in rows] == [
        ("bf16", "-"), ("fp8_deepseek", "nothing"), ("fp8_deepseek", "weights+inputs")]
    with pytest.raises(ValueError, match="remat_saves must be one of"):
        train_step.main(["--recipes", "bf16", "--remat-saves", "all", "--out", str(tmp_path)])
    with pytest.raises(ValueError, match="--attention must be one of"):
        train_step.main(["--recipes", "bf16", "--attention", "flash", "--out", str(tmp_path)])
    (row,) = train_step.main(["--recipes", "bf16", "--attention", "naive", "--no-kernel-time", "--steps", "1",
                              "--out", str(tmp_path)])
    assert row["wall_s"] > 0


def test_cpu_run_writes_kernel_columns(tmp_path):
    rows = train_step.main(["--recipes", "bf16", "--kernel-time", "--steps", "1", "--trace-steps", "1",
                            "--out", str(tmp_path)])
    assert len(rows) == 1 and rows[0]["wall_s"] > 0 and rows[0]["temp_mib"] >= 0
    (path,) = tmp_path.glob("train_step_*.csv")
    with open(path, newline="") as f:
        (r,) = list(csv.DictReader(f))
    assert set(train_step.CSV_FIELDS) <= set(r)
    assert r["attention"] in ("fused (xla)", "fused (cudnn)")
    assert float(r["median_ms"]) > 0 and r["ratio_vs_bf16"] == "1"
    if r["kernel_ms"]:  # a GPU
        assert float(r["kernel_ms"]) > 0 and r["top_kernels"]
    else:
        assert math.isnan(rows[0]["kernel_s"]) and "no /device:GPU plane" in r["kernel_source"]
