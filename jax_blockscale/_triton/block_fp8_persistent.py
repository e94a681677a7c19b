"""Persistent Hopper block FP8 GEMM: one program per SM walks output tiles; TMA loads, fp8 wgmma, fp32
promotion per 128-wide K block (DeepSeek-V3 §3.3.2, see block_fp8.py).

Why a second sm_90 kernel: the one-program-per-tile kernels (block_fp8.py, hopper_tma.py) reached
0.63-0.72x of cuBLAS blockwise FP8 on an H100 (e.g. 908 vs 1332 TFLOP/s at 8192^3). Each program pays
its prologue (descriptor set-up, pipeline fill) and its epilogue with the tensor cores idle, and the
waves of 128 x 128 programs quantize badly on 132 SMs. Here NUM_SMS programs each loop over tiles
(grouped order, `tiling.grouped_tile`, so a wave of SMs shares B tiles in L2), and the K loop of one tile
runs straight into the next tile's: with FLATTEN, Triton fuses the tile and K loops into one pipelined
loop (its persistent-matmul tutorial's scheme), so the next tile's TMA loads are in flight while this
tile's last wgmma and its epilogue run.

WARP_SPECIALIZE asks Triton 3.6's Hopper warp specialization (`tl.range(..., warp_specialize=True)`) to
split the loop into a TMA producer warp group and wgmma consumer warp groups with their own register
budgets (setmaxnreg), as DeepGEMM does by hand; whether Triton accepts the promotion's extra
multiply-add inside a specialized loop is a property of the compiler version, so it is a switch and the
lowering tests check what it builds.

Layouts: a (BATCHES, M, K) e4m3 and b ([BATCHES,] N, K) e4m3 through TMA descriptors built in the kernel
(3D when batched, so a tile never reads the next batch's rows: the TMA unit zero-fills past each
dimension); activation scales transposed to (BATCHES, K/128, M) so one K block's BLOCK_M scales are
contiguous; weight scales ([BATCHES,] ceil(N/128), K/128) as the contract gives them. The output goes out
through a TMA store where its rows are 16-byte aligned (N * itemsize % 16 == 0), else a masked store.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from . import launch as scratch
from .problem import (BLOCK_FP8, HOPPER_SMS, OUT_DTYPES, SCALE_GROUP, GemmProblem, TileConfig, check_operands,
                      fold_batch, out_rows_tma_aligned)
from .tiling import grouped_tile, tma_descriptor, tma_load, promote_block

SUPPORTED: frozenset[tuple[str, str]] = frozenset({(BLOCK_FP8, BLOCK_FP8)})

# H100 SXM / H200: 132 SMs. One program per SM; a GPU with fewer SMs still runs correctly (programs queue).
DEFAULT_NUM_SMS = HOPPER_SMS


@triton.jit
def _tile_coords(tile, M: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """(batch, first row, first column) of output tile `tile`; batches are walked one after the other."""
    TILES_PER_BATCH: tl.constexpr = triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    batch = tile // TILES_PER_BATCH
    pid_m, pid_n = grouped_tile(tile % TILES_PER_BATCH, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    return batch, pid_m * BLOCK_M, pid_n * BLOCK_N


@triton.jit
def _scales(a_scale_ptr, b_scale_ptr, batch, b_batch, kb, row_m, row_n, M: tl.constexpr, N: tl.constexpr,
            SCALE_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, A_SCALES_T: tl.constexpr):
    """The K block `kb` scales of a tile: a's per row (BLOCK_M,), b's a scalar when the tile's columns lie
    in one 128-row weight block, else one per column (BLOCK_N,). A_SCALES_T: a's scales are (K/128, M)
    per batch (one K block's rows contiguous), else the contract's (M, K/128) read with a stride."""
    offs_m = row_m + tl.arange(0, BLOCK_M)
    a_base = a_scale_ptr + batch * (SCALE_K * M)
    if A_SCALES_T:
        a_ptrs = a_base + kb * M + offs_m
    else:
        a_ptrs = a_base + offs_m * SCALE_K + kb
    a_s = tl.load(a_ptrs, mask=offs_m < M, other=0.0)
    b_base = b_scale_ptr + b_batch * (triton.cdiv(N, 128) * SCALE_K) + kb
    if 128 % BLOCK_N == 0:
        b_s = tl.load(b_base + (row_n // 128) * SCALE_K)
    else:
        offs_n = row_n + tl.arange(0, BLOCK_N)
        b_s = tl.load(b_base + (offs_n // 128) * SCALE_K, mask=offs_n < N, other=0.0)
    return a_s, b_s


@triton.jit
def _store(acc, alpha, out_ptr, out_desc, batch, row_m, row_n, M: tl.constexpr, N: tl.constexpr,
           BATCHES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TMA_STORE: tl.constexpr):
    out = (acc * alpha).to(out_ptr.dtype.element_ty)
    if TMA_STORE:  # rows past M / columns past N are clipped by the TMA unit
        if BATCHES == 1:
            out_desc.store([row_m, row_n], out)
        else:
            out_desc.store([batch, row_m, row_n], out.reshape(1, BLOCK_M, BLOCK_N))
    else:
        offs_m = row_m + tl.arange(0, BLOCK_M)
        offs_n = row_n + tl.arange(0, BLOCK_N)
        ptrs = (out_ptr + batch.to(tl.int64) * (M * N) + offs_m[:, None].to(tl.int64) * N + offs_n[None, :])
        tl.store(ptrs, out, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def persistent_block_fp8_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BATCHES: tl.constexpr, B_BATCHED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr,
    NUM_STAGES: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr, TMA_STORE: tl.constexpr,
    PREFETCH_SCALES: tl.constexpr, A_SCALES_T: tl.constexpr,
):
    """out[batch] = alpha * sum over 128-wide K blocks kb of (a_kb @ b_kb.T) * a_scale[kb, m] * b_scale[n/128, kb].

    a (BATCHES, M, K) e4m3, a_scale (BATCHES, K/128, M) fp32, b ([BATCHES,] N, K) e4m3, b_scale
    ([BATCHES,] ceil(N/128), K/128) fp32, out (BATCHES, M, N); K a multiple of 128. Grid: (NUM_SMS,).
    """
    BLOCK_K: tl.constexpr = 128  # one promotion per K tile: the scale block is the K tile
    SCALE_K: tl.constexpr = K // BLOCK_K
    B_BATCHES: tl.constexpr = BATCHES if B_BATCHED else 1
    TILES: tl.constexpr = BATCHES * triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N)
    a_desc = tma_descriptor(a_ptr, BATCHES, M, K, BLOCK_M, BLOCK_K)
    b_desc = tma_descriptor(b_ptr, B_BATCHES, N, K, BLOCK_N, BLOCK_K)
    if TMA_STORE:
        out_desc = tma_descriptor(out_ptr, BATCHES, M, N, BLOCK_M, BLOCK_N)
    else:
        out_desc = None
    alpha = tl.load(alpha_ptr)
    start = tl.program_id(0)

    # The tile loop carries the attributes, as in Triton's persistent-matmul tutorial: FLATTEN fuses it with
    # the K loop into one software-pipelined loop (next tile's loads issued during this tile's epilogue);
    # WARP_SPECIALIZE partitions the (fused) loop into producer and consumer warp groups.
    for tile in tl.range(start, TILES, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        batch, row_m, row_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        b_batch = batch if B_BATCHED else 0
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if PREFETCH_SCALES:
            a_s, b_s = _scales(a_scale_ptr, b_scale_ptr, batch, b_batch, 0, row_m, row_n, M, N, SCALE_K, BLOCK_M,
                               BLOCK_N, A_SCALES_T)
        for kb in tl.range(0, SCALE_K, num_stages=NUM_STAGES):
            if PREFETCH_SCALES:
                # The next K block's scales are loaded a step ahead and carried in registers (index
                # clamped), as block_fp8.py does. Triton 3.6's Hopper warp specializer rejects such
                # loop-carried values (the NVGPUWarpSpecialization pass fails): without warp specialization only.
                a_next, b_next = _scales(a_scale_ptr, b_scale_ptr, batch, b_batch, tl.minimum(kb + 1, SCALE_K - 1),
                                         row_m, row_n, M, N, SCALE_K, BLOCK_M, BLOCK_N, A_SCALES_T)
            else:
                # Loaded where used: the pipeliner streams these loads (cp.async) ahead when the loop is not
                # specialized; specialized, each consumer warp group issues them before waiting for its tiles.
                a_s, b_s = _scales(a_scale_ptr, b_scale_ptr, batch, b_batch, kb, row_m, row_n, M, N, SCALE_K,
                                   BLOCK_M, BLOCK_N, A_SCALES_T)
            a = tma_load(a_desc, batch, row_m, kb * BLOCK_K, BATCHES, BLOCK_M, BLOCK_K)
            b = tma_load(b_desc, b_batch, row_n, kb * BLOCK_K, B_BATCHES, BLOCK_N, BLOCK_K)
            partial = tl.dot(a, b.T, out_dtype=tl.float32)
            acc = promote_block(acc, partial, a_s, b_s, BLOCK_N)
            if PREFETCH_SCALES:
                a_s = a_next
                b_s = b_next
        _store(acc, alpha, out_ptr, out_desc, batch, row_m, row_n, M, N, BATCHES, BLOCK_M, BLOCK_N, TMA_STORE)


# ---------------------------------------------------------------------------------------------------------
# jnp side.

def check_config(p: GemmProblem, config: TileConfig) -> None:
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the persistent block FP8 kernel takes block_fp8 x block_fp8, got {p.a_kind} x {p.b_kind}")
    if p.k % SCALE_GROUP:
        raise ValueError(f"block_fp8 needs K padded to a multiple of 128, got K={p.k}")
    if config.block_k != SCALE_GROUP:
        raise ValueError(f"the persistent kernel promotes once per K tile: block_k must be 128, got {config.block_k}")
    if config.block_n > SCALE_GROUP and config.block_n % SCALE_GROUP:
        raise ValueError(f"block_n must divide 128 or be a multiple of it, got {config.block_n}")
    if config.split_k != 1 or config.swap_ab or config.tma:
        raise ValueError("the persistent kernel takes neither split_k, swap_ab nor tma (they select other kernels)")
    if config.num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {config.num_sms}")
    if config.max_registers and not 24 <= config.max_registers <= 255:
        raise ValueError(f"max_registers must be 0 (the compiler's choice) or within 24..255, got "
                         f"{config.max_registers}")
    if config.warp_specialize and config.num_warps != 4:
        # Triton 3.6's Hopper warp specializer builds one producer and two consumer warp groups from a
        # 4-warp kernel; with other counts it leaves the loop unspecialized.
        raise ValueError(f"warp_specialize needs num_warps=4 (one warp group per partition), got {config.num_warps}")
    if config.warp_specialize and config.flatten:
        raise ValueError("warp_specialize and flatten do not combine in Triton 3.6 (the loop stays unspecialized)")
    if config.warp_specialize and config.prefetch_scales:
        raise ValueError("prefetch_scales carries registers across K steps, which Triton 3.6's Hopper warp "
                         "specializer rejects: use it without warp_specialize")


# The warp-specialized loop (`ws_config`) compiles and, launched with its 12 warps, runs on an H100, but its
# results are wrong there (relative Frobenius error 0.23-0.55). Diagnosed on the H100 (2026-11-22): rows 0-63
# of every tile are exact and rows 64-127 wrong, with unit scales too. Triton 3.6 splits the 128-row tile
# between two consumer partitions (warps 4-7 and 8-11); the TTGIR is right (the second partition's
# `offs_m` is make_range(64, 128)), but its lowering offsets that range by the partition's warp index
# from the first worker warp, so the second consumer reads the activation scales of rows 128-191 instead
# of 64-127 (PTX: `or.b32 ..., 128` where 64 belongs). A scale tile loaded by TMA instead avoids the
# index but the specializer then issues it synchronously inside each consumer. Launches are refused
# unless this is set (for debugging it on a device).
ALLOW_WARP_SPECIALIZE = False


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """The plain persistent loop (8 warps, 128 x 128 tiles, 4 stages) with each K step's scales prefetched:
    the fastest variant measured on an H100 (2026-11-22, benchmarks/block_fp8_variants.py, kernel time):
    0.71x cuBLAS blockwise geomean over the five issue-#13 shapes, against 0.66x for the one-program-per-
    tile kernel. The warp-specialized variant (`ws_config`) gives wrong results (ALLOW_WARP_SPECIALIZE).
    From 2048 rows and columns dispatch runs the Gluon kernel instead (block_fp8_gluon.py, 0.95x).
    """
    del target
    return TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4,
                      persistent=True, prefetch_scales=True)


def ws_config(p: GemmProblem) -> TileConfig:
    """128 x 128 tiles, one TMA producer and two 64-row wgmma consumer warp groups (DeepGEMM's split of a
    128-row tile), 4 stages of A/B tiles (4 x 32 KiB of shared memory, plus the epilogue's tile).

    128 x 256 would halve B's reloads but needs 256 fp32 registers per consumer thread (the promoted
    accumulator and one K block's partial product, 128 each) against the 232 Triton grants: it spills.
    Without K >= 256 (one K block) Triton 3.6's warp specializer fails, so the plain persistent loop runs."""
    ws = p.k >= 2 * SCALE_GROUP
    return TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=4 if ws else 8, num_stages=4,
                      persistent=True, warp_specialize=ws)


def tma_store_ok(p: GemmProblem, warp_specialize: bool, batches: int) -> bool:
    """The TMA store needs 16-byte-aligned output rows; Triton 3.6's warp specializer fails on the 3D
    (batched) descriptor store, so batched problems store through pointers there."""
    return out_rows_tma_aligned(p) and not (warp_specialize and batches > 1)


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int) -> jax.Array:
    """Block FP8 GEMM on the persistent kernel; returns (p.batch, p.m, p.n) of p.out_dtype. A config without
    `persistent` (e.g. the caller's, to compare) runs the one-program-per-tile kernels of block_fp8.py."""
    if config.warp_specialize and not ALLOW_WARP_SPECIALIZE:
        raise ValueError("the warp-specialized persistent block FP8 kernel gave wrong results on an H100 "
                         "(relative error 0.23, 2026-11-22, Triton 3.6): refused until that is understood")
    if not config.persistent:
        from . import block_fp8

        return block_fp8.launch(p, a_values, a_scales, b_values, b_scales, alpha, config=config,
                                compute_capability=compute_capability)
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    batches, rows, a_values, a_scales = fold_batch(p, a_values, a_scales)
    if config.a_scales_t:
        a_scales = jnp.swapaxes(a_scales, -1, -2)  # (BATCHES, K/128, rows): an XLA transpose before the kernel
    # One K block: the specializer fails (the K loop folds away), so that case runs unspecialized, 8 warps.
    ws = config.warp_specialize and p.k >= 2 * SCALE_GROUP
    tiles = batches * triton.cdiv(rows, config.block_m) * triton.cdiv(p.n, config.block_n)
    programs = min(config.num_sms, tiles)
    out = scratch.scratch_call(
        persistent_block_fp8_kernel, a_values, a_scales, b_values, b_scales, alpha.reshape(1).astype(jnp.float32),
        out_shape=jax.ShapeDtypeStruct((batches, rows, p.n), OUT_DTYPES[p.out_dtype]), grid=(programs, 1, 1),
        num_warps=config.num_warps if ws or not config.warp_specialize else 8, num_stages=config.num_stages,
        compute_capability=compute_capability, name="block_fp8_persistent_gemm", maxnreg=config.max_registers,
        M=rows, N=p.n, K=p.k, BATCHES=batches, B_BATCHED=p.b_batched, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, GROUP_M=config.group_m, NUM_SMS=programs, NUM_STAGES=config.num_stages,
        WARP_SPECIALIZE=ws, FLATTEN=config.flatten, TMA_STORE=tma_store_ok(p, ws, batches),
        PREFETCH_SCALES=config.prefetch_scales, A_SCALES_T=config.a_scales_t,
    )
    return out.reshape(p.batch, p.m, p.n)
