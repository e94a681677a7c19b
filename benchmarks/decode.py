"""Decode matmuls (M <= 64 x one weight): GPU kernel time per matmul, from a CUPTI trace.

    python -m benchmarks.decode               # the issue's table: shapes x formats x M, vs XLA bf16 / cuBLAS
    python -m benchmarks.decode --variants    # both compute variants x split-K x tiles, to pick defaults
    python -m benchmarks.decode --quick       # N=7168, K=4096 only

Time per matmul = the summed device time of every GPU activity (kernels and memsets) recorded by
torch.profiler (CUPTI) while R jitted calls run, over R: host launch gaps are out of it, and every kernel
XLA adds around ours (splits, casts, broadcasts) is in it. Each call rotates through 16 distinct weights
(over L2 for every shape) and the activation stays the same. Every format is checked against the
reference before it is timed. GB/s counts the weight's value and scale bytes once per call. "read" is the
ceiling: an XLA sum over a 1 GiB float32 array, timed the same way.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

# torch (CUPTI, cuBLAS) shares the GPU with XLA's preallocated pool.
os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton.problem import TileConfig  # noqa: E402

WEIGHTS = 16
CALLS = 64
SHAPES = [(7168, 2048), (7168, 4096), (7168, 7168), (28672, 8192), (8192, 8192)]
ROWS = [1, 16, 64]
# (label, activation format, weight format)
FORMATS = [("bf16 x mxfp4", "bf16", "mxfp4"), ("mxfp8 x mxfp4", "mxfp8", "mxfp4"), ("bf16 x nvfp4", "bf16", "nvfp4"),
           ("bf16 x mxfp8", "bf16", "mxfp8"), ("mxfp8 x mxfp8", "mxfp8", "mxfp8"),
           ("block fp8", "fp8_block", "fp8_block")]


def _torch():
    try:
        import torch

        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def kernel_us(fn, args_list, torch) -> float:
    """Device time per call (us) of `fn(*args)` over `args_list` rotated CALLS times."""
    for args in args_list[:2]:
        jax.block_until_ready(fn(*args))  # compile, warm
    if torch is None:  # wall clock fallback (includes launch gaps): said in the output
        t = time.perf_counter()
        for i in range(CALLS):
            out = fn(*args_list[i % len(args_list)])
        jax.block_until_ready(out)
        return (time.perf_counter() - t) / CALLS * 1e6
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            out = fn(*args_list[i % len(args_list)])
        jax.block_until_ready(out)
    return _device_us(prof) / CALLS


def _device_us(prof) -> float:
    """Summed duration (us) of the GPU activities (kernels, memsets, copies) in a torch.profiler trace;
    kernels launched by XLA are recorded too (CUPTI traces the whole process)."""
    total = 0.0
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            total += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
    return total


def _weights(fmt, n, k, seed):
    keys = jax.random.split(jax.random.key(seed), WEIGHTS)
    make = jax.jit(lambda key: jax.random.normal(key, (n, k), jnp.float32) / np.sqrt(k))
    if fmt == "bf16":
        return [make(key).astype(jnp.bfloat16) for key in keys]
    quant = jax.jit(lambda key: jb.quantize_operand(make(key), fmt, side="b"))
    return [quant(key) for key in keys]


def _nbytes(w) -> int:
    return sum(x.nbytes for x in jax.tree_util.tree_leaves(w))


def _activation(fmt, m, k):
    x = jax.random.normal(jax.random.key(7), (m, k), jnp.float32)
    return x.astype(jnp.bfloat16) if fmt == "bf16" else jb.quantize_operand(x, fmt, side="a")


def _checked(x, w, config=None) -> float:
    out = jax.jit(lambda x, w: jb.matmul(x, w, config=config, out_dtype=jnp.float32))(x, w)
    ref = jb.reference.matmul(x, w, out_dtype=jnp.float32)
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def read_ceiling_gbs(torch) -> float:
    x = jnp.ones((2**28,), jnp.float32)  # 1 GiB
    us = kernel_us(jax.jit(lambda x: jnp.sum(x)), [(x,)], torch)
    return x.nbytes / us / 1e3


def _cublas_blockwise_us(torch, x, ws):
    """torch cuBLAS blockwise FP8 on the very bytes of our fp8_block operands (benchmarks/_torch.py)."""
    from benchmarks import _torch as bt

    cands = bt._candidates(torch)
    if not cands:
        return None
    _, mm = cands[0]
    ops = [bt._operands(torch, x, w) for w in ws]
    m = x.shape[0]
    from torch.profiler import ProfilerActivity, profile

    for a, b, sa, sb in ops[:2]:
        mm(a, b, sa, sb)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(CALLS):
            a, b, sa, sb = ops[i % len(ops)]
            mm(a, b, sa, sb)[:m]
        torch.cuda.synchronize()
    return _device_us(prof) / CALLS


def table(shapes, rows, torch):
    ceiling = read_ceiling_gbs(torch)
    print(f"device: {jax.devices()[0].device_kind}; timing: {'CUPTI kernel time' if torch else 'WALL CLOCK (no torch)'}")
    print(f"read ceiling (XLA sum over 1 GiB): {ceiling:.0f} GB/s\n")
    print("| M | N | K | format | path | us | GB/s | % read | vs XLA bf16 | vs cuBLAS | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    mm = jax.jit(lambda x, w: jb.matmul(x, w))
    xla = jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    for n, k in shapes:
        bf16_ws = _weights("bf16", n, k, 0)
        weights = {fb: _weights(fb, n, k, 1) for fb in sorted({f[2] for f in FORMATS})}
        for m in rows:
            x = _activation("bf16", m, k)
            base = kernel_us(xla, [(x, w) for w in bf16_ws], torch)
            print(f"| {m} | {n} | {k} | XLA bf16 | - | {base:.1f} | {_nbytes(bf16_ws[0]) / base / 1e3:.0f} | "
                  f"{100 * _nbytes(bf16_ws[0]) / base / 1e3 / ceiling:.0f}% | 1.00x | | |")
            for label, fa, fb in FORMATS:
                ws = weights[fb]
                xa = _activation(fa, m, k)
                err = _checked(xa, ws[0])
                us = kernel_us(mm, [(xa, w) for w in ws], torch)
                nb = _nbytes(ws[0])
                cublas = ""
                if fb == "fp8_block" and torch is not None:
                    try:
                        c = _cublas_blockwise_us(torch, xa, ws)
                        cublas = f"{c / us:.2f}x ({c:.1f} us)" if c else "n/a"
                    except Exception as e:  # noqa: BLE001
                        cublas = f"n/a ({type(e).__name__})"
                path = jb.explain(xa, ws[0]).kernel
                print(f"| {m} | {n} | {k} | {label} | {path} | {us:.1f} | {nb / us / 1e3:.0f} | "
                      f"{100 * nb / us / 1e3 / ceiling:.0f}% | {base / us:.2f}x | {cublas} | {err:.1e} |")
            sys.stdout.flush()
        del bf16_ws, weights


def variants(torch, n=7168, k=4096):
    print(f"device: {jax.devices()[0].device_kind}; N={n}, K={k}; us per matmul (CUPTI)\n")
    print("| format | M | fma | block_n | split | atomic | asm | stages | us | GB/s | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for fa, fb in (("bf16", "mxfp4"), ("bf16", "nvfp4"), ("bf16", "mxfp8"), ("fp8_block", "fp8_block")):
        ws = _weights(fb, n, k, 1)
        nb = _nbytes(ws[0])
        block_k = 256 if fb in ("mxfp4", "nvfp4") else 128
        for m in (1, 4, 16, 64):
            xa = _activation(fa, m, k)
            default = jb.matmul  # the heuristic default first
            us = kernel_us(jax.jit(default), [(xa, w) for w in ws], torch)
            print(f"| {fb} | {m} | default | | | | | | {us:.1f} | {nb / us / 1e3:.0f} | {_checked(xa, ws[0]):.1e} |")
            for fma, block_n, split, atomic, asm, stages in itertools.product(
                    (True, False), (32, 64, 128), (1, 2, 4), (False, True), (True, False), (3, 4)):
                if (fma and m > 4) or (atomic and split == 1) or (not asm and fb not in ("mxfp4", "nvfp4")):
                    continue
                if (not fma and block_n == 32) or (fb == "fp8_block" and block_n > 128):
                    continue
                block_m = max(1, 1 << (m - 1).bit_length()) if fma else max(16, 1 << (m - 1).bit_length())
                cfg = TileConfig(block_m=block_m, block_n=block_n, block_k=block_k, group_m=1, num_warps=4,
                                 num_stages=stages, split_k=split, fma=fma, atomic_split_k=atomic, asm_decode=asm,
                                 kernel="decode")
                try:
                    err = _checked(xa, ws[0], cfg)
                    f = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg))
                    us = kernel_us(f, [(xa, w) for w in ws], torch)
                    print(f"| {fb} | {m} | {fma} | {block_n} | {split} | {atomic} | {asm} | {stages} | {us:.1f} | "
                          f"{nb / us / 1e3:.0f} | {err:.1e} |")
                except Exception as e:  # noqa: BLE001 - a config that fails to compile is a row, not a stop
                    print(f"| {fb} | {m} | {fma} | {block_n} | {split} | {atomic} | {asm} | {stages} | failed: "
                          f"{type(e).__name__} | | |")
                sys.stdout.flush()
        del ws


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if jax.default_backend() != "gpu":
        raise SystemExit("benchmarks.decode needs a GPU")
    torch = _torch()
    if args.variants:
        variants(torch)
    else:
        table([(7168, 4096)] if args.quick else SHAPES, ROWS, torch)


if __name__ == "__main__":
    main()
