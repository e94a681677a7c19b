"""Experiment (session 35): where mxfp8 weights stand against issue #12's 1.7x XLA bf16 at M <= 16.

Per issue shape and row count: XLA bf16, what dispatch runs, and the candidate kernels (decode.py's tuned
config, decode_wgmma's default, decode_fp8 for mxfp8 activations), plus GEMV tile variants at M = 1.
CUPTI kernel time per matmul (benchmarks.decode's helpers: 16 weights rotated), every config checked first.
"""

from __future__ import annotations

import sys

import jax

import jax_blockscale as jb
from benchmarks import decode as bd
from jax_blockscale._triton import decode, decode_fp8, decode_wgmma
from jax_blockscale._triton.problem import GemmProblem

SHAPES = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else
                                                           "7168x2048,7168x4096,7168x7168,28672x8192,8192x8192").split(",")]
ROWS = [int(r) for r in (sys.argv[2] if len(sys.argv) > 2 else "1,2,4,8,16").split(",")]
PAIRS = [tuple(p.split(":")) for p in (sys.argv[3] if len(sys.argv) > 3 else "bf16:mxfp8,mxfp8:mxfp8").split(",")]
GEMV_VARIANTS = [  # (label, block_n, block_k, warps, stages, split)
    ("n8 k1024 w4 st4 s1", 8, 1024, 4, 4, 1),
    ("n8 k2048 w8 st2 s1", 8, 2048, 8, 2, 1),
    ("n16 k1024 w4 st3 s1", 16, 1024, 4, 3, 1),
    ("n8 k4096 w8 st2 s1", 8, 4096, 8, 2, 1),
    ("n16 k512 w4 st2 s2", 16, 512, 4, 2, 2),
    ("n16 k2048 w8 st2 s1", 16, 2048, 8, 2, 1),
]


def timed(fn, args):
    return bd.kernel_us(fn, args, torch), bd.wall_us(fn, args)


torch = bd._torch()
print(f"device: {jax.devices()[0].device_kind}; CUPTI kernel us per matmul (wall us in parentheses)")
print("| N x K | x | M | kernel | config | us | wall | vs XLA | % read | rel err |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n, k in SHAPES:
    bf16_ws = bd._weights("bf16", n, k, 0)
    xla = {m: timed(bd._XLA_BF16, [(bd._activation("bf16", m, k), w) for w in bf16_ws]) for m in ROWS}
    for m, (us, wall) in xla.items():
        print(f"| {n}x{k} | bf16 | {m} | XLA bf16 | | {us:.2f} | {wall:.2f} | 1.00x | | |", flush=True)
    del bf16_ws
    ws, nb, read_us = bd._weights_and_read(torch, "mxfp8", n, k)
    print(f"| {n}x{k} | - | - | same-size read | {nb / 1e6:.1f} MB | {read_us:.2f} | | | 100% | |", flush=True)
    for fa, _ in PAIRS:
        for m in ROWS:
            xa = bd._activation(fa, m, k)
            p = GemmProblem(1, False, m, n, k, bd._KIND[fa], "e4m3", "bf16")
            picked = jb.explain(xa, ws[0]).kernel
            cands = [(f"dispatch ({picked})", None)]
            base = decode.default_config(p, "sm_90").replace(kernel="decode")
            cands.append(("decode.py", base))
            try:
                decode_wgmma.check_config(p, decode_wgmma.default_config(p))
                cands.append(("decode_wgmma", decode_wgmma.default_config(p)))
            except Exception as e:  # noqa: BLE001
                print(f"  decode_wgmma n/a: {e}", file=sys.stderr)
            if fa != "bf16" and m > 1:
                cands.append(("decode_fp8", decode_fp8.default_config(p)))
            if m in (1, 4):
                for label, bn, bk, w, st, s in GEMV_VARIANTS:
                    if k % bk or bk > k:
                        continue
                    cands.append((f"gemv {label}", base.replace(gemv=True, block_n=bn, block_k=bk, num_warps=w,
                                                                num_stages=st, split_k=s, prefetch=False)))
            for label, cfg in cands:
                desc = "" if cfg is None else (f"n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} "
                                               f"st{cfg.num_stages}{' gemv' if cfg.gemv else ''}")
                try:
                    err = bd._checked(xa, ws[0], cfg)
                    if not err < 1e-4:
                        print(f"| {n}x{k} | {fa} | {m} | {label} | {desc} | WRONG | | | | {err:.1e} |", flush=True)
                        continue
                    fn = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg))
                    us, wall = timed(fn, [(xa, w) for w in ws])
                except Exception as e:  # noqa: BLE001 - a failing config is a row
                    print(f"| {n}x{k} | {fa} | {m} | {label} | {desc} | {type(e).__name__}: {str(e)[:70]} |",
                          flush=True)
                    continue
                print(f"| {n}x{k} | {fa} | {m} | {label} | {desc} | {us:.2f} | {wall:.2f} | {xla[m][0] / us:.2f}x | "
                      f"{100 * read_us / us:.0f}% | {err:.1e} |", flush=True)
    del ws
