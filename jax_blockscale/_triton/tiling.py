"""Triton helpers every GEMM kernel here shares: launch order, split-K ranges and the plain epilogue."""

import triton
import triton.language as tl


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
def k_tile_range(K_TILES: tl.constexpr, SPLIT_K: tl.constexpr):
    """The [begin, end) K tiles of this program: all of them, or its share under split-K (grid axis 2)."""
    if SPLIT_K == 1:
        begin = 0
        end = K_TILES
    else:
        per_split: tl.constexpr = triton.cdiv(K_TILES, SPLIT_K)
        begin = tl.program_id(2) * per_split
        end = tl.minimum(begin + per_split, K_TILES)
    return begin, end


@triton.jit
def store_alpha_tile(acc, alpha_ptr, out_base, pid_m, pid_n, M: tl.constexpr, N: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc * alpha (nvfp4's product of tensor scales, 1.0 otherwise; linear, so per split-K slice is fine),
    cast to the output type and stored to the row-major (M, N) slab at `out_base` where in bounds."""
    acc = acc * tl.load(alpha_ptr)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    out_ptrs = out_base + offs_m[:, None].to(tl.int64) * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, acc.to(out_base.dtype.element_ty), mask=mask)
