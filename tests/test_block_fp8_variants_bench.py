"""CPU checks of benchmarks/block_fp8_variants.py's interleaved rounds: paired ratios and their medians."""

import dataclasses
import itertools
import math

import pytest

from benchmarks import block_fp8_variants as bv
from benchmarks._kernel_time import EMPTY


def _profiles(times_us):
    """A reprofile callable returning the given kernel times (us) one call at a time."""
    it = iter(times_us)
    return lambda: dataclasses.replace(EMPTY, kernel_s=next(it) * 1e-6)


def test_interleaved_rounds_use_the_median_of_paired_ratios(capsys):
    # cuBLAS drifts 100 -> 125 us across rounds; "a" stays 1.25x slower than cuBLAS in every round except one
    # outlier, so its ratio is 0.8 however far the clock drifted.
    flops = 2e6
    timed = {"cuBLAS": (100.0, _profiles([110.0, 125.0, 100.0, 120.0])),
             "a": (125.0, _profiles([137.5, 156.25, 500.0, 150.0]))}
    rates = {"cuBLAS": {"s": math.nan}, "a": {"s": math.nan}}
    bv._interleaved("s", flops, timed, 5, rates)
    base = flops / 110.0 / 1e6  # cuBLAS's median over the five rounds
    assert rates["cuBLAS"]["s"] == pytest.approx(base)
    assert rates["a"]["s"] == pytest.approx(base * 0.8)
    assert "5 rounds: x0.800" in capsys.readouterr().out


def test_rounds_interleave_rows_in_turn():
    order = []
    timed = {label: (10.0, lambda label=label: order.append(label) or dataclasses.replace(EMPTY, kernel_s=1e-5))
             for label in ("cuBLAS", "a", "b")}
    bv._interleaved("s", 1.0, timed, 3, {label: {} for label in timed})
    assert order == list(itertools.chain.from_iterable([["cuBLAS", "a", "b"]] * 2))


def test_rounds_must_be_positive():
    assert bv.parse(["--rounds", "3"]).rounds == 3
    with pytest.raises(SystemExit):
        bv.parse(["--rounds", "0"])


def test_suite_shapes_are_the_targets_set():
    """--shapes suite: issue #13's "suite's shapes with M, N, K >= 2048", from the suite's own case list."""
    assert set(bv.SUITE_SHAPES) == {(8192, 8192, 8192), (4096, 7168, 2048), (4096, 2112, 7168), (4096, 7168, 16384),
                                    (4096, 4096, 7168), (4096, 8192, 8192), (4096, 28672, 8192)}
    assert bv.parse(["--shapes", "suite"]).shapes == "suite"
