"""CPU checks of benchmarks/mx_large_variants.py: config strings and a --tiny run of every row kind."""

import pytest

from benchmarks import mx_large_variants as mlv


def test_config_strings_round_trip_and_reject_garbage():
    for text in ("128x256x64w8s3", "128x128x32w8s4fp8", "64x256x64w4s4wsnoasmg4"):
        assert mlv.config_name(mlv.parse_config(text)) == text
    c = mlv.parse_config("128x128x32w8s4fp8ws")
    assert c.fp8_mma and c.warp_specialize and c.kernel == "hopper_mx" and c.block_k == 32
    with pytest.raises(ValueError, match="is not"):
        mlv.parse_config("128x256w8")
    g = mlv.parse_gluon("256x64s4")
    assert (g.kernel, g.block_m, g.block_n, g.block_k, g.num_stages) == ("mx_gluon", 128, 256, 64, 4)
    with pytest.raises(ValueError, match="is not"):
        mlv.parse_gluon("256x64")


def test_tiny_run_checks_every_row(capsys):
    rows = mlv.main(["--tiny", "--formats", "mxfp8,bf16xmxfp4", "--configs", "128x128x32w8s4fp8", "--gluon",
                     "256x64s2"])
    labels = {(r["fmt"], r["label"]) for r in rows}
    assert ("-", "XLA bf16") in labels and ("mxfp8", "new 128x128x32w8s4fp8") in labels
    assert ("bf16xmxfp4", "new 128x128x32w8s4fp8") not in labels  # fp8 variant: mxfp8 pairs only
    assert ("bf16xmxfp4", "old (XLA predecode + TMA)") in labels
    assert ("bf16xmxfp4", "gluon 256x64s2") in labels and ("mxfp8", "gluon 256x64s2") not in labels  # bf16 x W only
    assert all(r["status"] == "ok" for r in rows)
    assert "x dequant+dot" in capsys.readouterr().out
