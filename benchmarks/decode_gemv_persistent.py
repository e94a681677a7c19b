"""An experiment: the one-row fp4 GEMV as persistent programs whose weight tiles stream through Triton's
software pipeline (issue #12, M = 1).

    python -m benchmarks.decode_gemv_persistent                          # 7168x4096, 7168x2048, 8192x8192; mxfp4
    python -m benchmarks.decode_gemv_persistent --configs n8:k4096:w8:s3:p2,n8:k2048:w4:s4:p4
    python -m benchmarks.decode_gemv_persistent --sass                   # CPU: SASS per weight element

The question. `decode.gemv_kernel` at one row gives each program one tile (8 rows x all of K at K = 4096): it
loads the tile, then decodes and multiplies it, and the next tile's loads wait for another program to start.
On an H200 its 896 programs at 7168 x 4096 run as 1.7 waves of 528 (4 per SM), and within a wave the loads and
the arithmetic of a program follow each other. A structure whose loads run ahead of its arithmetic would take
about the larger of the two (a same-size read 5.1 us; the arithmetic ~4.4 us at full issue) instead of their sum.
Session 39's persistent TMA ring had that overlap but a consumer of 5.8-6.7 SASS instructions per code, and
session 38's register prefetch doubled the registers; here the arithmetic is the GEMV's own (`gemv_tile`, the
same 16-byte loads through shared memory as the dispatched config's cp.async), and the ring is Triton's
pipeliner over a flattened loop of (row tile, K tile) steps, as in Triton's persistent matmul tutorial.

The kernel (`gemv_persistent_kernel`): P programs per SM, each taking row tiles pid, pid + grid, ...; the loop
runs over its row tiles' K tiles with `tl.range(num_stages=S)` (S - 1 tiles in flight ahead of the arithmetic);
per-group partial sums as the GEMV's, reduced, scaled and stored at each row tile's last K tile. `:x` (HOIST_X, one
K tile): the activations loaded and widened once per program (4.80 -> 4.36 SASS per weight element in the loop).

Result (H200, 2026-12-02, session 40, `benchmarks/results/decode_gemv_experiments_h200_2026-12-02_session40.md`): not
adopted. Correct on every shape (relative error 6e-8), and slower than the dispatched GEMV on all of them: 7168 x 4096
mxfp4 8.98-10.71 us against 8.38 (best n4:k4096:w4:s4:p4:x, 0.93x), 7168 x 2048 6.01 against 5.02, 8192 x 8192 16.44
against 14.86. Overlapping a program's next tiles' loads with its arithmetic did not pay: the one-shot tiles'
programs already overlap each other's.
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")  # torch (CUPTI) shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import jt  # noqa: E402
from jax_blockscale._triton.decode import (_FP4_F32_PTX, _FP4_F32_UNSCALE, gemv_tile, gemv_weight_tile,  # noqa: E402
                                           gemv_x_row, tensor_scale_operands)
from jax_blockscale._triton.problem import NVFP4  # noqa: E402
from jax_blockscale._triton.upcast import scales_to_f32  # noqa: E402

KINDS = {"mxfp4": "e2m1", "nvfp4": NVFP4}
SMS = 132
DEFAULT_CONFIGS = "n8:k4096:w8:s2:p2,n8:k4096:w8:s3:p1,n8:k2048:w4:s4:p2,n8:k1024:w4:s6:p2,n16:k1024:w4:s4:p2"


@triton.jit
def _tile_dot(acc, codes, raw_s, x_lo, x_hi, W_KIND: tl.constexpr):
    """`decode.gemv_tile` at one row (the e4m3-route fp4 decode) with the activations given, split into the
    low and high nibbles' (G, BPG) fp32 values."""
    w_lo, w_hi = tl.inline_asm_elementwise(_FP4_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [codes],
                                           dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    part = tl.sum(w_lo * x_lo[None, :, :], axis=2) + tl.sum(w_hi * x_hi[None, :, :], axis=2)
    return acc + (part * _FP4_F32_UNSCALE) * scales_to_f32(raw_s, W_KIND)


@triton.jit
def gemv_persistent_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
                           N: tl.constexpr, K: tl.constexpr, W_KIND: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, WIDE: tl.constexpr,
                           HOIST_X: tl.constexpr = False):
    """out (1, N) = a_ts * b_ts * x (1, K) bf16 @ decode(w (N, K / 2), s).T. Grid (P,): program pid takes row
    tiles pid, pid + P, ... of BLOCK_N rows, each in K / BLOCK_K steps of the flattened, pipelined loop.
    HOIST_X (one K tile, BLOCK_K == K): the activations are loaded and widened once per program, not per tile."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    GROUP: tl.constexpr = 16 if W_KIND == "nvfp4" else 32
    K_TILES: tl.constexpr = K // BLOCK_K
    N_TILES: tl.constexpr = (N + BLOCK_N - 1) // BLOCK_N
    steps = (N_TILES - pid + nprog - 1) // nprog * K_TILES
    alpha = tl.load(a_ts_ptr) * tl.load(b_ts_ptr)
    acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP), dtype=tl.float32)
    if HOIST_X:
        tl.static_assert(K_TILES == 1, "HOIST_X holds all of K: BLOCK_K must be K")
        x_lo, x_hi = tl.split(tl.reshape(gemv_x_row(x_ptr, x_ptr, 0, 0, K, "bf16", K), (K // GROUP, GROUP // 2, 2)))
    for i in tl.range(0, steps, num_stages=NUM_STAGES):
        tile = pid + (i // K_TILES) * nprog
        kt = i % K_TILES
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        rows = offs_n % N   # rows past N read a valid row; the store mask drops them
        if WIDE:
            rows = rows.to(tl.int64)
        codes, raw_s = gemv_weight_tile(w_ptr, s_ptr, rows, kt * BLOCK_K, K, W_KIND, BLOCK_K)
        if HOIST_X:
            acc = _tile_dot(acc, codes, raw_s, x_lo, x_hi, W_KIND)
        else:
            acc = gemv_tile(acc, codes, raw_s, x_ptr, x_ptr, kt * BLOCK_K, 1, K, W_KIND, "bf16", BLOCK_K, True, True)
        if kt == K_TILES - 1:
            tl.store(out_ptr + offs_n, (tl.sum(acc, axis=1) * alpha).to(out_ptr.dtype.element_ty), mask=offs_n < N)
            acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP), dtype=tl.float32)


def parse_config(spec: str) -> dict:
    """'n8:k4096:w8:s3:p2' -> 8 rows x 4096 codes per step, 8 warps, 3 pipeline stages, 2 programs per SM."""
    m = re.fullmatch(r"n(\d+):k(\d+):w(\d+):s(\d+):p(\d+)(:x)?", spec)
    if m is None:
        raise ValueError(f"config {spec!r}: expected nN:kK:wW:sS:pP[:x], e.g. n8:k4096:w8:s3:p2")
    cfg = dict(zip(("block_n", "block_k", "warps", "stages", "per_sm"), (int(v) for v in m.groups()[:5])))
    return dict(cfg, hoist_x=m.group(6) is not None)


def describe(cfg: dict) -> str:
    return "n{block_n}:k{block_k}:w{warps}:s{stages}:p{per_sm}".format(**cfg) + (":x" if cfg["hoist_x"] else "")


def check(rows: int, n: int, k: int, cfg: dict) -> None:
    """Refuses what the kernel cannot take, before anything compiles."""
    if rows != 1:
        raise ValueError(f"the persistent GEMV takes one activation row, got {rows}")
    for name in ("block_n", "block_k", "warps"):
        v = cfg[name]
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if cfg["block_k"] < 256 or k % cfg["block_k"]:
        raise ValueError(f"block_k ({cfg['block_k']}) must be >= 256 and divide K ({k})")
    if cfg["hoist_x"] and cfg["block_k"] != k:
        raise ValueError(f"hoisted activations (:x) need one K tile: block_k {cfg['block_k']} != K {k}")
    if cfg["stages"] < 1 or cfg["per_sm"] < 1:
        raise ValueError(f"stages and programs per SM must be >= 1, got {cfg['stages']}, {cfg['per_sm']}")


def launch(x: jax.Array, w: "jb.BlockScaledArray", cfg: dict, out_dtype=jnp.bfloat16) -> jax.Array:
    """x (1, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (1, N)."""
    if w.fmt.name not in KINDS:
        raise ValueError(f"formats {tuple(KINDS)}, got {w.fmt.name!r}")
    (rows, _), (n, k) = x.shape, w.shape
    check(rows, n, k, cfg)
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)
    grid = min(SMS * cfg["per_sm"], triton.cdiv(n, cfg["block_n"]))
    return jt.jax_triton().triton_call(
        w.values, w.scales, x, a_ts, b_ts, kernel=gemv_persistent_kernel,
        out_shape=jax.ShapeDtypeStruct((1, n), out_dtype), grid=(grid,), name=f"gemv_persistent_{KINDS[w.fmt.name]}",
        num_warps=cfg["warps"], num_stages=cfg["stages"], compute_capability=90, N=n, K=k,
        W_KIND=KINDS[w.fmt.name], BLOCK_N=cfg["block_n"], BLOCK_K=cfg["block_k"], NUM_STAGES=cfg["stages"],
        WIDE=n * (k // 2) >= 2**31, HOIST_X=cfg["hoist_x"])


def sass(configs, kinds, k: int = 4096, n: int = 7168) -> None:
    """CPU: compile for sm_90; registers, shared memory and the pipelined loop's SASS per weight element."""
    from benchmarks._sass import disassemble, registers
    from benchmarks.sass_count import classify, largest_loop
    from jax_blockscale._triton.compile import compile_kernel

    for kind in kinds:
        for cfg in configs:
            sig = dict(w_ptr="*u8", s_ptr="*u8", x_ptr="*bf16", a_ts_ptr="*fp32", b_ts_ptr="*fp32", out_ptr="*bf16")
            ck = compile_kernel(gemv_persistent_kernel, target="sm_90", signature=sig,
                                constexprs=dict(N=n, K=k, W_KIND=KINDS[kind], BLOCK_N=cfg["block_n"],
                                                BLOCK_K=cfg["block_k"], NUM_STAGES=cfg["stages"], WIDE=False,
                                                HOIST_X=cfg["hoist_x"]),
                                num_warps=cfg["warps"], num_stages=cfg["stages"])
            counts = classify(largest_loop(disassemble(ck.asm["cubin"]).splitlines()))
            per = 32 * cfg["warps"] / (cfg["block_n"] * cfg["block_k"])
            print(f"{kind} {describe(cfg)}: regs {registers(ck.asm['cubin'])}, smem {ck.metadata.shared}, "
                  f"loop {counts['total'] * per:.2f} SASS per weight element; "
                  + ", ".join(f"{c} {v * per:.2f}" for c, v in counts.most_common() if c not in ("total", "smem bytes")))


def main(argv=None) -> None:
    from .decode import experiment_main

    experiment_main(argv, __doc__.split("\n")[0], shapes="7168x4096,7168x2048,8192x8192", formats="mxfp4",
                    configs=DEFAULT_CONFIGS, config_help="nN:kK:wW:sS:pP[:x],... (parse_config)", parse=parse_config,
                    sass=sass, variant=lambda c, fmt: (describe(c), lambda n, k: check(1, n, k, c),
                                                       lambda x, w, dtype: launch(x, w, c, dtype)))


if __name__ == "__main__":
    main()
