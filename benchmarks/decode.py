"""Decode matmuls (M <= 64 x one weight): GPU kernel time per matmul, from a CUPTI trace.

    python -m benchmarks.decode               # the issue's table: shapes x formats x M, vs XLA bf16 / cuBLAS
    python -m benchmarks.decode --variants --time-budget 270   # greedy knob search per (format, M)
    python -m benchmarks.decode --quick       # N=7168, K=4096 only
    python -m benchmarks.decode --gemv-decode # the GEMV's fp4 decode variants vs the tuned config (~1-2 min)
    python -m benchmarks.decode --mma16       # the MMA variants vs the tuned config at M = 8, 16 (~1-2 min)
    python -m benchmarks.decode --gemv-shapes # M=1 GEMV per model / issue shape vs a same-size read (~2-3 min)
    python -m benchmarks.decode --stream      # M=1 mxfp4: the GEMV vs a Triton kernel that only streams its bytes
    python -m benchmarks.decode --wgmma --shapes 7168x4096,8192x8192   # fp4 weights: decode_wgmma vs decode.py
    python -m benchmarks.decode --wgmma --pairs bf16:mxfp8,mxfp8:mxfp4 --rows 2,16,32   # other format pairs
    python -m benchmarks.decode --wgmma-knobs --shapes 7168x4096 --pairs bf16:mxfp4 --rows 16   # its launch knobs
    python -m benchmarks.decode --fp8         # block FP8 weights: decode_fp8 vs block_fp8 and cuBLAS blockwise
    python -m benchmarks.decode --fp8-knobs --shapes 7168x4096   # and decode_fp8's neighbouring configs
    python -m benchmarks.decode --fp8 --pairs mxfp8:mxfp8 --rows 1,8,16,32,64   # 8-bit MX: vs XLA bf16
    python -m benchmarks.decode --bf16-block  # bf16 activations x block FP8 weights: the kernels vs XLA bf16
    python -m benchmarks.decode --bf16-block --quick   # the same: XLA bf16, the jnp reference, dispatch only

Time per matmul = the summed device time of every GPU activity (kernels and memsets) recorded by
torch.profiler (CUPTI) while R jitted calls run, over R: host launch gaps are out of it, and every kernel
XLA adds around ours (splits, casts, broadcasts) is in it. Each call rotates through 16 distinct weights
(over L2 for every shape) and the activation stays the same. Every format is checked against the
reference before it is timed. GB/s counts the weight's value and scale bytes once per call. "read" is the
ceiling: an XLA sum over a 1 GiB float32 array, timed the same way.
"""

from __future__ import annotations

import argparse
import functools
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


def wall_us(fn, args_list) -> float:
    """Wall clock per call (us) of `fn(*args)` over `args_list` rotated CALLS times, dispatched back to back
    and blocked on once at the end: what a jitted call costs a Python loop, host launch gaps included."""
    for args in args_list[:2]:
        jax.block_until_ready(fn(*args))  # compile, warm
    t = time.perf_counter()
    for i in range(CALLS):
        out = fn(*args_list[i % len(args_list)])
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / CALLS * 1e6


def kernel_us(fn, args_list, torch) -> float:
    """Device time per call (us) of `fn(*args)` over `args_list` rotated CALLS times."""
    if torch is None:  # wall clock fallback (includes launch gaps): said in the output
        return wall_us(fn, args_list)
    for args in args_list[:2]:
        jax.block_until_ready(fn(*args))  # compile, warm
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


# The XLA bf16 baseline: x (M, K) . w (N, K)^T, fp32 accumulation, bf16 out.
_XLA_BF16 = jax.jit(lambda x, w: jnp.einsum("mk,nk->mn", x, w, preferred_element_type=jnp.float32).astype(jnp.bfloat16))


def _checked(x, w, config=None) -> float:
    out = jax.jit(lambda x, w: jb.matmul(x, w, config=config, out_dtype=jnp.float32))(x, w)
    ref = jb.reference.matmul(x, w, out_dtype=jnp.float32)
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def _checked_us(p, xa, ws, cfg, torch) -> tuple[float | None, float]:
    """(us per call, rel err) of `cfg`'s kernel (decode.py unless it names another) on xa . ws: validated, checked
    against the reference (fp32 output: only the summation order differs, ~1e-6) before it is timed; us is None
    when the result is wrong. An invalid config or a compile failure raises."""
    import importlib

    importlib.import_module(f"jax_blockscale._triton.{cfg.kernel or 'decode'}").check_config(p, cfg)
    err = _checked(xa, ws[0], cfg)
    if not err < 1e-4:
        return None, err
    return kernel_us(jax.jit(lambda x, w: jb.matmul(x, w, config=cfg)), [(xa, w) for w in ws], torch), err


def read_ceiling_gbs(torch) -> float:
    x = jnp.ones((2**28,), jnp.float32)  # 1 GiB
    us = kernel_us(jax.jit(lambda x: jnp.sum(x)), [(x,)], torch)
    return x.nbytes / us / 1e3


def _device_line(torch, n: int, k: int, ceiling: float) -> str:
    return (f"device: {jax.devices()[0].device_kind}; N={n}, K={k}; us per matmul ({'CUPTI' if torch else 'WALL'}); "
            f"read ceiling {ceiling:.0f} GB/s")


def same_size_read_us(torch, n: int, nbytes: int) -> float:
    """Kernel time of XLA's row sum over a (n, nbytes / 4n) float32 array, 16 distinct arrays rotated: a
    read of the weight's bytes, in the weight's row shape, with no decode. At decode sizes (~16 MB) launch
    and ramp-up are a large part of it, so it is the ceiling a weight-streaming kernel can approach, below
    the 1 GiB figure."""
    cols = max(1, nbytes // (4 * n))
    xs = [jnp.full((n, cols), float(i), jnp.float32) for i in range(WEIGHTS)]
    return kernel_us(jax.jit(lambda x: jnp.sum(x, axis=1)), [(x,) for x in xs], torch)


def _weights_and_read(torch, fb: str, n: int, k: int):
    """The rotated weights of format `fb`, one weight's bytes and a same-size read's time (us)."""
    ws = _weights(fb, n, k, 1)
    nb = _nbytes(ws[0])
    return ws, nb, same_size_read_us(torch, n, nb)


def experiment_weights(torch, fmt: str, n: int, k: int):
    """For the kept decode experiments (decode_mma_sync, decode_mma_f16, `experiment_table`'s): the rotated (N, K)
    weights of format `fmt`, a same-size read's time (us) and the rotated bf16 weights of XLA's baseline dot."""
    ws, _, read = _weights_and_read(torch, fmt, n, k)
    return ws, read, [_weights("bf16", n, k, 2 + i)[0] for i in range(4)]


def experiment_baselines(torch, x, ws, dense):
    """XLA's bf16 dot's and dispatch's kernel time (us) for activations x against `experiment_weights`' weights,
    and the jnp reference's fp32 result (float64) for the first weight."""
    xla = kernel_us(_XLA_BF16, [(x, w) for w in dense], torch)
    disp = kernel_us(jax.jit(lambda x, w: jb.matmul(x, w)), [(x, w) for w in ws], torch)
    return xla, disp, np.asarray(jb.reference.matmul(x, ws[0], out_dtype=jnp.float32), np.float64)


def experiment_table(torch, formats, shapes, variants, *, tol: float = 1e-5, again: bool = False) -> None:
    """The one-row decode experiments' table (decode_gemv_mma, decode_gemv_tma): per weight format and (N, K), XLA's
    bf16 dot and dispatch, then each of `variants`, (label, check, launch): check(n, k) raises ValueError where the
    variant cannot take the shape (printed as its refusal); launch(x, w, out_dtype) computes x (1, K) @ w.T.
    Every variant is checked against the jnp reference (relative error below `tol`) before it is timed; `again`
    times dispatch once more after them (clock drift)."""
    print(f"device {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'})")
    print("| format | N | K | kernel | us | % same-size read | vs XLA bf16 | vs dispatch | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt in formats:
        for n, k in shapes:
            ws, read, dense = experiment_weights(torch, fmt, n, k)
            x = jax.random.normal(jax.random.key(7), (1, k), jnp.float32).astype(jnp.bfloat16)
            xla, disp, ref = experiment_baselines(torch, x, ws, dense)
            row = f"| {fmt} | {n} | {k} |"
            print(f"{row} XLA bf16 | {xla:.2f} | | 1.00x | | |")
            print(f"{row} dispatch: {jb.explain(x, ws[0], rows=1).kernel} | {disp:.2f} | {read / disp:.0%} | "
                  f"{xla / disp:.2f}x | 1.00x | |", flush=True)
            for label, check, run in variants:
                try:
                    check(n, k)
                except ValueError as e:
                    print(f"{row} {label} | refused: {e} | | | | |")
                    continue
                out = np.asarray(jax.jit(lambda x, w, run=run: run(x, w, jnp.float32))(x, ws[0]), np.float64)
                err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                if not err < tol:
                    print(f"{row} {label} | wrong | | | | {err:.1e} |")
                    continue
                us = kernel_us(jax.jit(lambda x, w, run=run: run(x, w, jnp.bfloat16)), [(x, w) for w in ws], torch)
                print(f"{row} {label} | {us:.2f} | {read / us:.0%} | {xla / us:.2f}x | {disp / us:.2f}x | "
                      f"{err:.1e} |", flush=True)
            if again:
                again_us = kernel_us(jax.jit(lambda x, w: jb.matmul(x, w)), [(x, w) for w in ws], torch)
                print(f"{row} dispatch again | {again_us:.2f} | | | | |", flush=True)


def experiment_main(argv, description: str, *, shapes: str, formats: str, configs: str, config_help: str, parse,
                    variant, sass, again: bool = True) -> None:
    """The one-row decode experiments' command line (decode_gemv_mma, decode_gemv_tma, decode_gemv_persistent,
    decode_gemv_gluon): --shapes NxK,..., --formats, --configs (each through `parse`), and --sass, which calls
    `sass(configs, formats)` (CPU); else `experiment_table` of `variant(config, first format)` -> (label, check, run)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--shapes", default=shapes, help="NxK,...")
    ap.add_argument("--formats", default=formats, help="mxfp4,nvfp4")
    ap.add_argument("--configs", default=configs, help=config_help)
    ap.add_argument("--sass", action="store_true", help="CPU: compile and count SASS only")
    a = ap.parse_args(argv)
    parsed = [parse(c) for c in a.configs.split(",")]
    fmts = a.formats.split(",")
    if a.sass:
        sass(parsed, fmts)
        return
    experiment_table(_torch(), fmts, [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")],
                     [variant(c, fmts[0]) for c in parsed], again=again)


def _cublas_blockwise_us(torch, x, ws):
    """Kernel time (us per call) of torch's cuBLAS blockwise FP8 on the very bytes of our fp8_block operands,
    checked against the reference first (`benchmarks/_torch.torch_blockwise`, as `benchmarks.quick` times
    it); None with the reason printed when it does not run."""
    from benchmarks._timing import TimingConfig
    from benchmarks._torch import torch_blockwise

    del torch  # torch_blockwise imports it
    ref0 = jb.reference.matmul(x, ws[0], out_dtype=jnp.float32)
    out = torch_blockwise([(x, w) for w in ws], ref0, TimingConfig(kernel_time=True))
    if out.status != "ok" or out.kernel is None or not out.kernel.ok:
        print(f"  cuBLAS blockwise: {out.status} ({out.note[:160]})", file=sys.stderr)
        return None
    return out.kernel.kernel_s * 1e6


def table(shapes, rows, torch):
    ceiling = read_ceiling_gbs(torch)
    print(f"device: {jax.devices()[0].device_kind}; timing: {'CUPTI kernel time' if torch else 'WALL CLOCK (no torch)'}")
    print(f"read ceiling (XLA sum over 1 GiB): {ceiling:.0f} GB/s\n")
    print("| M | N | K | format | path | us | GB/s | % read | vs XLA bf16 | vs cuBLAS | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    mm = jax.jit(lambda x, w: jb.matmul(x, w))
    xla = _XLA_BF16
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
                        cublas = f"{c / us:.2f}x ({c:.1f} us)" if c else "n/a (see stderr)"
                    except Exception as e:  # noqa: BLE001
                        cublas = f"n/a ({type(e).__name__})"
                path = jb.explain(xa, ws[0]).kernel
                print(f"| {m} | {n} | {k} | {label} | {path} | {us:.1f} | {nb / us / 1e3:.0f} | "
                      f"{100 * nb / us / 1e3 / ceiling:.0f}% | {base / us:.2f}x | {cublas} | {err:.1e} |")
            sys.stdout.flush()
        del bf16_ws, weights


# The decode kernel's knobs, most promising value first and the knobs in order of expected effect (the search
# is cut off by the time budget). The GEMV (CUDA-core FMAs) serves 1 row, the swapped
# MMA 16 and 64 (FMAs would be compute-bound there: 16 rows x 29M weights = 16 us of fp32 FMA on an H100).
GEMV_SPACE = dict(block_n=(16, 8, 32, 64), split_k=(None, 1, 2, 4, 8), row_bytes=(256, 512, 128, 1024),
                  num_warps=(4, 2, 8, 1), num_stages=(2, 3, 4, 1), prefetch=(True, False), asm_decode=(True, False),
                  f16_decode=(False, True), atomic_split_k=(False, True))
MMA_SPACE = dict(block_n=(64, 32, 16, 128), split_k=(None, 1, 2, 4, 8), row_bytes=(128, 256, 64),
                 num_warps=(4, 8, 2), num_stages=(4, 3, 2, 5), atomic_split_k=(False, True), asm_decode=(True, False))
_KIND = {"mxfp4": "e2m1", "nvfp4": "nvfp4", "mxfp8": "e4m3", "mxfp8_e5m2": "e5m2", "fp8_block": "block_fp8",
         "bf16": "bf16"}
# (activation, weight) formats and the target per M: ("read", fraction of the read ceiling) or
# ("xla", speedup over XLA bf16) or ("cublas", speedup over the older kernels / cuBLAS blockwise ~15 us)
VARIANT_FORMATS = (("bf16", "mxfp4"), ("bf16", "nvfp4"), ("bf16", "mxfp8"), ("fp8_block", "fp8_block"))


def _config(p, knobs):
    """A TileConfig for the decode kernel from sweep knobs; None if the knobs do not make a valid one."""
    from jax_blockscale._triton import decode

    gemv = knobs["gemv"]
    rows = p.batch * p.m
    epb = 2 if p.b_kind in ("e2m1", "nvfp4") else 1
    block_k = 128 if (p.b_kind == "block_fp8" and not gemv) else knobs["row_bytes"] * epb
    if p.b_kind == "block_fp8":
        block_k = max(block_k, 128)
    block_m = max(1, 1 << (rows - 1).bit_length()) if gemv else max(16, 1 << (rows - 1).bit_length())
    n_tiles, k_tiles = -(-p.n // knobs["block_n"]), p.k // block_k if p.k % block_k == 0 else 0
    if not k_tiles:
        return None
    split = knobs["split_k"]
    if split is None:  # about four programs per SM, >= 2 K tiles each
        split = 1
        while n_tiles * split < 4 * 132 and k_tiles // (split * 2) >= 2:
            split *= 2
    if knobs["atomic_split_k"] and split == 1:
        return None
    cfg = TileConfig(block_m=block_m, block_n=knobs["block_n"], block_k=block_k, group_m=1,
                     num_warps=knobs["num_warps"], num_stages=knobs["num_stages"], split_k=split, fma=False,
                     atomic_split_k=knobs["atomic_split_k"], asm_decode=knobs["asm_decode"], gemv=gemv,
                     prefetch=knobs.get("prefetch", True), f16_decode=knobs.get("f16_decode", False),
                     kernel="decode")
    try:
        decode.check_config(p, cfg)
    except ValueError:
        return None
    return cfg


def _search(start, space, measure, deadline, applies):
    """Greedy coordinate search from `start`: each knob's values in order, moving to any faster config at
    once, repeated while something improves and time is left. Returns (best knobs, best us)."""
    best, best_us, seen = dict(start), measure(start), {tuple(sorted(start.items()))}
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for knob, values in space.items():
            if not applies(knob):
                continue
            for v in values:
                if time.monotonic() >= deadline:
                    return best, best_us
                cand = dict(best, **{knob: v})
                key = tuple(sorted(cand.items()))
                if key in seen:
                    continue
                seen.add(key)
                us = measure(cand)
                if us < best_us:
                    best, best_us, improved = cand, us, True
    return best, best_us


def variants(torch, n=7168, k=4096, time_budget=270.0):
    """Sweeps the decode kernel's knobs per (format, M) within `time_budget` seconds (split evenly over
    the 12 (format, M) pairs as they come, what one leaves goes to the next); prints every measured config
    and then the best per (format, M) against XLA bf16 and the older kernels (dispatch's default on sm_90)."""
    from jax_blockscale._triton import decode
    from jax_blockscale._triton.problem import GemmProblem

    t0 = time.monotonic()
    ceiling = read_ceiling_gbs(torch)
    print(_device_line(torch, n, k, ceiling) + f"; budget {time_budget:.0f} s\n")
    print("| format | M | variant | block_n | block_k | split | warps | stages | prefetch | asm | atomic | us | GB/s | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    xla = _XLA_BF16
    bf16_ws = _weights("bf16", n, k, 0)
    bf16_bytes = _nbytes(bf16_ws[0])
    summary = []
    pairs = [(fa, fb, m) for fa, fb in VARIANT_FORMATS for m in ROWS]
    ws, ws_format = None, None
    for i, (fa, fb, m) in enumerate(pairs):
        if fb != ws_format:
            ws, ws_format = _weights(fb, n, k, 1), fb
        nb = _nbytes(ws[0])
        xa = _activation(fa, m, k)
        args = [(xa, w) for w in ws]
        ref = np.asarray(jb.reference.matmul(xa, ws[0], out_dtype=jnp.float32), np.float64)
        x16 = _activation("bf16", m, k)
        xla_us = kernel_us(xla, [(x16, w) for w in bf16_ws], torch)
        old_us = kernel_us(jax.jit(lambda x, w: jb.matmul(x, w)), args, torch)
        old_kernel = jb.explain(xa, ws[0]).kernel
        p = GemmProblem(1, False, m, n, k, _KIND[fa], _KIND[fb], "bf16")
        results = {}

        def measure(knobs, label=None):
            cfg = _config(p, knobs)
            if cfg is None:
                return float("inf")
            row = (f"| {fb} | {m} | {label or ('gemv' if cfg.gemv else 'mma')} | {cfg.block_n} | {cfg.block_k} | "
                   f"{cfg.split_k} | {cfg.num_warps} | {cfg.num_stages} | {cfg.prefetch if cfg.gemv else '-'} | "
                   f"{cfg.asm_decode} | {cfg.atomic_split_k} |")
            try:
                f = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg))
                out = np.asarray(f(xa, ws[0]), np.float64)
                err = float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))
                if not err < 2e-2:  # bf16 output: a wrong config, not a slow one
                    print(f"{row} WRONG | | {err:.1e} |")
                    return float("inf")
                us = kernel_us(f, args, torch)
            except Exception as e:  # noqa: BLE001 - a config that fails to compile is a row, not a stop
                print(f"{row} failed: {type(e).__name__} | | |")
                return float("inf")
            print(f"{row} {us:.1f} | {nb / us / 1e3:.0f} | {err:.1e} |")
            sys.stdout.flush()
            results[tuple(sorted(knobs.items()))] = (us, cfg)
            return us

        # the previous heuristic (FMA <= 4 rows, else the 64-row MMA) as a reference point, then the search
        prev = decode.default_config(p, "sm_90")
        if m <= 4:
            measure(dict(gemv=False, block_n=32, row_bytes=128, split_k=None, num_warps=4, num_stages=4,
                         atomic_split_k=False, asm_decode=True), label="old fma")
        now = time.monotonic()
        deadline = now + (t0 + time_budget - now) / (len(pairs) - i)  # an even share of what is left
        fp4 = fb in ("mxfp4", "nvfp4")
        if m <= 4:
            start = dict(gemv=True, **{kk: v[0] for kk, v in GEMV_SPACE.items()})
            space = GEMV_SPACE
        else:
            start = dict(gemv=False, block_n=prev.block_n, row_bytes=prev.block_k // (2 if fp4 else 1),
                         split_k=prev.split_k, num_warps=prev.num_warps, num_stages=prev.num_stages,
                         atomic_split_k=False, asm_decode=True)
            space = MMA_SPACE
        best, best_us = _search(start, space, measure, deadline,
                                applies=lambda knob: knob not in ("asm_decode", "f16_decode") or fp4)
        if m == 16 and time.monotonic() < deadline:  # is the GEMV competitive at 16 rows?
            measure(dict(gemv=True, **{kk: v[0] for kk, v in GEMV_SPACE.items()}))
        us, cfg = min(results.values(), key=lambda r: r[0]) if results else (float("inf"), None)
        summary.append((fb, m, us, cfg, nb, xla_us, old_us, old_kernel))

    print(f"\nbest per (format, M), read ceiling {ceiling:.0f} GB/s, XLA bf16 reads {bf16_bytes / 1e6:.0f} MB:\n")
    print("| format | M | best us | GB/s | % read | vs XLA bf16 | older kernel (us) | vs older | config |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fb, m, us, cfg, nb, xla_us, old_us, old_kernel in summary:
        gbs = nb / us / 1e3
        desc = ("none" if cfg is None else
                f"{'gemv' if cfg.gemv else 'mma'} block_m={cfg.block_m} block_n={cfg.block_n} block_k={cfg.block_k} "
                f"split_k={cfg.split_k} num_warps={cfg.num_warps} num_stages={cfg.num_stages} "
                f"prefetch={cfg.prefetch} asm_decode={cfg.asm_decode} atomic_split_k={cfg.atomic_split_k}")
        print(f"| {fb} | {m} | {us:.1f} | {gbs:.0f} | {100 * gbs / ceiling:.0f}% | {xla_us / us:.2f}x ({xla_us:.1f} us) | "
              f"{old_kernel} {old_us:.1f} | {old_us / us:.2f}x | {desc} |")
    print(f"\nsweep took {time.monotonic() - t0:.0f} s")


# The GEMV's fp4 decode (`--gemv-decode`): label -> the changes to dispatch's tuned config; every label but
# the first applies to fp4 weights only.
GEMV_DECODE_VARIANTS = (
    ("tuned bf16 dec", lambda c: dict(f16_decode=False)),
    ("tuned f16 dec", lambda c: dict(f16_decode=True)),
    ("f16 n16", lambda c: dict(f16_decode=True, block_n=16)),
    ("f16 st2", lambda c: dict(f16_decode=True, num_stages=2)),
    ("f16 k1024", lambda c: dict(f16_decode=True, block_k=1024)),
)

# The swapped MMA's variants against dispatch's tuned sm_90 config at 5..16 rows (`--mma16`): label ->
# the changes to the tuned config ("asm toggled" for fp4 weights only).
MMA16_VARIANTS = (
    ("tuned", lambda c: {}),
    ("split x2", lambda c: dict(split_k=2 * c.split_k)),  # twice the warps per SM, same tiles
    ("asm toggled", lambda c: dict(asm_decode=not c.asm_decode)),  # fp4 only
    # fewest instructions per element for e2m1 / e4m3 (benchmarks.sass_count); split twice as often to keep
    # the warps per SM (64-row tiles halve the programs)
    ("n64 w2 split x2", lambda c: dict(block_n=64, num_warps=2, split_k=2 * c.split_k)),
)


def config_variants(torch, rows: tuple[int, ...], variants, fp4_only: set[str], n: int = 7168, k: int = 4096):
    """Dispatch's tuned sm_90 decode config per weight format (bf16 activations) at each M in `rows`
    against `variants` (label, config -> changes; labels in `fp4_only` skip mxfp8), beside XLA bf16 and a
    same-size read of each weight. Each variant is checked against the reference (fp32 output) before it
    is timed; one that is invalid, wrong or fails to compile is a row, not a stop."""
    from jax_blockscale._triton import decode
    from jax_blockscale._triton.problem import GemmProblem

    ceiling = read_ceiling_gbs(torch)
    print(_device_line(torch, n, k, ceiling) + "\n")
    print("| format | M | variant | config | us | GB/s | % read | vs XLA bf16 | rel err (fp32 out) |")
    print("|---|---|---|---|---|---|---|---|---|")
    xla = _XLA_BF16
    bf16_ws = _weights("bf16", n, k, 0)
    xla_us = {m: kernel_us(xla, [(_activation("bf16", m, k), w) for w in bf16_ws], torch) for m in rows}
    for m, us in xla_us.items():
        print(f"| bf16 | {m} | XLA bf16 | - | {us:.2f} | {_nbytes(bf16_ws[0]) / us / 1e3:.0f} | | 1.00x | |", flush=True)
    del bf16_ws
    for fb in ("mxfp4", "nvfp4", "mxfp8"):
        ws, nb, read_us = _weights_and_read(torch, fb, n, k)
        print(f"| {fb} | - | same-size read | XLA row sum over {nb / 1e6:.1f} MB | {read_us:.2f} | "
              f"{nb / read_us / 1e3:.0f} | {100 * nb / read_us / 1e3 / ceiling:.0f}% | | |", flush=True)
        for m in rows:
            xa = _activation("bf16", m, k)
            base = decode.default_config(GemmProblem(1, False, m, n, k, "bf16", _KIND[fb], "bf16"), "sm_90")
            for label, changes in variants:
                if label in fp4_only and fb == "mxfp8":
                    continue
                cfg = base.replace(kernel="decode", **changes(base))  # the decode entry is opt-in on sm_90
                desc = (f"n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} st{cfg.num_stages}"
                        f"{' gemv' if cfg.gemv else ''}{' pf' if cfg.prefetch and cfg.gemv else ''}"
                        f"{' f16' if cfg.f16_decode else ''}{' asm' if cfg.asm_decode and not cfg.gemv else ''}")
                try:
                    us, err = _checked_us(GemmProblem(1, False, m, n, k, "bf16", _KIND[fb], "bf16"), xa, ws, cfg,
                                          torch)
                except Exception as e:  # noqa: BLE001 - a config that is invalid or fails to compile is a row
                    print(f"| {fb} | {m} | {label} | {desc} | {type(e).__name__}: {str(e)[:60]} | | | | |", flush=True)
                    continue
                if us is None:
                    print(f"| {fb} | {m} | {label} | {desc} | WRONG | | | | {err:.1e} |", flush=True)
                    continue
                gbs = nb / us / 1e3
                print(f"| {fb} | {m} | {label} | {desc} | {us:.2f} | {gbs:.0f} | {100 * gbs / ceiling:.0f}% | "
                      f"{xla_us[m] / us:.2f}x | {err:.1e} |", flush=True)
        del ws


def gemv_decode(torch):
    """The GEMV at M = 1, 4: the tuned config with the bf16-route and fp16-route fp4 decode
    (TileConfig.f16_decode) and neighbours of it; instruction counts per weight element:
    `python -m benchmarks.sass_count --set f16_decode=True`."""
    config_variants(torch, (1, 4), GEMV_DECODE_VARIANTS, {label for label, _ in GEMV_DECODE_VARIANTS[1:]})


def mma16(torch):
    """The swapped MMA at M = 8, 16: the tuned config (decode._SM90_TUNED[kind][1]) and MMA16_VARIANTS."""
    config_variants(torch, (8, 16), MMA16_VARIANTS, {"asm toggled"})


# --gemv-shapes: the generation example's projections (qkv, out, gate/up, down of examples/generate.py) and
# issue #12's shapes; knobs changed from the default config, per weight kind.
GEMV_SHAPES = [(12288, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (7168, 2048), (7168, 7168),
               (28672, 8192), (8192, 8192)]
GEMV_SHAPE_VARIANTS = {
    "fp4": [("base", {}), ("k1024", dict(block_k=1024)), ("n16 k1024", dict(block_n=16, block_k=1024)),
            ("n4", dict(block_n=4)), ("st2", dict(num_stages=2)), ("st6", dict(num_stages=6)),
            ("s2", dict(split_k=2)), ("n16 w8", dict(block_n=16, num_warps=8)),
            ("pf st2", dict(prefetch=True, num_stages=2))],
    "fp8": [("base", {}), ("s1", dict(split_k=1)), ("s2", dict(split_k=2)), ("s8", dict(split_k=8)),
            ("n16 k512", dict(block_n=16, block_k=512)), ("st2", dict(num_stages=2)),
            ("n8 k1024 s1 st4", dict(block_n=8, block_k=1024, split_k=1, num_stages=4))],
}


def gemv_shapes(torch, formats=("mxfp4", "mxfp8"), shapes=GEMV_SHAPES, variants=GEMV_SHAPE_VARIANTS):
    """M = 1, bf16 activations: per shape, XLA bf16, a same-size read of each weight and the default decode
    config ("base") with the knobs of `variants` changed, each checked against the reference (fp32 out)
    before it is timed; a line per (shape, format): us and the fraction of the same-size read."""
    from jax_blockscale._triton import decode
    from jax_blockscale._triton.problem import GemmProblem

    xla = _XLA_BF16
    for n, k in shapes:
        xa = _activation("bf16", 1, k)
        ws = _weights("bf16", n, k, 0)
        print(f"## N={n} K={k}: XLA bf16 {kernel_us(xla, [(xa, w) for w in ws], torch):.2f} us", flush=True)
        del ws
        for fb in formats:
            ws = _weights(fb, n, k, 1)
            read = same_size_read_us(torch, n, _nbytes(ws[0]))
            p = GemmProblem(1, False, 1, n, k, "bf16", _KIND[fb], "bf16")
            base = decode.default_config(p, "sm_90")
            line = [f"{fb} read {read:.2f}"]
            for label, changes in variants["fp8" if fb == "mxfp8" else "fp4"]:
                cfg = base.replace(kernel="decode", **changes)
                try:
                    us, _ = _checked_us(p, xa, ws, cfg, torch)
                except Exception as e:  # noqa: BLE001 - an invalid or failing variant is a cell, not a stop
                    line.append(f"{label} {type(e).__name__}")
                    continue
                line.append(f"{label} WRONG" if us is None else f"{label} {us:.2f} ({read / us:.0%})")
            print("  " + " | ".join(line), flush=True)
            del ws


# --stream: how fast a Triton kernel streams an fp4 weight's bytes at all (no decode, no FMA), with the
# GEMV's tiles and others: (rows per program, 32-bit words of each row per tile, tl.range stages, warps).
STREAM_TILES = ((8, 256, 4, 4), (8, 512, 1, 8), (8, 512, 1, 4), (16, 128, 4, 4), (4, 512, 1, 4), (2, 512, 1, 2))


@functools.lru_cache(maxsize=None)
def _stream_kernel():
    """The stream kernel, built once (triton is imported only by the modes that launch it)."""
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(w_ptr, s_ptr, out_ptr, KW: tl.constexpr, SW: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_W: tl.constexpr, STAGES: tl.constexpr):
        """Row r's xor of its 32-bit code words and scale words: every byte read once, one op per word."""
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N, BLOCK_W), tl.int32)
        for kw in tl.range(0, KW, BLOCK_W, num_stages=STAGES):
            acc ^= tl.load(w_ptr + rows[:, None] * KW + (kw + tl.arange(0, BLOCK_W))[None, :])
        s = tl.load(s_ptr + rows[:, None] * SW + tl.arange(0, SW)[None, :])
        tl.store(out_ptr + rows, tl.xor_sum(acc, axis=1) ^ tl.xor_sum(s, axis=1))

    return stream_read


def stream_call(w32: jax.Array, s32: jax.Array, block_n: int, block_w: int, stages: int, warps: int):
    """(N,) int32 row xors of w32 (N, K/8) and s32 (N, K/128) int32 (an mxfp4 weight's bytes) by
    `_stream_kernel`; N % block_n == 0 and block_w divides K/8."""
    from jax_blockscale._triton import jt

    n, kw = w32.shape
    return jt.jax_triton().triton_call(
        w32, s32, kernel=_stream_kernel(), out_shape=jax.ShapeDtypeStruct((n,), jnp.int32), grid=(n // block_n,),
        num_warps=warps, num_stages=1, KW=kw, SW=s32.shape[1], BLOCK_N=block_n, BLOCK_W=block_w, STAGES=stages)


def stream(torch, shapes=((7168, 4096), (8192, 8192))):
    """M = 1, mxfp4: XLA's same-size read, the dispatched GEMV and the stream kernel at STREAM_TILES over the
    same bytes (checked against NumPy first): what the GEMV loses to its arithmetic, at its own tile and at
    the best streaming tile."""
    words = jax.jit(lambda v: jax.lax.bitcast_convert_type(v.reshape(v.shape[0], -1, 4), jnp.int32))
    for n, k in shapes:
        ws = _weights("mxfp4", n, k, 1)
        read = same_size_read_us(torch, n, _nbytes(ws[0]))
        xa = _activation("bf16", 1, k)
        gemv = kernel_us(jax.jit(lambda x, w: jb.matmul(x, w)), [(xa, w) for w in ws], torch)
        print(f"## mxfp4 N={n} K={k}: same-size read {read:.2f} us; dispatched GEMV {gemv:.2f} us "
              f"({read / gemv:.0%} of the read)", flush=True)
        pairs = [tuple(words(leaf) for leaf in sorted(jax.tree_util.tree_leaves(w), key=lambda a: -a.shape[1]))
                 for w in ws]
        want = np.bitwise_xor.reduce(np.asarray(pairs[0][0]), 1) ^ np.bitwise_xor.reduce(np.asarray(pairs[0][1]), 1)
        for tile in STREAM_TILES:
            if n % tile[0] or (k // 8) % tile[1]:
                continue
            fn = jax.jit(lambda w, s, t=tile: stream_call(w, s, *t))
            if not np.array_equal(np.asarray(fn(*pairs[0])), want):
                print(f"  stream {tile}: WRONG", flush=True)
                continue
            us = kernel_us(fn, pairs, torch)
            print(f"  stream rows {tile[0]}, {4 * tile[1]} bytes per row and tile, {tile[2]} stages, {tile[3]} warps: "
                  f"{us:.2f} us ({read / us:.0%} of the read)", flush=True)
        del ws, pairs


def gemv_l2(torch, shapes=((7168, 4096), (7168, 2048), (8192, 8192)), formats=("mxfp4", "nvfp4", "mxfp8")):
    """M = 1: the dispatched GEMV with 16 weights rotated (each read from HBM) and with one weight reused (after
    the first call it sits in the 50 MB L2: the GEMV's arithmetic and L2 reads alone), beside a same-size read:
    whether the GEMV's time is its HBM read, its arithmetic, or the two one after the other. Weights above 40 MB
    are skipped (they would not stay in L2)."""
    print(f"device {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'})")
    print("| weights | N x K | MB | same-size read | GEMV, 16 weights rotated | GEMV, one weight (L2) | "
          "rotated - L2 |")
    print("|---|---|---|---|---|---|---|")
    fn = jax.jit(lambda x, w: jb.matmul(x, w))
    for fmt in formats:
        for n, k in shapes:
            if n * k * (0.5 if fmt in ("mxfp4", "nvfp4") else 1) > 40e6:  # the codes alone: before building them
                continue
            ws, nb, read = _weights_and_read(torch, fmt, n, k)
            xa = _activation("bf16", 1, k)
            rotated = kernel_us(fn, [(xa, w) for w in ws], torch)
            resident = kernel_us(fn, [(xa, ws[0])], torch)
            print(f"| {fmt} | {n} x {k} | {nb / 1e6:.1f} | {read:.2f} | {rotated:.2f} | {resident:.2f} | "
                  f"{rotated - resident:.2f} |", flush=True)
            del ws


WGMMA_ROWS = (1, 2, 4, 8, 16)
WGMMA_PAIRS = (("bf16", "mxfp4"), ("bf16", "nvfp4"))


def _pair(text: str) -> tuple[str, str]:
    """"mxfp8:mxfp4" -> ("mxfp8", "mxfp4"): activation and weight formats."""
    fa, fb = text.split(":")
    for f in (fa, fb):
        if f not in _KIND:
            raise SystemExit(f"unknown format {f!r} in --pairs; choose from {sorted(_KIND)}")
    return fa, fb


def wgmma_table(torch, shapes, rows=WGMMA_ROWS, pairs=WGMMA_PAIRS):
    """(activation, weight) format pairs at 1-16 rows (default bf16 x fp4 weights): the Gluon decode kernel
    (`_triton/decode_wgmma.py`, its default config) against decode.py's tuned sm_90 config and XLA bf16,
    beside a same-size read of each weight; kernel time (CUPTI) with the wall clock per call beside it
    (`wall_us`: host launch gaps included). Every config is checked against the reference (fp32 output)
    before it is timed; the row's "dispatch" column says which one `jb.matmul` picks."""
    from jax_blockscale._triton import decode, decode_wgmma, upcast
    from jax_blockscale._triton.problem import GemmProblem

    ceiling = read_ceiling_gbs(torch)
    print(f"device: {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'}); "
          f"read ceiling {ceiling:.0f} GB/s\n")
    print("| N | K | x | weights | M | kernel | config | us | wall us | GB/s | % same-size read | vs XLA bf16 | dispatch | "
          "rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        bf16_ws = _weights("bf16", n, k, 0)
        xla_args = {m: [(_activation("bf16", m, k), w) for w in bf16_ws] for m in rows}
        xla_us = {m: kernel_us(_XLA_BF16, xla_args[m], torch) for m in rows}
        for m, us in xla_us.items():
            print(f"| {n} | {k} | bf16 | bf16 | {m} | XLA bf16 | - | {us:.2f} | {wall_us(_XLA_BF16, xla_args[m]):.2f} | "
                  f"{_nbytes(bf16_ws[0]) / us / 1e3:.0f} | | 1.00x | | |", flush=True)
        del bf16_ws
        for fb in dict.fromkeys(b for _, b in pairs):
            ws, nb, read_us = _weights_and_read(torch, fb, n, k)
            print(f"| {n} | {k} | - | {fb} | - | same-size read | {nb / 1e6:.1f} MB | {read_us:.2f} | | "
                  f"{nb / read_us / 1e3:.0f} | 100% | | | |", flush=True)
            for fa, m in ((fa, m) for fa, b in pairs if b == fb for m in rows):
                xa = _activation(fa, m, k)
                p = GemmProblem(1, False, m, n, k, _KIND[fa], _KIND[fb], "bf16")
                picked = jb.explain(xa, ws[0]).kernel
                base = decode_wgmma.default_config(p)
                candidates = [("decode", decode, decode.default_config(p, "sm_90").replace(kernel="decode")),
                              ("decode_wgmma", decode_wgmma, base)]
                if m > 16:  # where decode.py is opt-in: the upcast path is what dispatch would run instead
                    candidates.append(("upcast", upcast, upcast.default_config(p, "sm_90").replace(kernel="upcast")))
                for label, module, cfg in candidates:
                    desc = (f"n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} w{cfg.num_warps}"
                            + (" gemv" if cfg.gemv else "") + (" atomic" if cfg.atomic_split_k else ""))
                    try:
                        module.check_config(p, cfg)
                        err = _checked(xa, ws[0], cfg)
                        if not err < 1e-4:
                            print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | {desc} | WRONG | | | | | | {err:.1e} |")
                            continue
                        fn = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg))
                        us = kernel_us(fn, [(xa, w) for w in ws], torch)
                        wall = wall_us(fn, [(xa, w) for w in ws])
                    except Exception as e:  # noqa: BLE001 - a config that fails is a row, not a stop
                        print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | {desc} | {type(e).__name__}: {str(e)[:80]} |")
                        continue
                    mark = "yes" if label == picked else ""
                    print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | {desc} | {us:.2f} | {wall:.2f} | {nb / us / 1e3:.0f} | "
                          f"{100 * read_us / us:.0f}% | {xla_us[m] / us:.2f}x | {mark} | {err:.1e} |", flush=True)
            del ws


def wgmma_knob_configs(p) -> list[tuple[str, "TileConfig"]]:
    """decode_wgmma's default config for `p` (first) and its neighbours: the other ring depth (2 / 3
    stages), half and twice the K splits, the other chunk (128 / 256 codes), two warp groups (128 weight
    rows) at the default and half the splits; only those `check_config` accepts. What `default_config`'s
    stages and split rules were chosen from (sessions 16, 29 and 30)."""
    from jax_blockscale._triton import decode_wgmma

    base = decode_wgmma.default_config(p)
    other_chunk = 128 if base.block_k == 256 else 256
    cands = [base.replace(block_k=chunk, num_stages=stages, split_k=max(1, split))
             for chunk in (base.block_k, other_chunk) for stages in (base.num_stages, 5 - base.num_stages)
             for split in (base.split_k, base.split_k // 2, base.split_k * 2)]
    # two warp groups (128 weight rows per program: the staged activations serve twice the rows)
    cands += [base.replace(num_warps=8, block_n=128, split_k=max(1, split))
              for split in (base.split_k, base.split_k // 2)]
    out = []
    for cfg in cands:
        label = (("default " if cfg == base else "") + f"c{cfg.block_k} st{cfg.num_stages} sp{cfg.split_k}"
                 + (f" w{cfg.num_warps}" if cfg.num_warps != base.num_warps else ""))
        try:
            decode_wgmma.check_config(p, cfg)
        except ValueError:
            continue
        if all(c != cfg for _, c in out):
            out.append((label, cfg))
    return out


def wgmma_knobs(torch, shapes, rows, pairs, rounds: int = 2):
    """decode_wgmma at its default config and `wgmma_knob_configs`' neighbours, and what dispatch runs there,
    per format pair and row count: every config checked against the reference, then profiled in `rounds`
    interleaved rounds (XLA bf16 first, then each config once per round, so clock drift hits every row
    alike); kernel time is the median over rounds (CUPTI), the wall clock per call beside it."""
    import statistics

    from jax_blockscale._triton.problem import GemmProblem

    print(f"device: {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'}), median of "
          f"{rounds} interleaved rounds\n")
    print("| N | K | x | weights | M | config | us | rounds | wall us | % same-size read | vs XLA bf16 | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        bf16_ws = _weights("bf16", n, k, 0)
        for fb in dict.fromkeys(b for _, b in pairs):
            ws, nb, read_us = _weights_and_read(torch, fb, n, k)
            for fa, m in ((fa, m) for fa, b in pairs if b == fb for m in rows):
                xa = _activation(fa, m, k)
                xla_args = [(_activation("bf16", m, k), w) for w in bf16_ws]
                p = GemmProblem(1, False, m, n, k, _KIND[fa], _KIND[fb], "bf16")
                timed = []
                for label, cfg in wgmma_knob_configs(p):
                    err = _checked(xa, ws[0], cfg)
                    if not err < 1e-4:
                        print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | WRONG | | | | | {err:.1e} |")
                        continue
                    timed.append((label, jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg)), err))
                disp = jax.jit(lambda x, w: jb.matmul(x, w))
                timed.append((f"dispatch: {jb.explain(xa, ws[0]).kernel}", disp, _checked(xa, ws[0])))
                xla, us = [], {label: [] for label, _, _ in timed}
                for _ in range(rounds):
                    xla.append(kernel_us(_XLA_BF16, xla_args, torch))
                    for label, fn, _ in timed:
                        us[label].append(kernel_us(fn, [(xa, w) for w in ws], torch))
                xla_us = statistics.median(xla)
                print(f"| {n} | {k} | bf16 | bf16 | {m} | XLA bf16 | {xla_us:.2f} | "
                      f"{' / '.join(f'{t:.2f}' for t in xla)} | | | 1.00x | |", flush=True)
                for label, fn, err in timed:
                    t = statistics.median(us[label])
                    print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | {t:.2f} | "
                          f"{' / '.join(f'{v:.2f}' for v in us[label])} | {wall_us(fn, [(xa, w) for w in ws]):.2f} | "
                          f"{100 * read_us / t:.0f}% | {xla_us / t:.2f}x | {err:.1e} |", flush=True)
            del ws


FP8_ROWS = (1, 16, 64)
# Activation and weight formats --fp8 takes: block FP8 (baseline cuBLAS blockwise) and 8-bit MX on both sides
# (baseline XLA's bf16 dot).
FP8_PAIRS = (("fp8_block", "fp8_block"), ("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8"), ("mxfp8", "mxfp8_e5m2"))


def fp8_knob_configs(p, knobs: bool) -> list[tuple[str, "TileConfig"]]:
    """decode_fp8's default config for `p` (first) and, with `knobs`, its neighbours: other ring depths,
    program counts, K splits, fp32-atomic split-K; only those `check_config` accepts."""
    from jax_blockscale._triton import decode_fp8

    base = decode_fp8.default_config(p)
    out = [("decode_fp8 default " + _fp8_desc(base), base)]
    if knobs:
        cands = [base.replace(block_k=bk, num_stages=st, num_sms=264)
                 for bk, st in ((128, 6), (256, 3), (256, 4), (512, 2), (512, 3))]
        cands += [base.replace(split_k=2), base.replace(split_k=4), base.replace(block_k=256, num_stages=3, split_k=4),
                  base.replace(num_sms=base.num_sms // 2), base.replace(block_m=8)]
        # deeper rings on one program per SM (where the tiles number fewer than the SMs, the second is idle)
        cands += [base.replace(block_k=bk, num_stages=st, num_sms=132)
                  for bk, st in ((256, 5), (256, 6), (512, 3), (512, 4), (512, 5))]
        for cfg in cands:
            try:
                decode_fp8.check_config(p, cfg)
            except ValueError:
                continue
            if all(c != cfg for _, c in out):
                out.append(("decode_fp8 " + _fp8_desc(cfg), cfg))
    return out


def _fp8_desc(cfg) -> str:
    return (f"m{cfg.block_m} k{cfg.block_k} st{cfg.num_stages} sp{cfg.split_k} p{cfg.num_sms}"
            + (" atomic" if cfg.atomic_split_k else ""))


def previous_path(p, target: str = "sm_90") -> tuple[str, "TileConfig"]:
    """(kernel, config) that dispatch chose for `p` before decode_fp8 took its pair: the first other entry of
    the sm_90 table that holds it, with the config a launch would select (device table or heuristic)."""
    import importlib

    from jax_blockscale import backends
    from jax_blockscale._triton import configs

    rows = p.batch * p.m
    for entry in backends.KERNEL_TABLE[target]:
        if entry.module == "decode_fp8" or (p.a_kind, p.b_kind) not in entry.pairs:
            continue
        if backends._size_allows(entry, rows, p.n, p.k):
            mod = importlib.import_module(f"jax_blockscale._triton.{entry.module}")
            cfg = configs.select(entry.module, mod, p, target, jax.devices()[0].device_kind)
            return entry.module, cfg.replace(kernel=entry.module)
    raise ValueError(f"no other sm_90 kernel for {p.a_kind} x {p.b_kind} at {rows} rows")


# --fp8-knobs at one row: other GEMV tiles for block FP8 rows, (block_n, block_k or None for all of K, warps, stages)
BLOCK_GEMV_KNOB_TILES = ((8, None, 8, 2), (16, 1024, 4, 3), (8, 2048, 8, 2), (16, 2048, 8, 2), (32, 512, 4, 3),
                         (8, 1024, 4, 4))


def block_gemv_configs(p, knobs: bool = False) -> list[tuple[str, "TileConfig"]]:
    """At <= 2 rows of block FP8 x block FP8: decode.py's one-row default config (the GEMV on its block FP8 tile,
    `gemv_tiles.BLOCK_FP8_GEMV_TILES`), the activation rows in one program; labelled "default" where it is what
    dispatch runs (the dispatch column). `knobs` (one row): also the other tiles of `BLOCK_GEMV_KNOB_TILES` whose K
    tile divides K and that leave N a program per SM."""
    import dataclasses

    from jax_blockscale._triton import decode, gemv_tiles

    rows = p.batch * p.m
    if rows > 2 or not gemv_tiles.tile_fields(gemv_tiles.BLOCK_FP8_GEMV_TILES, 1, p.n, p.k):
        return []
    one_row = decode.default_config(dataclasses.replace(p, batch=1, m=1), "sm_90").replace(kernel="decode")
    tiles = [{}]
    if knobs and rows == 1:
        tiles += [dict(block_n=bn, block_k=bk or p.k, num_warps=w, num_stages=st)
                  for bn, bk, w, st in BLOCK_GEMV_KNOB_TILES
                  if p.k % (bk or p.k) == 0 and p.n // bn >= gemv_tiles.HOPPER_SMS]
    out = []
    for fields in tiles:
        cfg = one_row.replace(block_m=1 << (rows - 1).bit_length(), **fields)
        if all(c != cfg for _, c in out):
            mark = "default " if rows == 1 and cfg == one_row else ""
            out.append((f"decode {mark}GEMV n{cfg.block_n} k{cfg.block_k} w{cfg.num_warps} st{cfg.num_stages}", cfg))
    return out


def fp8_table(torch, shapes, rows=FP8_ROWS, knobs: bool = False, rounds: int = 2, pairs=FP8_PAIRS[:1]):
    """8-bit weights whose codes an fp8 wgmma multiplies as they are: block FP8 x block FP8 (1 x 128 fp8
    activations) and 8-bit MX on both sides. The Gluon fp8 decode kernel (`_triton/decode_fp8.py`) against
    the kernel dispatch took before it (block FP8: the swapped Triton block_fp8 kernel; MX: decode.py or
    upcast), the baseline (block FP8: cuBLAS blockwise, torch `F.scaled_mm`; MX: XLA's bf16 dot on bf16
    weights of the same shape) and a same-size read of the weight's value and scale bytes, per shape and row
    count. Every config is checked against the reference (fp32 output) first; the kernels are profiled in
    `rounds` interleaved rounds (median kernel time, CUPTI), the wall clock per call beside it. `knobs`:
    decode_fp8's neighbouring configs too."""
    import statistics

    from jax_blockscale._triton import block_fp8
    from jax_blockscale._triton.problem import GemmProblem

    print(f"device: {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'}), median of "
          f"{rounds} interleaved rounds\n")
    print("| x | w | N | K | M | kernel | us | rounds | wall us | GB/s | % same-size read | vs baseline | "
          "vs previous | dispatch | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        bf16_ws = None
        for fa, fb in pairs:
            block = fb == "fp8_block"
            ws, nb, read_us = _weights_and_read(torch, fb, n, k)
            head = f"| {fa} | {fb} | {n} | {k}"
            print(f"{head} | - | same-size read ({nb / 1e6:.1f} MB) | {read_us:.2f} | | | {nb / read_us / 1e3:.0f} | "
                  f"100% | | | | |", flush=True)
            for m in rows:
                xa = _activation(fa, m, k)
                p = GemmProblem(1, False, m, n, k, _KIND[fa], _KIND[fb], "bf16")
                if block:
                    base_label = "cuBLAS blockwise"
                    base = _cublas_blockwise_us(torch, xa, ws) if torch is not None else None
                    old = block_fp8.default_config(p, "sm_90").replace(kernel="block_fp8")
                    prev = [(f"block_fp8 swapped sp{old.split_k}", old)] + block_gemv_configs(p, knobs)
                else:
                    base_label = "XLA bf16"
                    if bf16_ws is None:
                        bf16_ws = _weights("bf16", n, k, 0)
                    xb = _activation("bf16", m, k)
                    base = kernel_us(_XLA_BF16, [(xb, w) for w in bf16_ws], torch)
                    kern, cfg = previous_path(p)
                    prev = [(f"{kern} (previous dispatch)", cfg)]
                print(f"{head} | {m} | {base_label} | {base or float('nan'):.2f} | | | | "
                      f"{100 * read_us / base if base else float('nan'):.0f}% | 1.00x | | | |", flush=True)
                picked = jb.explain(xa, ws[0]).kernel
                configs = prev + fp8_knob_configs(p, knobs)
                timed = []
                for label, cfg in configs:
                    try:
                        err = _checked(xa, ws[0], cfg)
                    except Exception as e:  # noqa: BLE001 - a config that fails is a row, not a stop
                        print(f"{head} | {m} | {label} | {type(e).__name__}: {str(e)[:100]} |", flush=True)
                        continue
                    if not err < 2e-3:  # fp8 wgmma accumulates with truncation (block_fp8.py): ~1e-4
                        print(f"{head} | {m} | {label} | WRONG | | | | | | | | | {err:.1e} |", flush=True)
                        continue
                    timed.append((label, cfg, jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg)), err))
                us = {label: [] for label, *_ in timed}
                for _ in range(rounds):
                    for label, _, fn, _ in timed:
                        us[label].append(kernel_us(fn, [(xa, w) for w in ws], torch))
                t_prev = statistics.median(us[timed[0][0]]) if timed and timed[0][0] == prev[0][0] else None
                for label, cfg, fn, err in timed:
                    t = statistics.median(us[label])
                    mark = "yes" if cfg.kernel == picked and label.startswith(f"{picked} default") else ""
                    print(f"{head} | {m} | {label} | {t:.2f} | {' / '.join(f'{v:.2f}' for v in us[label])} | "
                          f"{wall_us(fn, [(xa, w) for w in ws]):.2f} | {nb / t / 1e3:.0f} | {100 * read_us / t:.0f}% | "
                          f"{base / t if base else float('nan'):.2f}x | "
                          f"{t_prev / t if t_prev else float('nan'):.2f}x | {mark} | {err:.1e} |", flush=True)
            del ws
        del bf16_ws


# --bf16-block: bf16 activations x block FP8 (128 x 128) weights, decode.py's kernel at its default config and these
# changes of it (label, rows it applies to, TileConfig fields), against what dispatch runs and XLA's bf16 dot.
BF16_BLOCK_ROWS = (1, 2, 4, 16, 64, 256)
BF16_BLOCK_VARIANTS = (
    ("gemv 8-bit tile", lambda m: m <= 4, lambda p: dict(_fp8_gemv_tile_fields(p))),
    ("gemv n16 k1024 w4 st3", lambda m: m <= 4, lambda p: dict(block_n=16, block_k=1024, num_warps=4, num_stages=3,
                                                             split_k=1)),
    ("mma n32", lambda m: 4 < m <= 64, lambda p: dict(block_n=32)),
    ("mma n128 w8", lambda m: 4 < m <= 64, lambda p: dict(block_n=128, num_warps=8)),
)


def _fp8_gemv_tile_fields(p) -> dict:
    """The 8-bit MX weights' GEMV tile for `p` (gemv_tiles.FP8_GEMV_TILES), or whole 2048-code rows on 8 warps."""
    from jax_blockscale._triton import gemv_tiles

    tile = gemv_tiles.tile_fields(gemv_tiles.FP8_GEMV_TILES, p.batch * p.m, p.n, p.k)
    return dict(tile, split_k=1) if tile else dict(block_n=8, block_k=2048, num_warps=8, num_stages=2, split_k=1)


def bf16_block_table(torch, shapes, rows=BF16_BLOCK_ROWS, compare: bool = True):
    """bf16 activations x block FP8 weights (DeepSeek's 128 x 128 tiles): `dense_x_block_fp8` (block_fp8.py's
    kernel on 16-bit activations) at every row count, and at <= 64 rows decode.py's kernel (GEMV at <= 4 rows,
    swapped MMA above; per-128-K scales applied in fp32) at its default config and BF16_BLOCK_VARIANTS, against
    what `jb.matmul` dispatches and XLA's bf16 dot on bf16 weights of the same shape (what the user would run
    without quantizing) and the jnp reference (what dispatch ran for this pair before session 40), beside a
    same-size read. Every config is checked against the reference (fp32 out). `compare=False` (--quick): the
    baselines and dispatch only."""
    from jax_blockscale._triton import decode, dense_x_block_fp8
    from jax_blockscale._triton.problem import GemmProblem

    ceiling = read_ceiling_gbs(torch)
    print(_device_line(torch, *shapes[0], ceiling) + "\n")
    print("| N | K | M | path | config | us | wall us | % same-size read | vs XLA bf16 | vs dispatch | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    mm = jax.jit(lambda x, w: jb.matmul(x, w))
    ref = jax.jit(lambda x, w: jb.reference.matmul(x, w, out_dtype=jnp.bfloat16))
    for n, k in shapes:
        bf16_ws = _weights("bf16", n, k, 0)
        ws, nb, read_us = _weights_and_read(torch, "fp8_block", n, k)
        for m in rows:
            xa = _activation("bf16", m, k)
            args = [(xa, w) for w in ws]
            base = kernel_us(_XLA_BF16, [(xa, w) for w in bf16_ws], torch)
            print(f"| {n} | {k} | {m} | XLA bf16 | - | {base:.2f} | | | 1.00x | | |", flush=True)
            before = kernel_us(ref, args, torch)
            print(f"| {n} | {k} | {m} | jnp reference (before) | fp32 HIGHEST | {before:.2f} | | "
                  f"{100 * read_us / before:.0f}% | {base / before:.2f}x | | |", flush=True)
            disp = kernel_us(mm, args, torch)
            print(f"| {n} | {k} | {m} | dispatch: {jb.explain(xa, ws[0]).path} {jb.explain(xa, ws[0]).kernel} | - | "
                  f"{disp:.2f} | {wall_us(mm, args):.2f} | {100 * read_us / disp:.0f}% | {base / disp:.2f}x | 1.00x | "
                  f"{_checked(xa, ws[0]):.1e} |", flush=True)
            if not compare:
                continue
            p = GemmProblem(1, False, m, n, k, "bf16", "block_fp8", "bf16")
            dense_x = dense_x_block_fp8.default_config(p, "sm_90").replace(kernel="dense_x_block_fp8")
            candidates = [("dense_x_block_fp8 default", dense_x)]
            if m > 64:
                candidates.append(("dense_x_block_fp8 unswapped", dense_x.replace(swap_ab=False, split_k=1)))
                candidates.append(("dense_x_block_fp8 st4", dense_x.replace(num_stages=4)))
                candidates.append(("dense_x_block_fp8 widened first", dense_x.replace(widen_first=True)))
                candidates.append(("dense_x_block_fp8 widened first, unswapped",
                                   dense_x.replace(widen_first=True, swap_ab=False, split_k=1)))
            else:
                default = decode.default_config(p, "sm_90").replace(kernel="decode")
                candidates += [("decode default", default)] + [
                    (label, default.replace(**changes(p))) for label, applies, changes in BF16_BLOCK_VARIANTS
                    if applies(m)]
            for label, cfg in candidates:
                desc = (f"m{cfg.block_m} n{cfg.block_n} k{cfg.block_k} s{cfg.split_k} w{cfg.num_warps} "
                        f"st{cfg.num_stages}" + (" gemv" if cfg.gemv else "") + (" swap" if cfg.swap_ab else "")
                        + (" widen" if cfg.widen_first else ""))
                try:
                    us, err = _checked_us(p, xa, ws, cfg, torch)
                except Exception as e:  # noqa: BLE001 - a config that fails is a row, not a stop
                    print(f"| {n} | {k} | {m} | {label} | {desc} | {type(e).__name__}: {str(e)[:80]} |", flush=True)
                    continue
                if us is None:
                    print(f"| {n} | {k} | {m} | {label} | {desc} | WRONG | | | | | {err:.1e} |", flush=True)
                    continue
                fn = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg))
                print(f"| {n} | {k} | {m} | {label} | {desc} | {us:.2f} | {wall_us(fn, args):.2f} | "
                      f"{100 * read_us / us:.0f}% | {base / us:.2f}x | {disp / us:.2f}x | {err:.1e} |", flush=True)
        del bf16_ws, ws


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gemv-decode", action="store_true", help="the GEMV's fp4 decode variants vs the tuned config")
    ap.add_argument("--mma16", action="store_true", help="the MMA variants vs the tuned config at M = 8, 16")
    ap.add_argument("--gemv-shapes", action="store_true", help="M=1 GEMV per shape vs a same-size read")
    ap.add_argument("--stream", action="store_true", help="M=1 mxfp4: the GEMV vs streaming its bytes only")
    ap.add_argument("--l2", action="store_true", help="M=1: the GEMV with its weight in L2 vs from HBM")
    ap.add_argument("--wgmma", action="store_true", help="decode_wgmma vs decode.py (and upcast above 16 "
                    "rows) per format pair, 1-16 rows unless --rows")
    ap.add_argument("--wgmma-knobs", action="store_true",
                    help="decode_wgmma's default config against its neighbours (stages, splits, chunk, warps)")
    ap.add_argument("--fp8", action="store_true",
                    help="block FP8 weights: decode_fp8 vs the swapped block_fp8 kernel and cuBLAS blockwise")
    ap.add_argument("--fp8-knobs", action="store_true", help="--fp8 with decode_fp8's neighbouring configs")
    ap.add_argument("--bf16-block", action="store_true",
                    help="bf16 activations x block FP8 weights: the kernels vs XLA bf16 and the jnp reference")
    ap.add_argument("--rounds", type=int, default=2, help="--wgmma-knobs, --fp8: interleaved rounds per config")
    ap.add_argument("--pairs", default=None, help="--wgmma(-knobs), --fp8: x:w format pairs, e.g. "
                    "bf16:mxfp8,mxfp8:mxfp4 (default bf16:mxfp4,bf16:nvfp4; --fp8: fp8_block:fp8_block)")
    ap.add_argument("--rows", default=None, help="--wgmma: activation rows, e.g. 2,16,32 (default 1,2,4,8,16; "
                    "--wgmma-knobs: 16)")
    ap.add_argument("--shapes", default=None, help="NxK,NxK,... (--wgmma(-knobs); default: every issue shape)")
    ap.add_argument("--time-budget", type=float, default=270.0, help="seconds for --variants (all formats and M)")
    args = ap.parse_args(argv)
    if jax.default_backend() != "gpu":
        raise SystemExit("benchmarks.decode needs a GPU")
    torch = _torch()
    if args.bf16_block:
        shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES)
        bf16_block_table(torch, shapes, tuple(int(r) for r in args.rows.split(",")) if args.rows else BF16_BLOCK_ROWS,
                         compare=not args.quick)
    elif args.fp8 or args.fp8_knobs:
        shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES)
        pairs = tuple(_pair(t) for t in args.pairs.split(",")) if args.pairs else FP8_PAIRS[:1]
        fp8_table(torch, shapes, tuple(int(r) for r in args.rows.split(",")) if args.rows else FP8_ROWS,
                  knobs=args.fp8_knobs, rounds=args.rounds, pairs=pairs)
    elif args.wgmma or args.wgmma_knobs:
        shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")] if args.shapes else SHAPES)
        pairs = tuple(_pair(t) for t in args.pairs.split(",")) if args.pairs else WGMMA_PAIRS
        if args.wgmma_knobs:
            wgmma_knobs(torch, shapes, tuple(int(r) for r in args.rows.split(",")) if args.rows else (16,), pairs,
                        args.rounds)
        else:
            wgmma_table(torch, shapes, tuple(int(r) for r in args.rows.split(",")) if args.rows else WGMMA_ROWS,
                        pairs)
    elif args.gemv_shapes:
        gemv_shapes(torch)
    elif args.stream:
        stream(torch)
    elif args.l2:
        gemv_l2(torch)
    elif args.gemv_decode:
        gemv_decode(torch)
    elif args.mma16:
        mma16(torch)
    elif args.variants:
        variants(torch, time_budget=args.time_budget)
    else:
        table([(7168, 4096)] if args.quick else SHAPES, ROWS, torch)


if __name__ == "__main__":
    main()
