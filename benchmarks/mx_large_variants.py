"""Large-M MX / nvfp4 GEMMs on Hopper: the in-kernel decodes (`_triton/hopper_mx.py`, and for bf16
activations `_triton/mx_gluon.py`) and their variants against the old XLA-predecode path, XLA bf16 and XLA
dequantize + dot, by kernel time (issue #13).

    python -m benchmarks.mx_large_variants                    # defaults, < 4 min on an H100
    python -m benchmarks.mx_large_variants --formats mxfp8 --shapes 8192x8192x8192 \\
        --configs "128x256x64w8s3,128x256x64w8s4,128x128x128w8s4,128x128x32w8s4fp8"
    python -m benchmarks.mx_large_variants --formats bf16xmxfp4,bf16xnvfp4 --configs "" --gluon 256x64s4,256x64s3
    python -m benchmarks.mx_large_variants --tiny             # tiny shapes: every path runs (CPU)

Rows per (shape, format): XLA bf16 dot of the unquantized bf16 operands; XLA dequantize + bf16 dot of the
same quantized operands; `old` (TileConfig(kernel="upcast"): XLA dequantizes both sides, then the bf16 TMA
GEMM); `new <config>` for the default hopper_mx config and every --configs entry that fits the pair
(fp8 entries only run mxfp8 x mxfp8); and for bf16 activations, `gluon <config>` for every --gluon
entry (`<BLOCK_X>x<BLOCK_K>s<stages>`: mx_gluon's activation rows per tile, K step and stages). A config is
`<BM>x<BN>x<BK>w<warps>s<stages>` plus optional
suffixes `fp8` (fp8 wgmma, one promotion per MX block), `ws` (warp_specialize), `noasm` (fp32 fp4 decode),
`g<GROUP_M>`.

Each row is checked against the jnp reference (dequantize + fp32 dot) on its first operand set before
it is timed (`_baselines.run_jax`: R distinct operand sets in one jit, > 128 MB together); the number is
kernel time (CUPTI, `_kernel_time`), wall clock beside it. Printed as a markdown table with TFLOP/s and
the ratios the targets are stated in: vs XLA bf16 (target >= 1.0) and vs XLA dequantize + dot (>= 1.1).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from typing import Optional  # noqa: E402

import jax  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import hopper_mx, mx_gluon, upcast  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402
from jax_blockscale.api import operand_kind  # noqa: E402

from . import _baselines as bl  # noqa: E402
from ._cases import FORMATS  # noqa: E402
from ._timing import TimingConfig, choose_repeats  # noqa: E402

# 8192^3 and the two Llama shapes with M = 4096 (benchmarks/_cases.py, group "llama").
SHAPES = ((8192, 8192, 8192), (4096, 8192, 8192), (4096, 28672, 8192))
TINY_SHAPES = ((256, 256, 512),)
DEFAULT_FORMATS = ("mxfp8", "mxfp4", "nvfp4", "bf16xmxfp4")
# Variants run besides the default config unless --configs replaces them.
DEFAULT_VARIANTS = "128x128x32w8s4fp8,128x256x128w8s3"
_CONFIG_RE = re.compile(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)((?:fp8|ws|noasm|g\d+)*)$")


def parse_config(text: str) -> TileConfig:
    """"128x256x64w8s3fp8ws" -> TileConfig(kernel="hopper_mx", ...); ValueError on anything else."""
    match = _CONFIG_RE.match(text.strip())
    if not match:
        raise ValueError(f"config {text!r} is not <BM>x<BN>x<BK>w<warps>s<stages>[fp8][ws][noasm][g<N>]")
    bm, bn, bk, warps, stages = (int(match.group(i)) for i in range(1, 6))
    flags = match.group(6)
    group = re.search(r"g(\d+)", flags)
    return TileConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages, tma=True,
                      group_m=int(group.group(1)) if group else 8, fp8_mma="fp8" in flags,
                      warp_specialize="ws" in flags, asm_decode="noasm" not in flags, kernel="hopper_mx")


_GLUON_RE = re.compile(r"(\d+)x(\d+)s(\d+)$")


def parse_gluon(text: str) -> TileConfig:
    """"256x64s4" -> TileConfig(kernel="mx_gluon", block_n=256, block_k=64, num_stages=4)."""
    match = _GLUON_RE.match(text.strip())
    if not match:
        raise ValueError(f"gluon config {text!r} is not <BLOCK_X>x<BLOCK_K>s<stages>")
    bx, bk, stages = (int(g) for g in match.groups())
    return TileConfig(block_m=128, block_n=bx, block_k=bk, num_warps=4, num_stages=stages, kernel="mx_gluon")


def config_name(c: TileConfig) -> str:
    flags = ("fp8" if c.fp8_mma else "") + ("ws" if c.warp_specialize else "") + ("" if c.asm_decode else "noasm")
    group = "" if c.group_m == 8 else f"g{c.group_m}"
    return f"{c.block_m}x{c.block_n}x{c.block_k}w{c.num_warps}s{c.num_stages}{flags}{group}"


def _problem(qa, qb, m: int, n: int, k: int) -> GemmProblem:
    return GemmProblem(1, False, m, n, k, operand_kind(qa, "a"), operand_kind(qb, "b"), "bf16")


def _row(rows: list, shape: str, fmt: str, label: str, outcome: bl.Outcome, flops: float) -> None:
    kernel_s = outcome.kernel.kernel_s if outcome.kernel is not None else math.nan
    wall_s = outcome.timing.median_s if outcome.timing is not None else math.nan
    top = outcome.kernel.kernels[0].name if outcome.kernel is not None and outcome.kernel.kernels else ""
    rows.append(dict(shape=shape, fmt=fmt, label=label, status=outcome.status, kernel_s=kernel_s, wall_s=wall_s,
                     tflops=flops / kernel_s / 1e12 if kernel_s == kernel_s else math.nan, err=outcome.rel_err,
                     note=outcome.note, top=top))
    r = rows[-1]
    print(f"  {label:<28} {r['status']:<12} kernel {kernel_s * 1e3:8.3f} ms  {r['tflops']:7.1f} TF/s  "
          f"wall {wall_s * 1e3:8.3f} ms  err {r['err']:.2e}  {r['note'][:80]}", flush=True)


def _matmul_with(config: TileConfig):
    return lambda a, b: jb.matmul(a, b, out_dtype=bl.BF16, config=config)


def run(shapes, formats, variants: list[TileConfig], cfg: TimingConfig, gluon: tuple = ()) -> list[dict]:
    rows: list[dict] = []
    for m, n, k in shapes:
        shape, flops = f"{m}x{n}x{k}", 2.0 * m * n * k
        r = choose_repeats(int((m * k + n * k) * 0.5625), (m * k + n * k) * 4 + m * n * 2, cfg)
        dense = [bl.dense_pair(key, m, n, k) for key in jax.random.split(jax.random.key(m + n + k), r)]
        print(f"{shape} (R = {r})", flush=True)
        _row(rows, shape, "-", "XLA bf16", bl.run_jax("xla_bf16", bl.xla_bf16, dense, bl.xla_bf16_ref, cfg), flops)
        for fmt in formats:
            qs = [bl.quantized_pair(x, w, *FORMATS[fmt]) for x, w in dense]
            p = _problem(*qs[0], m, n, k)
            print(f" {fmt} ({p.a_kind} x {p.b_kind})", flush=True)
            _row(rows, shape, fmt, "XLA dequant+dot", bl.run_jax("xla_dequant", bl.xla_dequant, qs, bl.ours_ref, cfg),
                 flops)
            old = upcast.default_config(p, "sm_90").replace(kernel="upcast")
            _row(rows, shape, fmt, "old (XLA predecode + TMA)",
                 bl.run_jax("old", _matmul_with(old), qs, bl.ours_ref, cfg), flops)
            configs = [hopper_mx.default_config(p).replace(kernel="hopper_mx")] + variants
            seen = set()
            for c in configs:
                if config_name(c) in seen or (c.fp8_mma and not hopper_mx.fp8_mma_ready(p)):
                    continue
                seen.add(config_name(c))
                try:
                    hopper_mx.check_config(p, c)
                except ValueError as e:
                    print(f"  new {config_name(c):<24} skipped: {e}", flush=True)
                    continue
                _row(rows, shape, fmt, f"new {config_name(c)}", bl.run_jax("new", _matmul_with(c), qs, bl.ours_ref, cfg),
                     flops)
            for c in gluon if p.a_kind == "bf16" else ():
                try:
                    mx_gluon.check_config(p, c)
                except ValueError as e:
                    print(f"  gluon {c.block_n}x{c.block_k}s{c.num_stages} skipped: {e}", flush=True)
                    continue
                _row(rows, shape, fmt, f"gluon {c.block_n}x{c.block_k}s{c.num_stages}",
                     bl.run_jax("gluon", _matmul_with(c), qs, bl.ours_ref, cfg), flops)
            del qs
        del dense
    return rows


def _ratio(num: Optional[dict], den: Optional[dict]) -> float:
    if not num or not den or not (num["kernel_s"] > 0 and den["kernel_s"] > 0):
        return math.nan
    return num["kernel_s"] / den["kernel_s"]


def markdown(rows: list[dict]) -> str:
    """One table: every row with kernel-time TF/s, x XLA bf16 and x XLA dequant+dot of its format."""
    lines = ["| shape | format | implementation | kernel ms | TF/s | x XLA bf16 | x dequant+dot | wall ms | check |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        bf16 = next((x for x in rows if x["shape"] == r["shape"] and x["label"] == "XLA bf16"), None)
        deq = next((x for x in rows if x["shape"] == r["shape"] and x["fmt"] == r["fmt"]
                    and x["label"] == "XLA dequant+dot"), None)
        lines.append(f"| {r['shape']} | {r['fmt']} | {r['label']} | {r['kernel_s'] * 1e3:.3f} | {r['tflops']:.0f} | "
                     f"{_ratio(bf16, r):.2f} | {_ratio(deq, r) if r['fmt'] != '-' else math.nan:.2f} | "
                     f"{r['wall_s'] * 1e3:.3f} | {r['status']} {r['err']:.1e} |")
    return "\n".join(lines)


def parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", help="comma-separated MxNxK (default: 8192^3 and the two Llama M=4096 shapes)")
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help=f"subset of {sorted(FORMATS)}")
    ap.add_argument("--configs", default=DEFAULT_VARIANTS,
                    help="hopper_mx variants besides the default, e.g. 128x256x64w8s3ws,128x128x32w8s4fp8 ('' = none)")
    ap.add_argument("--gluon", default="",
                    help="mx_gluon configs for bf16-activation formats, e.g. 256x64s4,256x64s3 ('' = none)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, fixed repeats, no kernel time (CPU check)")
    ap.add_argument("--out", help="also write the markdown table to this file")
    args = ap.parse_args(argv)
    for f in args.formats.split(","):
        if f not in FORMATS:
            ap.error(f"unknown format {f!r}")
    return args


def main(argv: Optional[list[str]] = None) -> list[dict]:
    args = parse(argv)
    variants = [parse_config(c) for c in args.configs.split(",") if c.strip()]
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    else:
        shapes = TINY_SHAPES if args.tiny else SHAPES
    if args.tiny:
        cfg = TimingConfig(fixed_repeats=2, target_sample_s=0.0, min_samples=2, max_samples=2, sample_budget_s=0.0)
    else:
        cfg = TimingConfig(min_samples=3, max_samples=8, sample_budget_s=0.3, kernel_time=True)
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jb.detect_target(device)}), jax {jax.__version__}", flush=True)
    t0 = time.time()
    gluon = tuple(parse_gluon(c) for c in args.gluon.split(",") if c.strip())
    rows = run(shapes, args.formats.split(","), variants, cfg, gluon)
    table = markdown(rows)
    print(f"\n{table}\n\n({time.time() - t0:.0f} s)")
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
