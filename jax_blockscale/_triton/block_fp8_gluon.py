"""Hopper block FP8 GEMM in Gluon: warp-specialized, one warp group promotes while the other multiplies.

Why a Gluon kernel: DeepSeek-V3's block scaling promotes every 128-wide K block into the fp32 accumulator
(`acc += partial * a_scale[m] * b_scale[n]`, §3.3.2; see block_fp8.py), so each K block's wgmma result is
read by CUDA cores before the next block can use the partial's registers. In one instruction stream (the
Triton kernels, block_fp8_persistent.py) the tensor cores idle during every promotion: 0.70-0.77x of
cuBLAS blockwise on an H100. Triton 3.6's automatic warp specialization would split that stream, but
lowers the second consumer's rows wrong (block_fp8_persistent.py says how), and an asynchronous wgmma
kept in flight across the promotion made ptxas serialize every wgmma (C7514/C7515: the partials' registers
copied while pending; 0.51x). Gluon's explicit `warp_specialize` gives the DeepGEMM structure instead:

    loader    (1 warp)   TMA: a (BLOCK_M x 128) and b (BLOCK_N x 128) e4m3 tiles into STAGES stages, running
                         ahead over this program's tiles; a stage is refilled when both consumers released it
                         (a named barrier per stage: `_release`, `EMPTY_BARRIER0`).
    consumer 0 (4 warps) rows 0-63 of the tile   } per K block and 128-column subtile: wgmma into a fresh
    consumer 1 (4 warps) rows 64-127 of the tile } partial, wait for it, promote it with the block's scales.

Each consumer waits only for its own wgmma, so while one promotes the other's wgmma runs. The consumers also
take turns issuing (an mbarrier pair, CUTLASS's "ping-pong" order), which keeps them half a step apart
instead of finishing their wgmma together. A 128 x 256 tile multiplies in two 128-column subtiles with one
partial: 128 + 64 accumulator and partial registers per thread, within the 224 that setmaxnreg gives
each consumer. Nothing is pending across a promotion, so ptxas keeps every wgmma asynchronous.

Light tiles: where the last column of tiles is mostly past N (`light_columns`: N % 256 <= 128, or N % 128
<= 64), those tiles run after all the full ones, one per row tile, each multiplying only its live 64 or 128
columns (`_light_tiles`); with 64 columns a stage holds two K blocks. DeepSeek-V3's N = 2112 is 8 wide
tiles and 64 columns: at 4096 x 2112 x 7168 the 288 tiles were three rounds of full tiles for 2.06 rounds
of work, now two and a light one (0.75x -> 0.87x cuBLAS blockwise; H100, 2026-11-24,
benchmarks/results/block_fp8_light_tiles_h100_2026-11-24_session24.md).

Epilogue: a tile's output leaves during the next tile's first K step (`_k_step(FIRST=True)`): each 128-column
subtile's conversion, shared-memory write and TMA store run while one of that step's wgmma does, instead of
between tiles with no wgmma in flight; and a subtile waits only for its own buffer's previous TMA store.

Measured on an H100 (kernel time, benchmarks/results/block_fp8_variants_h100_2026-11-23.md): 128 x 256 tiles,
3 stages. Interleaved rounds (`block_fp8_variants --rounds`: each shape's rows profiled in turn, median of
paired ratios; single passes drifted by up to 8%) put the kernel before the epilogue overlap at 0.937x of
cuBLAS blockwise geomean over the issue-#13 shapes, and after it at 0.952x (2026-11-23, session 14; faster on
7 of 8 shapes). Earlier single-pass measurements (0.96-1.01x) were biased by that drift: in those rounds
the first pass read up to 0.13x more than the median of the later ones on most shapes. The persistent Triton
kernel ran at 0.70-0.75x in the same single-pass runs as the older figures.
Stage releases by named barrier instead of mbarrier (session 36, 2026-12-02, H200, same method, 4 rounds):
1.02-1.04x faster on 8192^3, 4096 x 7168 x 16384 and 2048 x 4096 x 7168 (0.951x, 0.989x, 0.948x of cuBLAS
blockwise against 0.935x, 0.955x, 0.912x); see `EMPTY_BARRIER0`.

Layouts: a (M, K) e4m3 and b (N, K) e4m3 read through TMA descriptors built in the kernel (global scratch,
`launch.scratch_call`); a's scales (M, K/128) and b's (ceil(N/128), K/128) fp32 as the contract gives them,
loaded one K block ahead into registers (a consumer thread holds two rows' scales). Unbatched b only (a
batch of activations folds into M); batched weights use block_fp8_persistent.py. The output leaves in
(64, 128) subtiles through a TMA store where its rows are 16-byte aligned, else a masked store; either can
write the product transposed, (N, M) (`launch(transpose_out=True)`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import launch as scratch
from .problem import (BLOCK_FP8, HOPPER_SMEM_BYTES, OUT_DTYPES, SCALE_GROUP, GemmProblem, TileConfig, check_operands,
                      fold_batch, out_rows_tma_aligned)

SUPPORTED: frozenset[tuple[str, str]] = frozenset({(BLOCK_FP8, BLOCK_FP8)})
# Columns per wgmma and per promotion: one weight scale block, 64 partial registers per consumer thread.
SUBTILE_COLUMNS = 128
SUBTILE_N = gl.constexpr(SUBTILE_COLUMNS)
# 12 warps (two 4-warp consumers; the 1-warp loader padded to a warp group) x 32 threads x 168 registers =
# 64512 of the SM's 65536. setmaxnreg then moves registers from the loader to the consumers: 224 + 224 + 56
# = 3 x 168, no spills (232 + 232 + 40 spilled 16 bytes in the loader; ptxas -v, sm_90a).
MAX_REGISTERS = 168
CONSUMER_REGISTERS = gl.constexpr(224)
LOADER_REGISTERS = gl.constexpr(56)
SMEM_BYTES = HOPPER_SMEM_BYTES
# A stage's release (both consumers have read stage s; the loader waits for it before refilling) is named
# barrier EMPTY_BARRIER0 + s (bar.arrive by every consumer thread, bar.sync by the loader warp), not an
# mbarrier. Why: Triton 3.6's membar analysis counts an mbarrier arrive as a write to shared memory, so each
# one got a bar.sync of the consumer's warp group before it and another before the next shared-memory read
# (4 per K step and consumer with the turns' arrives, 2 now; PTX, sm_90a); a named barrier touches no shared
# memory. The consumers' turns stay mbarriers: as named barriers too they ran 5-7% slower at K >= 8192.
# H200, 2026-12-02, kernel time against cuBLAS blockwise, 4 interleaved rounds, median ratios: 8192^3 0.935x
# -> 0.951x, 4096 x 7168 x 16384 0.955x -> 0.989x, 2048 x 4096 x 7168 0.912x -> 0.948x
# (benchmarks/results/block_fp8_sync_h200_2026-12-02_session36.md).
# IDs 0-2 are Triton's (the partitions' own bar.sync and warp_specialize's start / end); 16 exist.
EMPTY_BARRIER0 = gl.constexpr(8)
MAX_STAGES = 8  # IDs 8-15
CONSUMER_THREADS = gl.constexpr(128)
LOADER_THREADS = gl.constexpr(32)


@gluon.constexpr_function
def light_columns(n: int, block_n: int) -> int:
    """How many columns the kernel multiplies of the last column tile when that tile is mostly past N, else
    0. Such a light tile (N % block_n <= 64, or <= 128 of a 256-wide tile) runs one m64 x 64 (or x 128)
    wgmma per K block instead of the full tile's, and the light tiles run after all the others, where they
    fill the last wave: DeepSeek-V3's N = 2112 is 8 wide tiles and 64 columns, so at M = 4096 its 288 tiles
    were 3 waves of full tiles for 2.06 waves of work (0.72x cuBLAS blockwise, H100)."""
    rest = n % block_n
    if 0 < rest <= 64:
        return 64
    if block_n == 2 * SUBTILE_COLUMNS and 0 < rest <= SUBTILE_COLUMNS:
        return SUBTILE_COLUMNS
    return 0


@gluon.constexpr_function
def _grouped_columns(n: int, block_n: int, light: int) -> int:
    """Column tiles that run in grouped order: all of them, or (light > 0) all but the light last one."""
    return n // block_n if light else triton.cdiv(n, block_n)


@gluon.constexpr_function
def _light_k_blocks(block_n: int, light: int) -> int:
    """K blocks per stage of a light tile: 2 where a stage's 256-row weight buffer holds a second block's 128
    activation rows and 64 weight rows beside the first's 64 weight rows (`_light_buffer`), else 1."""
    return 2 if block_n == 2 * SUBTILE_COLUMNS and light == 64 else 1


@gluon.jit
def _named_barrier(barrier_id, threads: gl.constexpr, ARRIVE: gl.constexpr, WARPS: gl.constexpr):
    """bar.arrive (ARRIVE: signal and go on) or bar.sync (signal and wait) on named barrier `barrier_id` (a
    uniform int32) that completes when `threads` threads have signalled; every thread of the calling partition
    (WARPS warps) takes part. bar.sync orders the memory accesses of the threads it waits for before the
    caller's next ones (PTX ISA, "bar, barrier"). No shared memory is touched, so Triton's membar analysis
    adds no bar.sync around it."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    ids = gl.full([1], 0, gl.int32, layout) + barrier_id
    counts = gl.full([1], threads, gl.int32, layout)
    asm: gl.constexpr = ("bar.arrive" if ARRIVE else "bar.sync") + " $1, $2;\n mov.u32 $0, 0;"
    gl.inline_asm_elementwise(asm, "=r,r,r", [ids, counts], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release(s):
    """A consumer has read stage s (its wgmma waited for): its 128 threads' share of the arrivals the loader's
    `_wait_released` needs. Every arrival is waited for: the loader waits for stage s again only after
    refilling it, which the consumers' next release of s needs first, so no barrier generation ever
    collects two steps' releases; and the loader waits for the last STAGES releases before it ends."""
    _named_barrier(EMPTY_BARRIER0 + s, 2 * CONSUMER_THREADS + LOADER_THREADS, True, CONSUMER_THREADS // 32)


@gluon.jit
def _wait_released(s):
    """The loader waits until both consumers released stage s."""
    _named_barrier(EMPTY_BARRIER0 + s, 2 * CONSUMER_THREADS + LOADER_THREADS, False, LOADER_THREADS // 32)


@gluon.jit
def _tiles_below(count: gl.constexpr, NUM_SMS: gl.constexpr):
    """How many of tiles 0 .. count - 1 this program runs: pid, pid + NUM_SMS, ... (pid < NUM_SMS: never
    negative)."""
    return (count - gl.program_id(0) + NUM_SMS - 1) // NUM_SMS


@gluon.jit
def _program_tiles(M: gl.constexpr, N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   NUM_SMS: gl.constexpr):
    """How many tiles this program runs."""
    return _tiles_below(((M + BLOCK_M - 1) // BLOCK_M) * ((N + BLOCK_N - 1) // BLOCK_N), NUM_SMS)


@gluon.jit
def _full_tiles(M: gl.constexpr, N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                NUM_SMS: gl.constexpr, LIGHT_N: gl.constexpr):
    """How many of this program's tiles are full-width ones; the rest (light tiles, `light_columns`) follow
    them."""
    return _tiles_below(((M + BLOCK_M - 1) // BLOCK_M) * _grouped_columns(N, BLOCK_N, LIGHT_N), NUM_SMS)


@gluon.jit
def _tile_origin(t, M: gl.constexpr, N: gl.constexpr, GROUP_M: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, NUM_SMS: gl.constexpr, LIGHT_N: gl.constexpr = 0):
    """First row and column of this program's t-th tile (tile pid + t * NUM_SMS) in grouped order
    (tiling.grouped_tile's order: GROUP_M row tiles at a time, so the programs of a wave share B tiles in
    L2). With LIGHT_N > 0 the last column of tiles is light (`light_columns`) and its tiles come after all
    the others, one per row tile: they fill the last wave, where they cost a fraction of a full tile."""
    TILES_M: gl.constexpr = (M + BLOCK_M - 1) // BLOCK_M
    FULL_N: gl.constexpr = _grouped_columns(N, BLOCK_N, LIGHT_N)
    FULL: gl.constexpr = TILES_M * FULL_N
    LAST_FULL: gl.constexpr = FULL - 1
    per_group: gl.constexpr = GROUP_M * FULL_N
    tile = gl.program_id(0) + t * NUM_SMS
    if FULL_N == 0:  # only light tiles (N <= LIGHT_N)
        first_m = tile * BLOCK_M
        first_n = tile * 0
    else:
        grouped = tile
        if LIGHT_N > 0:
            grouped = gl.minimum(tile, LAST_FULL)  # a light tile's index past the grouped ones: see below
        first_m = (grouped // per_group) * GROUP_M
        group_rows = gl.minimum(TILES_M - first_m, GROUP_M)
        in_group = grouped % per_group
        first_m = (first_m + in_group % group_rows) * BLOCK_M
        first_n = (in_group // group_rows) * BLOCK_N
        if LIGHT_N > 0:
            if tile > LAST_FULL:
                first_m = (tile - FULL) * BLOCK_M
                first_n = grouped * 0 + FULL_N * BLOCK_N
    return first_m, first_n


@gluon.jit
def _loader(descs, bufs, bars, ptrs, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BLOCK_M: gl.constexpr,
            BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr,
            TMA_STORE: gl.constexpr, TRANS_OUT: gl.constexpr, EPI_BUFS: gl.constexpr, WG: gl.constexpr,
            LIGHT_N: gl.constexpr):
    """The TMA partition: every (tile, K block) step of this program, in order, into stage step % STAGES;
    a light tile's steps hold LIGHT_KB K blocks each (`_light_stage`). (Gluon gives every worker partition
    one signature: the consumer's, whose arguments this one mostly ignores.)"""
    a_desc, b_desc, _, light_desc = descs
    a_bufs, b_bufs, _ = bufs
    ready, _ = bars
    SCALE_K: gl.constexpr = K // 128
    step = 0
    full = _full_tiles(M, N, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
    for t in range(full):
        row, col = _tile_origin(t, M, N, GROUP_M, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
        for kb in range(SCALE_K):
            s = step % STAGES
            if step >= STAGES:  # the first pass over the stages waits for nothing
                _wait_released(s)
            bar = ready.index(s)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(a_desc, [row, kb * 128], bar, a_bufs.index(s))  # zero past M, K
            tma.async_copy_global_to_shared(b_desc, [col, kb * 128], bar, b_bufs.index(s))
            step += 1
    if LIGHT_N > 0:
        LIGHT_KB: gl.constexpr = _light_k_blocks(BLOCK_N, LIGHT_N)
        for t in range(full, _program_tiles(M, N, BLOCK_M, BLOCK_N, NUM_SMS)):
            row, col = _tile_origin(t, M, N, GROUP_M, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
            for kp in range(SCALE_K // LIGHT_KB):
                _light_load(step, row, col, kp * LIGHT_KB, LIGHT_KB, a_desc, light_desc, bufs, bars, STAGES, LIGHT_N)
                step += 1
            if SCALE_K % LIGHT_KB != 0:  # an odd K block count: the last step holds one
                _light_load(step, row, col, SCALE_K - 1, 1, a_desc, light_desc, bufs, bars, STAGES, LIGHT_N)
                step += 1
    # The consumers' last releases: every arrival on a named barrier is waited for before the program ends.
    for i in range(gl.maximum(step - STAGES, 0), step):
        _wait_released(i % STAGES)


@gluon.jit
def _light_load(step, row, col, kb, KB: gl.constexpr, a_desc, light_desc, bufs, bars, STAGES: gl.constexpr,
                LIGHT_N: gl.constexpr):
    """The loader's step of a light tile: K blocks kb .. kb + KB - 1 of its activation rows and live weight
    rows into stage step % STAGES (`_light_buffer`), once both consumers have released it."""
    a_bufs, b_bufs, _ = bufs
    ready, _ = bars
    s = step % STAGES
    if step >= STAGES:
        _wait_released(s)
    bar = ready.index(s)
    mbarrier.expect(bar, KB * (a_desc.block_type.nbytes + light_desc.block_type.nbytes))
    for j in gl.static_range(KB):
        tma.async_copy_global_to_shared(a_desc, [row, (kb + j) * 128], bar,
                                        _light_buffer(a_bufs, b_bufs, s, j, 0, 128, LIGHT_N))
        tma.async_copy_global_to_shared(light_desc, [col, (kb + j) * 128], bar,
                                        _light_buffer(a_bufs, b_bufs, s, j, 1, LIGHT_N, LIGHT_N))


@gluon.jit
def _settled(acc):
    """`acc`, after an empty volatile asm statement. The next wgmma reuses the partial's registers (its C
    operand, ignored with use_acc=False, is tied to its output), and LLVM would otherwise schedule the
    promotion that reads the partial after that wgmma and copy the partial to fresh registers for it (64
    moves and 64 more live registers per subtile and K block, seen in the PTX). The asm consumes the
    promoted accumulator and, being volatile, stays before the next wgmma (also volatile asm), so the
    promotion completes first and the partial's registers are free. It emits no instruction."""
    return gl.inline_asm_elementwise("", "=r,0", [acc], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _store_subtile(out, row, col, rows, c_smem, out_desc, out_ptr, M: gl.constexpr, N: gl.constexpr,
                   TMA_STORE: gl.constexpr, TRANS_OUT: gl.constexpr, EPI_BUFS: gl.constexpr,
                   mma_layout: gl.constexpr):
    """One consumer's (64, 128) output subtile at (row, col): through its shared buffer and a TMA store
    (clipped at M and N by the TMA unit), or a masked pointer store. TRANS_OUT: the output is (N, M) and the
    subtile goes to (col, row) transposed; its shared buffer is (128, 64), written through a transposed view,
    so the transpose costs no more than the store's own pass through shared memory.

    With EPI_BUFS buffers per consumer used in turn, this buffer's previous store is the EPI_BUFS-th most
    recent, so up to EPI_BUFS - 1 newer stores may still be reading theirs: a 256-wide tile's second subtile
    does not wait for the first subtile's store (waiting for it there, pendings=0, stalled both consumers on
    a TMA store's read of 16 KiB once per tile)."""
    if TMA_STORE:
        tma.store_wait(pendings=EPI_BUFS - 1)  # this buffer's previous store has read it
        if TRANS_OUT:
            c_smem.permute((1, 0)).store(out)
        else:
            c_smem.store(out)
        fence_async_shared()
        tma.async_copy_shared_to_global(out_desc, [col, row] if TRANS_OUT else [row, col], c_smem)
    else:
        _store_by_pointer(out, rows, col, out_ptr, M, N, TRANS_OUT, SUBTILE_N, mma_layout)


@gluon.jit
def _store_by_pointer(out, rows, col, out_ptr, M: gl.constexpr, N: gl.constexpr, TRANS_OUT: gl.constexpr,
                      COLS: gl.constexpr, layout: gl.constexpr):
    """`out` (rows, COLS columns from col) straight from registers, masked at M and N; (N, M) with
    TRANS_OUT."""
    cols = col + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    if TRANS_OUT:
        ptrs = out_ptr + cols[None, :].to(gl.int64) * M + rows[:, None]
    else:
        ptrs = out_ptr + rows[:, None].to(gl.int64) * N + cols[None, :]
    gl.store(ptrs, out, mask=(rows[:, None] < M) & (cols[None, :] < N))


@gluon.jit
def _previous_tile_subtile(out, t, sub: gl.constexpr, c_bufs, out_desc, out_ptr, M: gl.constexpr,
                           N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                           NUM_SMS: gl.constexpr, TMA_STORE: gl.constexpr, TRANS_OUT: gl.constexpr,
                           EPI_BUFS: gl.constexpr, WG: gl.constexpr, mma_layout: gl.constexpr,
                           LIGHT_N: gl.constexpr):
    """Stores `out`, this consumer's subtile `sub` of its tile t - 1 (nothing when t == 0)."""
    if t > 0:
        ROWS: gl.constexpr = BLOCK_M // 2
        row, col = _tile_origin(t - 1, M, N, GROUP_M, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
        rows = row + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, mma_layout))
        buf = c_bufs.index(WG * EPI_BUFS + sub * (EPI_BUFS - 1))  # one buffer reused when EPI_BUFS == 1
        _store_subtile(out, row + WG * ROWS, col + sub * SUBTILE_N, rows, buf, out_desc, out_ptr, M, N, TMA_STORE,
                       TRANS_OUT, EPI_BUFS, mma_layout)


@gluon.jit
def _k_step(step, kb, acc0, acc1, partial, a_s, b_s0, b_s1, a_s_ptrs, row_ok, b_s_ptr, second_ok, out0, out1, t,
            bufs, bars, out_desc, out_ptr, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr,
            STAGES: gl.constexpr, TMA_STORE: gl.constexpr, TRANS_OUT: gl.constexpr, EPI_BUFS: gl.constexpr,
            WG: gl.constexpr, mma_layout: gl.constexpr, FIRST: gl.constexpr, LIGHT_N: gl.constexpr):
    """One K block of a consumer's tile: per 128-column subtile, wgmma into the partial, wait for it, promote
    it with the block's scales (FIRST: the accumulators start from it). FIRST also stores the previous
    tile's converted subtiles (out0, out1), each while one of this step's wgmma runs: the shared-memory
    write and the TMA store's issue then overlap the tensor cores instead of stalling both consumers
    between tiles. The registers fit (no spills for any output dtype, ptxas -v): the new accumulators are
    not live yet while the previous tile's outputs are.
    Returns the accumulators, the partial and the next K block's scales."""
    a_bufs, b_bufs, c_bufs = bufs
    ready, turn = bars
    SCALE_K: gl.constexpr = K // 128
    ROWS: gl.constexpr = BLOCK_M // 2
    SPLIT: gl.constexpr = BLOCK_N // SUBTILE_N
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    a_tile = a_bufs.index(s).slice(WG * ROWS, ROWS, dim=0)
    b_tile = b_bufs.index(s).slice(0, SUBTILE_N, dim=0).permute((1, 0))
    # Ping-pong: consumer WG issues its step after the other consumer issued the previous one.
    mbarrier.wait(turn.index(WG), (step & 1) ^ (1 - WG))
    partial = warpgroup_mma(a_tile, b_tile, partial, use_acc=False, is_async=True)
    mbarrier.arrive(turn.index(1 - WG), count=1)
    # The next K block's scales load while the wgmma runs (the last block reloads its own).
    nk = gl.minimum(kb + 1, SCALE_K - 1)
    next_a_s = gl.load(a_s_ptrs + nk, mask=row_ok, other=0.0)
    next_b_s0 = gl.load(b_s_ptr + nk)
    next_b_s1 = next_b_s0
    if FIRST:
        _previous_tile_subtile(out0, t, 0, c_bufs, out_desc, out_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS,
                               TMA_STORE, TRANS_OUT, EPI_BUFS, WG, mma_layout, LIGHT_N)
    if SPLIT == 2:
        next_b_s1 = gl.load(b_s_ptr + SCALE_K + nk, mask=second_ok, other=0.0)
        partial = warpgroup_mma_wait(num_outstanding=0, deps=(partial, b_tile))[0]
        if FIRST:
            acc0 = _settled(partial * (a_s * b_s0)[:, None])
        else:
            acc0 = _settled(acc0 + partial * (a_s * b_s0)[:, None])
        b_tile = b_bufs.index(s).slice(SUBTILE_N, SUBTILE_N, dim=0).permute((1, 0))
        partial = warpgroup_mma(a_tile, b_tile, partial, use_acc=False, is_async=True)
        if FIRST:
            _previous_tile_subtile(out1, t, 1, c_bufs, out_desc, out_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M,
                                   NUM_SMS, TMA_STORE, TRANS_OUT, EPI_BUFS, WG, mma_layout, LIGHT_N)
        partial = warpgroup_mma_wait(num_outstanding=0, deps=(partial, a_tile, b_tile))[0]
        _release(s)  # both consumers' releases free the stage
        if FIRST:
            acc1 = _settled(partial * (a_s * b_s1)[:, None])
        else:
            acc1 = _settled(acc1 + partial * (a_s * b_s1)[:, None])
    else:
        partial = warpgroup_mma_wait(num_outstanding=0, deps=(partial, a_tile, b_tile))[0]
        _release(s)
        if FIRST:
            acc0 = _settled(partial * (a_s * b_s0)[:, None])
        else:
            acc0 = _settled(acc0 + partial * (a_s * b_s0)[:, None])
    return acc0, acc1, partial, next_a_s, next_b_s0, next_b_s1


@gluon.jit
def _light_buffer(a_bufs, b_bufs, s, j: gl.constexpr, operand: gl.constexpr, rows: gl.constexpr,
                  LIGHT_N: gl.constexpr):
    """Where a light tile's K block j of stage s keeps its activation (operand 0, 128 rows) or weight
    (operand 1, LIGHT_N rows) tile: block 0 in the stage's activation buffer and the weight buffer's first
    LIGHT_N rows; block 1 (LIGHT_N = 64 only) in the weight buffer's rows 64-127 and 128-255. Both buffers
    have 128-byte rows and the same 128-byte swizzle, and a slice's offset is a multiple of its size (which
    the shared-memory subview requires)."""
    if j == 0:
        if operand == 0:
            buf = a_bufs.index(s)
        else:
            buf = b_bufs.index(s).slice(0, rows, dim=0)
    else:
        if operand == 0:
            buf = b_bufs.index(s).slice(128, rows, dim=0)
        else:
            buf = b_bufs.index(s).slice(LIGHT_N, rows, dim=0)
    return buf


@gluon.jit
def _light_stage(step, kb, KB: gl.constexpr, acc, partial0, partial1, a_s0, b_s0, a_s1, b_s1, a_s_ptrs, row_ok,
                 b_s_ptr, bufs, bars, SCALE_K: gl.constexpr, STAGES: gl.constexpr, WG: gl.constexpr,
                 LIGHT_N: gl.constexpr):
    """One stage of a light tile: K blocks kb .. kb + KB - 1, each an m64 x LIGHT_N wgmma into its own partial,
    issued together and waited for together (the stage is released before the promotions), then promoted
    with their scales (a_s0, b_s0; a_s1, b_s1). Returns the accumulator, the partials and the next stage's
    scales, which load while this stage's wgmma run."""
    a_bufs, b_bufs, _ = bufs
    ready, turn = bars
    ROWS: gl.constexpr = 64
    s = step % STAGES
    mbarrier.wait(ready.index(s), (step // STAGES) & 1)
    a0 = _light_buffer(a_bufs, b_bufs, s, 0, 0, 128, LIGHT_N).slice(WG * ROWS, ROWS, dim=0)
    b0 = _light_buffer(a_bufs, b_bufs, s, 0, 1, LIGHT_N, LIGHT_N).permute((1, 0))
    a1 = a0
    b1 = b0
    mbarrier.wait(turn.index(WG), (step & 1) ^ (1 - WG))
    partial0 = warpgroup_mma(a0, b0, partial0, use_acc=False, is_async=True)
    if KB == 2:
        a1 = _light_buffer(a_bufs, b_bufs, s, 1, 0, 128, LIGHT_N).slice(WG * ROWS, ROWS, dim=0)
        b1 = _light_buffer(a_bufs, b_bufs, s, 1, 1, LIGHT_N, LIGHT_N).permute((1, 0))
        partial1 = warpgroup_mma(a1, b1, partial1, use_acc=False, is_async=True)
    mbarrier.arrive(turn.index(1 - WG), count=1)
    n0 = gl.minimum(kb + KB, SCALE_K - 1)
    next_a_s0 = gl.load(a_s_ptrs + n0, mask=row_ok, other=0.0)
    next_b_s0 = gl.load(b_s_ptr + n0)
    next_a_s1 = next_a_s0
    next_b_s1 = next_b_s0
    if KB == 2:
        n1 = gl.minimum(kb + KB + 1, SCALE_K - 1)
        next_a_s1 = gl.load(a_s_ptrs + n1, mask=row_ok, other=0.0)
        next_b_s1 = gl.load(b_s_ptr + n1)
        partial0, partial1 = warpgroup_mma_wait(num_outstanding=0, deps=(partial0, partial1, a0, b0, a1, b1))[:2]
    else:
        partial0 = warpgroup_mma_wait(num_outstanding=0, deps=(partial0, a0, b0))[0]
    _release(s)
    if KB == 2:
        acc = _settled(acc + partial0 * (a_s0 * b_s0)[:, None] + partial1 * (a_s1 * b_s1)[:, None])
    else:
        acc = _settled(acc + partial0 * (a_s0 * b_s0)[:, None])
    return acc, partial0, partial1, next_a_s0, next_b_s0, next_a_s1, next_b_s1


@gluon.jit
def _light_tiles(step, first, tiles, bufs, bars, ptrs, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr,
                 STAGES: gl.constexpr, TRANS_OUT: gl.constexpr, WG: gl.constexpr, LIGHT_N: gl.constexpr):
    """This consumer's rows of the program's light tiles t = first .. tiles - 1 (`light_columns`): one
    m64 x LIGHT_N wgmma per K block on LIGHT_N weight rows (the loader's box for them reads no row past N),
    promoted as in `_k_step`, the output stored from registers at the tile's end.

    Why two K blocks per stage where they fit (LIGHT_N = 64 beside 256-wide tiles): a light tile does a
    quarter of a full tile's wgmma work per K block, so its steps are as short as the stage ring's latency
    allows: alone on the GPU a light tile took longer than a full one did (39.5 against 30.7 us at K = 7168,
    H100). Two blocks per stage double the K blocks in flight."""
    a_scale_ptr, b_scale_ptr, out_ptr, alpha_ptr = ptrs
    SCALE_K: gl.constexpr = K // 128
    ROWS: gl.constexpr = BLOCK_M // 2
    LIGHT_KB: gl.constexpr = _light_k_blocks(BLOCK_N, LIGHT_N)
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, LIGHT_N, 32])
    alpha = gl.load(alpha_ptr)
    partial0 = gl.zeros((ROWS, LIGHT_N), gl.float32, layout=layout)
    partial1 = partial0
    for t in range(first, tiles):
        row, col = _tile_origin(t, M, N, GROUP_M, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
        rows = row + WG * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        row_ok = rows < M
        a_s_ptrs = a_scale_ptr + rows * SCALE_K
        b_s_ptr = b_scale_ptr + (col // 128) * SCALE_K
        acc = gl.zeros((ROWS, LIGHT_N), gl.float32, layout=layout)
        a_s0 = gl.load(a_s_ptrs, mask=row_ok, other=0.0)
        b_s0 = gl.load(b_s_ptr)
        a_s1 = a_s0
        b_s1 = b_s0
        if LIGHT_KB == 2:
            a_s1 = gl.load(a_s_ptrs + gl.minimum(1, SCALE_K - 1), mask=row_ok, other=0.0)
            b_s1 = gl.load(b_s_ptr + gl.minimum(1, SCALE_K - 1))
        for kp in range(SCALE_K // LIGHT_KB):
            acc, partial0, partial1, a_s0, b_s0, a_s1, b_s1 = _light_stage(
                step, kp * LIGHT_KB, LIGHT_KB, acc, partial0, partial1, a_s0, b_s0, a_s1, b_s1, a_s_ptrs, row_ok,
                b_s_ptr, bufs, bars, SCALE_K, STAGES, WG, LIGHT_N)
            step += 1
        if SCALE_K % LIGHT_KB != 0:
            acc, partial0, partial1, a_s0, b_s0, a_s1, b_s1 = _light_stage(
                step, SCALE_K - 1, 1, acc, partial0, partial1, a_s0, b_s0, a_s1, b_s1, a_s_ptrs, row_ok, b_s_ptr,
                bufs, bars, SCALE_K, STAGES, WG, LIGHT_N)
            step += 1
        _store_by_pointer((acc * alpha).to(out_ptr.dtype.element_ty), rows, col, out_ptr, M, N, TRANS_OUT,
                          LIGHT_N, layout)


@gluon.jit
def _consumer(descs, bufs, bars, ptrs, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr,
              TMA_STORE: gl.constexpr, TRANS_OUT: gl.constexpr, EPI_BUFS: gl.constexpr, WG: gl.constexpr,
              LIGHT_N: gl.constexpr):
    """One 4-warp consumer: rows WG * 64 .. WG * 64 + 63 of every tile, wgmma and promotion per K block
    (`_k_step`); then this program's light tiles, if any (`_light_tiles`)."""
    out_desc = descs[2]
    c_bufs = bufs[2]
    a_scale_ptr, b_scale_ptr, out_ptr, alpha_ptr = ptrs
    SCALE_K: gl.constexpr = K // 128
    SCALE_N: gl.constexpr = (N + 127) // 128
    ROWS: gl.constexpr = BLOCK_M // 2
    SPLIT: gl.constexpr = BLOCK_N // SUBTILE_N  # 1 or 2 subtiles
    # wgmma m64n128k32: the warp group's 4 warps hold 16 rows each.
    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, SUBTILE_N, 32])
    row_layout: gl.constexpr = gl.SliceLayout(1, mma_layout)
    alpha = gl.load(alpha_ptr)
    partial = gl.zeros((ROWS, SUBTILE_N), gl.float32, layout=mma_layout)
    acc0 = partial
    acc1 = partial
    # The previous tile's output subtiles, converted (bf16 / fp32 registers) but not yet stored.
    out0 = partial.to(out_ptr.dtype.element_ty)
    out1 = out0
    tiles = _full_tiles(M, N, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
    step = 0
    for t in range(tiles):
        row, col = _tile_origin(t, M, N, GROUP_M, BLOCK_M, BLOCK_N, NUM_SMS, LIGHT_N)
        rows = row + WG * ROWS + gl.arange(0, ROWS, layout=row_layout)
        row_ok = rows < M
        a_s_ptrs = a_scale_ptr + rows * SCALE_K
        b_s_ptr = b_scale_ptr + (col // 128) * SCALE_K
        second_ok = col // 128 + 1 < SCALE_N  # a 256-wide tile's second weight block may lie past N
        a_s = gl.load(a_s_ptrs, mask=row_ok, other=0.0)
        b_s0 = gl.load(b_s_ptr)
        b_s1 = b_s0
        if SPLIT == 2:
            b_s1 = gl.load(b_s_ptr + SCALE_K, mask=second_ok, other=0.0)
        # The first K step starts the accumulators (no zeros kept live beside the pending output) and stores
        # the previous tile's subtiles while its wgmma run.
        acc0, acc1, partial, a_s, b_s0, b_s1 = _k_step(
            step, 0, acc0, acc1, partial, a_s, b_s0, b_s1, a_s_ptrs, row_ok, b_s_ptr, second_ok, out0, out1,
            t, bufs, bars, out_desc, out_ptr, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS, STAGES, TMA_STORE,
            TRANS_OUT, EPI_BUFS, WG, mma_layout, True, LIGHT_N)
        step += 1
        for kb in range(1, SCALE_K):
            acc0, acc1, partial, a_s, b_s0, b_s1 = _k_step(
                step, kb, acc0, acc1, partial, a_s, b_s0, b_s1, a_s_ptrs, row_ok, b_s_ptr, second_ok, out0,
                out1, t, bufs, bars, out_desc, out_ptr, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS, STAGES,
                TMA_STORE, TRANS_OUT, EPI_BUFS, WG, mma_layout, False, LIGHT_N)
            step += 1
        out0 = (acc0 * alpha).to(out_ptr.dtype.element_ty)
        out1 = (acc1 * alpha).to(out_ptr.dtype.element_ty)
    # The last full tile's output: no wgmma left to overlap it with.
    _previous_tile_subtile(out0, tiles, 0, c_bufs, out_desc, out_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS,
                           TMA_STORE, TRANS_OUT, EPI_BUFS, WG, mma_layout, LIGHT_N)
    if SPLIT == 2:
        _previous_tile_subtile(out1, tiles, 1, c_bufs, out_desc, out_ptr, M, N, BLOCK_M, BLOCK_N, GROUP_M,
                               NUM_SMS, TMA_STORE, TRANS_OUT, EPI_BUFS, WG, mma_layout, LIGHT_N)
    if LIGHT_N > 0:
        _light_tiles(step, tiles, _program_tiles(M, N, BLOCK_M, BLOCK_N, NUM_SMS), bufs, bars, ptrs, M, N, K,
                     BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS, STAGES, TRANS_OUT, WG, LIGHT_N)
    if TMA_STORE:
        tma.store_wait(pendings=0)


@gluon.jit
def ready_barriers(STAGES: gl.constexpr):
    """ready[s]: completed by stage s's TMA bytes after the loader's expect."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    return ready


@gluon.jit
def stage_barriers(STAGES: gl.constexpr):
    """The stage ring's mbarriers of a warp-specialized GEMM with one TMA loader and two consumers (mx_gluon.py;
    this module's kernel takes `ready_barriers` only and releases its stages by named barrier, see
    `EMPTY_BARRIER0`): `ready_barriers`, and empty[s], completed by one arrival of each consumer once it has
    read stage s."""
    ready = ready_barriers(STAGES)
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(empty.index(i), count=2)
    return ready, empty


@gluon.jit
def block_fp8_gluon_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,
    M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr, TMA_STORE: gl.constexpr,
    EPI_BUFS: gl.constexpr, TRANS_OUT: gl.constexpr = False,
):
    """out = alpha * sum over 128-wide K blocks kb of (a_kb @ b_kb.T) * a_scale[m, kb] * b_scale[n/128, kb].

    a (M, K) e4m3, a_scale (M, K/128) fp32, b (N, K) e4m3, b_scale (ceil(N/128), K/128) fp32, out (M, N),
    or with TRANS_OUT out (N, M) holding the product transposed;
    K a multiple of 128, BLOCK_M = 128, BLOCK_N 128 or 256. Grid: (NUM_SMS,), every program with at least
    one tile; launched with num_warps=4 (the first consumer), the partitions add 8 more warps.
    """
    BLOCK_K: gl.constexpr = 128  # one promotion per K step: the scale block is the K tile
    LIGHT_N: gl.constexpr = light_columns(N, BLOCK_N)  # 0: no light tiles
    ROWS: gl.constexpr = BLOCK_M // 2
    a_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_K], gl.float8e4nv)
    b_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_K], gl.float8e4nv)
    a_desc = tma.make_tensor_descriptor(a_ptr, [M, K], [K, 1], [BLOCK_M, BLOCK_K], a_layout)
    b_desc = tma.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [BLOCK_N, BLOCK_K], b_layout)
    a_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_M, BLOCK_K], a_layout)
    b_bufs = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BLOCK_N, BLOCK_K], b_layout)
    ready = ready_barriers(STAGES)
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, SUBTILE_N], out_ptr.dtype.element_ty)
    if TMA_STORE and TRANS_OUT:
        c_layout_t: gl.constexpr = gl.NVMMASharedLayout.get_default_for([SUBTILE_N, ROWS], out_ptr.dtype.element_ty)
        out_desc = tma.make_tensor_descriptor(out_ptr, [N, M], [M, 1], [SUBTILE_N, ROWS], c_layout_t)
        c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2 * EPI_BUFS, SUBTILE_N, ROWS], c_layout_t)
    elif TMA_STORE:
        out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [ROWS, SUBTILE_N], c_layout)
        c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2 * EPI_BUFS, ROWS, SUBTILE_N], c_layout)
    else:  # placeholders of the partitions' common signature; the pointer store uses neither
        out_desc = a_desc
        c_bufs = gl.allocate_shared_memory(out_ptr.dtype.element_ty, [2 * EPI_BUFS, 8, SUBTILE_N], c_layout)
    if LIGHT_N > 0:  # the weight's last LIGHT_N-column tiles: a box of only those rows (`_light_tiles`)
        light_desc = tma.make_tensor_descriptor(b_ptr, [N, K], [K, 1], [LIGHT_N, BLOCK_K], b_layout)
    else:
        light_desc = b_desc
    descs = (a_desc, b_desc, out_desc, light_desc)
    bufs = (a_bufs, b_bufs, c_bufs)
    bars = (ready, turn)
    ptrs = (a_scale_ptr, b_scale_ptr, out_ptr, alpha_ptr)
    gl.warp_specialize([
        (_consumer, (descs, bufs, bars, ptrs, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS, STAGES, TMA_STORE,
                     TRANS_OUT, EPI_BUFS, 0, LIGHT_N)),
        (_consumer, (descs, bufs, bars, ptrs, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS, STAGES, TMA_STORE,
                     TRANS_OUT, EPI_BUFS, 1, LIGHT_N)),
        (_loader, (descs, bufs, bars, ptrs, M, N, K, BLOCK_M, BLOCK_N, GROUP_M, NUM_SMS, STAGES, TMA_STORE,
                   TRANS_OUT, EPI_BUFS, 0, LIGHT_N)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])


# ---------------------------------------------------------------------------------------------------------
# jnp side.

def _smem_bytes(config: TileConfig, out_dtype, buffers: int) -> int:
    """Shared memory of the stages, `buffers` output subtiles per consumer and the mbarriers (rounded up)."""
    stages = config.num_stages * (config.block_m + config.block_n) * config.block_k
    subtile = config.block_m // 2 * SUBTILE_COLUMNS * jnp.dtype(out_dtype).itemsize
    return stages + 2 * buffers * subtile + 1024


def epilogue_buffers(config: TileConfig, out_dtype) -> int:
    """Output buffers per consumer: one per 128-column subtile where they fit beside the stages, else one
    reused (each subtile's TMA store has read it before the next is written)."""
    split = config.block_n // SUBTILE_COLUMNS
    return split if _smem_bytes(config, out_dtype, split) <= SMEM_BYTES else 1


def check_warp_specialized(config: TileConfig, kernel: str, smem: int, smem_holds: str) -> None:
    """The rules the warp-specialized Gluon GEMMs share (here and mx_gluon.py): two 4-warp consumers (num_warps
    names the first partition) beside a loader warp, at least two stages (one loading while one is read),
    `smem` bytes (what `smem_holds` names) within a block's shared memory, the fixed register split, and at
    least one program."""
    if config.num_warps != 4:
        raise ValueError(f"{kernel} runs 4-warp consumers, got num_warps={config.num_warps}")
    if config.num_stages < 2:
        raise ValueError(f"num_stages must be >= 2 (one stage loading while one is read), got {config.num_stages}")
    if smem > SMEM_BYTES:
        raise ValueError(f"{smem_holds} need {smem} bytes of shared memory; an H100 block has {SMEM_BYTES}")
    if config.max_registers not in (0, MAX_REGISTERS):
        raise ValueError(f"{kernel}'s register split is fixed ({CONSUMER_REGISTERS} per consumer thread), got "
                         f"max_registers={config.max_registers}")
    if config.num_sms < 1:
        raise ValueError(f"num_sms must be >= 1, got {config.num_sms}")


def check_config(p: GemmProblem, config: TileConfig) -> None:
    if config.num_stages > MAX_STAGES:
        raise ValueError(f"the Gluon block FP8 kernel releases its stages by named barriers {EMPTY_BARRIER0.value}-15: "
                         f"at most {MAX_STAGES} stages, got {config.num_stages}")
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the Gluon block FP8 kernel takes block_fp8 x block_fp8, got {p.a_kind} x {p.b_kind}")
    if p.k % SCALE_GROUP:
        raise ValueError(f"block_fp8 needs K padded to a multiple of 128, got K={p.k}")
    if p.b_batched:
        raise ValueError("the Gluon block FP8 kernel takes an unbatched weight (batched: block_fp8_persistent)")
    if config.block_m != 128 or config.block_k != 128 or config.block_n not in (128, 256):
        raise ValueError(f"the Gluon block FP8 kernel runs 128 x 128 x 128 or 128 x 256 x 128 tiles, got "
                         f"{config.block_m} x {config.block_n} x {config.block_k}")
    check_warp_specialized(config, "the Gluon block FP8 kernel", _smem_bytes(config, OUT_DTYPES[p.out_dtype], 1),
                           f"{config.num_stages} stages of {config.block_m} x {config.block_n} tiles and the "
                           f"{p.out_dtype} output subtiles")


# The measured configurations: 128 x 256 tiles with 3 stages (4 stages within the run-to-run spread), and
# 128 x 128 tiles with 4 stages, which at 8192^3 ran at 0.89x the wide tiles' rate (1091 vs 1227 TF/s,
# benchmarks/results/block_fp8_variants_h100_2026-11-23.md): a narrow tile takes 0.5 / 0.89 = 0.56 of a wide
# tile's time.
WIDE_TILES = TileConfig(block_m=128, block_n=256, block_k=128, group_m=8, num_warps=4, num_stages=3,
                        kernel="block_fp8_gluon")
NARROW_TILES = WIDE_TILES.replace(block_n=128, num_stages=4)
_NARROW_TILE_TIME = 0.56
# A light tile's time, as a fraction of a wide tile's, by the columns it multiplies. 64: measured (H100,
# 2026-11-24, K = 7168): 24 us alone (4096 x 64), against ~49 us per wide tile when every SM runs them
# (4096 x 2112: 124 us for two wide tiles and a light one). A light tile does a quarter of the wgmma work but
# is bound by its K steps (two K blocks per stage; four stages instead of three were no faster). 128: not
# measured, an estimate: one K block per stage, as the 64-column tiles had before pairing, when one took
# 39.5 us alone (longer than a wide tile alone, 30.7 us).
LIGHT_TILE_TIME = {64: 0.5, 128: 0.8}


def busiest_program_time(p: GemmProblem, config: TileConfig) -> float:
    """The time of the busiest persistent program (one per SM) on p's tiles, in wide-tile times: program i
    runs tiles i, i + num_sms, ..., the full tiles first and the light ones (`light_columns`) last."""
    tiles_m = triton.cdiv(p.batch * p.m, config.block_m)
    light = light_columns(p.n, config.block_n)
    full = tiles_m * _grouped_columns(p.n, config.block_n, light)
    tiles = full + (tiles_m if light else 0)
    full_time = 1.0 if config.block_n == 2 * SUBTILE_COLUMNS else _NARROW_TILE_TIME
    programs = min(config.num_sms, tiles)
    busiest = 0.0
    for pid in range(programs):
        mine = triton.cdiv(tiles - pid, programs)
        full_mine = triton.cdiv(max(full - pid, 0), programs)
        busiest = max(busiest, full_mine * full_time + (mine - full_mine) * LIGHT_TILE_TIME.get(light, 0.0))
    return busiest


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """128 x 256 tiles, unless 128 x 128 tiles keep the busiest program busy for less time.

    Why the busiest program: every program owns one SM and runs its tiles in turn, so the one with the most
    work sets the time (`busiest_program_time`). Where a wide-tile count lands just past a whole wave,
    narrow tiles can fill the waves better: at 3072 x 2048 x 4096 192 wide tiles are two waves for 1.45
    waves of work, 384 narrow ones three waves of 0.56 (0.71x -> 0.82x cuBLAS blockwise, H100, 2026-11-24,
    benchmarks/results/block_fp8_suite_shapes_h100_2026-11-24_session23.md). The suite's other large shapes
    keep wide tiles."""
    del target
    wide = busiest_program_time(p, WIDE_TILES)
    return NARROW_TILES if busiest_program_time(p, NARROW_TILES) < wide else WIDE_TILES


# The kernel can write the product transposed (TRANS_OUT): `primitive` asks for it with transpose_out=True
# when one (M, N) product is wanted as (N, M), e.g. a (K, N) weight's gradient (recipes' wgrad).
WRITES_TRANSPOSED = True


def kernel_constexprs(p: GemmProblem, config: TileConfig, transpose_out: bool = False) -> dict:
    """The kernel's constexprs for p (an unbatched weight: the batch folds into M) under `config`: one program
    per SM up to the tile count (NUM_SMS, also the grid), the TMA store where the output rows allow it. What
    `launch` passes, and what benchmarks/assembler_ab.py passes to Triton's own launcher."""
    rows = p.batch * p.m
    out_dtype = OUT_DTYPES[p.out_dtype]
    tiles = triton.cdiv(rows, config.block_m) * triton.cdiv(p.n, config.block_n)
    return dict(M=rows, N=p.n, K=p.k, BLOCK_M=config.block_m, BLOCK_N=config.block_n, GROUP_M=config.group_m,
                NUM_SMS=min(config.num_sms, tiles), STAGES=config.num_stages,
                TMA_STORE=out_rows_tma_aligned(p, transpose_out), EPI_BUFS=epilogue_buffers(config, out_dtype),
                TRANS_OUT=bool(transpose_out))


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int, transpose_out: bool = False
           ) -> jax.Array:
    """Block FP8 GEMM on the Gluon kernel; returns (p.batch, p.m, p.n) of p.out_dtype, or with transpose_out
    (p.batch == 1 only) (1, p.n, p.m): the product transposed, written so by the kernel's epilogue (the
    TMA store's shared buffer is written through a transposed view: stmatrix .trans, no extra pass).
    Dispatch sends it only configs that name it (`backends.KernelEntry.named_configs_only`;
    `default_config` does)."""
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    if transpose_out and p.batch != 1:
        raise ValueError(f"transpose_out takes one (M, N) product, got a batch of {p.batch}")
    _, rows, a_values, a_scales = fold_batch(p, a_values, a_scales)
    constexprs = kernel_constexprs(p, config, transpose_out)
    out = scratch.scratch_call(
        block_fp8_gluon_kernel, a_values.reshape(rows, p.k), a_scales.reshape(rows, p.k // SCALE_GROUP),
        b_values, b_scales, alpha.reshape(1).astype(jnp.float32),
        out_shape=jax.ShapeDtypeStruct((p.n, rows) if transpose_out else (rows, p.n), OUT_DTYPES[p.out_dtype]),
        grid=(constexprs["NUM_SMS"], 1, 1), num_warps=4, num_stages=config.num_stages,
        compute_capability=compute_capability, name="block_fp8_gluon_gemm", maxnreg=MAX_REGISTERS, **constexprs,
    )
    return out.reshape((1, p.n, p.m) if transpose_out else (p.batch, p.m, p.n))
