"""Device timing for the suite: R distinct operand sets per call, back-to-back calls, medians.

Why not time one jitted call: a jitted JAX call costs about 25 µs of host dispatch, and a matmul run
twice on the same operands finds them in the 50-60 MB L2 the second time. Under ~100 µs both distort the
number. So every implementation, ours and each baseline alike, is timed the same way:

1. R distinct operand sets, R chosen so that together they hold more than `flush_bytes` (128 MB by
   default, over twice the H100/H200 L2), clamped to [2, 64] and to a memory budget (`choose_repeats`).
   Consecutive matmuls therefore never reuse operands that are still in L2.
2. One jitted function runs all R matmuls (an unrolled Python loop) and returns all R outputs: nothing is
   dead code, and no reduction kernel is added to shrink the outputs.
3. One call compiles and warms up (its output is what the correctness check reads), one more settles.
4. A sample launches `calls` jitted calls back to back and blocks on all their outputs; `calls` is chosen
   so a sample lasts at least ~5 ms, so the host work of call i+1 (argument handling of R operand sets
   included) overlaps the device work of call i. sample / (calls * R) is one per-matmul time.
5. The median over samples is reported (the minimum alongside). Nothing is subtracted.

torch uses the same R sets, captured once in a CUDA graph (an eager loop if capture fails, said in the
row's note) and timed with CUDA events around `calls` replays.

With `kernel_time` (the suite's default on a GPU) the same jitted call (or graph replay) is then run a few
more times inside a profiler trace and the CUPTI kernel durations are summed per matmul
(`benchmarks/_kernel_time.py`): the primary number, free of host launch gaps; the time above stays beside
it as the wall-clock column.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

__all__ = ["Timing", "TimingConfig", "choose_repeats", "measure", "jax_sampler", "torch_sampler",
           "rel_errors", "tree_nbytes"]


@dataclasses.dataclass(frozen=True)
class TimingConfig:
    flush_bytes: int = 128 << 20  # operand bytes the R sets must exceed (> 2x L2)
    mem_budget: int = 16 << 30  # bytes all R sets of the largest implementation may take
    r_min: int = 2
    r_max: int = 64
    target_sample_s: float = 5e-3  # a sample lasts at least this long (host work hidden)
    max_calls: int = 16
    min_samples: int = 5
    max_samples: int = 30
    sample_budget_s: float = 1.5  # stop sampling after this long once min_samples are in
    fixed_repeats: int | None = None  # --smoke: R fixed
    kernel_time: bool = False  # also trace the calls and sum CUPTI kernel durations (`_kernel_time`)


@dataclasses.dataclass(frozen=True)
class Timing:
    median_s: float  # per matmul (or per quantization)
    min_s: float
    repeats: int  # R operand sets per call
    calls: int  # calls per sample
    samples: int


def tree_nbytes(tree: Any) -> int:
    """Bytes of all array leaves (values, scales and tensor scale of a BlockScaledArray)."""
    return sum(int(x.size) * jnp.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
               if hasattr(x, "dtype"))


def choose_repeats(bytes_per_set: int, largest_set_bytes: int, cfg: TimingConfig) -> int:
    """R: enough sets that their operands exceed `flush_bytes`, within [r_min, r_max] and the budget.

    `bytes_per_set` is the smallest operand footprint in the case (so every implementation's sets exceed
    the flush size); `largest_set_bytes` (inputs + output of the biggest implementation) bounds memory.
    """
    if cfg.fixed_repeats:
        return cfg.fixed_repeats
    r = max(cfg.r_min, min(cfg.r_max, math.ceil(cfg.flush_bytes / max(bytes_per_set, 1))))
    return max(1, min(r, cfg.mem_budget // max(largest_set_bytes, 1)))


def measure(sample: Callable[[int], float], repeats: int, cfg: TimingConfig) -> Timing:
    """Median per-operation time from `sample(calls)` (seconds for `calls` calls of R operations)."""
    first = sample(1)  # settles clocks and allocator after the warm-up call
    calls = 1 if first >= cfg.target_sample_s else min(cfg.max_calls, math.ceil(cfg.target_sample_s / first))
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < cfg.max_samples and (
            len(times) < cfg.min_samples or time.perf_counter() - start < cfg.sample_budget_s):
        times.append(sample(calls) / (calls * repeats))
    return Timing(statistics.median(times), min(times), repeats, calls, len(times))


def jax_sampler(fn: Callable, *args) -> Callable[[int], float]:
    """`sample(calls)`: wall time of `calls` back-to-back calls of a jitted `fn`, blocking on all outputs."""
    def sample(calls: int) -> float:
        t0 = time.perf_counter()
        outs = [fn(*args) for _ in range(calls)]
        jax.block_until_ready(outs)
        return time.perf_counter() - t0
    return sample


def torch_sampler(torch: Any, launch: Callable[[], Any]) -> Callable[[int], float]:
    """`sample(calls)`: CUDA-event time of `calls` launches (a graph replay or an eager loop of R matmuls)."""
    def sample(calls: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            launch()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    return sample


@jax.jit
def _errors(y: jax.Array, ref: jax.Array) -> tuple[jax.Array, jax.Array]:
    y, ref = y.astype(jnp.float32), ref.astype(jnp.float32)
    d = y - ref
    fro = jnp.linalg.norm(d) / jnp.maximum(jnp.linalg.norm(ref), 1e-30)
    mx = jnp.max(jnp.abs(d)) / jnp.maximum(jnp.max(jnp.abs(ref)), 1e-30)
    return fro, mx


def rel_errors(y: jax.Array, ref: jax.Array) -> tuple[float, float]:
    """(relative Frobenius error, max |y - ref| / max |ref|), computed on the device; NaN stays NaN."""
    fro, mx = _errors(y, ref)
    return float(fro), float(mx)
