"""8-bit decode GEMM on Hopper: the weight's fp8 codes straight into an fp8 wgmma (Gluon).

Two weight formats whose codes the tensor cores multiply as they are, at 1-64 activation rows (a serving
step, where the matmul streams the weight once and its time is the weight's bytes over the memory
bandwidth):
- block FP8 (DeepSeek-V3): weights w (N, K) e4m3 with fp32 scales per 128 x 128 tile, activations x (M, K)
  e4m3 with fp32 scales per 1 x 128 group;
- 8-bit MX on both sides (mxfp8, e4m3 or e5m2 codes in any pairing): e8m0 scales per 32 elements along K.
Unlike the fp4 / bf16-activation decode kernels (decode.py, decode_wgmma.py) nothing is decoded: the kernel
is a stream of the weight through shared memory with a few instructions per K block.

- The weight is the MMA's M side (64 rows per work item, one warp group), the activations, padded to
  `block_m` in (8, 16, 32, 64) rows by the TMA unit's zero fill, its N side: wgmma m64nBMk32, both operands
  from shared memory, K-major as the contract lays them out (no transpose anywhere).
- Persistent programs (two per SM where the ring leaves room) take the (64-row tile, K split) work items in
  turn, and one ring runs across them: a slot holds `block_k` / 128 consecutive 128-wide K blocks of the
  weight and activations (one TMA box each, one mbarrier per slot), issued `STAGES - 1` slots ahead of the
  wgmma reading it, so the next item's blocks load while this one finishes; the TMA descriptors are built
  once per program.
- Block FP8: each 128-wide K block's wgmma result is promoted into the fp32 accumulator with
  `w_scale * x_scale[m]` (DeepSeek-V3 §3.3.2, as block_fp8.py): a 64-row tile lies in one 128-row weight scale
  block, so the weight's scale is one scalar per block; the activations' are one per output column.
- MX: one k32 wgmma per 32-wide group (the four of a 128-wide block issued together, one wait), each product
  promoted with its weight row's and activation row's e8m0 scales. The weight's four per row and block are
  one 32-bit load, decoded by bit placement (`_e8m0`); the activations' are decoded once per program into
  shared memory (fp32, a row of `block_m` per group), since every work item multiplies by the same ones. The
  fp8 wgmma's truncating accumulation then covers 32 products: ~5e-5 relative to the exact reference.
- Split-K (off by default) is reduced in the same kernel by decode_wgmma's epilogue (the last program of a
  tile sums the fp32 partials in split order, bitwise deterministic; `atomic_split_k` for fp32 atomics).

Measured (H100, 2026-11-23, kernel time, the five issue-#12 shapes):
- Block FP8 (benchmarks/results/decode_fp8_h100_2026-11-23_session18.md): 1.00-1.13x cuBLAS blockwise at 1-32
  rows and 0.95-1.03x at 64 (7168 x 4096: 13.19 / 13.62 / 14.62 / 15.98 us at 1 / 16 / 32 / 64 rows),
  1.01-1.37x the swapped Triton block_fp8 kernel that ran here before (except 0.98x at 7168 x 2048, 32 rows).
  What moved it, in order: persistent programs (one per (tile, split) with its own descriptors ran 0.52-0.93x
  cuBLAS), no K split (splits' fp32 partials cost more traffic than the extra programs win: 5-40% slower), and
  slots of 2-4 K blocks (256-512 contiguous bytes of each weight row requested together: 74-82% -> 78-86% of a
  same-size read at 7168 x 4096 and 8192 x 8192). At 64 rows the activation tile is as large as the weight's
  and is re-read by every work item; that is where it is slowest.
- mxfp8 x mxfp8 (benchmarks/results/decode_fp8_mx_h100_2026-11-23_session19.md), against what dispatch took
  before (decode.py up to 16 rows, upcast above): 1.56-1.70x at 4 rows, 0.89-1.27x at 8, 0.98-1.26x at 16,
  1.27-1.43x at 32, 1.12-1.33x at 64; at one row decode.py's GEMV stays (this kernel 0.72-1.01x of it). Against
  XLA's bf16 dot 1.31-1.85x at 4-32 rows. It stays issue-bound where block FP8 is not: 223 SASS instructions
  per 128-wide block and thread at 16 rows against block FP8's 107 (the promotion is 2 fp32 operations per
  output, group and thread, and the weight's scales need decoding), with one warp group per SM at N = 7168.
  Keeping the next block's wgmmas in flight across a block's promotion measured slower (19.5 against 16.6 us
  at 16 rows of 7168 x 4096), as did K splits and deeper rings.

Hopper only (wgmma); sm_100 and gfx950 keep decode.py, whose Triton source lowers to tcgen05 / MFMA there.
Gluon kernels do not run in Triton's interpreter: tests/test_gpu_decode_fp8.py checks results on the GPU,
tests/test_lowering_decode_fp8.py the instructions and dispatch on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

from . import launch as scratch
from .decode import split_k_workspace, tensor_scale_operands
from .decode_wgmma import check_rows_and_k_steps, split_k_epilogue
from .problem import (BLOCK_FP8, HOPPER_SMEM_BYTES, HOPPER_SMS, OUT_DTYPES, SCALE_GROUP, GemmProblem, TileConfig,
                      check_operands)

# Block FP8 x block FP8, and 8-bit MX (e4m3 / e5m2 codes, e8m0 scales per 32) on both sides: the pairs whose
# codes an fp8 wgmma multiplies as they are.
_MX8 = ("e4m3", "e5m2")
SUPPORTED: frozenset[tuple[str, str]] = frozenset({(BLOCK_FP8, BLOCK_FP8)} | {(x, w) for x in _MX8 for w in _MX8})
BLOCK_MS = (8, 16, 32, 64)  # the activation rows padded to wgmma's N side
_DEFAULT_BLOCK_MS = (16, 32, 64)  # block FP8's (n8 not measured there)
TILE_ROWS = 64  # weight rows per work item: one m64 warp group, half a 128-row scale block
BLOCK_KS = (128, 256, 512)  # K per ring slot: 1, 2 or 4 TMA boxes of 128 K, one mbarrier


@gluon.jit
def _issue(w_desc, x_desc, w_bufs, x_bufs, ready, g, NSTEP: gl.constexpr, BOXES: gl.constexpr,
           N_TILES: gl.constexpr, PROGRAMS: gl.constexpr, STAGES: gl.constexpr):
    """TMA of this program's g-th step into ring slot g % STAGES, completing that slot's mbarrier: step
    g % NSTEP of its work item g // NSTEP (`_item`), BOXES consecutive 128-wide K blocks of weight rows n0..
    (zero past N) and activation rows 0..BM-1 (zero past M)."""
    n0, kb0 = _item(g // NSTEP, NSTEP * BOXES, N_TILES, PROGRAMS)
    kb = kb0 + (g % NSTEP) * BOXES
    s = g % STAGES
    bar = ready.index(s)
    mbarrier.expect(bar, BOXES * (w_desc.block_type.nbytes + x_desc.block_type.nbytes))
    for b in gl.static_range(BOXES):
        tma.async_copy_global_to_shared(w_desc, [n0, (kb + b) * 128], bar, w_bufs.index(s * BOXES + b))
        tma.async_copy_global_to_shared(x_desc, [0, (kb + b) * 128], bar, x_bufs.index(s * BOXES + b))


@gluon.jit
def _item(t, NKB: gl.constexpr, N_TILES: gl.constexpr, PROGRAMS: gl.constexpr):
    """(first weight row, first K block) of this program's t-th work item: item pid + t * PROGRAMS, which is
    split item // N_TILES of N tile item % N_TILES (consecutive programs take neighbouring tiles)."""
    item = gl.program_id(0) + t * PROGRAMS
    return (item % N_TILES) * 64, (item // N_TILES) * NKB


@gluon.jit
def _e8m0(code):
    """e8m0 code (uint32, 0..255) -> 2**(code - 127) in fp32 from bits: code << 23, with bit 22 set for codes
    0 (2**-127, an fp32 subnormal) and 255 (NaN), found by one add-and-mask test instead of
    upcast.e8m0_to_f32's two compares and selects: the MX loop decodes eight per thread and 128-wide block."""
    special = ((code + 1) & 0xFE) == 0
    return ((code << 23) | gl.where(special, 0x400000, 0)).to(gl.float32, bitcast=True)


@gluon.jit
def _stage_x_scales(x_scale_ptr, xs_smem, M: gl.constexpr, BM: gl.constexpr, SCALE_K: gl.constexpr):
    """The activations' e8m0 scales (M, SCALE_K), decoded to fp32 once per program into the first SCALE_K rows
    of xs_smem (group-major, BM per row): every work item of the program multiplies by the same ones, so the
    loop reads them decoded (columns past M hold 2**-127; their codes are TMA's zeros)."""
    # Groups per staging chunk: a power of two dividing SCALE_K (K is a multiple of 128: SCALE_K of 4).
    CH: gl.constexpr = 128 if SCALE_K % 128 == 0 else 64 if SCALE_K % 64 == 0 else 32 if SCALE_K % 32 == 0 else (
        16 if SCALE_K % 16 == 0 else 8 if SCALE_K % 8 == 0 else 4)
    L: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [1, 4], [0, 1])
    g = gl.arange(0, CH, layout=gl.SliceLayout(1, L))
    c = gl.arange(0, BM, layout=gl.SliceLayout(0, L))
    for g0 in gl.static_range(0, SCALE_K, CH):
        raw = gl.load(x_scale_ptr + c[None, :] * SCALE_K + g0 + g[:, None], mask=(c < M)[None, :], other=0)
        xs_smem.slice(g0, CH, dim=0).store(_e8m0(raw.to(gl.uint32)))


@gluon.jit
def _mx_box(acc, w_box, x_box, w_word, xs_smem, g, zeros, X_SCALES: gl.constexpr):
    """acc + one 128-wide K block (codes in w_box / x_box) for 8-bit MX: four k32 wgmmas, one per 32-wide group,
    all in flight at once (a wait per group would serialize the MMA's latency four times per block), each
    product promoted with its group's scales, the weight row's times the activation row's. The weight's four
    per row are w_word's bytes (little-endian: group j in byte j); the activations' come decoded from xs_smem
    (row g + j). Keeping the next block's wgmmas in flight across this promotion measured slower (module
    docstring)."""
    t0 = warpgroup_mma(w_box.slice(0, 32, dim=1), x_box.slice(0, 32, dim=1).permute((1, 0)), zeros, use_acc=False,
                       is_async=True)
    t1 = warpgroup_mma(w_box.slice(32, 32, dim=1), x_box.slice(32, 32, dim=1).permute((1, 0)), zeros,
                       use_acc=False, is_async=True)
    t2 = warpgroup_mma(w_box.slice(64, 32, dim=1), x_box.slice(64, 32, dim=1).permute((1, 0)), zeros,
                       use_acc=False, is_async=True)
    t3 = warpgroup_mma(w_box.slice(96, 32, dim=1), x_box.slice(96, 32, dim=1).permute((1, 0)), zeros,
                       use_acc=False, is_async=True)
    x0 = xs_smem.index(g).load(X_SCALES)
    x1 = xs_smem.index(g + 1).load(X_SCALES)
    x2 = xs_smem.index(g + 2).load(X_SCALES)
    x3 = xs_smem.index(g + 3).load(X_SCALES)
    p0, p1, p2, p3 = warpgroup_mma_wait(0, deps=[t0, t1, t2, t3])
    acc += (p0 * _e8m0(w_word & 0xFF)[:, None]) * x0[None, :]
    acc += (p1 * _e8m0((w_word >> 8) & 0xFF)[:, None]) * x1[None, :]
    acc += (p2 * _e8m0((w_word >> 16) & 0xFF)[:, None]) * x2[None, :]
    return acc + (p3 * _e8m0(w_word >> 24)[:, None]) * x3[None, :]


@gluon.jit
def decode_fp8_kernel(w_ptr, w_scale_ptr, x_ptr, x_scale_ptr, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr,
                      M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr, BOXES: gl.constexpr,
                      SPLIT_K: gl.constexpr, STAGES: gl.constexpr, PROGRAMS: gl.constexpr, ATOMIC: gl.constexpr):
    """Block FP8 (fp32 scales): out (M, N) = a_ts * b_ts * sum over 128-wide K blocks kb of (x_kb @ w_kb.T) *
    x_scale[m, kb] * w_scale[n / 128, kb]; w (N, K), x (M, K) e4m3, w_scale (cdiv(N, 128), K / 128) and
    x_scale (M, K / 128) fp32. MX (uint8 scales): the same sum over 32-wide K groups g with the e8m0 scales
    w_scale[n, g] and x_scale[m, g] (uint8, (N, K / 32) and (M, K / 32)); w and x e4m3 or e5m2, M <= BM.

    ws: (SPLIT_K, M, N) fp32 partials or a zeroed (M, N) accumulator (ATOMIC); count: zeroed int32 per N tile
    (both unused when SPLIT_K == 1). Work items: (64-row N tile, K split) pairs, cdiv(N, 64) * SPLIT_K of
    them; grid (PROGRAMS,), one warp group each, program p taking items p, p + PROGRAMS, ... with one ring
    running across them (the next item's blocks load while this item finishes). A ring slot holds BOXES
    consecutive 128-wide K blocks, loaded together. K a multiple of 128 * BOXES * SPLIT_K."""
    R: gl.constexpr = 64
    MX: gl.constexpr = w_scale_ptr.dtype.element_ty == gl.uint8  # e8m0 codes per 32; block FP8's are fp32
    SCALE_K: gl.constexpr = K // 32 if MX else K // 128  # scale groups along K
    NKB: gl.constexpr = K // 128 // SPLIT_K  # 128-wide K blocks per item
    NSTEP: gl.constexpr = NKB // BOXES      # ring steps per item
    N_TILES: gl.constexpr = (N + R - 1) // R
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BM, 32])
    W_T: gl.constexpr = w_ptr.dtype.element_ty  # e4m3 or (MX) e5m2: wgmma takes either on either side
    X_T: gl.constexpr = x_ptr.dtype.element_ty
    W_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([R, 128], W_T)
    X_SMEM: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, 128], X_T)

    items = (N_TILES * SPLIT_K - gl.program_id(0) + PROGRAMS - 1) // PROGRAMS
    total = items * NSTEP  # ring steps this program streams

    # Descriptors built once per program (global scratch); they zero-fill past N and M.
    w_desc = tma.make_tensor_descriptor(w_ptr, [N, K], [K, 1], [R, 128], W_SMEM)
    x_desc = tma.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BM, 128], X_SMEM)
    w_bufs = gl.allocate_shared_memory(W_T, [STAGES * BOXES, R, 128], W_SMEM)
    x_bufs = gl.allocate_shared_memory(X_T, [STAGES * BOXES, BM, 128], X_SMEM)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    for j in gl.static_range(STAGES - 1):
        if j < total:
            _issue(w_desc, x_desc, w_bufs, x_bufs, ready, j, NSTEP, BOXES, N_TILES, PROGRAMS, STAGES)
    if MX:
        # The activations' scales, staged while the first steps' loads fly.
        # Rows for every group, their count rounded up to a power of two (as shared memory shapes must be).
        XS_ROWS: gl.constexpr = triton.next_power_of_2(SCALE_K)
        xs_2d = gl.allocate_shared_memory(gl.float32, [XS_ROWS, BM], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        _stage_x_scales(x_scale_ptr, xs_2d, M, BM, SCALE_K)
        # The same bytes as rows of BM (a rank-1 layout), so that the loop indexes a group's row.
        xs_smem = xs_2d._reinterpret(gl.float32, [XS_ROWS, BM], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    cols = gl.arange(0, BM, layout=gl.SliceLayout(0, MMA))
    col_ok = cols < M
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
    zeros = gl.zeros([R, BM], gl.float32, layout=MMA)
    g = 0
    for t in range(items):
        n0, kb0 = _item(t, NKB, N_TILES, PROGRAMS)
        if MX:
            # e8m0 scales per 32-wide K group: the weight's one per row (each thread holds two rows of the tile;
            # a 128-wide block's four are one 32-bit word), the activations' staged above.
            row_ok = n0 + rows < N
            ws_words = (w_scale_ptr + (n0 + rows) * SCALE_K + kb0 * 4).to(gl.pointer_type(gl.uint32))
        else:
            # The weight's one scale per (128-row block, K block), the activations' one per output column;
            # each block's loaded before the previous block's wgmma, so that their latency hides behind it.
            xs_ptrs = x_scale_ptr + cols * SCALE_K + kb0
            ws_ptr0 = w_scale_ptr + (n0 // 128) * SCALE_K + kb0
            x_s = gl.load(xs_ptrs, mask=col_ok, other=0.0)
            w_s = gl.load(ws_ptr0)
        acc = zeros
        for i in range(NSTEP):
            # Slot (g - 1) % STAGES was read by the previous step's wgmma, which every warp has waited for.
            gl.thread_barrier()
            if g + STAGES - 1 < total:
                _issue(w_desc, x_desc, w_bufs, x_bufs, ready, g + STAGES - 1, NSTEP, BOXES, N_TILES, PROGRAMS,
                       STAGES)
            s = g % STAGES
            mbarrier.wait(ready.index(s), (g // STAGES) & 1)
            for b in gl.static_range(BOXES):
                w_box = w_bufs.index(s * BOXES + b)
                x_box = x_bufs.index(s * BOXES + b)
                if MX:
                    q = i * BOXES + b
                    acc = _mx_box(acc, w_box, x_box, gl.load(ws_words + q, mask=row_ok, other=0), xs_smem,
                                  kb0 * 4 + 4 * q, zeros, gl.SliceLayout(0, MMA))
                else:
                    nk = gl.minimum(i * BOXES + b + 1, NKB - 1)
                    next_x_s = gl.load(xs_ptrs + nk, mask=col_ok, other=0.0)
                    next_w_s = gl.load(ws_ptr0 + nk)
                    partial = warpgroup_mma(w_box, x_box.permute((1, 0)), zeros, use_acc=False)
                    acc += partial * (x_s * w_s)[None, :]
                    x_s = next_x_s
                    w_s = next_w_s
            g += 1
        split_k_epilogue(acc, n0 // R, kb0 // NKB, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, M, N, SPLIT_K,
                         ATOMIC, MMA)
    for j in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(j))


# ---------------------------------------------------------------------------------------------------------
# Host side.

# Launch defaults, from `python -m benchmarks.decode --fp8-knobs` (H100, 2026-11-23, kernel time, 7168 x 4096 and
# 8192 x 8192 at 1 / 16 / 64 rows; benchmarks/results/decode_fp8_h100_2026-11-23_session18.md, knob sweeps):
# - K per ring slot: 128-wide blocks alone read at 74-82% of a same-size read; slots of 2-4 consecutive blocks
#   (256-512 contiguous bytes of each weight row requested together) at 78-86% (7168 x 4096, 1 row: 14.31 ->
#   13.26 us). At 64 rows 256 beat 512 (16.07 against 16.69 us), its activation tiles being as large as the
#   weight's.
# - About 48 KiB of weight in the ring per program: 4 or 8 stages of 128-wide blocks ran 2-5% slower than 6;
#   3 stages of 512 within 2% of 2, 4 stages of 256 within 1% of 3.
# - Persistent programs, as many as fit on the SMs at once (two per SM where the ring leaves room): K splits
#   ran 5-40% slower (their fp32 partials cost more traffic than the extra programs win), and 132 programs
#   instead of 264 made no difference where the tiles number fewer than the SMs.
# 8-bit MX (benchmarks/results/decode_fp8_mx_h100_2026-11-23_session19.md, sweeps at 7168 x 2048 / 4096, 1 / 8 /
# 16 rows): 256-wide slots in 3 stages ran 1-5% faster than 512 in 2 (16.16 against 16.56 us at 16 rows of 7168 x
# 4096); up to 8 rows padded to wgmma's n8 instead of 16 ran 1-3% faster (half the promotion per thread).
_RING_BYTES = 48 * 1024


def _smem_bytes(p: GemmProblem, config: TileConfig) -> int:
    """The ring (STAGES slots of 64 weight rows and BM activation rows, block_k bytes each), its mbarriers and
    for MX the activations' decoded scales (fp32, BM per 32-wide K group)."""
    x_scales = 0 if p.b_kind == BLOCK_FP8 else 4 * config.block_m * triton.next_power_of_2(p.k // 32)
    return config.num_stages * (TILE_ROWS + config.block_m) * config.block_k + 1024 + x_scales


def check_config(p: GemmProblem, config: TileConfig) -> None:
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the fp8 decode kernel takes block_fp8 x block_fp8 or 8-bit MX (e4m3 / e5m2) on both "
                         f"sides, got {p.a_kind} x {p.b_kind}")
    if p.b_batched:
        raise ValueError("the fp8 decode kernel needs an unbatched weight")
    if p.k % SCALE_GROUP:
        raise ValueError(f"the fp8 decode kernel needs K padded to a multiple of 128 (its TMA boxes), got K={p.k}")
    check_rows_and_k_steps(p, config, "the fp8 decode kernel", BLOCK_MS, BLOCK_KS, "the K one ring slot holds")
    if config.block_n != TILE_ROWS or config.num_warps != 4:
        raise ValueError(f"the fp8 decode kernel runs 64 weight rows on one 4-warp group, got "
                         f"block_n={config.block_n}, num_warps={config.num_warps}")
    if config.num_stages < 2:
        raise ValueError(f"num_stages (the ring's slots) must be >= 2, got {config.num_stages}")
    if config.num_sms < 1:
        raise ValueError(f"num_sms (the persistent programs) must be >= 1, got {config.num_sms}")
    if _smem_bytes(p, config) > HOPPER_SMEM_BYTES:
        raise ValueError(f"{config.num_stages} stages of {TILE_ROWS + config.block_m} x {config.block_k} bytes (and "
                         f"MX activation scales) exceed an H100 block's {HOPPER_SMEM_BYTES} bytes of shared memory")


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """The rows padded to 16, 32 or 64 (MX: 8 too); ring slots of the widest K (512, 256 or 128; at most 256 at
    64 rows and for MX) that divides K, about `_RING_BYTES` of weight in the ring; no K split; as many
    persistent programs as fit on the SMs at once (launch defaults above)."""
    del target
    mx = p.b_kind != BLOCK_FP8
    block_m = next(b for b in (BLOCK_MS if mx else _DEFAULT_BLOCK_MS) if b >= p.batch * p.m)
    widest = 256 if mx or block_m == 64 else 512
    block_k = next(bk for bk in BLOCK_KS[::-1] if p.k % bk == 0 and bk <= widest)
    cfg = TileConfig(block_m=block_m, block_n=TILE_ROWS, block_k=block_k, group_m=1, num_warps=4,
                     num_stages=max(2, _RING_BYTES // (TILE_ROWS * block_k)), split_k=1, kernel="decode_fp8")
    return cfg.replace(num_sms=HOPPER_SMS * max(1, min(2, HOPPER_SMEM_BYTES // _smem_bytes(p, cfg))))


# The primitive passes the tensor scales (ones for block FP8) as they are, multiplied in the kernel's epilogue:
# no XLA multiply kernel beside this one.
TAKES_TENSOR_SCALES = True


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int, a_ts=None, b_ts=None) -> jax.Array:
    """The block FP8 decode GEMM (module docstring); returns (p.batch, p.m, p.n) of p.out_dtype. `alpha` (1,)
    is used when the scalar tensor scales `a_ts` / `b_ts` are not given."""
    if compute_capability != 90:
        raise ValueError(f"the fp8 decode kernel runs on sm_90 (wgmma), got compute capability {compute_capability}")
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    rows = p.batch * p.m
    x = a_values.reshape(rows, p.k)
    group = SCALE_GROUP if p.b_kind == BLOCK_FP8 else 32  # block FP8's 1 x 128 / 128 x 128, or MX's 32
    xs = a_scales.reshape(rows, p.k // group)
    a_ts, b_ts = tensor_scale_operands(alpha, a_ts, b_ts)
    n_tiles = triton.cdiv(p.n, TILE_ROWS)
    ws_shape, zeroed = split_k_workspace(rows, p.n, config)
    programs = min(config.num_sms, n_tiles * config.split_k)
    out, _, _ = scratch.scratch_call(
        decode_fp8_kernel, b_values, b_scales, x, xs, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((rows, p.n), OUT_DTYPES[p.out_dtype]),
                   jax.ShapeDtypeStruct(ws_shape, jnp.float32),
                   jax.ShapeDtypeStruct((n_tiles if config.split_k > 1 else 1,), jnp.int32)],
        zeroed_outputs=zeroed, grid=(programs,), num_warps=4, num_stages=config.num_stages,
        compute_capability=compute_capability, name="decode_fp8", M=rows, N=p.n, K=p.k, BM=config.block_m,
        BOXES=config.block_k // SCALE_GROUP, SPLIT_K=config.split_k, STAGES=config.num_stages, PROGRAMS=programs,
        ATOMIC=bool(config.atomic_split_k),
    )
    return out.reshape(p.batch, p.m, p.n)
