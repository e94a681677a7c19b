"""Reliability sweep: many seeded random matmuls through `jb.matmul`, each against the jnp reference and
each run twice (bitwise equal).

    python -m benchmarks.reliability_sweep --jobs 4     # >= 500 cases, every pair and kernel variant (GPU),
                                                        # 4 processes compiling in parallel on one GPU
    python -m benchmarks.reliability_sweep --quick      # a representative subset, ~200 cases
    python -m benchmarks.reliability_sweep --tiny       # CPU: jb.matmul is the reference there, so this
                                                        # checks only the harness (tests/test_reliability_sweep.py)

Cases are grouped: a group is one format pair, one operand shape (batch dims, M, N, K), one output dtype
and one kernel configuration, so it compiles once (one XLA program around one Triton kernel, and one for
the reference); its cases differ only in data (seeded: distribution, magnitude). The groups cover every
format pair `jb.matmul` accepts on this target (`jb.explain` rejects exactly what it rejects), every output
dtype, M = 1 / odd N and K / batch dims, and every kernel variant the dispatch can choose, forced through
`config=` where `jb.explain` would not pick it for that shape: block FP8 pointer / split-K / swapped
(decode) / TMA / persistent (with and without its scale prefetch, flattened loops), upcast pointer /
split-K / swapped / predecoded-TMA, decode swapped MMA / CUDA-core FMA / split-K / fp32 decode, the
streaming GEMV for every weight format (prefetch, split-K, fp32 decode) and the opt-in one-kernel Hopper
MX GEMM (bf16 and fp8 wgmma). The decode kernel's fp32-atomic split-K is left out: it is documented as not
bitwise deterministic and dispatch never picks it.

Tolerances are tests/test_gpu_matmul.py's: a relative Frobenius error of 2 * eps(out) + 1e-5 for 16-bit
outputs (1e-5 for fp32), with 2e-3 in place of 1e-5 when `a` is fp8_block (fp8 wgmma keeps ~14 bits
within each 128-K block). Writes benchmarks/results/reliability_<device>_<date>.{md,csv}.
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import datetime
import functools
import json
import pathlib
import sys
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale.api import operand_kind
from jax_blockscale._triton.problem import TileConfig

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
DENSE = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}
QUANTIZED = ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e2m3", "mxfp6_e3m2", "mxfp4", "nvfp4", "fp8_block")
FORMATS = (*DENSE, *QUANTIZED)
OUT_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}
OUT_DTYPES_ORDER = tuple(OUT_DTYPES)


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: tuple[int, ...]  # leading dims of a
    m: int
    n: int
    k: int
    b_batched: bool = False  # b carries the same batch dims (no decode kernel then)

    def label(self) -> str:
        lead = "x".join(map(str, self.batch)) + "x" if self.batch else ""
        return f"{lead}{self.m}x{self.n}x{self.k}{'(bB)' if self.b_batched else ''}"


# M = 1 and decode-sized rows (<= 64: the decode kernel for MX weights), a folded batch, rows just past a
# tile, odd N and K (K padded inside), a batched weight, and a large predecoded/TMA problem.
SHAPES = (
    Shape((), 1, 256, 512), Shape((), 7, 200, 320), Shape((3,), 5, 300, 512), Shape((2,), 33, 264, 768),
    Shape((), 64, 520, 2048), Shape((), 129, 130, 4160), Shape((2, 3), 65, 136, 256),
    Shape((2,), 129, 200, 256, b_batched=True), Shape((), 300, 520, 768), Shape((), 1000, 1100, 512),
)
TINY_SHAPES = (Shape((), 1, 24, 64), Shape((2,), 5, 17, 96), Shape((), 33, 40, 160),
               Shape((2,), 9, 16, 64, b_batched=True))


@dataclasses.dataclass(frozen=True)
class Group:
    fa: str
    fb: str
    shape: Shape
    out: str
    variant: str = "default"
    config: Optional[TileConfig] = None


def accepted_pairs(target: str) -> list[tuple[str, str]]:
    """Every (a, b) format pair that `jb.matmul` accepts on `target` (explain rejects exactly the same)."""
    pairs = []
    for fa in FORMATS:
        for fb in FORMATS:
            try:
                jb.explain(fa, fb, target=target, rows=1000)
            except ValueError:
                continue
            pairs.append((fa, fb))
    return pairs


def _decode_configs(rows: int, fb: str) -> dict[str, TileConfig]:
    """The decode kernel's non-atomic variants (as tests/test_gpu_decode.py builds them)."""
    block_k = 256 if fb in ("mxfp4", "nvfp4") else 128
    mma_m = max(16, 1 << (rows - 1).bit_length())
    base = TileConfig(block_m=mma_m, block_n=64, block_k=block_k, group_m=1, num_warps=4, num_stages=3,
                      kernel="decode")  # opt-in on sm_90: named
    out = {"mma_split1": base, "mma_split3": base.replace(split_k=3),
           "mma_split8_fp32_decode": base.replace(split_k=8, asm_decode=False)}
    if rows <= 8:
        fma = base.replace(block_m=max(1, 1 << (rows - 1).bit_length()), block_n=32, fma=True)
        out.update(fma_split1=fma, fma_split3=fma.replace(split_k=3), fma_fp32_decode=fma.replace(asm_decode=False))
    return out


def _gemv_configs(rows: int, fb: str) -> dict[str, TileConfig]:
    """The streaming GEMV (decode.gemv_kernel, dispatch's pick for <= 4 rows of fp4 / mxfp8 weights on
    sm_90): the tuned tile, register prefetch on / off, split-K and the fp32 (non-PTX) fp4 decode."""
    block_k = 512 if fb in ("mxfp4", "nvfp4") else 256
    base = TileConfig(block_m=max(1, 1 << (rows - 1).bit_length()), block_n=8, block_k=block_k, group_m=1,
                      num_warps=4, num_stages=3, gemv=True, prefetch=False, kernel="decode")
    return {"gemv": base, "gemv_prefetch_split2": base.replace(prefetch=True, split_k=2, block_n=16),
            "gemv_fp32_decode": base.replace(asm_decode=False)}


BLOCK_FP8_VARIANTS = {
    "pointer_128x128": TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4),
    "pointer_bk64": TileConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=4),
    "pointer_bn256": TileConfig(block_m=64, block_n=256, block_k=128, num_warps=8, num_stages=3),
    "split_k3": TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, split_k=3),
    "small_split_k2": TileConfig(block_m=16, block_n=32, block_k=128, num_warps=4, num_stages=3, split_k=2),
    "swapped_split_k2": TileConfig(block_m=64, block_n=16, block_k=128, group_m=1, num_warps=4, num_stages=4,
                                   split_k=2, swap_ab=True),
    "tma_64x128": TileConfig(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4, tma=True),
    "tma_64x256": TileConfig(block_m=64, block_n=256, block_k=128, num_warps=8, num_stages=3, tma=True),
}
# The persistent block FP8 kernel (dispatch's pick from 1024 rows, N and K) forced onto odd, batched and
# small shapes, with and without its scale prefetch (the tile and K loops flattened).
PERSISTENT_VARIANTS = {
    "persistent_prefetch": TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4,
                                      persistent=True, prefetch_scales=True, kernel="block_fp8_persistent"),
    "persistent_flat": TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4,
                                  persistent=True, flatten=True, kernel="block_fp8_persistent"),
    "persistent_64x128": TileConfig(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3,
                                    persistent=True, num_sms=7, kernel="block_fp8_persistent"),
}
UPCAST_VARIANTS = {
    "pointer_bn256_bk32": TileConfig(block_m=64, block_n=256, block_k=32, num_warps=8, num_stages=4),
    "split_k3": TileConfig(block_m=128, block_n=64, block_k=64, num_warps=4, num_stages=3, split_k=3),
    "swapped_split_k3": TileConfig(block_m=64, block_n=16, block_k=128, group_m=1, num_warps=4, num_stages=4,
                                   split_k=3, swap_ab=True),
}


def build_groups(target: str, *, quick: bool, tiny: bool, seed: int) -> list[Group]:
    rng = np.random.default_rng(seed)
    shapes = TINY_SHAPES if tiny else SHAPES
    outs = list(OUT_DTYPES)
    groups: list[Group] = []
    pairs = accepted_pairs(target)
    if quick or tiny:
        # One pair per a-format and per b-format, plus the pairs of every native kernel.
        keep, seen_a, seen_b = [], set(), set()
        for fa, fb in rng.permutation(np.array(pairs, dtype=object)).tolist():
            if fa not in seen_a or fb not in seen_b or (fa, fb) in (("fp8_block", "fp8_block"), ("bf16", "mxfp4")):
                keep.append((fa, fb))
                seen_a.add(fa)
                seen_b.add(fb)
        pairs = sorted(set(keep), key=lambda p: (FORMATS.index(p[0]), FORMATS.index(p[1])))
    # Every pair once, with a seeded shape and output dtype (rotated so every family sees all three).
    for i, (fa, fb) in enumerate(pairs):
        shape = shapes[int(rng.integers(len(shapes)))]
        groups.append(Group(fa, fb, shape, outs[i % 3]))
    if tiny:
        return groups
    # Every shape (and output dtype) for two of the kernels' representative pairs, rotating.
    reps = (("fp8_block", "fp8_block"), ("nvfp4", "nvfp4"), ("bf16", "mxfp4"), ("mxfp8_e4m3", "mxfp4"))
    for j, shape in enumerate(shapes if not quick else shapes[::2]):
        for fa, fb in (reps[(2 * j) % 4], reps[(2 * j + 1) % 4]):
            groups.append(Group(fa, fb, shape, outs[(j + len(fa)) % 3]))
    # The default block FP8 config for 65-256 rows is the TMA kernel.
    groups.append(Group("fp8_block", "fp8_block", Shape((), 129, 130, 4160), "bf16"))
    # Forced variants, on alternating shapes / pairs: one compilation each.
    fp8_shapes = (Shape((), 300, 520, 768), Shape((2,), 40, 264, 1024))
    for j, (name, cfg) in enumerate(BLOCK_FP8_VARIANTS.items()):
        groups.append(Group("fp8_block", "fp8_block", fp8_shapes[j % 2], "fp32", name, cfg))
    upcast_pairs = (("nvfp4", "nvfp4"), ("mxfp8_e4m3", "mxfp4"))
    for j, (name, cfg) in enumerate(UPCAST_VARIANTS.items()):
        groups.append(Group(*upcast_pairs[j % 2], Shape((), 300, 520, 768), "fp32", name, cfg))
    for rows, fa, fb in ((1, "bf16", "mxfp4"), (16, "mxfp8_e4m3", "mxfp4"))[: 1 if quick else 2]:
        for name, cfg in _decode_configs(rows, fb).items():
            groups.append(Group(fa, fb, Shape((), rows, 520, 2048), "bf16", name, cfg))
    # The GEMV for every weight format (quantized activations where the pair has them), M = 1 and 3.
    gemv_pairs = (("bf16", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("bf16", "mxfp6_e2m3"),
                  ("mxfp6_e3m2", "mxfp6_e3m2"), ("fp8_block", "fp8_block"), ("bf16", "fp8_block"))
    for j, (fa, fb) in enumerate(gemv_pairs[: 3 if quick else None]):
        rows = 1 + 2 * (j % 2)
        variants = _gemv_configs(rows, fb)
        for name, cfg in (variants.items() if j < 3 else list(variants.items())[:1]):
            groups.append(Group(fa, fb, Shape((), rows, 264, 1024), OUT_DTYPES_ORDER[(j + len(name)) % 3], name, cfg))
    # The persistent block FP8 kernel: dispatch's pick at an odd large shape, and forced variants.
    groups.append(Group("fp8_block", "fp8_block", Shape((), 1100, 1040, 1152), "bf16"))
    persistent_shapes = (Shape((2,), 300, 520, 768), Shape((), 129, 1100, 384), Shape((), 1, 260, 256))
    for j, (name, cfg) in enumerate(PERSISTENT_VARIANTS.items()):
        groups.append(Group("fp8_block", "fp8_block", persistent_shapes[j % 3], ("fp32", "bf16")[j % 2], name, cfg))
    # The opt-in one-kernel Hopper MX GEMM (TileConfig(kernel="hopper_mx")), one group per operand family.
    if target == "sm_90" and not quick:
        hopper_mx = TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, tma=True,
                               kernel="hopper_mx")  # its default_config; fp6 takes 32-wide K steps
        for fa, fb in (("mxfp8_e4m3", "mxfp4"), ("nvfp4", "nvfp4"), ("bf16", "mxfp6_e2m3"),
                       ("mxfp8_e4m3", "mxfp8_e4m3")):
            cfg = hopper_mx.replace(block_k=32) if "mxfp6" in fa + fb else hopper_mx
            name = "hopper_mx_fp8_mma" if fa == fb == "mxfp8_e4m3" else "hopper_mx"
            cfg = cfg.replace(fp8_mma=True, block_k=32) if name.endswith("fp8_mma") else cfg  # one MX block
            groups.append(Group(fa, fb, Shape((), 300, 520, 768), "bf16", name, cfg))
    return groups


def tolerance(out: str, fa: str) -> float:
    """tests/test_gpu_matmul.py's `_tolerance`."""
    eps = float(jnp.finfo(OUT_DTYPES[out]).eps)
    accumulation = 2e-3 if fa == "fp8_block" else 1e-5
    return 2 * eps + accumulation if out != "fp32" else accumulation


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


@functools.lru_cache(maxsize=None)
def _quantizer(fmt: str, side: str):
    if fmt in DENSE:
        return jax.jit(lambda x: x.astype(DENSE[fmt]))
    return jax.jit(lambda x: jb.quantize_operand(x, fmt, side=side))


def operands(g: Group, seed: int):
    """Seeded operands: normal, uniform or heavy-tailed (Student t) data at a random magnitude."""
    rng = np.random.default_rng(seed)
    s = g.shape
    a_shape = s.batch + (s.m, s.k)
    b_shape = (s.batch if s.b_batched else ()) + (s.n, s.k)
    kind = rng.integers(3)
    draw = {0: rng.standard_normal, 1: lambda sh: rng.uniform(-1.7, 1.7, sh),
            2: lambda sh: rng.standard_t(4, sh) / 1.4}[int(kind)]
    a = draw(a_shape) * 10.0 ** rng.uniform(-1.5, 1.5)
    b = draw(b_shape) * 10.0 ** rng.uniform(-1.5, 1.5) / np.sqrt(s.k)
    return (_quantizer(g.fa, "a")(jnp.asarray(a, jnp.float32)), _quantizer(g.fb, "b")(jnp.asarray(b, jnp.float32)))


def family(g: Group, a, b, target: str) -> str:
    """The kernel that runs (the dispatch with this problem's activation rows), or "reference"."""
    rows = None if g.shape.b_batched else int(np.prod(g.shape.batch, dtype=np.int64)) * g.shape.m
    n, k = (None, None) if g.shape.b_batched else (g.shape.n, g.shape.k)
    choice = backends.choose(target, operand_kind(a, "a"), operand_kind(b, "b"), rows=rows, n=n, k=k,
                             kernel=g.config.kernel if g.config is not None else None)
    return choice.kernel or "reference"


def default_variant(g: Group, a, b, fam: str, target: str, device_kind: Optional[str]) -> str:
    """What the dispatch chose for a group without `config=`: "default:<kernel variant>[_splitN]"."""
    if g.config is not None or fam == "reference":
        return g.variant
    import importlib

    from jax_blockscale._triton import configs
    from jax_blockscale._triton.problem import GemmProblem
    from jax_blockscale.primitive import _K_ALIGN

    s = g.shape
    k = -(-s.k // _K_ALIGN) * _K_ALIGN  # every block size divides the primitive's K alignment
    p = GemmProblem(int(np.prod(s.batch, dtype=np.int64)), s.b_batched, s.m, s.n, k, operand_kind(a, "a"),
                    operand_kind(b, "b"), g.out)
    launcher = importlib.import_module(f"jax_blockscale._triton.{fam}")
    cfg = configs.select(fam, launcher, p, target, device_kind)
    name = "persistent" if cfg.persistent else "gemv" if cfg.gemv else "tma" if cfg.tma else \
        "swapped" if cfg.swap_ab else "fma" if cfg.fma else "mma" if fam == "decode" else "pointer"
    if fam == "upcast" and any(launcher.predecoded_sides(p, cfg)):
        name += "_predecoded"
    return f"default:{name}" + (f"_split{cfg.split_k}" if cfg.split_k > 1 else "")


def run(args) -> int:
    target = "cpu" if args.tiny else jb.detect_target()
    if args.tiny and jax.default_backend() != "cpu":
        print("--tiny runs the CPU reference path; ignoring the GPU", file=sys.stderr)
    device_kind = None if args.tiny else str(jax.devices()[0].device_kind)
    device = "cpu" if args.tiny else device_kind.lower().replace(" ", "_")
    groups = build_groups(target, quick=args.quick, tiny=args.tiny, seed=args.seed)
    n_cases = args.cases if args.cases is not None else (24 if args.tiny else 200 if args.quick else 500)
    n_cases = max(n_cases, len(groups))  # every group at least once
    per_group = collections.Counter(i % len(groups) for i in range(n_cases))
    print(f"target {target}, {len(groups)} groups (one compilation each, plus its reference), {n_cases} cases")

    shard, shards = (int(v) for v in args.shard.split("/")) if args.shard else (0, 1)
    rows, compile_s, run_s = [], 0.0, 0.0
    cpu = jax.devices("cpu")[0] if args.tiny else None
    for gi, g in enumerate(groups):
        if gi % shards != shard:
            continue
        mm = jax.jit(functools.partial(jb.matmul, out_dtype=OUT_DTYPES[g.out], config=g.config,
                                       target="cpu" if args.tiny else None))
        ref_fn = jax.jit(functools.partial(jb.reference.matmul, out_dtype=jnp.float32))
        for c in range(per_group[gi]):
            seed = args.seed * 1_000_003 + gi * 1009 + c
            with (jax.default_device(cpu) if cpu else _null()):
                a, b = operands(g, seed)
                t0 = time.perf_counter()
                try:
                    first = mm(a, b)
                    first.block_until_ready()
                    t1 = time.perf_counter()
                    second = mm(a, b)
                    ref = ref_fn(a, b)
                    err = rel_err(first, ref)
                    same = bool(np.array_equal(bits(first), bits(second)))
                    status = "ok"
                except Exception as e:  # a crash is a failure of the case, reported, not the end of the sweep
                    t1 = time.perf_counter()
                    err, same, status = float("nan"), False, f"error: {type(e).__name__}: {str(e)[:200]}"
                if c == 0:
                    compile_s += t1 - t0
                else:
                    run_s += t1 - t0
            tol = tolerance(g.out, g.fa)
            fam = family(g, a, b, target)
            if c == 0:
                variant = g.variant if args.tiny else default_variant(g, a, b, fam, target, device_kind)
            rows.append(dict(group=gi, case=c, seed=seed, family=fam, variant=variant, a=g.fa, b=g.fb,
                             shape=g.shape.label(), out=g.out, rel_err=err, tolerance=tol,
                             within=bool(err < tol), deterministic=same, status=status))
        if args.verbose:
            last = rows[-1]
            print(f"  [{gi + 1}/{len(groups)}] {last['family']:<10} {last['variant']:<26} {g.fa} x {g.fb} "
                  f"{g.shape.label()} {g.out}: err {last['rel_err']:.2e}")
    if args.shard:  # one of --jobs' processes: its rows go back to the parent, which reports
        out = pathlib.Path(args.out_dir) / f"shard_{shard}.json"
        out.write_text(json.dumps(dict(rows=rows, compile_s=compile_s, run_s=run_s, device=device)))
        return 0
    return report(rows, groups, device, args, compile_s, run_s)


def run_jobs(args) -> int:
    """--jobs N: N processes of this script, each on every N-th group (compilation, mostly host time, runs
    in parallel; the GPU is shared), then one report over all their cases."""
    import os
    import subprocess
    import tempfile

    groups = build_groups("cpu" if args.tiny else jb.detect_target(), quick=args.quick, tiny=args.tiny,
                          seed=args.seed)
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")  # N processes on one GPU
    common = ["--seed", str(args.seed)] + (["--cases", str(args.cases)] if args.cases is not None else [])
    common += [flag for flag, on in (("--quick", args.quick), ("--tiny", args.tiny), ("-v", args.verbose)) if on]
    with tempfile.TemporaryDirectory() as tmp:
        procs = [subprocess.Popen([sys.executable, "-m", "benchmarks.reliability_sweep", *common,
                                   "--shard", f"{i}/{args.jobs}", "--out-dir", tmp], env=env)
                 for i in range(args.jobs)]
        codes = [proc.wait() for proc in procs]
        if any(codes):
            print(f"a shard process failed: exit codes {codes}", file=sys.stderr)
            return 1
        parts = [json.loads((pathlib.Path(tmp) / f"shard_{i}.json").read_text()) for i in range(args.jobs)]
    rows = sorted((r for part in parts for r in part["rows"]), key=lambda r: (r["group"], r["case"]))
    # Compile and run seconds are summed over the processes (host seconds, not wall time).
    return report(rows, groups, parts[0]["device"], args, sum(p["compile_s"] for p in parts),
                  sum(p["run_s"] for p in parts))


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def summarize(rows: list[dict]) -> list[list[str]]:
    by = collections.defaultdict(list)
    for r in rows:
        by[r["family"]].append(r)
    lines = []
    for fam in sorted(by):
        rs = by[fam]
        errs = [r["rel_err"] for r in rs if np.isfinite(r["rel_err"])]
        lines.append([fam, str(len(rs)), str(len({r["group"] for r in rs})),
                      str(len({r["variant"] for r in rs})), f"{max(errs):.2e}" if errs else "-",
                      f"{max(r['rel_err'] / r['tolerance'] for r in rs if np.isfinite(r['rel_err'])):.3f}"
                      if errs else "-",
                      str(sum(not r["within"] for r in rs)), str(sum(not r["deterministic"] for r in rs))])
    return lines


def _table(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


def report(rows, groups, device, args, compile_s, run_s) -> int:
    header = ["kernel family", "cases", "groups (compilations)", "variants", "max rel err",
              "max err / tolerance", "failures", "nondeterministic"]
    lines = summarize(rows)
    failures = [r for r in rows if not r["within"] or not r["deterministic"]]
    total = ["all", str(len(rows)), str(len(groups)), str(len({(r['family'], r['variant']) for r in rows})),
             "", "", str(sum(not r["within"] for r in rows)), str(sum(not r["deterministic"] for r in rows))]
    text = _table(header, lines + [total])
    date = datetime.date.today().isoformat()
    mode = "tiny" if args.tiny else "quick" if args.quick else "full"
    summary = (f"Reliability sweep, {device}, {date}, jax {jax.__version__}, mode {mode}, seed {args.seed}: "
               f"{len(rows)} cases in {len(groups)} groups; first call per group (compile + run) "
               f"{compile_s:.1f} s, the other calls {run_s:.1f} s.")
    print(summary)
    print(text)
    for r in failures[:20]:
        print(f"FAIL {r['family']}/{r['variant']} {r['a']} x {r['b']} {r['shape']} {r['out']} seed {r['seed']}: "
              f"err {r['rel_err']:.3g} (tol {r['tolerance']:.3g}), deterministic {r['deterministic']}, {r['status']}")
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"reliability_{device}_{date}{'' if mode == 'full' else '_' + mode}"
    with open(stem.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    variants = collections.Counter((r["family"], r["variant"]) for r in rows)
    vlines = [[fam, var, str(n)] for (fam, var), n in sorted(variants.items())]
    stem.with_suffix(".md").write_text(
        f"{summary}\n\n{text}\n\nCases per kernel variant:\n\n{_table(['family', 'variant', 'cases'], vlines)}\n"
        + ("".join(f"\nFAIL {r}" for r in failures) if failures else "\nNo case beyond tolerance; every output "
           "bitwise equal when run twice.\n"))
    print(f"wrote {stem}.md and .csv")
    return 1 if failures else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="number of cases (default 500; --quick 200)")
    ap.add_argument("--quick", action="store_true", help="a representative subset of groups")
    ap.add_argument("--tiny", action="store_true", help="CPU reference path, small shapes: checks the harness")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out-dir", default=str(RESULTS))
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--jobs", type=int, default=1, help="processes sharing the GPU, each on every N-th group")
    ap.add_argument("--shard", default=None, help=argparse.SUPPRESS)  # "I/N": set by --jobs
    args = ap.parse_args(argv)
    if args.jobs > 1 and not args.shard:
        return run_jobs(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
