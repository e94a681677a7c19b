"""Triton helpers the GEMM kernels here share: launch order, split-K ranges, the plain epilogue and TMA tiles."""

import triton
import triton.language as tl
from triton.experimental import gluon


@triton.jit
def grouped_tile(pid, M: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program `pid`, GROUP_M row tiles at a time so a wave of programs reuses the same
    B column tiles (and A row tiles) out of L2."""
    tiles_m: tl.constexpr = triton.cdiv(M, BLOCK_M)
    tiles_n: tl.constexpr = triton.cdiv(N, BLOCK_N)
    programs_per_group: tl.constexpr = GROUP_M * tiles_n
    group = pid // programs_per_group
    first_m = group * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % programs_per_group) % group_rows
    pid_n = (pid % programs_per_group) // group_rows
    return pid_m, pid_n


@triton.jit
def k_tile_range(K_TILES: tl.constexpr, SPLIT_K: tl.constexpr, AXIS: tl.constexpr = 2):
    """The [begin, end) K tiles of this program: all of them, or its share under split-K (grid axis AXIS)."""
    if SPLIT_K == 1:
        begin = 0
        end = K_TILES
    else:
        per_split: tl.constexpr = triton.cdiv(K_TILES, SPLIT_K)
        begin = tl.program_id(AXIS) * per_split
        end = tl.minimum(begin + per_split, K_TILES)
    return begin, end


@triton.jit
def store_alpha_tile(acc, alpha_ptr, out_base, pid_m, pid_n, M: tl.constexpr, N: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, OUT_T: tl.constexpr = False):
    """acc * alpha (nvfp4's product of tensor scales, 1.0 otherwise; linear, so per split-K slice is fine),
    cast to the output type and stored to the row-major (M, N) slab at `out_base` where in bounds; OUT_T: to
    the (N, M) slab, the product transposed (Triton's coalescing pass then converts the tile's layout so that
    the stores run along M)."""
    acc = acc * tl.load(alpha_ptr)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if OUT_T:
        out_ptrs = out_base + offs_n[None, :].to(tl.int64) * M + offs_m[:, None]
    else:
        out_ptrs = out_base + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, acc.to(out_base.dtype.element_ty), mask=mask)


@triton.jit
def tma_descriptor(ptr, BATCHES: tl.constexpr, ROWS: tl.constexpr, K: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_K: tl.constexpr):
    """A TMA descriptor over (BLOCK_R, BLOCK_K) tiles of a row-major (BATCHES, ROWS, K) array; 3D when
    batched, so that a tile never reads the next batch's rows (the TMA unit zero-fills past each
    dimension's end). Built in the kernel: it needs global scratch (`launch.scratch_call`)."""
    if BATCHES == 1:
        desc = tl.make_tensor_descriptor(ptr, shape=[ROWS, K], strides=[K, 1], block_shape=[BLOCK_R, BLOCK_K])
    else:
        desc = tl.make_tensor_descriptor(ptr, shape=[BATCHES, ROWS, K], strides=[ROWS * K, K, 1],
                                         block_shape=[1, BLOCK_R, BLOCK_K])
    return desc


@triton.jit
def tma_load(desc, batch, row, k, BATCHES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (BLOCK_R, BLOCK_K) tile at (batch, row, k) of a `tma_descriptor`."""
    if BATCHES == 1:
        tile = desc.load([row, k])
    else:
        tile = desc.load([batch, row, k]).reshape(BLOCK_R, BLOCK_K)
    return tile


@triton.jit
def promote_block(acc, partial, a_s, b_s, BLOCK_N: tl.constexpr):
    """Block FP8 promotion of one 128-K block: acc += partial * a_scale[m] * b_scale[n] in fp32 (b's scale
    is one scalar when the tile lies inside one 128-row weight block)."""
    if 128 % BLOCK_N == 0:
        acc += partial * (a_s * b_s)[:, None]
    else:
        acc += partial * a_s[:, None] * b_s[None, :]
    return acc


@gluon.constexpr_function  # so Gluon layout functions may call it (Triton hashes what they reference)
def linear_bases(rank: int, dim: int, count: int, first: int) -> list[list[int]]:
    """Bases of a Gluon `DistributedLinearLayout` (rank dims) that step `count` (a power of two) times along
    `dim`: first, 2 * first, 4 * first, ... (the quantizers' two-register-order layouts)."""
    return [[first << i if d == dim else 0 for d in range(rank)] for i in range(count.bit_length() - 1)]

