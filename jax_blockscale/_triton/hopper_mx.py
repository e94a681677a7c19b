"""Hopper GEMM for MX / nvfp4 operands with the decode inside the kernel: one launch per matmul.

The earlier large-M path (`upcast.predecoded_sides`) dequantized both operands to bf16 in XLA (one
memory-bound pass per operand, ~3 bytes moved per fp8 element, more for fp4) and then ran the bf16 TMA
GEMM. Here the packed operands themselves arrive by TMA (`cp.async.bulk.tensor`: fp8 codes, fp6 codes one
per byte, fp4 pairs as uint8, bf16 for a dense side), so each tile moves 1/2 to 1/4 of the bf16 bytes, and
are decoded in registers right before the MMA. Two ways to multiply (`TileConfig.fp8_mma`):

- bf16 (every kind): each element is decoded to bf16 and multiplied by its block scale (exact: module
  docstring of upcast.py; fp4 by decode.py's inline-PTX sequence on NVIDIA, the rest by upcast.py's bit
  decoders), then one bf16 wgmma chain accumulates the tile in fp32.
- fp8 (mxfp8 x mxfp8 only): the e4m3/e5m2 codes go to wgmma as they are, one K step per MX block (32 =
  one fp8 wgmma's K), and each block's fp32 partial is promoted: acc += partial * 2^sa[m] * 2^sb[n].
  Exact up to fp32 summation: the wgmma sums 32 products of 4-bit-significand codes, and multiplying by
  powers of two rounds nothing (outside fp32's range). Why not fold the scales into the codes and run
  K = 128 between promotions: q * 2^(s - s_max) is an e4m3 value only while it stays above e4m3's
  normal range (2^-6); blocks whose scales differ lose the low bits of their small elements, i.e. the
  result would differ from dequantize + dot by more than summation order. Not done.

Scales (one byte per 16/32 elements, rows of K/32 bytes: too narrow for TMA's 16-byte minimum when
K = 256) are read with vector loads straight from the canonical (rows, K / block) arrays, so XLA runs no
transpose or other kernel beside this one. Out-of-range rows of a tile read row 0's scales (any finite
value times the TMA's zero fill is zero, and those output rows are not stored).

`TileConfig.warp_specialize` is refused (`check_config`): Triton 3.6's warp specializer fails on this loop
when compiling for an H100 (it emitted unspecialized PTX for some configurations on the CPU).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from . import launch as _launch
from .decode import _FP4_PTX, e8m0_to_bf16
from .problem import MX_KINDS, NVFP4, OUT_DTYPES, GemmProblem, TileConfig, check_operands, fold_batch
from .tiling import grouped_tile, store_alpha_tile, tma_descriptor, tma_load
from .upcast import codes_to_f32, e8m0_to_f32, scales_to_f32

_SCALED_KINDS = MX_KINDS + (NVFP4,)
# Every pair with at least one scaled side; fp16 keeps the reference (a bf16 MMA would round it).
SUPPORTED: frozenset[tuple[str, str]] = frozenset(
    (a, b) for a in _SCALED_KINDS + ("bf16",) for b in _SCALED_KINDS + ("bf16",)
    if (a in _SCALED_KINDS or b in _SCALED_KINDS) and ((a == NVFP4) == (b == NVFP4) or "bf16" in (a, b))
)
FP8_KINDS = ("e4m3", "e5m2")
_MX_BLOCK = 32


# ---------------------------------------------------------------------------------------------------------
# Decoding a loaded tile (the helpers are upcast.py's and decode.py's; this only arranges their inputs).


@triton.jit
def _fp4_tile_to_bf16(packed, raw_scales, KIND: tl.constexpr, R: tl.constexpr, BLOCK_K: tl.constexpr):
    """(R, BLOCK_K / 2) packed e2m1 bytes and their (R, BLOCK_K / group) raw scales -> the (even, odd) K
    elements as two (R, BLOCK_K / 2) bf16 tiles, by decode.py's PTX (two bit operations and two bf16x2
    multiplies per pair of elements)."""
    GROUP: tl.constexpr = 16 if KIND == "nvfp4" else 32
    G: tl.constexpr = BLOCK_K // GROUP
    BPG: tl.constexpr = GROUP // 2
    if KIND == "nvfp4":
        s = raw_scales.to(tl.bfloat16)  # e4m3 has 4 significant bits: exact in bf16
    else:
        s = e8m0_to_bf16(raw_scales)
    # The scales are spread over the 2D byte tile as it was loaded (a 3D view of the loaded tile gave
    # Triton 3.6 an "Illegal shared layout" on the way to the MMA operand).
    s = tl.reshape(tl.broadcast_to(tl.reshape(s, (R, G, 1)), (R, G, BPG)), (R, BLOCK_K // 2))
    lo, hi = tl.inline_asm_elementwise(_FP4_PTX, "=r,=r,=r,=r,r,r,r", [packed, s],
                                       dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return lo, hi


@triton.jit
def decode_tile(codes, raw_scales, KIND: tl.constexpr, R: tl.constexpr, BLOCK_K: tl.constexpr):
    """One operand's (R, BLOCK_K) tile as bf16 in K order, block scales applied, by upcast.py's decoders
    (exact fp32 bit arithmetic, then one rounding-free cast)."""
    GROUP: tl.constexpr = 16 if KIND == "nvfp4" else 32
    values = tl.reshape(codes_to_f32(codes, KIND), (R, BLOCK_K // GROUP, GROUP))
    s = scales_to_f32(raw_scales, KIND)
    return tl.reshape(values * s[:, :, None], (R, BLOCK_K)).to(tl.bfloat16)


@triton.jit
def even_odd_halves(tile, raw_scales, KIND: tl.constexpr, R: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (even, odd) K elements of one operand's (R, BLOCK_K) tile as two (R, BLOCK_K / 2) bf16 tiles."""
    if KIND == "e2m1" or KIND == "nvfp4":
        even, odd = _fp4_tile_to_bf16(tile, raw_scales, KIND, R, BLOCK_K)
    else:
        if KIND != "bf16":
            tile = decode_tile(tile, raw_scales, KIND, R, BLOCK_K)
        even, odd = tl.split(tl.reshape(tile, (R, BLOCK_K // 2, 2)))
    return even, odd


@triton.jit
def _raw_scales(s_base, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (R, BLOCK_K / group) scale codes of the tile at K offset k0 (a dense kind's are never read)."""
    GROUP: tl.constexpr = 16 if KIND == "nvfp4" else 32
    offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
    return tl.load(s_base + rows[:, None] * (K // GROUP) + offs_g[None, :])


@triton.jit
def mx_gemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, a_ts_ptr, b_ts_ptr, out_ptr,  # jax-triton order: outputs last
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BATCHES: tl.constexpr, B_BATCHED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_STAGES: tl.constexpr, A_KIND: tl.constexpr, B_KIND: tl.constexpr, FP8_MMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, ASM: tl.constexpr,
):
    """out[batch] = a_ts * b_ts * decode(a[batch]) @ decode(b[batch or 0]).T (a_ts, b_ts: (1,) fp32, the
    nvfp4 tensor scales or ones, multiplied here so that XLA runs no scalar kernel for their product).

    a (BATCHES, M, K / a_epb) codes with scales (BATCHES, M, K / a_block), b ([BATCHES,] N, K / b_epb)
    likewise; a dense (bf16) side's scale pointer is never read. FP8_MMA: both sides MX fp8 and
    BLOCK_K == 32 (one promotion per MX block, module docstring).
    """
    A_EPB: tl.constexpr = 2 if A_KIND == "e2m1" or A_KIND == "nvfp4" else 1
    B_EPB: tl.constexpr = 2 if B_KIND == "e2m1" or B_KIND == "nvfp4" else 1
    A_GROUP: tl.constexpr = 16 if A_KIND == "nvfp4" else 32
    B_GROUP: tl.constexpr = 16 if B_KIND == "nvfp4" else 32
    B_BATCHES: tl.constexpr = BATCHES if B_BATCHED else 1
    a_desc = tma_descriptor(a_ptr, BATCHES, M, K // A_EPB, BLOCK_M, BLOCK_K // A_EPB)
    b_desc = tma_descriptor(b_ptr, B_BATCHES, N, K // B_EPB, BLOCK_N, BLOCK_K // B_EPB)
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1)
    b_batch = batch if B_BATCHED else 0
    row_m = pid_m * BLOCK_M
    row_n = pid_n * BLOCK_N
    # Rows past the end read row 0's scales (module docstring); the TMA zero-fills their codes.
    rows_a = (row_m + tl.arange(0, BLOCK_M)) % M
    rows_b = (row_n + tl.arange(0, BLOCK_N)) % N
    a_scales = a_scale_ptr + batch.to(tl.int64) * (M * (K // A_GROUP))
    b_scales = b_scale_ptr + b_batch.to(tl.int64) * (N * (K // B_GROUP))

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    K_TILES: tl.constexpr = K // BLOCK_K
    SPLIT_PAIRS: tl.constexpr = ASM and (A_EPB == 2 or B_EPB == 2)
    for kt in tl.range(0, K_TILES, num_stages=NUM_STAGES, warp_specialize=WARP_SPECIALIZE):
        k0 = kt * BLOCK_K
        a = tma_load(a_desc, batch, row_m, k0 // A_EPB, BATCHES, BLOCK_M, BLOCK_K // A_EPB)
        b = tma_load(b_desc, b_batch, row_n, k0 // B_EPB, B_BATCHES, BLOCK_N, BLOCK_K // B_EPB)
        if FP8_MMA:
            # One MX block per step: the partial's scales are one per row of a and one per row of b.
            sa = e8m0_to_f32(tl.load(a_scales + rows_a * (K // 32) + kt))
            sb = e8m0_to_f32(tl.load(b_scales + rows_b * (K // 32) + kt))
            partial = tl.dot(a, tl.trans(b), out_dtype=tl.float32)
            acc += partial * sa[:, None] * sb[None, :]
        elif SPLIT_PAIRS:
            # sum_k a_k b_k = (even k) + (odd k): the low- and high-nibble halves that the PTX fp4 decode
            # yields go to two dots as they are (interleaving them back into K order before one dot failed
            # in Triton 3.6's shared-layout selection for the MMA operand); the other side is split to match.
            a_even, a_odd = even_odd_halves(a, _raw_scales(a_scales, rows_a, k0, K, A_KIND, BLOCK_K), A_KIND,
                                            BLOCK_M, BLOCK_K)
            b_even, b_odd = even_odd_halves(b, _raw_scales(b_scales, rows_b, k0, K, B_KIND, BLOCK_K), B_KIND,
                                            BLOCK_N, BLOCK_K)
            acc = tl.dot(a_even, tl.trans(b_even), acc)
            acc = tl.dot(a_odd, tl.trans(b_odd), acc)
        else:
            if A_KIND != "bf16":
                a = decode_tile(a, _raw_scales(a_scales, rows_a, k0, K, A_KIND, BLOCK_K), A_KIND, BLOCK_M,
                                BLOCK_K)
            if B_KIND != "bf16":
                b = decode_tile(b, _raw_scales(b_scales, rows_b, k0, K, B_KIND, BLOCK_K), B_KIND, BLOCK_N,
                                BLOCK_K)
            acc = tl.dot(a, tl.trans(b), acc)

    acc = acc * tl.load(b_ts_ptr)
    store_alpha_tile(acc, a_ts_ptr, out_ptr + batch.to(tl.int64) * (M * N), pid_m, pid_n, M, N, BLOCK_M,
                     BLOCK_N)


# ---------------------------------------------------------------------------------------------------------
# Launcher.


def fp8_mma_ready(p: GemmProblem) -> bool:
    """Whether the fp8-wgmma variant takes this pair: both sides MX fp8 codes."""
    return p.a_kind in FP8_KINDS and p.b_kind in FP8_KINDS


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """Heuristic, to be measured (`benchmarks/mx_large_variants.py --configs`): 128 x 256 tiles over two
    consumer warpgroups (the shape XLA's own Hopper GEMMs use at these sizes), 64-wide K steps (the
    decoded bf16 tiles of a and b stay within the register file beside the 128-register accumulator),
    3 stages of packed tiles in shared memory; bf16 wgmma, no warp specialization. fp6 sides take 32-wide
    K steps: at 64 ptxas spilled (their fp32 decode holds more temporaries).

    Warp specialization is off because Triton 3.6 compiles `warp_specialize=True` on this loop for sm_90
    to the same PTX as without it (no producer partition; checked on a CPU): the switch is kept so the
    benchmark can show it once a Triton partitions this loop."""
    del target
    block_k = 32 if {"e2m3", "e3m2"} & {p.a_kind, p.b_kind} else 64
    return TileConfig(block_m=128, block_n=256, block_k=block_k, group_m=8, num_warps=8, num_stages=3, tma=True)


def check_config(p: GemmProblem, config: TileConfig) -> None:
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the Hopper MX kernel does not take {p.a_kind} x {p.b_kind}")
    if config.split_k != 1 or config.swap_ab:
        raise ValueError("the Hopper MX kernel has no split-K or swapped launch; decode sizes take decode.py")
    if config.block_k < 32 or config.block_k & (config.block_k - 1):
        # (32 also keeps every TMA box row at >= 16 bytes: 16 fp4 bytes, 32 fp8, 64 bf16)
        raise ValueError(f"block_k must be a power of two >= 32 (one MX block), got {config.block_k}")
    if p.k % config.block_k:
        raise ValueError(f"K ({p.k}) must be a multiple of block_k ({config.block_k}); the primitive pads K to 256")
    if config.warp_specialize:
        # Compiling this loop with warp_specialize=True for sm_90 fails inside Triton 3.6's
        # NVGPUWarpSpecialization pass on an H100 (PassManager::run failed, nvfp4 x nvfp4, 2026-11-22).
        raise ValueError("warp_specialize: Triton 3.6's warp specializer fails on the Hopper MX kernel's loop")
    if config.fp8_mma:
        if not fp8_mma_ready(p):
            raise ValueError(f"fp8_mma needs MX fp8 codes on both sides, got {p.a_kind} x {p.b_kind}")
        if config.block_k != _MX_BLOCK:
            raise ValueError(f"fp8_mma promotes once per MX block: block_k must be 32, got {config.block_k}")


# The primitive passes nvfp4 tensor scales separately (`a_ts`, `b_ts`), multiplied in the kernel.
TAKES_TENSOR_SCALES = True


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int, a_ts=None,
           b_ts=None) -> jax.Array:
    """The fused-decode GEMM (module docstring); returns (p.batch, p.m, p.n) of p.out_dtype.

    `alpha` (1,) is used when `a_ts`/`b_ts` (scalar nvfp4 tensor scales) are not given; the primitive
    passes them separately so that their product is taken in the kernel."""
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    if compute_capability is None or compute_capability < 90:
        raise ValueError("the Hopper MX kernel needs TMA and wgmma (sm_90 or newer)")
    if a_ts is None or b_ts is None:
        a_ts, b_ts = alpha, jnp.ones((1,), jnp.float32)
    a_ts, b_ts = (jnp.asarray(t, jnp.float32).reshape(1) for t in (a_ts, b_ts))
    batches, rows, a_values, a_scales = fold_batch(p, a_values, a_scales)
    grid = (triton.cdiv(rows, config.block_m) * triton.cdiv(p.n, config.block_n), batches, 1)
    variant = "fp8" if config.fp8_mma else "bf16"
    return _launch.scratch_call(
        mx_gemm_kernel, a_values, a_scales, b_values, b_scales, a_ts, b_ts,
        out_shape=jax.ShapeDtypeStruct((batches, rows, p.n), OUT_DTYPES[p.out_dtype]), grid=grid,
        num_warps=config.num_warps, num_stages=config.num_stages, compute_capability=compute_capability,
        name=f"hopper_mx_{p.a_kind}_{p.b_kind}_{variant}{'_ws' if config.warp_specialize else ''}",
        M=rows, N=p.n, K=p.k, BATCHES=batches, B_BATCHED=p.b_batched, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m, NUM_STAGES=config.num_stages,
        A_KIND=p.a_kind, B_KIND=p.b_kind, FP8_MMA=config.fp8_mma,
        WARP_SPECIALIZE=config.warp_specialize, ASM=config.asm_decode,
    ).reshape(p.batch, p.m, p.n)
