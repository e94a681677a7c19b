"""CPU test of benchmarks/reliability_sweep.py's harness (--tiny: jb.matmul runs the reference on a CPU).

The GPU sweep itself is run on the device (`python -m benchmarks.reliability_sweep`); here the grouping,
seeding, tolerance, determinism check and the markdown/CSV report are exercised end to end.
"""

import csv

import jax
import numpy as np
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
    assert set(sweep.PERSISTENT_VARIANTS) | {"gemv", "gemv_prefetch_split2", "gemv_fp32_decode", "hopper_mx",
                                            "hopper_mx_fp8_mma"} <= forced
    assert any(g.shape.m == 1 for g in groups) and any(g.shape.b_batched for g in groups)
    # The GEMV sees every weight format.
    gemv_weights = {g.fb for g in groups if g.config is not None and g.config.gemv}
    assert {"mxfp4", "nvfp4", "mxfp8_e4m3", "mxfp6_e2m3", "mxfp6_e3m2", "fp8_block"} <= gemv_weights
    # Compilations stay bounded: one per group.
    assert len(groups) <= 140


def test_forced_configs_are_valid_for_their_kernels():
    """Every forced variant names a kernel whose dispatch entry holds the pair and whose config check
    accepts the group's (K-padded) problem, so a GPU run cannot fail on a harness mistake."""
    import importlib

    from jax_blockscale import backends
    from jax_blockscale._triton.problem import GemmProblem
    from jax_blockscale.primitive import _K_ALIGN

    kinds = {"mxfp8_e4m3": "e4m3", "mxfp8_e5m2": "e5m2", "mxfp6_e2m3": "e2m3", "mxfp6_e3m2": "e3m2",
             "mxfp4": "e2m1", "nvfp4": "nvfp4", "fp8_block": "block_fp8"}

    def kind(fmt):
        return kinds.get(fmt, fmt)

    for g in sweep.build_groups("sm_90", quick=False, tiny=False, seed=0):
        if g.config is None:
            continue
        s = g.shape
        rows = None if s.b_batched else int(np.prod(s.batch, dtype=np.int64)) * s.m
        fam = g.config.kernel or backends.choose("sm_90", kind(g.fa), kind(g.fb), rows=rows).kernel
        backends.choose("sm_90", kind(g.fa), kind(g.fb), rows=rows, kernel=fam)  # raises if no entry
        k = -(-s.k // _K_ALIGN) * _K_ALIGN
        p = GemmProblem(int(np.prod(s.batch, dtype=np.int64)), s.b_batched, s.m, s.n, k, kind(g.fa), kind(g.fb),
                        g.out)
        importlib.import_module(f"jax_blockscale._triton.{fam}").check_config(p, g.config)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="--tiny is the CPU harness check")
def test_jobs_shard_the_groups_and_merge_one_report(tmp_path):
    assert sweep.main(["--tiny", "--cases", "8", "--jobs", "2", "--out-dir", str(tmp_path)]) == 0
    (csv_path,) = tmp_path.glob("reliability_cpu_*_tiny.csv")
    rows = list(csv.DictReader(open(csv_path)))
    groups = sweep.build_groups("cpu", quick=False, tiny=True, seed=0)
    assert sorted({int(r["group"]) for r in rows}) == list(range(len(groups)))  # both shards' groups


def test_tolerance_matches_the_gpu_tests():
    assert sweep.tolerance("fp32", "mxfp8_e4m3") == 1e-5
    assert sweep.tolerance("fp32", "fp8_block") == 2e-3
    assert abs(sweep.tolerance("bf16", "nvfp4") - (2 * 2.0 ** -7 + 1e-5)) < 1e-12
