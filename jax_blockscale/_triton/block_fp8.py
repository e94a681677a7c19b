"""DeepSeek-V3 block FP8 GEMM: e4m3 operands, fp32 scales per 1 x 128 (activations) and 128 x 128 (weights).

One generic Triton kernel for Hopper (fp8 `tl.dot` lowers to wgmma e4m3), Blackwell (tcgen05 f8f6f4) and
gfx950 (fp8 MFMA). Every 128-wide K step runs its own fp32 `tl.dot` and is promoted into the fp32
accumulator with `a_scale[m] * b_scale[n]`: DeepSeek-V3 (§3.3.2) promotes at that interval because the
tensor cores' fp8 accumulation keeps only ~14 bits, and a K-long chain of fp8 products loses accuracy.
What remains is that truncation within each 128 block: measured on an H200, 1e-4 to 2e-4 relative
(Frobenius) error against the fp32 reference, far below a bf16 output's rounding.

Dense activations (bf16 / fp16: a serving model with DeepSeek's FP8 checkpoint and unquantized activations) take
the same kernel with `X_DENSE` (launched by `dense_x_block_fp8.py`): the weight's e4m3 codes are widened to the
activations' 16-bit type in registers (exact: every e4m3 value is a bf16 and an fp16 value) and each 128-K step
runs a 16-bit `tl.dot`, promoted with the weight's scale alone. The products are exact and summed in fp32 (~1e-6 relative against the fp32 reference),
where the jnp reference that ran before widened the weight to fp32 in memory for an fp32 GEMM.

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
from .problem import BLOCK_FP8, OUT_DTYPES, SCALE_GROUP, GemmProblem, TileConfig, check_operands, fold_batch

SUPPORTED: frozenset[tuple[str, str]] = frozenset({(BLOCK_FP8, BLOCK_FP8)})

# Offsets of int32 overflow past 2**31 elements; above it the kernels index with int64.
_INT32_LIMIT = 2**31
# Rough SM count used only to pick split-K for skinny problems (H100/H200: 132, B200: 148).
_TYPICAL_SM_COUNT = 132


# ---------------------------------------------------------------------------------------------------------
# Shared Triton helpers (tile order and split-K ranges live in tiling.py).


@triton.jit
def store_tile(acc, alpha_ptr, out_ptr, offs_m, offs_n, batch, M: tl.constexpr, N: tl.constexpr,
               BATCHES: tl.constexpr, SPLIT_K: tl.constexpr, WIDE: tl.constexpr, OUT_T: tl.constexpr = False):
    """acc * alpha, cast to the output type, stored where in bounds. Under split-K each split writes its
    own fp32 slice (SPLIT_K, BATCHES, M, N), summed outside in a fixed order: atomics would make the
    result depend on the arrival order of programs. OUT_T (swapped operands): the tile is out.T's, so it
    is stored to (.., N, M)."""
    acc = acc * tl.load(alpha_ptr)
    if SPLIT_K == 1:
        slab = batch
    else:
        slab = tl.program_id(2) * BATCHES + batch
    if WIDE:
        slab = slab.to(tl.int64)
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)  # OUT_T multiplies the columns by M
    if OUT_T:
        ptrs = out_ptr + slab * (M * N) + offs_n[None, :] * M + offs_m[:, None]
    else:
        ptrs = out_ptr + slab * (M * N) + offs_m[:, None] * N + offs_n[None, :]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------------------
# The block FP8 kernel.


@triton.jit
def _scale_pointers(scale_ptr, rows, pid, BLOCK: tl.constexpr, GROUP_ROWS: tl.constexpr, SCALE_K: tl.constexpr):
    """Pointers to the K-block-0 scales of a tile's rows: one per row (1 x 128 activation groups) or, for
    128 x 128 weight tiles, one per 128 rows, a scalar when the whole tile sits in one group."""
    if GROUP_ROWS == 1:
        ptrs = scale_ptr + rows * SCALE_K
    elif GROUP_ROWS % BLOCK == 0:
        ptrs = scale_ptr + (pid * BLOCK // GROUP_ROWS) * SCALE_K
    else:
        ptrs = scale_ptr + (rows // GROUP_ROWS) * SCALE_K
    return ptrs


@triton.jit
def _scale_index(kt, BLOCK_K: tl.constexpr, K_TILES: tl.constexpr):
    """The 128-wide scale block of K tile `kt`, clamped into range."""
    return (tl.minimum(kt, K_TILES - 1) * BLOCK_K) // 128


@triton.jit
def widen_codes(codes, dtype: tl.constexpr):
    """e4m3 codes as `dtype` (bf16 / fp16), exact. To bf16 by way of fp16 and fp32: Triton's direct route
    converts e4m3x2 -> f16x2 and then f16 -> bf16 one element at a time with F2F, on sm_90's conversion pipe
    (16 lanes per SM and clock: ~1,000 cycles per 128 x 128 tile on 8 warps, about the tile's wgmma time);
    f16 -> f32 is an FMA-pipe HADD2.F32 and f32 -> bf16 a packing F2FP. Every step is exact: each e4m3 value
    (NaN and zero included) is an fp16, fp32 and bf16 value."""
    if codes.dtype == dtype:   # widened before the kernel (TileConfig.widen_first)
        out = codes
    elif dtype == tl.bfloat16:
        out = codes.to(tl.float16).to(tl.float32).to(tl.bfloat16)
    else:
        out = codes.to(dtype)
    return out


@triton.jit
def block_fp8_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,  # jax-triton appends outputs last
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BATCHES: tl.constexpr, B_BATCHED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, WIDE: tl.constexpr, OUT_T: tl.constexpr, A_SCALE_ROWS: tl.constexpr,
    B_SCALE_ROWS: tl.constexpr, X_DENSE: tl.constexpr = False,
):
    """out[batch] = sum over 128-wide K blocks of (a_blk @ b_blk.T) * a_scale[m, blk] * b_scale[n, blk].

    Shapes (all constexpr: jax-triton does not divisibility-specialize scalar ints): a (BATCHES, M, K),
    b ([BATCHES,] N, K); scales (.., cdiv(rows, *_SCALE_ROWS), K/128): activations have 1-row groups,
    weights 128-row tiles. Swapped launches (weights as a, OUT_T) set A_SCALE_ROWS=128, B_SCALE_ROWS=1.
    X_DENSE: the activations (b when OUT_T, else a) are dense 16-bit values with no scales (their scale pointer
    is never read); the weight's codes are widened to that type before each step's dot (module docstring).
    """
    SCALE_K: tl.constexpr = K // 128
    A_SCALE_LEN: tl.constexpr = triton.cdiv(M, A_SCALE_ROWS) * SCALE_K
    B_SCALE_LEN: tl.constexpr = triton.cdiv(N, B_SCALE_ROWS) * SCALE_K
    A_SCALAR: tl.constexpr = A_SCALE_ROWS > 1 and A_SCALE_ROWS % BLOCK_M == 0
    B_SCALAR: tl.constexpr = B_SCALE_ROWS > 1 and B_SCALE_ROWS % BLOCK_N == 0

    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    # Out-of-range rows read a valid row instead of a masked one (unmasked loads vectorize and pipeline);
    # their results are dropped by the store mask.
    rows_a = offs_m % M
    rows_b = offs_n % N
    if WIDE:
        rows_a = rows_a.to(tl.int64)
        rows_b = rows_b.to(tl.int64)
        batch = batch.to(tl.int64)
    # An unbatched b gets no batch term at all: `0 * (N * K)` would make Triton build N * K as an int32
    # constant, which fails to compile once a weight holds 2**31 elements.
    b_start = b_ptr
    b_scale_start = b_scale_ptr
    if B_BATCHED:
        b_start += batch * (N * K)
        b_scale_start += batch * B_SCALE_LEN

    a_tile_ptrs = a_ptr + batch * (M * K) + rows_a[:, None] * K + offs_k[None, :]
    b_tile_ptrs = b_start + rows_b[:, None] * K + offs_k[None, :]
    a_scale_ptrs = _scale_pointers(a_scale_ptr + batch * A_SCALE_LEN, rows_a, pid_m, BLOCK_M, A_SCALE_ROWS, SCALE_K)
    b_scale_ptrs = _scale_pointers(b_scale_start, rows_b, pid_n, BLOCK_N, B_SCALE_ROWS, SCALE_K)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    K_TILES: tl.constexpr = K // BLOCK_K
    k_begin, k_end = k_tile_range(K_TILES, SPLIT_K)
    # Triton's pipeliner streams the tiles through cp.async but leaves the (scalar or short) scale loads
    # synchronous, so each K step would wait one memory round trip for them. Scales are loaded two K steps
    # ahead instead and carried in registers (indices clamped: the ring reads past the range harmlessly).
    # X_DENSE: the dense side has no scales (ones: no loads), and only the weight's are carried.
    A_ONES: tl.constexpr = X_DENSE and not OUT_T
    B_ONES: tl.constexpr = X_DENSE and OUT_T
    a_s0 = tl.load(a_scale_ptrs + _scale_index(k_begin, BLOCK_K, K_TILES)) if not A_ONES else 1.0
    b_s0 = tl.load(b_scale_ptrs + _scale_index(k_begin, BLOCK_K, K_TILES)) if not B_ONES else 1.0
    for kt in range(k_begin, k_end):
        k0 = kt * BLOCK_K
        a = tl.load(a_tile_ptrs + k0)
        b = tl.load(b_tile_ptrs + k0)
        if A_ONES:
            # wgmma takes a 16-bit B from shared memory: the widened codes go back there (Triton inserts it)
            b_s1 = tl.load(b_scale_ptrs + _scale_index(kt + 1, BLOCK_K, K_TILES))
            partial = tl.dot(a, tl.trans(widen_codes(b, a.dtype)), out_dtype=tl.float32)
            if B_SCALAR:
                acc += partial * b_s0
            else:
                acc += partial * b_s0[None, :]
            b_s0 = b_s1
        elif B_ONES:
            # the widened weight is wgmma's A operand, taken from registers
            a_s1 = tl.load(a_scale_ptrs + _scale_index(kt + 1, BLOCK_K, K_TILES))
            partial = tl.dot(widen_codes(a, b.dtype), tl.trans(b), out_dtype=tl.float32)
            if A_SCALAR:
                acc += partial * a_s0
            else:
                acc += partial * a_s0[:, None]
            a_s0 = a_s1
        else:
            a_s1 = tl.load(a_scale_ptrs + _scale_index(kt + 1, BLOCK_K, K_TILES))
            b_s1 = tl.load(b_scale_ptrs + _scale_index(kt + 1, BLOCK_K, K_TILES))
            # wgmma fp8 takes both operands K-major in shared memory: b stays (N, K) and is transposed here.
            partial = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
            if A_SCALAR:
                acc += partial * (a_s0 * b_s0)[None, :]
            elif B_SCALAR:
                acc += partial * (a_s0 * b_s0)[:, None]
            else:
                acc += partial * a_s0[:, None] * b_s0[None, :]
            a_s0 = a_s1
            b_s0 = b_s1

    store_tile(acc, alpha_ptr, out_ptr, offs_m, offs_n, tl.program_id(1), M, N, BATCHES, SPLIT_K, WIDE, OUT_T)


# ---------------------------------------------------------------------------------------------------------
# jnp side, shared by the launchers of this package.


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
             compute_capability: int, name: str, widen_b=None, **constexprs) -> jax.Array:
    """Folds the batch, launches `kernel` (signature: the five operands, out, then constexprs M, N, K,
    BATCHES, B_BATCHED, BLOCK_*, GROUP_M, SPLIT_K, WIDE, OUT_T and `constexprs`), reduces split-K partials.

    With `config.swap_ab` (decode: few activation rows, an unbatched weight) the kernel computes out.T =
    b @ a.T and stores it transposed: the weight's N rows become the MMA's M side, whose smallest wgmma
    tile is 64, while the few activation rows fill the N side, whose tiles go down to 8 (Hopper) — no
    tensor-core work is spent on padding rows. The caller's `constexprs` must describe the swapped roles.
    `widen_b`: a dtype the checked b values are converted to (by XLA) before the launch.
    """
    check_operands(p, a_values, a_scales, b_values, b_scales)
    if widen_b is not None:
        b_values = b_values.astype(widen_b)
    batches, rows, a_values, a_scales = fold_batch(p, a_values, a_scales)
    out_dtype = OUT_DTYPES[p.out_dtype]
    split = config.split_k
    out_shape = (split, batches, rows, p.n) if split > 1 else (batches, rows, p.n)
    swap = config.swap_ab
    if swap and p.b_batched:
        raise ValueError("swap_ab needs an unbatched weight (b); batched problems use the normal order")
    operands = (b_values, b_scales, a_values, a_scales) if swap else (a_values, a_scales, b_values, b_scales)
    kernel_m, kernel_n = (p.n, rows) if swap else (rows, p.n)
    out = jt.call(
        kernel, *operands, alpha.reshape(1).astype(jnp.float32),
        out_shape=jax.ShapeDtypeStruct(out_shape, jnp.float32 if split > 1 else out_dtype),
        grid=gemm_grid(batches, kernel_m, kernel_n, config),
        num_warps=config.num_warps, num_stages=config.num_stages, compute_capability=compute_capability,
        name=name,
        M=kernel_m, N=kernel_n, K=p.k, BATCHES=batches, B_BATCHED=p.b_batched,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        SPLIT_K=split, WIDE=needs_wide_offsets(p, config), OUT_T=swap, **constexprs,
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
    weight_block = config.block_m if config.swap_ab else config.block_n
    if weight_block > SCALE_GROUP and weight_block % SCALE_GROUP:
        raise ValueError(f"the weight's tile ({weight_block} rows) must divide 128 or be a multiple of it")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")
    if config.tma and (config.swap_ab or config.split_k != 1):
        raise ValueError("the TMA kernel takes neither swap_ab nor split_k (small M uses the swapped kernel)")


def with_split_k(p: GemmProblem, base: TileConfig) -> TileConfig:
    """`base` (normal operand order) with split-K from `split_k_for` for the tiles it gives `p`."""
    rows = p.m if p.b_batched else p.batch * p.m
    batches = p.batch if p.b_batched else 1
    tiles = batches * triton.cdiv(rows, base.block_m) * triton.cdiv(p.n, base.block_n)
    return base.replace(split_k=split_k_for(tiles, triton.cdiv(p.k, base.block_k)))


def with_swapped_split_k(base: TileConfig, n: int, rows: int, k: int) -> TileConfig:
    """`base` (swapped: the weight's n rows on the M side, the activation rows on N) with split-K from
    `split_k_for` for the tiles it gives."""
    tiles = triton.cdiv(n, base.block_m) * triton.cdiv(rows, base.block_n)
    return base.replace(split_k=split_k_for(tiles, triton.cdiv(k, base.block_k)))


def swapped_decode_config(n: int, rows: int, k: int) -> TileConfig:
    """Hopper decode: the weight's n rows as 64-row MMA tiles, the activation rows (>= 16, wgmma's useful
    minimum here) as the N side, split-K to about two programs per SM."""
    base = TileConfig(block_m=64, block_n=max(16, triton.next_power_of_2(rows)), block_k=128, group_m=1,
                      num_warps=4, num_stages=4, swap_ab=True)
    return with_swapped_split_k(base, n, rows, k)


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """Heuristic tiles for shapes the per-device tables (configs.py) do not hold.

    Hopper (measured on an H200, benchmarks/tune.py): decode-sized M (<= 64 rows) swaps the operands so
    the weight fills wgmma's 64-row M side and splits K until about two programs per SM exist, as the
    weight read dominates; 65-256 rows take the TMA kernel with 64 x 128 tiles (one warpgroup); larger M
    the pointer kernel with 128 x 128 tiles over two warpgroups, which measured faster than the TMA kernel
    there (797 vs 709 TFLOP/s at 8192^3). 128 x 256 tiles would need 256 accumulator registers per thread
    with the promotion's partial product, and spill. Elsewhere: 128 x 128 (or 16/64-row tiles with split-K
    for small M) on the pointer kernel."""
    rows = p.m if p.b_batched else p.batch * p.m
    if target == "sm_90" and rows <= 64 and not p.b_batched:
        return swapped_decode_config(p.n, rows, p.k)
    if target == "sm_90" and 64 < rows <= 256:
        return TileConfig(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4, tma=True)
    if rows <= 16:
        base = TileConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)
    elif rows <= 64:
        base = TileConfig(block_m=64, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=4)
    else:
        base = TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4)
    return with_split_k(p, base)


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int) -> jax.Array:
    """Block FP8 GEMM (see module docstring); returns (p.batch, p.m, p.n) of p.out_dtype."""
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"block_fp8 kernel takes block_fp8 x block_fp8, got {p.a_kind} x {p.b_kind} (16-bit "
                         f"activations: dense_x_block_fp8)")
    if config.persistent:
        from . import block_fp8_persistent

        return block_fp8_persistent.launch(p, a_values, a_scales, b_values, b_scales, alpha, config=config,
                                           compute_capability=compute_capability)
    check_config(p, config)
    if config.tma:
        from . import hopper_tma

        check_operands(p, a_values, a_scales, b_values, b_scales)
        return hopper_tma.launch_gemm(p, a_values, a_scales, b_values, b_scales, alpha, config=config,
                                      compute_capability=compute_capability, scaled=True,
                                      name="block_fp8_tma_gemm")
    return run_gemm(block_fp8_kernel, p, a_values, a_scales, b_values, b_scales, alpha, config=config,
                    compute_capability=compute_capability,
                    name="block_fp8_gemm_swapped" if config.swap_ab else "block_fp8_gemm",
                    **kernel_constexprs(config.swap_ab))


def kernel_constexprs(swapped: bool) -> dict:
    """Rows per scale of the kernel's a and b: activations 1 (1 x 128 groups), weights 128 (tiles)."""
    return dict(A_SCALE_ROWS=SCALE_GROUP, B_SCALE_ROWS=1) if swapped else dict(A_SCALE_ROWS=1, B_SCALE_ROWS=SCALE_GROUP)
