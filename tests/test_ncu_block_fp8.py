"""benchmarks/ncu_block_fp8.py (the one-shape launcher for Nsight Compute) runs its own path on the CPU."""

import pytest

pytest.importorskip("jax")

from benchmarks import ncu_block_fp8  # noqa: E402


def test_ours_runs_the_shape_it_is_given(capsys):
    ncu_block_fp8.main(["128", "256", "384"])
    assert capsys.readouterr().out.startswith("128 x 256 x 384: ours")


@pytest.mark.parametrize("shape", [["128", "256"], ["128", "0", "256"]])
def test_shape_needs_three_positive_sizes(shape, capsys):
    with pytest.raises(SystemExit):
        ncu_block_fp8.main(shape)
    assert "three positive sizes" in capsys.readouterr().err
