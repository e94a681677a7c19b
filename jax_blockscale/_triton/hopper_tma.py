"""Hopper GEMM with TMA loads: DeepSeek block FP8 (fp8 wgmma, fp32 promotion per 128 K) and plain 16-bit.

The pointer-based kernels (block_fp8.py, upcast.py) load tiles with per-thread `cp.async`, which spends
issue slots and registers on address arithmetic and reached 0.6-0.7x of XLA's fp8 GEMM on an H200. Here
each operand tile arrives by one TMA bulk copy (`cp.async.bulk.tensor`) into swizzled shared memory,
which wgmma reads directly, and out-of-bounds rows are zero-filled by the TMA unit instead of masked.
The descriptors are built in the kernel (`tl.make_tensor_descriptor`), so they need global scratch:
`launch.scratch_call` provides it.

Promotion (SCALED): each 128-wide K block runs its own fp32 wgmma chain, then `acc += partial * a_s * b_s`
(DeepSeek-V3 §3.3.2, see block_fp8.py). Triton waits for each block's wgmma before the promotion (its
accumulator is not loop-carried); promoting block k-1 after issuing block k's wgmma was measured slower
on an H200 (526 vs 751 TFLOP/s at 8192^3: the extra 64 live registers per thread), so it is not done.

Activation scales are passed transposed, (K/128, M), so that one K block's BLOCK_M scales are contiguous.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from . import launch
from .problem import OUT_DTYPES, SCALE_GROUP, GemmProblem, TileConfig, fold_batch
from .tiling import grouped_tile, store_alpha_tile, tma_descriptor, tma_load, promote_block



@triton.jit
def _scales(a_scale_ptr, b_scale_ptr, kb, offs_m, row_n, offs_n, M: tl.constexpr, SCALE_K: tl.constexpr,
            BLOCK_N: tl.constexpr):
    """(a_scale[kb, rows], b_scale[n / 128, kb]): b's is a scalar when the tile lies in one 128-row block."""
    a_s = tl.load(a_scale_ptr + kb * M + offs_m, mask=offs_m < M, other=0.0)
    if 128 % BLOCK_N == 0:
        b_s = tl.load(b_scale_ptr + (row_n // 128) * SCALE_K + kb)
    else:
        b_s = tl.load(b_scale_ptr + (offs_n // 128) * SCALE_K + kb)
    return a_s, b_s


@triton.jit
def tma_gemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BATCHES: tl.constexpr, B_BATCHED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr, SCALED: tl.constexpr,
):
    """out[batch] = alpha * a[batch] @ b[batch or 0].T, a (BATCHES, M, K), b ([BATCHES,] N, K).

    SCALED (block FP8): a_scale (BATCHES, K/128, M) and b_scale ([BATCHES,] ceil(N/128), K/128) fp32, and
    BLOCK_K == 128. Otherwise the scale pointers are unused dummies and the dot accumulates in place.
    """
    B_BATCHES: tl.constexpr = BATCHES if B_BATCHED else 1
    a_desc = tma_descriptor(a_ptr, BATCHES, M, K, BLOCK_M, BLOCK_K)
    b_desc = tma_descriptor(b_ptr, B_BATCHES, N, K, BLOCK_N, BLOCK_K)
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1)
    b_batch = batch if B_BATCHED else 0
    row_m = pid_m * BLOCK_M
    row_n = pid_n * BLOCK_N
    offs_m = row_m + tl.arange(0, BLOCK_M)
    offs_n = row_n + tl.arange(0, BLOCK_N)
    SCALE_K: tl.constexpr = K // 128
    a_scales = a_scale_ptr + batch * (SCALE_K * M)
    b_scales = b_scale_ptr + b_batch * (triton.cdiv(N, 128) * SCALE_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    K_TILES: tl.constexpr = K // BLOCK_K
    if SCALED:
        # Triton pipelines the TMA tile loads but not these small scale loads: each is issued one K step
        # ahead and carried in registers, so the promotion does not wait a memory round trip.
        a_s, b_s = _scales(a_scales, b_scales, 0, offs_m, row_n, offs_n, M, SCALE_K, BLOCK_N)
        for kt in tl.range(0, K_TILES, num_stages=NUM_STAGES):
            a_next, b_next = _scales(a_scales, b_scales, tl.minimum(kt + 1, K_TILES - 1), offs_m, row_n, offs_n,
                                     M, SCALE_K, BLOCK_N)
            a = tma_load(a_desc, batch, row_m, kt * BLOCK_K, BATCHES, BLOCK_M, BLOCK_K)
            b = tma_load(b_desc, b_batch, row_n, kt * BLOCK_K, B_BATCHES, BLOCK_N, BLOCK_K)
            partial = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
            acc = promote_block(acc, partial, a_s, b_s, BLOCK_N)
            a_s = a_next
            b_s = b_next
    else:
        for kt in tl.range(0, K_TILES, num_stages=NUM_STAGES):
            a = tma_load(a_desc, batch, row_m, kt * BLOCK_K, BATCHES, BLOCK_M, BLOCK_K)
            b = tma_load(b_desc, b_batch, row_n, kt * BLOCK_K, B_BATCHES, BLOCK_N, BLOCK_K)
            acc = tl.dot(a, tl.trans(b), acc)

    store_alpha_tile(acc, alpha_ptr, out_ptr + batch.to(tl.int64) * (M * N), pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


def check_config(p: GemmProblem, config: TileConfig, scaled: bool) -> None:
    if scaled and config.block_k != SCALE_GROUP:
        raise ValueError(f"the TMA block FP8 kernel promotes once per K tile: block_k must be 128, got {config.block_k}")
    if p.k % config.block_k:
        raise ValueError(f"K ({p.k}) must be a multiple of block_k ({config.block_k})")
    if scaled and config.block_n > SCALE_GROUP and config.block_n % SCALE_GROUP:
        raise ValueError(f"block_n must divide 128 or be a multiple of it, got {config.block_n}")
    if config.split_k != 1:
        raise ValueError("the TMA kernel has no split-K; small-M problems take the swapped decode kernel")


def launch_gemm(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array,
                b_scales: jax.Array, alpha: jax.Array, *, config: TileConfig, compute_capability: int,
                scaled: bool, name: str) -> jax.Array:
    """(p.batch, p.m, p.n) of p.out_dtype. Operands as problem.py lays them out; for `scaled` (block FP8)
    the activation scales are transposed here, otherwise a/b are 16-bit and scales are ignored."""
    check_config(p, config, scaled)
    batches, rows, a_values, a_scales = fold_batch(p, a_values, a_scales)
    if scaled:
        a_scales = jnp.swapaxes(a_scales, -1, -2)  # (BATCHES, K/128, rows): one K block's scales contiguous
    else:
        a_scales = jnp.zeros((1,), jnp.float32)
        b_scales = jnp.zeros((1,), jnp.float32)
    grid = (triton.cdiv(rows, config.block_m) * triton.cdiv(p.n, config.block_n), batches, 1)
    out = launch.scratch_call(
        tma_gemm_kernel, a_values, a_scales, b_values, b_scales, alpha.reshape(1).astype(jnp.float32),
        out_shape=jax.ShapeDtypeStruct((batches, rows, p.n), OUT_DTYPES[p.out_dtype]), grid=grid,
        num_warps=config.num_warps, num_stages=config.num_stages, compute_capability=compute_capability,
        name=name, M=rows, N=p.n, K=p.k, BATCHES=batches, B_BATCHED=p.b_batched,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        NUM_STAGES=config.num_stages, SCALED=scaled,
    )
    return out.reshape(p.batch, p.m, p.n)
