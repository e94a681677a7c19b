"""AMD CDNA4 (gfx950, MI355) block-scaled GEMM: `tl.dot_scaled` -> `v_mfma_scale_f32_*_f8f6f4`.

Scales are pre-shuffled in jnp by `layouts.to_cdna4_scales(scales, mfma)`: each 32-row x 8-scale-column
unit (32 rows x 256 elements of K) becomes 256 contiguous bytes, so that a lane finds the scales of four
consecutive MFMAs in one 32-bit word. The kernel loads whole units with plain pointer loads and undoes the
shuffle in registers (reshape + permute, as in Triton's block-scaled tutorial); hence BLOCK_M and BLOCK_N
are multiples of 32 and BLOCK_K a multiple of 256.

The shuffle only has to match the MFMA for speed: the in-kernel unshuffle makes any `mfma` variant
numerically correct with either instruction. Which instruction Triton uses is its `matrix_instr_nonkdim`
option: 16 -> v_mfma_scale_f32_16x16x128_f8f6f4, 32 -> v_mfma_scale_f32_32x32x64_f8f6f4, and 0 (the
default) lets Triton choose, which for every tile allowed here (both sides >= 32) is 32x32x64.
jax-triton 0.3.1 cannot pass `matrix_instr_nonkdim` (its `get_or_create_triton_kernel` builds the
option dict from a fixed set of keys), so under jax the instruction is always 32x32x64 and `launch`
defaults to the matching mfma=32 shuffle. `compile_kernel(..., matrix_instr_nonkdim=16)` reaches the
16x16x128 variant (tests/test_lowering_cdna4.py). jax-triton's ROCm lowering also queries the device's
architecture, so it cannot be lowered for gfx950 on a machine without one.

fp6 is widened to fp8 in jnp exactly as for NVIDIA (Triton 3.6's dot_scaled rejects e2m3/e3m2); nvfp4 has
no CDNA4 path in Triton 3.6 and is left to the generic upcast kernel.
Triton 3.6 limitation seen (gfx950, matrix_instr_nonkdim=0, BLOCK_K=256): some tile/warp combinations
abort in TritonAMDGPUAccelerateMatmul with "deduceTilesPerWarpForScale: Assertion `largest <= 8 && "at most
pack 4 scales for scale a & b respectively"' failed" (then "PassManager::run failed"): with 4 warps
32x64, 64x32, 64x64, 64x128 and 128x64; with 8 warps 32x128. `default_config` uses only combinations
that compile (128x128 with 8 warps, 32x128 with 4 warps), which the lowering tests check.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from .tiling import grouped_tile, k_tile_range, store_alpha_tile

from .. import layouts
from . import dot_scaled_nvidia as _nv
from . import jt
from .problem import ELEMENTS_PER_BYTE, MX_KINDS, OUT_DTYPES, GemmProblem, TileConfig

__all__ = ["SUPPORTED", "MFMA_VARIANTS", "JAX_TRITON_MFMA", "default_config", "launch", "kernel_constexprs",
           "pointer_signature", "check_config", "grid", "compile_options", "scaled_gemm_kernel_cdna4"]

SUPPORTED: frozenset[tuple[str, str]] = frozenset(itertools.product(MX_KINDS, MX_KINDS))
MFMA_VARIANTS = (16, 32)
JAX_TRITON_MFMA = 32  # what Triton picks with matrix_instr_nonkdim=0 for tiles >= 32 x 32
_SHUFFLE_UNIT_K = 256  # elements of K in one 32 x 8 scale unit
_CU_COUNT = 256  # MI355X; only steers the split-K heuristic for small grids


@triton.jit
def _load_scale_tile(base, row_block, k_step, NUM_ROW_UNITS: tl.constexpr, UNIT_ROW_BYTES: tl.constexpr,
                     BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, MFMA: tl.constexpr,
                     MASK_K: tl.constexpr):
    """(BLOCK_ROWS, BLOCK_K // 32) e8m0 scales of one tile, read from the `to_cdna4_scales` layout."""
    # The tile's first unit offset in int64 (scales of a folded batch can pass 2**31 bytes), the rest
    # in int32. Units past the operand's last one only feed output rows never stored: clamp them.
    first_unit = row_block * (BLOCK_ROWS // 32)
    base += first_unit.to(tl.int64) * UNIT_ROW_BYTES
    unit = tl.minimum(tl.arange(0, BLOCK_ROWS // 32), NUM_ROW_UNITS - 1 - first_unit)
    cols = k_step * BLOCK_K + tl.arange(0, BLOCK_K)  # a 32-row unit holds one byte per element of K
    ptrs = base + unit[:, None] * UNIT_ROW_BYTES + cols[None, :]
    if MASK_K:
        packed = tl.load(ptrs, mask=(cols < UNIT_ROW_BYTES)[None, :], other=0)
    else:
        packed = tl.load(ptrs)
    K_UNITS: tl.constexpr = BLOCK_K // 256
    if MFMA == 32:
        # unit bytes = [k unit][col pair (2)][row (32)][col in quad (4)]
        scales = packed.reshape(BLOCK_ROWS // 32, K_UNITS, 2, 32, 4).permute(0, 3, 1, 4, 2)
    else:
        # unit bytes = [k unit][col quad (4)][row in half (16)][col pair (2)][row half (2)]
        scales = packed.reshape(BLOCK_ROWS // 32, K_UNITS, 4, 16, 2, 2).permute(0, 5, 3, 1, 4, 2)
    return scales.reshape(BLOCK_ROWS, BLOCK_K // 32)


@triton.jit
def scaled_gemm_kernel_cdna4(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_BATCH_STRIDE: tl.constexpr, A_SCALE_BATCH_STRIDE: tl.constexpr,
    B_BATCH_STRIDE: tl.constexpr, B_SCALE_BATCH_STRIDE: tl.constexpr,
    OUT_BATCH_STRIDE: tl.constexpr, OUT_SPLIT_STRIDE: tl.constexpr,
    A_FORMAT: tl.constexpr, B_FORMAT: tl.constexpr, A_PER_BYTE: tl.constexpr, B_PER_BYTE: tl.constexpr,
    MFMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr,
):
    """out[s, b] = alpha * sum over split s of (a[b] * sa) @ (b[b] * sb).T for one BLOCK_M x BLOCK_N tile.

    Grid: (tiles, batch, SPLIT_K). Batch strides are 0 for an operand without a batch dim.
    """
    K_STEPS: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    MASK_K: tl.constexpr = K % BLOCK_K != 0
    UNIT_ROW_BYTES: tl.constexpr = (K + 255) // 256 * 256  # one 32-row unit: 32 rows x K/32 scales

    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    a_base = a_ptr + batch * A_BATCH_STRIDE + (pid_m * BLOCK_M).to(tl.int64) * (K // A_PER_BYTE)
    b_base = b_ptr + batch * B_BATCH_STRIDE + (pid_n * BLOCK_N).to(tl.int64) * (K // B_PER_BYTE)
    a_scale_base = a_scale_ptr + batch * A_SCALE_BATCH_STRIDE
    b_scale_base = b_scale_ptr + batch * B_SCALE_BATCH_STRIDE
    a_rows = tl.minimum(tl.arange(0, BLOCK_M), M - 1 - pid_m * BLOCK_M)
    b_rows = tl.minimum(tl.arange(0, BLOCK_N), N - 1 - pid_n * BLOCK_N)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin, k_end = k_tile_range(K_STEPS, SPLIT_K)
    for k_step in range(k_begin, k_end):
        a = _nv.load_value_tile(a_base, a_rows, k_step, K // A_PER_BYTE, BLOCK_K // A_PER_BYTE, MASK_K)
        b = _nv.load_value_tile(b_base, b_rows, k_step, K // B_PER_BYTE, BLOCK_K // B_PER_BYTE, MASK_K)
        a_scale = _load_scale_tile(a_scale_base, pid_m, k_step, (M + 31) // 32, UNIT_ROW_BYTES,
                                   BLOCK_M, BLOCK_K, MFMA, MASK_K)
        b_scale = _load_scale_tile(b_scale_base, pid_n, k_step, (N + 31) // 32, UNIT_ROW_BYTES,
                                   BLOCK_N, BLOCK_K, MFMA, MASK_K)
        acc = tl.dot_scaled(a, a_scale, A_FORMAT, b.T, b_scale, B_FORMAT, acc)

    out_base = out_ptr + batch * OUT_BATCH_STRIDE + split.to(tl.int64) * OUT_SPLIT_STRIDE
    store_alpha_tile(acc, alpha_ptr, out_base, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)


def check_config(config: TileConfig) -> None:
    """Raises ValueError for tiles the CDNA4 scale unshuffle (or Triton 3.6) cannot serve."""
    if config.block_m % 32 or config.block_n % 32:
        raise ValueError(f"BLOCK_M/BLOCK_N must be multiples of 32 (one shuffled scale unit), got {config}")
    if config.block_k % _SHUFFLE_UNIT_K:
        raise ValueError(f"BLOCK_K must be a multiple of {_SHUFFLE_UNIT_K} (8 scale columns), got {config}")
    for n in (config.block_m, config.block_n, config.block_k):
        if n & (n - 1):
            raise ValueError(f"tile sizes must be powers of two (tl.arange), got {config}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")


def kernel_constexprs(p: GemmProblem, config: TileConfig, mfma: int = JAX_TRITON_MFMA) -> dict:
    """Constexpr arguments of `scaled_gemm_kernel_cdna4` (batch folded into M unless `p.b_batched`)."""
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"dot_scaled_cdna4 does not handle {p.a_kind} x {p.b_kind}; see SUPPORTED")
    if mfma not in MFMA_VARIANTS:
        raise ValueError(f"mfma must be one of {MFMA_VARIANTS}, got {mfma}")
    check_config(config)
    a_per_byte, b_per_byte = ELEMENTS_PER_BYTE.get(p.a_kind, 1), ELEMENTS_PER_BYTE.get(p.b_kind, 1)
    unit_row_bytes = -(-p.k // _SHUFFLE_UNIT_K) * _SHUFFLE_UNIT_K
    batched = p.b_batched
    return dict(
        M=p.m if batched else p.batch * p.m, N=p.n, K=p.k,
        A_BATCH_STRIDE=p.m * p.k // a_per_byte if batched else 0,
        A_SCALE_BATCH_STRIDE=-(-p.m // 32) * unit_row_bytes if batched else 0,
        B_BATCH_STRIDE=p.n * p.k // b_per_byte if batched else 0,
        B_SCALE_BATCH_STRIDE=-(-p.n // 32) * unit_row_bytes if batched else 0,
        OUT_BATCH_STRIDE=p.m * p.n if batched else 0,
        OUT_SPLIT_STRIDE=p.batch * p.m * p.n,
        A_FORMAT=_nv.DOT_FORMAT[p.a_kind], B_FORMAT=_nv.DOT_FORMAT[p.b_kind],
        A_PER_BYTE=a_per_byte, B_PER_BYTE=b_per_byte, MFMA=mfma,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, SPLIT_K=config.split_k,
    )


def pointer_signature(p: GemmProblem) -> dict[str, str]:
    """Triton types of the kernel's pointer arguments as `launch` passes them (for cross-compiling)."""
    return {
        "a_ptr": _nv.POINTER_TYPES[p.a_kind], "a_scale_ptr": "*u8",
        "b_ptr": _nv.POINTER_TYPES[p.b_kind], "b_scale_ptr": "*u8",
        "alpha_ptr": "*fp32", "out_ptr": jt.triton_pointer_type(OUT_DTYPES[p.out_dtype]),
    }


def compile_options(mfma: int) -> dict:
    """Triton compile options selecting the scaled-MFMA shape (`compile_kernel(**compile_options(16))`)."""
    return {"matrix_instr_nonkdim": mfma}


def grid(p: GemmProblem, config: TileConfig) -> tuple[int, int, int]:
    rows = p.m if p.b_batched else p.batch * p.m
    tiles = math.ceil(rows / config.block_m) * math.ceil(p.n / config.block_n)
    return (tiles, p.batch if p.b_batched else 1, config.split_k)


def default_config(p: GemmProblem, target: str = "") -> TileConfig:
    """128 x 128 x 256 tiles with 8 warps (the tutorial's MI355 setting); 32-row tiles for decode-sized M,
    and split-K while the grid covers under half the CUs and each split keeps >= 4 K-steps."""
    rows = p.m if p.b_batched else p.batch * p.m
    block_m = 32 if rows <= 32 else 128
    block_n, block_k = 128, 256
    tiles = math.ceil(rows / block_m) * math.ceil(p.n / block_n) * (p.batch if p.b_batched else 1)
    k_steps = math.ceil(p.k / block_k)
    split_k = 1
    while tiles * split_k * 2 <= _CU_COUNT and k_steps // (split_k * 2) >= 4:
        split_k *= 2
    return TileConfig(block_m=block_m, block_n=block_n, block_k=block_k, group_m=8,
                      num_warps=8 if block_m == 128 else 4, num_stages=2, split_k=split_k)


def _kernel_operand(values: jax.Array, scales: jax.Array, kind: str, mfma: int, fold_batch: bool):
    if fold_batch:
        values = values.reshape(-1, values.shape[-1])
        scales = scales.reshape(-1, scales.shape[-1])
    if kind in _nv.FP6_WIDENED:
        values = _nv.widen_fp6(values, kind)
    return values, layouts.to_cdna4_scales(scales, mfma=mfma)


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array,
           b_scales: jax.Array, alpha: jax.Array, *, config: TileConfig, compute_capability: int | None = None,
           mfma: int = JAX_TRITON_MFMA) -> jax.Array:
    """The (p.batch, p.m, p.n) product of the contract's operands (see problem.py), as p.out_dtype.

    `compute_capability` is accepted for the common launcher interface and unused (jax-triton reads the
    ROCm architecture from the device). `mfma` picks the scale shuffle; keep 32 under jax-triton.
    """
    del compute_capability
    constexprs = kernel_constexprs(p, config, mfma)
    out_dtype = OUT_DTYPES[p.out_dtype]
    if config.split_k > 1:
        out_shape = jax.ShapeDtypeStruct((config.split_k, p.batch, p.m, p.n), jnp.float32)
    else:
        out_shape = jax.ShapeDtypeStruct((p.batch, p.m, p.n), out_dtype)
    a_values, a_scales = _kernel_operand(a_values, a_scales, p.a_kind, mfma, fold_batch=not p.b_batched)
    b_values, b_scales = _kernel_operand(b_values, b_scales, p.b_kind, mfma, fold_batch=False)
    out = jt.call(
        scaled_gemm_kernel_cdna4, a_values, a_scales, b_values, b_scales,
        jnp.asarray(alpha, jnp.float32).reshape(1),
        out_shape=out_shape, grid=grid(p, config), num_warps=config.num_warps,
        num_stages=config.num_stages, compute_capability=None,
        name=f"dot_scaled_gfx950_{p.a_kind}_{p.b_kind}", **constexprs,
    )
    if config.split_k > 1:
        out = out.sum(axis=0).astype(out_dtype)
    return out
