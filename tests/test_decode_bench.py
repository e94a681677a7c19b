"""CPU check of benchmarks/decode.py's variant tables (--gemv-decode, --mma16): the harness runs end to end
on the jnp reference path (tiny sizes, wall clock), every format gets its same-size read row and every
variant a checked, timed row. The GPU numbers themselves come from the device."""

import re

import jax
import pytest

from benchmarks import decode as bench


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU harness check")
def _pick(variants, *labels):
    return tuple(v for v in variants if v[0] in labels)


@pytest.mark.parametrize("variants, fp4_only, m, k", [
    (_pick(bench.GEMV_DECODE_VARIANTS, "tuned bf16 dec", "tuned f16 dec"), {"tuned f16 dec"}, 1, 512),
    (_pick(bench.MMA16_VARIANTS, "tuned", "split x2"), set(), 8, 2048),  # K holds twice the tuned splits
], ids=["gemv", "mma16"])
def test_config_variants_runs_on_the_reference(monkeypatch, capsys, variants, fp4_only, m, k):
    assert len(variants) == 2
    monkeypatch.setattr(bench, "WEIGHTS", 2)
    monkeypatch.setattr(bench, "CALLS", 2)
    bench.config_variants(None, (m,), variants, fp4_only, n=128, k=k)
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    for fb in ("mxfp4", "nvfp4", "mxfp8"):
        assert any(r.startswith(f"| {fb} | - | same-size read") for r in rows), fb
        for label, _ in variants:
            expected = fb != "mxfp8" or label not in fp4_only
            got = [r for r in rows if r.startswith(f"| {fb} | {m} | {label} |")]
            assert len(got) == int(expected), (fb, label, got)
            if got:  # checked against the reference and timed: a number, an error within tolerance
                cells = [c.strip() for c in got[0].split("|")]
                assert float(cells[5]) > 0 and float(cells[-2]) < 1e-4, got[0]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU harness check")
def test_gemv_shapes_runs_on_the_reference(monkeypatch, capsys):
    monkeypatch.setattr(bench, "WEIGHTS", 2)
    monkeypatch.setattr(bench, "CALLS", 2)
    variants = {"fp4": bench.GEMV_SHAPE_VARIANTS["fp4"][:2], "fp8": bench.GEMV_SHAPE_VARIANTS["fp8"][:2]}
    bench.gemv_shapes(None, shapes=[(64, 2048)], variants=variants)
    out = capsys.readouterr().out
    assert "## N=64 K=2048: XLA bf16" in out
    for fb, labels in (("mxfp4", ("base", "k1024")), ("mxfp8", ("base", "s1"))):
        (line,) = [ln for ln in out.splitlines() if ln.strip().startswith(f"{fb} read")]
        for label in labels:  # a time and a fraction of the read: checked against the reference, then timed
            assert re.search(rf"\| {label} [\d.]+ \(\d+%\)", line), line


def test_cublas_baseline_is_none_without_cuda(monkeypatch, capsys):
    # The table's cuBLAS column goes through benchmarks/_torch.torch_blockwise; without a CUDA device (or
    # torch) it reports why and gives None, never an exception from a stale helper.
    monkeypatch.setattr(bench, "WEIGHTS", 2)
    x = bench._activation("fp8_block", 4, 256)
    ws = bench._weights("fp8_block", 128, 256, 0)
    assert bench._cublas_blockwise_us(None, x, ws) is None
    assert "cuBLAS blockwise: n/a" in capsys.readouterr().err


@pytest.mark.parametrize("m,n,k", [(16, 7168, 4096), (16, 7168, 2048), (32, 28672, 8192), (2, 64, 256),
                                   (64, 7168, 4096)])
def test_wgmma_knob_configs_are_the_default_and_valid_neighbours(m, n, k):
    # --wgmma-knobs profiles decode_wgmma's default config against these: the default first, then distinct
    # configs differing in stages, split-K or chunk, or with two warp groups, each one the kernel's own checks
    # accept.
    from jax_blockscale._triton import decode_wgmma
    from jax_blockscale._triton.problem import GemmProblem

    p = GemmProblem(1, False, m, n, k, "bf16", "e2m1", "bf16")
    configs = bench.wgmma_knob_configs(p)
    assert configs[0] == (configs[0][0], decode_wgmma.default_config(p)) and configs[0][0].startswith("default ")
    assert len({c for _, c in configs}) == len(configs) > 1
    for label, cfg in configs:
        decode_wgmma.check_config(p, cfg)
        warps = f" w{cfg.num_warps}" if cfg.num_warps != configs[0][1].num_warps else ""
        assert label.endswith(f"c{cfg.block_k} st{cfg.num_stages} sp{cfg.split_k}{warps}")
        # only stages, split-K, chunk and the warp groups differ from the default
        assert cfg.replace(block_k=configs[0][1].block_k, num_stages=configs[0][1].num_stages,
                           split_k=configs[0][1].split_k, num_warps=configs[0][1].num_warps,
                           block_n=configs[0][1].block_n) == configs[0][1]
    assert any(c.num_warps == 8 and c.block_n == 128 for _, c in configs)
    if k >= 2048:  # room for the other ring depth at the default chunk and split
        other = 5 - configs[0][1].num_stages
        assert any(c.num_stages == other and c.split_k == configs[0][1].split_k for _, c in configs)


@pytest.mark.parametrize("m,n,k,label", [(1, 7168, 4096, "decode default GEMV n8 k4096 w8 st2"),
                                         (2, 7168, 4096, "decode GEMV n8 k4096 w8 st2"),
                                         (1, 8192, 8192, "decode default GEMV n16 k1024 w4 st3"),
                                         (4, 7168, 4096, None), (1, 1024, 4096, None)])
def test_block_gemv_configs_are_the_one_row_tile(m, n, k, label):
    # --fp8 times decode.py's GEMV beside decode_fp8 at <= 2 rows of block FP8 x block FP8, where its whole-row tile
    # applies; at one row that is what dispatch runs, so the label says "default" (the dispatch column's mark)
    from jax_blockscale._triton import decode
    from jax_blockscale._triton.problem import GemmProblem

    p = GemmProblem(1, False, m, n, k, "block_fp8", "block_fp8", "bf16")
    configs = bench.block_gemv_configs(p)
    assert [lbl for lbl, _ in configs] == ([label] if label else [])
    for _, cfg in configs:
        assert cfg.gemv and cfg.kernel == "decode" and cfg.block_m == m
        decode.check_config(p, cfg)
    # --fp8-knobs: the default first, then distinct tiles the kernel accepts (one row only)
    knobs = bench.block_gemv_configs(p, knobs=True)
    assert knobs[: len(configs)] == configs and len({c for _, c in knobs}) == len(knobs)
    assert (len(knobs) > len(configs)) == (m == 1 and bool(label))
    for _, cfg in knobs:
        decode.check_config(p, cfg)


@pytest.mark.parametrize("tile", [(8, 256, 4, 4), (8, 512, 1, 8)])
def test_stream_kernel_reads_whole_16_byte_vectors_for_sm90(tile):
    """--stream's ceiling kernel (the GEMV's bytes with no arithmetic but one xor per word) compiles for
    sm_90 to 16-byte loads of each row, the software-pipelined cp.async where the tile loops over K."""
    from jax_blockscale._triton.compile import compile_kernel

    block_n, block_w, stages, warps = tile
    assert tile in bench.STREAM_TILES
    compiled = compile_kernel(bench._stream_kernel(), target="sm_90",
                              signature={"w_ptr": "*i32", "s_ptr": "*i32", "out_ptr": "*i32"},
                              constexprs=dict(KW=512, SW=32, BLOCK_N=block_n, BLOCK_W=block_w, STAGES=stages),
                              num_warps=warps, num_stages=1)
    ptx = compiled.asm["ptx"]
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32|cp\.async\.cg\.shared\.global(\.\w+)* \[[^]]+\], \[[^]]+\], (16|0x10)", ptx)
    assert "fma" not in ptx  # nothing but the loads, the xors and the row reductions


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU harness check")
def test_gemv_l2_runs_on_the_reference(monkeypatch, capsys):
    monkeypatch.setattr(bench, "WEIGHTS", 2)
    monkeypatch.setattr(bench, "CALLS", 2)
    bench.gemv_l2(None, shapes=[(64, 512)], formats=("mxfp4", "mxfp8"))
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| mx")]
    assert [r.split("|")[1].strip() for r in rows] == ["mxfp4", "mxfp8"]
    for r in rows:  # read, rotated, resident: three positive times
        assert all(float(c) > 0 for c in r.split("|")[4:7]), r


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU harness check")
def test_experiment_table_checks_refuses_and_times(monkeypatch, capsys):
    import jax.numpy as jnp

    import jax_blockscale as jb

    monkeypatch.setattr(bench, "WEIGHTS", 2)
    monkeypatch.setattr(bench, "CALLS", 2)

    def too_wide(n, k):
        if k > 256:
            raise ValueError("K too wide")

    def takes_any(n, k):
        pass

    variants = [("same as dispatch", takes_any, lambda x, w, dt: jb.matmul(x, w, out_dtype=dt)),
                ("refuses", too_wide, lambda x, w, dt: jb.matmul(x, w, out_dtype=dt)),
                ("wrong", takes_any, lambda x, w, dt: 2 * jb.matmul(x, w, out_dtype=jnp.float32).astype(dt))]
    bench.experiment_table(None, ["mxfp4"], [(64, 512)], variants, again=True)
    rows = {r.split("|")[4].strip(): r for r in capsys.readouterr().out.splitlines() if r.startswith("| mxfp4")}
    assert float(rows["same as dispatch"].split("|")[5]) > 0
    assert "refused: K too wide" in rows["refuses"]
    assert "| wrong |" in rows["wrong"]
    assert "dispatch again" in rows


def test_experiment_main_parses_and_routes(monkeypatch):
    """--sass calls the experiment's sass(configs, formats) with each config parsed; otherwise experiment_table gets
    one variant per config, built with the first format."""
    seen = {}
    bench.experiment_main(["--sass", "--configs", "a1,b2", "--formats", "nvfp4,mxfp4"], "x", shapes="64x512",
                          formats="mxfp4", configs="z", config_help="", parse=lambda c: c.upper(),
                          variant=None, sass=lambda configs, fmts: seen.update(configs=configs, fmts=fmts))
    assert seen == dict(configs=["A1", "B2"], fmts=["nvfp4", "mxfp4"])

    def table(torch, formats, shapes, variants, again):
        seen.update(formats=formats, shapes=shapes, variants=variants, again=again)

    monkeypatch.setattr(bench, "experiment_table", table)
    monkeypatch.setattr(bench, "_torch", lambda: None)
    bench.experiment_main(["--shapes", "64x512,128x256"], "x", shapes="", formats="mxfp4,nvfp4", configs="a1",
                          config_help="", parse=str, variant=lambda c, fmt: (c, fmt), sass=None, again=False)
    assert seen["shapes"] == [(64, 512), (128, 256)] and seen["variants"] == [("a1", "mxfp4")]
    assert seen["formats"] == ["mxfp4", "nvfp4"] and seen["again"] is False


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU harness check")
@pytest.mark.parametrize("compare", [False, True])
def test_bf16_block_table_runs_on_the_reference(monkeypatch, capsys, compare):
    """On the CPU every path is the reference (the kernels' forced configs are rows naming their error): the table's
    baselines, dispatch and candidate rows, per row count."""
    monkeypatch.setattr(bench, "WEIGHTS", 2)
    monkeypatch.setattr(bench, "CALLS", 2)
    bench.bf16_block_table(None, [(256, 512)], rows=(1, 70), compare=compare)
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| 256 |")]
    labels = [r.split("|")[4].strip() for r in rows]
    for m in ("1", "70"):
        mine = [r.split("|")[4].strip() for r in rows if r.split("|")[3].strip() == m]
        assert mine[:3] == ["XLA bf16", "jnp reference (before)", "dispatch: reference None"], mine
    if compare:
        assert "dense_x_block_fp8 default" in labels and "decode default" in labels
        assert "dense_x_block_fp8 unswapped" in labels        # the large-M variants at 70 rows
    else:
        assert len(rows) == 6
