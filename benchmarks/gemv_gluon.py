"""An experiment: the one-row fp4 GEMV in Gluon, activations loaded in the weight's layout.

    python -m benchmarks.gemv_gluon                                    # 7168x4096, 8192x8192; mxfp4, nvfp4
    python -m benchmarks.gemv_gluon --configs r4:w2:g4,r2:w4:g2 --shapes 7168x4096

Why (issue #12, M = 1; `benchmarks/gemv_controls.py`): the Triton GEMV (`decode.gemv_kernel`) spends 4.40
SASS instructions per weight element and takes 8.76 us at 7168 x 4096 mxfp4 where streaming the same bytes
takes 6.5. Without its activations it ran 7.65 us. Triton loads the activation row in its own layout and
moves it through shared memory twice (two `convert_layout`s of the 4096-element row) to meet the weight
tile's layout, and each thread converts 32 bf16 activations for every 32 weight codes it holds (one row per
thread). Here the layouts are explicit:

- The weight tile (R rows, CG groups, one 16-byte vector per group or group pair) sits RT rows x one 16-byte
  vector per thread: a thread's RT rows share their K positions, so the activations it loads (its groups'
  32 bf16, four 16-byte loads, an L1 hit for all but the first warp) serve RT rows.
- The activations are loaded straight into the slice of that layout: no shared memory.
- The decode is the GEMV's (`decode._FP4_F32_PTX`, fp4 -> e4m3 bytes -> fp16 -> fp32, 2**-6 times the value);
  each group's dot product is multiplied by 2**6 and the group's scale, as there.
- K is walked in steps of CG groups (all of K in one step where the warps cover it), no split.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import launch as scratch  # noqa: E402
from jax_blockscale._triton.decode import _fp4_f32_ptx, tensor_scale_operands  # noqa: E402
from jax_blockscale._triton.problem import NVFP4  # noqa: E402

KINDS = {"mxfp4": "e2m1", "nvfp4": NVFP4}
_F32_PTX = gl.constexpr(_fp4_f32_ptx())
DEFAULT_CONFIGS = "r4:w2:g4,r2:w2:g4,r4:w1:g8,r8:w1:g4,r2:w4:g2,r4:w2:g2"


@gluon.jit
def _scales_f32(raw, W_KIND: gl.constexpr):
    """Raw group scales -> fp32: e8m0 codes (0 -> 2**-127, 0xFF -> NaN) or e4m3 values."""
    if W_KIND == "nvfp4":
        return raw.to(gl.float32)
    c = raw.to(gl.int32)
    bits = gl.where(c == 0, 0x00400000, gl.where(c == 255, 0x7FC00000, c << 23))
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def gemv_gluon_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
                      N: gl.constexpr, K: gl.constexpr, W_KIND: gl.constexpr, RT: gl.constexpr,
                      WR: gl.constexpr, WG: gl.constexpr, WIDE: gl.constexpr):
    """out (1, N) = a_ts * b_ts * x (1, K) bf16 . decode(w (N, K/2), s (N, K/GROUP))^T; grid (cdiv(N, RT*WR),),
    RT * WR rows per program, WR * WG warps."""
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    BPG: gl.constexpr = GROUP // 2          # bytes per group
    GPT: gl.constexpr = 16 // BPG           # groups per thread: one 16-byte vector
    R: gl.constexpr = RT * WR
    CG: gl.constexpr = 32 * WG * GPT        # groups per K step
    STEPS: gl.constexpr = K // GROUP // CG
    # (rows, groups, bytes): RT rows x one 16-byte vector per thread, lanes along the groups
    L3: gl.constexpr = gl.BlockedLayout([RT, GPT, BPG], [1, 32, 1], [WR, WG, 1], [2, 1, 0])
    # (rows, groups, activations): the same threads, the group's 2 * BPG activations
    LX: gl.constexpr = gl.BlockedLayout([RT, GPT, GROUP], [1, 32, 1], [WR, WG, 1], [2, 1, 0])
    SL: gl.constexpr = gl.SliceLayout(2, L3)   # (rows, groups)
    XL: gl.constexpr = gl.SliceLayout(0, LX)   # (groups, activations), shared by a thread's RT rows
    WL: gl.constexpr = gl.SliceLayout(0, L3)   # (groups, bytes)

    pid = gl.program_id(0)
    rows = pid * R + gl.arange(0, R, layout=gl.SliceLayout(1, SL))
    live = rows < N
    rows = gl.minimum(rows, N - 1)
    if WIDE:
        rows = rows.to(gl.int64)
    g2 = gl.arange(0, CG, layout=gl.SliceLayout(0, SL))
    b3 = gl.arange(0, BPG, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    r3 = rows[:, None, None]
    w_offs = r3 * (K // 2) + (g2[None, :, None] * BPG + b3[None, None, :])
    s_offs = rows[:, None] * (K // GROUP) + g2[None, :]
    gx = gl.arange(0, CG, layout=gl.SliceLayout(1, XL))
    ex = gl.arange(0, GROUP, layout=gl.SliceLayout(0, XL))
    x_offs = gx[:, None] * GROUP + ex[None, :]

    acc = gl.zeros([R, CG], gl.float32, SL)
    for step in range(STEPS):
        codes = gl.load(w_ptr + w_offs + step * (CG * BPG))
        raw_s = gl.load(s_ptr + s_offs + step * CG)
        x = gl.load(x_ptr + x_offs + step * (CG * GROUP)).to(gl.float32)
        x_lo, x_hi = gl.split(gl.reshape(x, [CG, BPG, 2]))
        x_lo = gl.convert_layout(x_lo, WL)
        x_hi = gl.convert_layout(x_hi, WL)
        w_lo, w_hi = gl.inline_asm_elementwise(_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [codes],
                                               dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
        # two FMA chains per group (a sum of the summed products would add an FADD per pair)
        part = gl.sum(w_lo * x_lo[None, :, :], axis=2) + gl.sum(w_hi * x_hi[None, :, :], axis=2)
        acc += (part * 64.0) * _scales_f32(raw_s, W_KIND)
    total = gl.sum(acc, axis=1) * (gl.load(a_ts_ptr) * gl.load(b_ts_ptr))
    out_rows = pid * R + gl.arange(0, R, layout=gl.SliceLayout(1, SL))
    gl.store(out_ptr + out_rows, total.to(out_ptr.dtype.element_ty), mask=live)


def parse_config(spec: str) -> dict:
    """'r4:w2:g4' -> 4 rows per thread, 2 warps along rows, 4 warps along K (8 warps, 8 rows per program)."""
    v = {t[0]: int(t[1:]) for t in spec.split(":")}
    return dict(RT=v["r"], WR=v["w"], WG=v["g"])


def check(n: int, k: int, fmt: str, cfg: dict) -> None:
    group = 16 if fmt == "nvfp4" else 32
    step = 32 * cfg["WG"] * (16 // (group // 2)) * group
    if k % step:
        raise ValueError(f"K ({k}) must be a multiple of {step} (32 lanes x {cfg['WG']} warps of 16-byte vectors)")
    if cfg["WR"] * cfg["WG"] not in (1, 2, 4, 8, 16):
        raise ValueError("WR * WG warps must be a power of two <= 16")


def launch(x: jax.Array, w, cfg: dict, out_dtype=jnp.bfloat16) -> jax.Array:
    """x (1, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (1, N)."""
    (_, k), (n, _) = x.shape, w.shape
    check(n, k, w.fmt.name, cfg)
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)
    rows = cfg["RT"] * cfg["WR"]
    return scratch.scratch_call(
        gemv_gluon_kernel, w.values, w.scales, x, a_ts, b_ts,
        out_shape=jax.ShapeDtypeStruct((1, n), out_dtype), grid=(triton.cdiv(n, rows),),
        num_warps=cfg["WR"] * cfg["WG"], num_stages=1, compute_capability=90,
        name=f"gemv_gluon_{KINDS[w.fmt.name]}", N=n, K=k, W_KIND=KINDS[w.fmt.name], WIDE=n * (k // 2) >= 2**31,
        **cfg)


def main(argv=None) -> None:
    from . import decode as bd

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="7168x4096,8192x8192,7168x2048,28672x8192")
    ap.add_argument("--formats", default="mxfp4,nvfp4")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS)
    a = ap.parse_args(argv)
    torch = bd._torch()
    print(f"device {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'})")
    print("| format | N x K | kernel | us | % same-size read | vs XLA bf16 | vs dispatch | rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for fmt in a.formats.split(","):
        for n, k in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
            ws, read, dense = bd.experiment_weights(torch, fmt, n, k)
            x = jax.random.normal(jax.random.key(7), (1, k), jnp.float32).astype(jnp.bfloat16)
            xla, disp, ref = bd.experiment_baselines(torch, x, ws, dense)
            row = f"| {fmt} | {n}x{k} |"
            print(f"{row} XLA bf16 | {xla:.2f} | | 1.00x | | |")
            print(f"{row} dispatch: {jb.explain(x, ws[0], rows=1).kernel} | {disp:.2f} | {read / disp:.0%} | "
                  f"{xla / disp:.2f}x | 1.00x | |", flush=True)
            for spec in a.configs.split(","):
                cfg = parse_config(spec)
                try:
                    check(n, k, fmt, cfg)
                except ValueError as e:
                    print(f"{row} {spec} | refused: {e} | | | | |")
                    continue
                out = np.asarray(jax.jit(lambda x, w: launch(x, w, cfg, jnp.float32))(x, ws[0]), np.float64)
                err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                if not err < 1e-5:
                    print(f"{row} {spec} | wrong | | | | {err:.1e} |", flush=True)
                    continue
                us = bd.kernel_us(jax.jit(lambda x, w: launch(x, w, cfg)), [(x, w) for w in ws], torch)
                print(f"{row} {spec} | {us:.2f} | {read / us:.0%} | {xla / us:.2f}x | {disp / us:.2f}x | {err:.1e} |",
                      flush=True)
            del ws, dense


if __name__ == "__main__":
    main()
