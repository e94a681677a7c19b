"""DeepSeek-V3 block FP8 GEMM: e4m3 operands, fp32 scales per 1 x 128 (activations) and 128 x 128 (weights).

One generic Triton kernel for Hopper (fp8 `tl.dot` lowers to wgmma e4m3), Blackwell (tcgen05 f8f6f4) and
gfx950 (fp8 MFMA). Every 128-wide K step runs its own fp32 `tl.dot` and is promoted into the fp32
accumulator with `a_scale[m] * b_scale[n]`: DeepSeek-V3 (§3.3.2) promotes at that interval because the
tensor cores' fp8 accumulation keeps only ~14 bits, and a K-long chain of fp8 products loses accuracy.
What remains is that truncation within each 128 block: measured on an H200, 1e-4 to 2e-4 relative
(Frobenius) error against the fp32 reference, far below a bf16 output's rounding.

Also holds the pieces every GEMM launcher of this package shares: the grouped tile order, the epilogue
(alpha, cast, masked store, split-K partials) and the jnp side (batch folding, grid, split-K reduction).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from .tiling import grouped_tile, k_tile_range

from . import jt
from .problem import BLOCK_FP8, NVFP4, GemmProblem, TileConfig

SUPPORTED: frozenset[tuple[str, str]] = frozenset({(BLOCK_FP8, BLOCK_FP8)})

SCALE_GROUP = 128  # DeepSeek-V3's quantization block along K (and along N for weights)
# Offsets of int32 overflow past 2**31 elements; above it the kernels index with int64.
_INT32_LIMIT = 2**31
# Rough SM count used only to pick split-K for skinny problems (H100/H200: 132, B200: 148).
_TYPICAL_SM_COUNT = 132

OUT_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


def operand_dtypes(kind: str) -> tuple[jnp.dtype, jnp.dtype | None]:
    """(values dtype, scales dtype) of an operand kind, as problem.py lays them out; None: a dummy of any
    dtype (dense kinds)."""
    if kind in ("bf16", "fp16"):
        return jnp.dtype(OUT_DTYPES[kind]), None
    values = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2, BLOCK_FP8: jnp.float8_e4m3fn}.get(kind, jnp.uint8)
    scales = {NVFP4: jnp.float8_e4m3fn, BLOCK_FP8: jnp.float32}.get(kind, jnp.uint8)
    return jnp.dtype(values), jnp.dtype(scales)


def check_operands(p: GemmProblem, a_values, a_scales, b_values, b_scales) -> None:
    """Wrong dtypes would be reinterpreted by the kernel rather than converted: refuse them here."""
    for side, kind, values, scales in (("a", p.a_kind, a_values, a_scales), ("b", p.b_kind, b_values, b_scales)):
        want_values, want_scales = operand_dtypes(kind)
        if values.dtype != want_values or (want_scales is not None and scales.dtype != want_scales):
            raise TypeError(
                f"{side} ({kind}) needs values of {want_values} and scales of {want_scales or 'any dtype'}, "
                f"got {values.dtype} and {scales.dtype}"
            )


# ---------------------------------------------------------------------------------------------------------
# Shared Triton helpers (tile order and split-K ranges live in tiling.py).


@triton.jit
def store_tile(acc, alpha_ptr, out_ptr, offs_m, offs_n, batch, M: tl.constexpr, N: tl.constexpr,
               BATCHES: tl.constexpr, SPLIT_K: tl.constexpr, WIDE: tl.constexpr):
    """acc * alpha, cast to the output type, stored where in bounds. Under split-K each split writes its
    own fp32 slice (SPLIT_K, BATCHES, M, N), summed outside in a fixed order: atomics would make the
    result depend on the arrival order of programs."""
    acc = acc * tl.load(alpha_ptr)
    if SPLIT_K == 1:
        slab = batch
    else:
        slab = tl.program_id(2) * BATCHES + batch
    if WIDE:
        slab = slab.to(tl.int64)
        offs_m = offs_m.to(tl.int64)
    ptrs = out_ptr + slab * (M * N) + offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------------------
# The block FP8 kernel.


@triton.jit
def block_fp8_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,  # jax-triton appends outputs last
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BATCHES: tl.constexpr, B_BATCHED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, WIDE: tl.constexpr,
):
    """out[batch] = sum over 128-wide K blocks of (a_blk @ b_blk.T) * a_scale[:, blk] * b_scale[n/128, blk].

    Shapes (all constexpr: jax-triton does not divisibility-specialize scalar ints): a (BATCHES, M, K),
    a_scale (BATCHES, M, K/128), b ([BATCHES,] N, K), b_scale ([BATCHES,] ceil(N/128), K/128).
    """
    SCALE_K: tl.constexpr = K // 128
    SCALE_N: tl.constexpr = triton.cdiv(N, 128)
    # A tile column within one 128-row weight block shares one scale: a scalar load instead of a vector.
    ONE_B_SCALE: tl.constexpr = 128 % BLOCK_N == 0

    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows read a valid row instead of a masked one (unmasked loads vectorize and pipeline);
    # their results are dropped by the store mask.
    rows_a = offs_m % M
    rows_b = offs_n % N
    b_batch = batch if B_BATCHED else 0
    if WIDE:
        rows_a = rows_a.to(tl.int64)
        rows_b = rows_b.to(tl.int64)
        batch = batch.to(tl.int64)
        b_batch = b_batch.to(tl.int64) if B_BATCHED else 0

    a_tile_ptrs = a_ptr + batch * (M * K) + rows_a[:, None] * K + offs_k[None, :]
    b_tile_ptrs = b_ptr + b_batch * (N * K) + rows_b[:, None] * K + offs_k[None, :]
    a_scale_ptrs = a_scale_ptr + batch * (M * SCALE_K) + rows_a * SCALE_K
    b_scale_base = b_scale_ptr + b_batch * (SCALE_N * SCALE_K)
    if ONE_B_SCALE:
        b_scale_ptrs = b_scale_base + (pid_n * BLOCK_N // 128) * SCALE_K
    else:
        b_scale_ptrs = b_scale_base + (rows_b // 128) * SCALE_K

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin, k_end = k_tile_range(K // BLOCK_K, SPLIT_K)
    for kt in range(k_begin, k_end):
        k0 = kt * BLOCK_K
        a = tl.load(a_tile_ptrs + k0)
        b = tl.load(b_tile_ptrs + k0)
        a_scale = tl.load(a_scale_ptrs + k0 // 128)
        b_scale = tl.load(b_scale_ptrs + k0 // 128)
        # wgmma fp8 takes both operands K-major in shared memory: b stays (N, K) and is transposed here.
        partial = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
        if ONE_B_SCALE:
            acc += partial * (a_scale * b_scale)[:, None]
        else:
            acc += partial * a_scale[:, None] * b_scale[None, :]

    store_tile(acc, alpha_ptr, out_ptr, offs_m, offs_n, tl.program_id(1), M, N, BATCHES, SPLIT_K, WIDE)


# ---------------------------------------------------------------------------------------------------------
# jnp side, shared by the launchers of this package.


def fold_batch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array) -> tuple[int, int, jax.Array, jax.Array]:
    """(grid batches, rows per batch, a_values, a_scales). With an unbatched b, batch folds into M: one 2D
    GEMM of B*M rows fills the machine better than B small ones."""
    if p.b_batched:
        return p.batch, p.m, a_values, a_scales
    rows = p.batch * p.m
    return 1, rows, a_values.reshape(1, rows, a_values.shape[-1]), a_scales.reshape(1, rows, a_scales.shape[-1])


def needs_wide_offsets(p: GemmProblem, config: TileConfig) -> bool:
    """Whether some element offset (values, or the split-K fp32 partials) can reach 2**31."""
    b_count = (p.batch if p.b_batched else 1) * p.n * p.k
    largest = max(p.batch * p.m * p.k, b_count, config.split_k * p.batch * p.m * p.n)
    return largest >= _INT32_LIMIT


def gemm_grid(batches: int, rows: int, n: int, config: TileConfig) -> tuple[int, int, int]:
    tiles = triton.cdiv(rows, config.block_m) * triton.cdiv(n, config.block_n)
    return (tiles, batches, config.split_k)


def split_k_for(tiles: int, k_tiles: int, *, min_k_tiles_per_split: int = 4) -> int:
    """Split-K for problems with too few output tiles to occupy the SMs (decode): enough splits for about
    two programs per SM, while each split keeps several K tiles to pipeline."""
    split = 1
    while tiles * split * 2 <= 2 * _TYPICAL_SM_COUNT and k_tiles // (split * 2) >= min_k_tiles_per_split:
        split *= 2
    return split


def run_gemm(kernel, p: GemmProblem, a_values, a_scales, b_values, b_scales, alpha, *, config: TileConfig,
             compute_capability: int, name: str, **constexprs) -> jax.Array:
    """Folds the batch, launches `kernel` (signature: the five operands, out, then constexprs M, N, K,
    BATCHES, B_BATCHED, BLOCK_*, GROUP_M, SPLIT_K, WIDE and `constexprs`), reduces split-K partials."""
    check_operands(p, a_values, a_scales, b_values, b_scales)
    batches, rows, a_values, a_scales = fold_batch(p, a_values, a_scales)
    out_dtype = OUT_DTYPES[p.out_dtype]
    split = config.split_k
    out_shape = (split, batches, rows, p.n) if split > 1 else (batches, rows, p.n)
    out = jt.call(
        kernel, a_values, a_scales, b_values, b_scales, alpha.reshape(1).astype(jnp.float32),
        out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if split > 1 else out_dtype),
        grid=gemm_grid(batches, rows, p.n, config),
        num_warps=config.num_warps, num_stages=config.num_stages, compute_capability=compute_capability,
        name=name,
        M=rows, N=p.n, K=p.k, BATCHES=batches, B_BATCHED=p.b_batched,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        SPLIT_K=split, WIDE=needs_wide_offsets(p, config), **constexprs,
    )
    if split > 1:
        out = out.sum(axis=0).astype(out_dtype)
    return out.reshape(p.batch, p.m, p.n)


# ---------------------------------------------------------------------------------------------------------
# Public launcher.


def check_config(p: GemmProblem, config: TileConfig) -> None:
    if p.k % SCALE_GROUP:
        raise ValueError(f"block_fp8 needs K padded to a multiple of 128, got K={p.k}")
    if SCALE_GROUP % config.block_k or config.block_k < 32:
        # One K tile must not straddle two 1x128 activation scales; wgmma fp8 consumes K in steps of 32.
        raise ValueError(f"block_fp8 needs block_k in (32, 64, 128), got {config.block_k}")
    if config.block_n > SCALE_GROUP and config.block_n % SCALE_GROUP:
        raise ValueError(f"block_n must divide 128 or be a multiple of it, got {config.block_n}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")


def default_config(p: GemmProblem) -> TileConfig:
    """Decode (M <= 16): thin row tiles and split-K, since the weight read dominates and few output tiles
    exist. Mid M: 64-row tiles (one warpgroup's wgmma M). Large: 128 x 128 over two warpgroups, 4 stages
    of 32 KiB fp8 tiles in shared memory."""
    rows = p.m if p.b_batched else p.batch * p.m
    batches = p.batch if p.b_batched else 1
    k_tiles = p.k // SCALE_GROUP
    if rows <= 16:
        base = TileConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)
    elif rows <= 64:
        base = TileConfig(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4)
    else:
        base = TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4)
    tiles = batches * triton.cdiv(rows, base.block_m) * triton.cdiv(p.n, base.block_n)
    return base.replace(split_k=split_k_for(tiles, k_tiles))


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int) -> jax.Array:
    """Block FP8 GEMM (see module docstring); returns (p.batch, p.m, p.n) of p.out_dtype."""
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"block_fp8 kernel takes block_fp8 x block_fp8, got {p.a_kind} x {p.b_kind}")
    check_config(p, config)
    return run_gemm(block_fp8_kernel, p, a_values, a_scales, b_values, b_scales, alpha, config=config,
                    compute_capability=compute_capability, name="block_fp8_gemm")
