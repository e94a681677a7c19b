"""An experiment kept with its result: fp4 decode on mma.sync with the weight streamed into registers (Hopper).

    python -m benchmarks.decode_mma_sync                              # 7168x4096, 8192x8192; 1, 8, 16 rows
    python -m benchmarks.decode_mma_sync --shapes 7168x2048 --rows 4,8 --configs w4:k256:s8,w2:k256:s16

The question (issue #12): does the fp4 decode GEMM at 1-16 rows reach more of a same-size read when the
weight goes from global memory straight into the registers of the tensor-core operand, with no shared-memory
ring? `decode_wgmma.py` streams the weight through a cp.async ring into wgmma's register operand and reads
35-57% of a same-size read at 2-16 rows; `decode.py`'s CUDA-core GEMV reads ~70% at one row.

The kernel here (`decode_mma_sync_kernel`) keeps decode_wgmma's weight layout, K relabelling (`_slots`) and
exact fp4 decode (`_decode`: bit placement and two bf16 multiplies per pair), but each warp owns 16 weight
rows and issues mma.sync m16n8k16 on its own (no warp-group coupling, no barrier in the K loop): it loads its
16-byte vectors with plain global loads, decodes them into the A fragment and takes the activations (padded
to 8 or 16 rows, staged once per program in shared memory) as the B fragment through ldmatrix. Split-K is
reduced in the kernel as decode_wgmma's (`split_k_epilogue`).

Result (H100, 2026-11-24, benchmarks/results/decode_mma_sync_h100_2026-11-24_session21.md): not adopted.
The best configuration per case, against dispatch in the same run (three runs): 0.79-0.86x the GEMV at one
row, 1.02-1.09x decode_wgmma at 8 rows and 0.83-1.06x at 16; at most 63% of a same-size read. On the CPU
its K loop has 4.03 SASS instructions per weight element against the GEMV's 5.02, but 2.33 of them run on
sm_90's half-rate integer pipe (the GEMV: 2.20): the fp4 decode's bit placement, not the FMAs or the MMA,
sets the issue cost, and moving the dot product to the tensor cores does not remove it.

Every configuration is checked against the jnp reference (fp32 output) before it is timed; times are CUPTI
kernel time per matmul over 16 rotated weights (`benchmarks/decode.py`'s harness), beside XLA's bf16 dot
and dispatch's kernel for the same operands.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")  # torch (CUPTI) shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import launch as scratch  # noqa: E402
from jax_blockscale._triton.decode import split_k_workspace, tensor_scale_operands  # noqa: E402
from jax_blockscale._triton.decode_wgmma import (_bytes_layout, _decode, _slots, _stage_activations,  # noqa: E402
                                                 _weight_layout, check_rows_and_k_steps, split_k_epilogue)
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

KINDS = {"mxfp4": "e2m1", "nvfp4": "nvfp4"}
DEFAULT_CONFIGS = ",".join(f"w{w}:k{c}:s{s}" for w in (1, 2, 4) for c in (128, 256) for s in (8, 16, 32))


@gluon.jit
def _load_chunk(w_ptr, s_ptr, n0, k0, N: gl.constexpr, K: gl.constexpr, R: gl.constexpr, CB: gl.constexpr,
                GROUP: gl.constexpr, EPB: gl.constexpr, BL: gl.constexpr, SL: gl.constexpr):
    """Weight bytes (R, CB) at K offset k0 of rows n0.. (rows past N read row N - 1: never stored) and their
    raw scales (R, CB * EPB / GROUP), loaded into the layouts the decode takes."""
    rows = gl.minimum(n0 + gl.arange(0, R, layout=gl.SliceLayout(1, BL)), N - 1)
    cols = gl.arange(0, CB, layout=gl.SliceLayout(0, BL))
    packed = gl.load(w_ptr + rows[:, None] * (K // EPB) + k0 // EPB + cols[None, :])
    s_rows = gl.minimum(n0 + gl.arange(0, R, layout=gl.SliceLayout(1, SL)), N - 1)
    s_cols = gl.arange(0, CB * EPB // GROUP, layout=gl.SliceLayout(0, SL))
    return packed, gl.load(s_ptr + s_rows[:, None] * (K // GROUP) + k0 // GROUP + s_cols[None, :])


@gluon.jit
def decode_mma_sync_kernel(w_ptr, s_ptr, x_ptr, xs_ptr, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr,
                           M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr,
                           W_KIND: gl.constexpr, CHUNK: gl.constexpr, SPLIT_K: gl.constexpr):
    """out (M, N) = a_ts * b_ts * x (M, K) bf16 @ decode(w (N, K / 2) fp4, s).T; operands, workspace and
    grid (cdiv(N, 16 * num_warps), SPLIT_K) as decode_wgmma_kernel's."""
    W: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 16 * W                      # weight rows per program: 16 per warp (mma's M)
    KS: gl.constexpr = K // SPLIT_K
    NC: gl.constexpr = KS // CHUNK
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    CB: gl.constexpr = CHUNK // 2
    L3: gl.constexpr = _weight_layout(W, CB, GROUP // 2)
    BL: gl.constexpr = _bytes_layout(W, CB)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [W, 1], [1, 0])
    XS: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = pid_n * R
    k_begin = pid_k * KS
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BM, CHUNK], XS)
    for c in gl.static_range(NC):
        xv = _stage_activations(x_ptr, xs_ptr, k_begin + c * CHUNK, M, K, BM, CHUNK, "bf16", XL)
        x_smem.index(c).store(_slots(xv, BM, CHUNK, 32))
    gl.thread_barrier()

    acc = gl.zeros([R, BM], gl.float32, layout=MMA)
    for i in range(NC):
        packed, raw_s = _load_chunk(w_ptr, s_ptr, n0, k_begin + i * CHUNK, N, K, R, CB, GROUP, 2, BL,
                                    gl.SliceLayout(2, L3))
        w = _decode(gl.convert_layout(gl.reshape(packed, [R, CHUNK // GROUP, GROUP // 2]), L3), raw_s, W_KIND)
        a = gl.convert_layout(_slots(gl.reshape(w, [R, CHUNK]), R, CHUNK, 32), A_OP)  # no data moves
        acc = mma_v2(a, x_smem.index(i).permute((1, 0)).load(B_OP), acc)
    split_k_epilogue(acc, pid_n, pid_k, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, M, N, SPLIT_K, False, MMA)


BLOCK_MS = (8, 16)  # the activation rows padded to mma's n8, or two n8 blocks
CHUNKS = (128, 256)


def parse_config(spec: str, rows: int) -> TileConfig:
    """'w4:k256:s8' -> 4 warps (16 weight rows each), 256-code K steps, 8 K splits; rows padded to 8 or 16."""
    vals = {t[0]: int(t[1:]) for t in spec.split(":")}
    return TileConfig(block_m=8 if rows <= 8 else 16, block_n=16 * vals["w"], block_k=vals["k"], group_m=1,
                      num_warps=vals["w"], num_stages=1, split_k=vals["s"])


def describe(cfg: TileConfig) -> str:
    return f"m{cfg.block_m} w{cfg.num_warps} k{cfg.block_k} s{cfg.split_k}"


def launch(x: jax.Array, w: "jb.BlockScaledArray", cfg: TileConfig, out_dtype=jnp.bfloat16) -> jax.Array:
    """x (M, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (M, N), checked as
    decode_wgmma's launches are (`check_rows_and_k_steps`)."""
    rows, (n, k) = x.shape[0], w.shape
    kind = KINDS[w.fmt.name]
    check_rows_and_k_steps(GemmProblem(1, False, rows, n, k, "bf16", kind, "bf16"), cfg, "the mma.sync experiment",
                           BLOCK_MS, CHUNKS, "the chunk of K per step")
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)  # nvfp4's in the kernel
    ws_shape, zeroed = split_k_workspace(rows, n, cfg)
    n_tiles = triton.cdiv(n, cfg.block_n)
    out, _, _ = scratch.scratch_call(
        decode_mma_sync_kernel, w.values, w.scales, x, x, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((rows, n), out_dtype), jax.ShapeDtypeStruct(ws_shape, jnp.float32),
                   jax.ShapeDtypeStruct((n_tiles if cfg.split_k > 1 else 1,), jnp.int32)],
        zeroed_outputs=zeroed, grid=(n_tiles, cfg.split_k), num_warps=cfg.num_warps, num_stages=1,
        compute_capability=90, name=f"decode_mma_sync_{kind}", M=rows, N=n, K=k, BM=cfg.block_m, W_KIND=kind,
        CHUNK=cfg.block_k, SPLIT_K=cfg.split_k)
    return out


def main(argv=None) -> None:
    from . import decode as bd

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="7168x4096,8192x8192", help="NxK,...")
    ap.add_argument("--rows", default="1,8,16")
    ap.add_argument("--formats", default="mxfp4", help="mxfp4,nvfp4")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="wW:kCHUNK:sSPLIT,...")
    a = ap.parse_args(argv)
    torch = bd._torch()
    print(f"device {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'})")
    print("| format | N | K | M | kernel | us | % same-size read | vs XLA bf16 | vs dispatch | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fmt in a.formats.split(","):
        for n, k in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
            ws, read, dense = bd.experiment_weights(torch, fmt, n, k)
            for m in (int(v) for v in a.rows.split(",")):
                x = jax.random.normal(jax.random.key(7), (m, k), jnp.float32).astype(jnp.bfloat16)
                xla, disp, ref = bd.experiment_baselines(torch, x, ws, dense)
                row = f"| {fmt} | {n} | {k} | {m} |"
                print(f"{row} XLA bf16 | {xla:.2f} | | 1.00x | | |")
                print(f"{row} dispatch: {jb.explain(x, ws[0], rows=m).kernel} | {disp:.2f} | {read / disp:.0%} | "
                      f"{xla / disp:.2f}x | 1.00x | |", flush=True)
                for spec in a.configs.split(","):
                    cfg = parse_config(spec, m)
                    if k % (cfg.block_k * cfg.split_k):
                        continue
                    out = np.asarray(jax.jit(lambda x, w: launch(x, w, cfg, jnp.float32))(x, ws[0]), np.float64)
                    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                    if not err < 1e-4:
                        print(f"{row} {describe(cfg)} | wrong | | | | {err:.1e} |")
                        continue
                    us = bd.kernel_us(jax.jit(lambda x, w: launch(x, w, cfg)), [(x, w) for w in ws], torch)
                    print(f"{row} {describe(cfg)} | {us:.2f} | {read / us:.0%} | {xla / us:.2f}x | {disp / us:.2f}x | "
                          f"{err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
