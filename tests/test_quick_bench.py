"""`python -m benchmarks.quick --tiny` runs end to end on a CPU, and its ratios are the issue's metrics.

Every section's rows must be checked and timed (the GPU-only torch baseline: 'n/a' with a reason, or ok),
the markdown tables must be well formed, and the ratio arithmetic (speedups; quantization GB/s relative to
the x*2 pass, counting ideal bytes) is checked on synthetic rows.
"""

import math
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _baselines as bl  # noqa: E402
from benchmarks import quick  # noqa: E402
from benchmarks._kernel_time import DeviceEvent, aggregate  # noqa: E402
from benchmarks._timing import Timing  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("quick")
    q = quick.main(["--tiny", "--out", str(out)])
    return q, out


def test_every_section_and_row(tiny):
    q, _ = tiny
    labels = {(r.section, r.label) for r in q.rows}
    for fmt in quick.QUANT_FORMATS:
        assert ("quant", fmt) in labels and ("quant", f"{fmt} + transpose") in labels
    assert {("quant", "nvfp4, tensor scale given"), ("quant", "nvfp4 + transpose, tensor scale given")} <= labels
    for fmt in quick.DECODE_FORMATS:
        assert ("decode", f"ours {fmt}") in labels
    reads = [r for r in q.rows if r.label == "XLA read of the mxfp4 bytes"]  # the same-size read ceiling
    assert [r.case for r in reads] == [f"{quick.TINY.decode_m[0]}x256x512"] and reads[0].nbytes > 0
    for fmt in quick.LARGE_MX:
        assert ("large", f"ours {fmt}") in labels and ("large", f"XLA dequant+dot {fmt}") in labels
    assert {r.case for r in q.rows if r.section == "decode"} == {f"{m}x256x512" for m in quick.TINY.decode_m}
    for r in q.rows:
        if r.label == "torch cuBLAS blockwise":
            assert r.o.status in ("ok", "n/a") and (r.o.status == "ok" or r.o.note), r
            continue
        assert r.o.status == "ok", (r.label, r.o)
        assert r.us("wall") > 0
        if r.label.startswith("ours ") or r.section == "quant" and r.label != "XLA x*2":
            assert quick.comparisons(q.rows, r), r.label


def test_markdown_and_csv_written(tiny):
    q, out = tiny
    (md,) = out.glob("quick_*.md")
    text = md.read_text()
    for title in quick.TITLES.values():
        assert title in text
    for line in text.splitlines():
        if line.startswith("| "):  # every table row has the header's 9 cells
            assert line.count(" | ") == 8, line
    (csv_path,) = out.glob("quick_*.csv")
    assert len(csv_path.read_text().strip().splitlines()) == len(q.rows) + 1


def _row(section, label, wall_us, kernel_us=None, nbytes=0.0, flops=0.0, case="c"):
    kernel = None
    if kernel_us is not None:
        kernel = aggregate([DeviceEvent("k", kernel_us * 1e3)], calls=1)
    o = bl.Outcome(label, "ok", Timing(wall_us * 1e-6, wall_us * 1e-6, 2, 1, 3), 0.0, 0.0, kernel=kernel)
    return quick.Row(section, case, label, o, nbytes, flops)


def test_ratios_on_synthetic_rows():
    # x*2: 200 MB moved in 100 us (kernel) = 2000 GB/s; quantize: 150 MB ideal in 100 us = 1500 GB/s -> 0.75
    base = _row("quant", "XLA x*2", 120, 100, nbytes=200e6)
    qr = _row("quant", "mxfp8", 150, 100, nbytes=150e6)
    (name, kernel, wall), = quick.comparisons([base, qr], qr)
    assert name == "x*2 GB/s" and kernel == pytest.approx(0.75) and wall == pytest.approx(0.6)
    bf16 = _row("large", "XLA bf16", 100, 80)
    dq = _row("large", "XLA dequant+dot mxfp8", 200, 160)
    ours = _row("large", "ours mxfp8", 90, 40, flops=2e12)
    got = {b: (k, w) for b, k, w in quick.comparisons([bf16, dq, ours], ours)}
    assert got["XLA bf16"] == (pytest.approx(2.0), pytest.approx(100 / 90))
    assert got["XLA dequant+dot mxfp8"] == (pytest.approx(4.0), pytest.approx(200 / 90))
    assert quick._rate(ours) == "5e+04 TFLOP/s"
    no_kernel = _row("decode", "ours fp8_block", 10, None, nbytes=1e6)
    assert quick._rate(no_kernel) == "100 GB/s (wall)"
    assert math.isnan(no_kernel.us("kernel"))


def test_with_transpose_falls_back_and_says_so():
    op, how = quick.with_transpose("mxfp8")
    import jax.numpy as jnp
    q, qt = op(jnp.ones((64, 32), jnp.float32))
    assert q.shape == (64, 32) and qt.shape == (32, 64)
    import jax_blockscale as jb
    if hasattr(jb, "quantize_with_transpose"):
        assert how == "jb.quantize_with_transpose"
    else:
        assert how.startswith("two jb.quantize calls")
