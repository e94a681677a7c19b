"""CPU test of benchmarks/reliability_sweep.py's harness (--tiny: jb.matmul runs the reference on a CPU).

The GPU sweep itself is run on the device (`python -m benchmarks.reliability_sweep`); here the grouping,
seeding, tolerance, determinism check and the markdown/CSV report are exercised end to end.
"""

import csv

import jax
import pytest

from benchmarks import reliability_sweep as sweep


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="--tiny is the CPU harness check")
def test_tiny_sweep_runs_and_reports(tmp_path):
    assert sweep.main(["--tiny", "--cases", "20", "--out-dir", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("reliability_cpu_*_tiny.csv")
    rows = list(csv.DictReader(open(csv_path)))
    assert len(rows) >= 20
    assert all(r["within"] == "True" and r["deterministic"] == "True" for r in rows)
    assert {r["out"] for r in rows} == {"bf16", "fp16", "fp32"}
    md = csv_path.with_suffix(".md").read_text()
    assert "| reference |" in md and "No case beyond tolerance" in md


def test_groups_cover_every_accepted_pair_and_variant_on_sm90():
    groups = sweep.build_groups("sm_90", quick=False, tiny=False, seed=0)
    pairs = {(g.fa, g.fb) for g in groups}
    assert set(sweep.accepted_pairs("sm_90")) <= pairs
    forced = {g.variant for g in groups if g.config is not None}
    assert set(sweep.BLOCK_FP8_VARIANTS) | set(sweep.UPCAST_VARIANTS) <= forced
    assert {"fma_split1", "mma_split3"} <= forced
    assert any(g.shape.m == 1 for g in groups) and any(g.shape.b_batched for g in groups)
    # Compilations stay bounded: one per group.
    assert len(groups) <= 120


def test_tolerance_matches_the_gpu_tests():
    assert sweep.tolerance("fp32", "mxfp8_e4m3") == 1e-5
    assert sweep.tolerance("fp32", "fp8_block") == 2e-3
    assert abs(sweep.tolerance("bf16", "nvfp4") - (2 * 2.0 ** -7 + 1e-5)) < 1e-12
