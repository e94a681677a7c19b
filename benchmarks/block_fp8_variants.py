"""Block FP8 GEMM on Hopper: the one-program-per-tile, persistent and Gluon kernels vs cuBLAS, as a config sweep.

    python -m benchmarks.block_fp8_variants                          # default configs, the 5 issue-#13 shapes
    python -m benchmarks.block_fp8_variants --configs gluon,gluon:128x128:s4,p:s4:pf --shapes 8192x8192x8192
    python -m benchmarks.block_fp8_variants --configs gluon --rounds 5   # interleaved rounds, paired ratios
    python -m benchmarks.block_fp8_variants --configs gluon --rounds 3 --shapes suite   # issue #13's target set
    python -m benchmarks.block_fp8_variants --tiny                   # tiny shapes: checks the script runs

Every row is checked against the jnp reference (`jb.reference.matmul` on the same quantized operands)
before it is timed, and timed as the suite does (R distinct operand sets > 128 MB in one jit, then CUPTI
kernel time per matmul, `benchmarks/_kernel_time.py`; the cuBLAS row through `_torch.torch_blockwise`,
torch's `F.scaled_mm` 1x128 x 128x128 on the same bytes). TF/s and ratios use kernel time, which counts
every kernel one matmul launches (the XLA transpose of `:at` configs included); each row's first line also
prints its wall clock (median per matmul over the timing loop, host launch gaps included) beside.

Why `--rounds`: an H100's clock drifts with power and temperature, so one kernel measured twice a minute
apart differed by up to 8% on a shape, more than the changes being compared. With N rounds every row of a
shape is profiled again N - 1 times in turn (cuBLAS, config 1, config 2, ..., cuBLAS, ...); a config's
ratio on the shape is the median over rounds of its kernel time against cuBLAS's in the same round, and
its TF/s is cuBLAS's median TF/s times that ratio.

Config specs (`--configs`, comma-separated; tokens joined by ':'):
  old            block_fp8's heuristic for the shape (what ran before the persistent kernel)
  tma            the old TMA kernel, 128 x 128, 8 warps, 4 stages
  ws             the persistent kernel's default (128 x 128, warp-specialized, 4 warps, 4 stages)
  p              the persistent kernel without warp specialization (8 warps unless :wN)
  gluon          the Gluon kernel as dispatch configures it (block_fp8_gluon.default_config: 128 x 256 tiles,
                 3 stages, or 128 x 128 tiles, 4 stages, where those need fewer waves of tiles)
then modifiers: BMxBN tile (e.g. 128x64), wN warps, sN stages, gN group_m, smsN programs, rN registers per
thread at most (PTX .maxnreg), flat (flatten
the tile and K loops), pf (scales prefetched a K step ahead), at (activation scales transposed by XLA).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax: torch shares the GPU

import argparse  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Callable, Optional  # noqa: E402

import jax  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from . import _baselines as bl  # noqa: E402
from ._cases import FORMATS, full_cases  # noqa: E402
from ._timing import TimingConfig, choose_repeats  # noqa: E402
from ._torch import torch_blockwise  # noqa: E402

SHAPES = ((8192, 8192, 8192), (4096, 7168, 2048), (4096, 24576, 1536), (4096, 7168, 16384), (2048, 4096, 7168))
# Issue #13's target set as it is worded: the suite's shapes (benchmarks/_cases.py) with M, N, K >= 2048.
SUITE_SHAPES = tuple((c.m, c.n, c.k) for c in full_cases() if min(c.m, c.n, c.k) >= 2048)
TINY_SHAPES = ((256, 384, 512),)
DEFAULT_CONFIGS = ("gluon", "gluon:s4", "gluon:128x128:s4", "p:s4:pf", "old")


def parse_config(spec: str, p: GemmProblem) -> TileConfig:
    """A TileConfig from a spec (module docstring); raises ValueError naming the bad token."""
    from jax_blockscale._triton import block_fp8, block_fp8_gluon, block_fp8_persistent

    base, *mods = spec.split(":")
    if base == "old":
        cfg = block_fp8.default_config(p, "sm_90")
    elif base == "tma":
        cfg = TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4, tma=True)
    elif base == "ws":
        cfg = block_fp8_persistent.ws_config(p).replace(warp_specialize=True, num_warps=4)
    elif base == "gluon":
        cfg = block_fp8_gluon.default_config(p)
    elif base == "p":
        cfg = TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4,
                         persistent=True)
    else:
        raise ValueError(f"config {spec!r}: unknown base {base!r} (old, tma, ws, p, gluon)")
    flags = {"flat": "flatten", "pf": "prefetch_scales", "at": "a_scales_t"}
    numbers = {"w": "num_warps", "s": "num_stages", "g": "group_m", "sms": "num_sms", "r": "max_registers"}
    for mod in mods:
        tile = re.fullmatch(r"(\d+)x(\d+)", mod)
        number = re.fullmatch(r"(sms|w|s|g|r)(\d+)", mod)
        if tile:
            cfg = cfg.replace(block_m=int(tile[1]), block_n=int(tile[2]))
        elif number:
            cfg = cfg.replace(**{numbers[number[1]]: int(number[2])})
        elif mod in flags:
            cfg = cfg.replace(**{flags[mod]: True})
        else:
            raise ValueError(f"config {spec!r}: unknown modifier {mod!r}")
    return cfg


def _operands(m: int, n: int, k: int, cfg: TimingConfig) -> list:
    r = choose_repeats(int((m * k + n * k) * 1.01), (m * k + n * k) * 4 + m * n * 2, cfg)
    dense = [bl.dense_pair(key, m, n, k) for key in jax.random.split(jax.random.key(m * 7 + n * 11 + k), r)]
    return jax.block_until_ready([bl.quantized_pair(x, w, *FORMATS["fp8_block"]) for x, w in dense])


def _kernel_us(o: bl.Outcome) -> float:
    if o.status != "ok" or o.kernel is None or not o.kernel.ok:
        return math.nan
    return o.kernel.kernel_s * 1e6


def run(shapes, specs, cfg: TimingConfig, budget_s: float, rounds: int = 1) -> dict[str, dict[str, float]]:
    """{spec: {shape: kernel-time TF/s}} (plus "cuBLAS"), printing one line per row as it goes; with
    rounds > 1, the paired-ratio TF/s of interleaved rounds (module docstring)."""
    start = time.perf_counter()
    rates: dict[str, dict[str, float]] = {}
    for m, n, k in shapes:
        case, flops = f"{m}x{n}x{k}", 2.0 * m * n * k
        p = GemmProblem(1, False, m, n, k + (-k % 256), "block_fp8", "block_fp8", "bf16")
        qs = _operands(m, n, k, cfg)
        ref0 = jax.jit(bl.ours_ref)(*qs[0])
        rows = [("cuBLAS", lambda qs=qs, ref0=ref0: torch_blockwise(qs, ref0, cfg))]
        for spec in specs:
            try:
                config = parse_config(spec, p)
            except Exception as e:  # noqa: BLE001 - a spec the shape cannot take is one failed row
                rows.append((spec, lambda e=e: bl.Outcome("ours", "error", note=bl.short(e))))
                continue
            op = lambda a, b, config=config: jb.matmul(a, b, out_dtype=bl.BF16, config=config)  # noqa: E731
            rows.append((spec, lambda op=op, qs=qs: bl.run_jax("ours", op, qs, bl.ours_ref, cfg)))
        timed: dict[str, tuple[float, Callable]] = {}  # label: (first kernel us, reprofile)
        for label, work in rows:
            if time.perf_counter() - start > budget_s:
                print(f"  {case:<18} {label:<22} skipped (time budget {budget_s:g} s)", flush=True)
                continue
            try:
                o = work()
            except Exception as e:  # noqa: BLE001 - one failing row must not stop the sweep
                o = bl.Outcome(label, "error", note=bl.short(e))
            us = _kernel_us(o)
            tf = flops / us / 1e6 if math.isfinite(us) else math.nan
            rates.setdefault(label, {})[case] = tf
            base = rates.get("cuBLAS", {}).get(case, math.nan)
            wall = o.timing.median_s * 1e6 if o.timing is not None else math.nan
            print(f"  {case:<18} {label:<22} {o.status:<12} kernel {us:9.1f} us {tf:7.1f} TF/s "
                  f"x{tf / base:5.2f} cuBLAS  wall {wall:9.1f} us  err {o.rel_err:.1e}  {o.note[:90]}", flush=True)
            if math.isfinite(us) and o.reprofile is not None:
                timed[label] = (us, o.reprofile)
        if rounds > 1 and "cuBLAS" in timed:
            _interleaved(case, flops, timed, rounds, rates)
        del qs, rows, timed  # the operand sets (and the reprofiles holding them) before the next shape's
    return rates


def _interleaved(case: str, flops: float, timed: dict, rounds: int, rates: dict) -> None:
    """Rounds 2..N of the rows in `timed` ({label: (first kernel us, reprofile)}), in turn; replaces their
    rates with the paired-ratio medians (module docstring) and prints each row's per-round ratios."""
    us = {label: [first] for label, (first, _) in timed.items()}
    for _ in range(rounds - 1):
        for label, (_, again) in timed.items():
            us[label].append(again().kernel_s * 1e6)
    base = us["cuBLAS"]
    rates["cuBLAS"][case] = flops / statistics.median(base) / 1e6
    for label, times in us.items():
        if label == "cuBLAS":
            continue
        ratios = [b / t for b, t in zip(base, times)]
        rates[label][case] = rates["cuBLAS"][case] * statistics.median(ratios)
        print(f"  {case:<18} {label:<22} {rounds} rounds: x{statistics.median(ratios):5.3f} cuBLAS (median; "
              f"rounds {' '.join(f'{r:.3f}' for r in ratios)})", flush=True)


def summary(rates: dict[str, dict[str, float]], shapes) -> str:
    """One line per config: TF/s per shape, geomean and worst ratio to cuBLAS over the shapes it ran."""
    cases = [f"{m}x{n}x{k}" for m, n, k in shapes]
    base = rates.get("cuBLAS", {})
    lines = ["config                  " + " ".join(f"{c:>17}" for c in cases) + "   geomean    worst"]
    for label, per in rates.items():
        ratios = [per[c] / base[c] for c in cases if c in per and c in base and per[c] > 0 and base[c] > 0]
        cells = " ".join(f"{per.get(c, math.nan):8.1f} (x{per.get(c, math.nan) / base.get(c, math.nan):4.2f})"
                         for c in cases)
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else math.nan
        worst = min(ratios) if ratios else math.nan
        lines.append(f"{label:<23} {cells}   x{geo:5.3f}   x{worst:5.3f}")
    return "\n".join(lines)


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="comma-separated specs (see module doc)")
    ap.add_argument("--shapes", default="",
                    help="MxNxK,... or 'suite' (the suite's shapes with M, N, K >= 2048, issue #13's target set; "
                         "default: the 5 shapes of issue #13's table)")
    ap.add_argument("--time-budget", type=float, default=220.0, help="seconds; later rows are skipped")
    ap.add_argument("--rounds", type=int, default=1,
                    help="profile every row N times in turn per shape; report median paired ratios (default 1)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and fixed repeats (checks the script runs)")
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    return a


def main(argv: Optional[list[str]] = None) -> dict:
    a = parse(argv)
    if a.shapes == "suite":
        shapes = SUITE_SHAPES
    elif a.shapes:
        shapes = tuple(tuple(int(v) for v in s.split("x")) for s in a.shapes.split(","))
    else:
        shapes = TINY_SHAPES if a.tiny else SHAPES
    if a.tiny:
        cfg = TimingConfig(fixed_repeats=2, target_sample_s=0.0, min_samples=2, max_samples=2, sample_budget_s=0.0,
                           kernel_time=True)
    else:
        cfg = TimingConfig(min_samples=3, max_samples=8, sample_budget_s=0.25, kernel_time=True)
    specs = [s for s in a.configs.split(",") if s]
    print(f"block_fp8_variants: {jax.devices()[0].device_kind} (target {jb.detect_target()}), "
          f"configs {','.join(specs)}, {a.rounds} round(s)", flush=True)
    start = time.perf_counter()
    rates = run(shapes, specs, cfg, a.time_budget, a.rounds)
    print("\nkernel-time TF/s (x ratio to cuBLAS blockwise)\n" + summary(rates, shapes))
    print(f"total {time.perf_counter() - start:.0f} s")
    return rates


if __name__ == "__main__":
    main(sys.argv[1:])
