"""Measure candidate tile configurations on this GPU and write its config table (jax_blockscale/_triton/configs).

    python -m benchmarks.tune                      # all shape classes, writes <out>/<device slug>.json
    python -m benchmarks.tune --classes fp8_decode --out /tmp/t

Each shape class is a (kernel, representative shapes, candidate configs) triple: every candidate runs on
every representative shape (checked against the jnp reference first, then timed as device time with the
suite's method, benchmarks/_timing.py), and the candidate with the lowest total time over the shapes
becomes the class's rule. The heuristic default (`default_config`) is always a candidate, so a table never
makes a class slower than having no table. A table is data, not code: commit it with the device run's log.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import reference  # noqa: E402
from jax_blockscale._triton import block_fp8, configs, upcast  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from ._timing import TimingConfig, choose_repeats, jax_sampler, measure, rel_errors, tree_nbytes  # noqa: E402

T = TileConfig


def _swap(bm, bn, split, stages=4, bk=128, warps=4):
    return T(block_m=bm, block_n=bn, block_k=bk, group_m=1, num_warps=warps, num_stages=stages, split_k=split,
             swap_ab=True)


@dataclasses.dataclass(frozen=True)
class ShapeClass:
    name: str
    kernel: str  # module under jax_blockscale._triton
    formats: tuple[str, str]
    shapes: tuple[tuple[int, int, int], ...]  # (M, N, K) representatives
    rule: dict  # the rows/n/k ranges the winner is written for
    candidates: tuple[TileConfig, ...]


CLASSES = (
    ShapeClass("fp8_large", "block_fp8", ("fp8_block", "fp8_block"), ((8192, 8192, 8192), (4096, 7168, 2048)),
               {"rows": [257, 1 << 30]}, (
                   T(128, 128, 128, 8, 8, 4, tma=True), T(128, 128, 128, 8, 8, 3, tma=True),
                   T(128, 128, 128, 16, 8, 4, tma=True), T(128, 128, 128, 8, 8, 5, tma=True),
                   T(128, 128, 128, 8, 8, 4),  # the pointer kernel, for the record
               )),
    ShapeClass("fp8_mid", "block_fp8", ("fp8_block", "fp8_block"), ((128, 7168, 2048), (512, 7168, 4096)),
               {"rows": [65, 256]}, (
                   T(128, 128, 128, 8, 8, 4, tma=True), T(64, 128, 128, 8, 4, 4, tma=True),
                   T(64, 64, 128, 8, 4, 4, tma=True),
               )),
    ShapeClass("fp8_decode", "block_fp8", ("fp8_block", "fp8_block"),
               ((16, 7168, 2048), (16, 7168, 4096), (16, 7168, 7168)), {"rows": [1, 16]}, (
                   _swap(64, 16, 1), _swap(64, 16, 2), _swap(64, 16, 4), _swap(64, 16, 2, stages=6),
                   _swap(128, 16, 2, warps=8), _swap(64, 16, 4, stages=6),
               )),
    ShapeClass("fp8_decode64", "block_fp8", ("fp8_block", "fp8_block"),
               ((64, 7168, 2048), (64, 7168, 4096), (64, 7168, 7168)), {"rows": [17, 64]}, (
                   _swap(64, 64, 1), _swap(64, 64, 2), _swap(64, 32, 2), _swap(128, 64, 2, warps=8),
                   _swap(64, 64, 4),
               )),
    ShapeClass("fp4w_decode16", "upcast", ("bf16", "mxfp4"), ((16, 7168, 4096), (1, 7168, 4096)),
               {"rows": [1, 16]}, (
                   _swap(64, 16, 2), _swap(64, 16, 4), _swap(64, 16, 2, bk=256), _swap(64, 16, 4, bk=64),
                   _swap(128, 16, 2, warps=8), _swap(64, 16, 8),
               )),
    ShapeClass("fp4w_decode64", "upcast", ("bf16", "mxfp4"), ((64, 7168, 4096), (32, 7168, 4096)),
               {"rows": [17, 64]}, (
                   _swap(64, 64, 2), _swap(64, 64, 4), _swap(64, 64, 2, bk=64), _swap(128, 64, 2, warps=8),
               )),
    ShapeClass("mx_large", "upcast", ("mxfp8", "mxfp8"), ((8192, 8192, 8192),),
               # where upcast.predecoded_sides dequantizes both operands first (the TMA kernel needs it)
               {"rows": [512, 1 << 30], "n": [1024, 1 << 30]}, (
        T(128, 256, 64, 8, 8, 3, tma=True), T(128, 256, 64, 8, 8, 4, tma=True), T(128, 128, 64, 8, 8, 4, tma=True),
        T(128, 128, 64, 8, 8, 3),  # the pointer kernel, for the record
    )),
)


def _operand_sets(m, n, k, formats, repeats, seed=0):
    key = jax.random.PRNGKey(seed)
    sets = []
    for r in range(repeats):
        ka, kb = jax.random.split(jax.random.fold_in(key, r))
        a = jax.random.normal(ka, (m, k), jnp.bfloat16)
        b = jax.random.normal(kb, (n, k), jnp.bfloat16)
        sets.append((jb.quantize_operand(a, formats[0], side="a"), jb.quantize_operand(b, formats[1], side="b")))
    return jax.block_until_ready(sets)


def _problem(cls: ShapeClass, m, n, k) -> GemmProblem:
    kinds = {"fp8_block": "block_fp8", "bf16": "bf16", "mxfp4": "e2m1", "mxfp8": "e4m3"}
    return GemmProblem(1, False, m, n, k + (-k % 256), kinds[cls.formats[0]], kinds[cls.formats[1]], "bf16")


def _time_config(sets, config, timing):
    fn = jax.jit(lambda sets: [jb.matmul(a, b, config=config) for a, b in sets])
    outs = jax.block_until_ready(fn(sets))
    ref = reference.matmul(*sets[0])
    err = rel_errors(outs[0], ref)[0]
    if not err < 1e-2:
        return float("inf"), err
    return measure(jax_sampler(fn, sets), len(sets), timing).median_s, err


def tune_class(cls: ShapeClass, timing: TimingConfig, log) -> dict:
    module = {"block_fp8": block_fp8, "upcast": upcast}[cls.kernel]
    totals: dict[TileConfig, float] = {}
    for m, n, k in cls.shapes:
        p = _problem(cls, m, n, k)
        candidates = list(dict.fromkeys((module.default_config(p, "sm_90"),) + cls.candidates))
        probe = _operand_sets(m, n, k, cls.formats, 1)
        bytes_per_set = tree_nbytes(probe)
        sets = _operand_sets(m, n, k, cls.formats, choose_repeats(bytes_per_set, bytes_per_set, timing))
        for config in candidates:
            try:
                t, err = _time_config(sets, config, timing)
            except Exception as e:  # a candidate that fails to compile or launch just loses
                t, err = float("inf"), float("nan")
                log(f"  {cls.name} {m}x{n}x{k} {config}: FAILED {type(e).__name__}: {str(e)[:200]}")
            totals[config] = totals.get(config, 0.0) + t
            tflops = 2 * m * n * k / t / 1e12 if np.isfinite(t) else 0.0
            log(f"  {cls.name} {m}x{n}x{k} {_short(config)}: {t * 1e6:9.1f} us {tflops:7.1f} TF/s err {err:.1e}")
        del sets
    runs: dict[TileConfig, int] = {}
    for m, n, k in cls.shapes:  # a heuristic default may differ per shape: rank only configs run on all
        p = _problem(cls, m, n, k)
        for config in dict.fromkeys((module.default_config(p, "sm_90"),) + cls.candidates):
            runs[config] = runs.get(config, 0) + 1
    best = min((c for c in totals if runs[c] == len(cls.shapes)), key=totals.get)
    log(f"{cls.name}: best {_short(best)} (total {totals[best] * 1e6:.1f} us)")
    config = {f.name: getattr(best, f.name) for f in dataclasses.fields(TileConfig)
              if getattr(best, f.name) != getattr(TileConfig(), f.name)}
    return {**cls.rule, "class": cls.name, "config": config}


def _short(c: TileConfig) -> str:
    flags = "".join(f for f, on in (("T", c.tma), ("S", c.swap_ab)) if on)
    return (f"{c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} w{c.num_warps} s{c.num_stages} "
            f"k{c.split_k} {flags or '-'}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", default=",".join(c.name for c in CLASSES))
    parser.add_argument("--out", default=str(configs.TABLE_DIR))
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    wanted = args.classes.split(",")
    timing = TimingConfig(min_samples=3, max_samples=10, sample_budget_s=0.5)
    lines: list[str] = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    rules: dict[str, list] = {}
    start = time.perf_counter()
    for cls in CLASSES:
        if cls.name in wanted:
            rules.setdefault(cls.kernel, []).append(tune_class(cls, timing, log))
            log(f"[{time.perf_counter() - start:.0f} s]")
    for kernel_rules in rules.values():  # narrow row ranges first: the first match wins
        kernel_rules.sort(key=lambda r: r["rows"][1] - r["rows"][0])
    table = {"device_kind": device.device_kind, "measured": datetime.date.today().isoformat(),
             "how": "python -m benchmarks.tune", "kernels": rules}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{configs.device_slug(device.device_kind)}.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    (out / f"tune_{configs.device_slug(device.device_kind)}.log").write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
