"""`python -m benchmarks.dequantize --tiny` runs on a CPU: every format gets its three rows, checked first."""

from benchmarks import dequantize as bd


def test_tiny_run_has_every_row():
    rows = bd.main(["--tiny"])
    assert {(r["fmt"], r["row"]) for r in rows} == {(f, row) for f in bd.FORMATS
                                                    for row in ("bf16", "f32->bf16", "x*2")}
