"""Blackwell (sm_100 / sm_103) block-scaled GEMM: `tl.dot_scaled` -> `tcgen05.mma ... block_scale`.

Scales arrive row-major and are packed in jnp into the 5D tcgen05 layout (`layouts.to_blackwell_scales`):
(R/128, C/4, 32, 4, 4). One (128-row, 4-scale-column) unit is 512 contiguous bytes, so a tile's scales are
`rep_rows x rep_k` whole units, read with plain pointer loads (device-side `tl.make_tensor_descriptor`
crashes under jax-triton 0.3.1 and host TMA descriptors cannot be passed through it) and unpacked in
registers with the reshape/transpose of Triton's block-scaled tutorial. Hence BLOCK_M and BLOCK_N are
multiples of 128 and BLOCK_K a multiple of 4 * VEC.

What Triton 3.6 emits on sm_100 (asserted by tests/test_lowering_nvidia.py):
  e4m3/e5m2 (and fp6, see below) x any MX kind -> tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X
  e2m1 x e2m1 (mxfp4)                           -> ...kind::mxf4.block_scale.scale_vec::2X
  nvfp4 x nvfp4                                 -> ...kind::mxf4nvf4.block_scale.scale_vec::4X
  bf16/fp16 x MX                                -> ...kind::f16 (Triton upcasts the MX operand in-kernel)
fp6: Triton 3.6's `dot_scaled` front end rejects "e2m3"/"e3m2" ("NYI: lhs_format e2m3"; the IR enum has
them, the language does not), so fp6 codes are widened in jnp to the fp8 type with the same mantissa width,
which is exact: e2m3 -> e4m3, e3m2 -> e5m2. The MMA is then mxf8f6f4, the instruction fp6 would use anyway.
On sm_90 `dot_scaled` is emulated (bf16 upcast + wgmma): every pair here compiles except nvfp4, for which
Triton 3.6 has no emulation (TritonGPUAccelerateMatmul fails). `launch` refuses nvfp4 below sm_100.
"""

from __future__ import annotations

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import triton
import triton.language as tl

from .tiling import grouped_tile, k_tile_range, store_alpha_tile

from .. import layouts
from . import jt
from .problem import DENSE_KINDS, ELEMENTS_PER_BYTE, MX_KINDS, NVFP4, OUT_DTYPES, SCALE_BLOCK, GemmProblem, TileConfig

__all__ = ["SUPPORTED", "DOT_FORMAT", "default_config", "launch", "kernel_constexprs", "pointer_signature",
           "grid", "scaled_gemm_kernel", "widen_fp6"]

SUPPORTED: frozenset[tuple[str, str]] = frozenset(
    set(itertools.product(MX_KINDS, MX_KINDS))
    | {(NVFP4, NVFP4)}
    | set(itertools.product(DENSE_KINDS, MX_KINDS))
)

# The operand format named to tl.dot_scaled for each of our kinds (fp6 is widened to fp8 first, see above).
DOT_FORMAT = {"e4m3": "e4m3", "e5m2": "e5m2", "e2m3": "e4m3", "e3m2": "e5m2", "e2m1": "e2m1",
              NVFP4: "e2m1", "bf16": "bf16", "fp16": "fp16"}
FP6_WIDENED = {"e2m3": (ml_dtypes.float6_e2m3fn, jnp.float8_e4m3fn),
                "e3m2": (ml_dtypes.float6_e3m2fn, jnp.float8_e5m2)}
_SCALE_UNIT = 512  # bytes of one (128 rows x 4 scale columns) unit of the 5D layout
_SM_COUNT = 148  # B200 / B300; only steers the split-K heuristic for small grids


@triton.jit
def _load_scale_tile(base, row_block, k_step, NUM_ROW_UNITS: tl.constexpr, NUM_K_UNITS: tl.constexpr,
                     BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, VEC: tl.constexpr,
                     MASK_K: tl.constexpr):
    """(BLOCK_ROWS, BLOCK_K // VEC) scales of one tile, read from the (R/128, C/4, 32, 4, 4) layout."""
    REP_ROWS: tl.constexpr = BLOCK_ROWS // 128
    REP_K: tl.constexpr = BLOCK_K // VEC // 4
    # The tile's first unit offset in int64 (scales of a folded batch can pass 2**31 bytes), the rest
    # in int32. Units past the operand's last one only feed output rows never stored: clamp them.
    first_unit = row_block * REP_ROWS
    base += first_unit.to(tl.int64) * (NUM_K_UNITS * 512)
    row_unit = tl.minimum(tl.arange(0, REP_ROWS), NUM_ROW_UNITS - 1 - first_unit)
    k_unit = k_step * REP_K + tl.arange(0, REP_K)
    offs = ((row_unit[:, None, None] * NUM_K_UNITS + k_unit[None, :, None]) * 512
            + tl.arange(0, 512)[None, None, :])
    if MASK_K:
        packed = tl.load(base + offs, mask=(k_unit < NUM_K_UNITS)[None, :, None], other=0.0)
    else:
        packed = tl.load(base + offs)
    # packed[i0, j0, i2, i1, j1] = scales[i0*128 + i1*32 + i2, j0*4 + j1]
    return packed.reshape(REP_ROWS, REP_K, 32, 4, 4).trans(0, 3, 2, 1, 4).reshape(BLOCK_ROWS, BLOCK_K // VEC)


@triton.jit
def load_value_tile(base, rows, k_step, ROW_BYTES: tl.constexpr, TILE_BYTES: tl.constexpr,
                    MASK_K: tl.constexpr):
    """(len(rows), TILE_BYTES) of a row-major operand, K-step `k_step`; bytes past K read as zero."""
    cols = k_step * TILE_BYTES + tl.arange(0, TILE_BYTES)
    ptrs = base + rows[:, None] * ROW_BYTES + cols[None, :]
    if MASK_K:
        return tl.load(ptrs, mask=(cols < ROW_BYTES)[None, :], other=0.0)  # fp8 takes no int other
    return tl.load(ptrs)


@triton.jit
def scaled_gemm_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    A_BATCH_STRIDE: tl.constexpr, A_SCALE_BATCH_STRIDE: tl.constexpr,
    B_BATCH_STRIDE: tl.constexpr, B_SCALE_BATCH_STRIDE: tl.constexpr,
    OUT_BATCH_STRIDE: tl.constexpr, OUT_SPLIT_STRIDE: tl.constexpr,
    A_FORMAT: tl.constexpr, B_FORMAT: tl.constexpr, A_SCALED: tl.constexpr,
    A_PER_BYTE: tl.constexpr, B_PER_BYTE: tl.constexpr, VEC: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, SPLIT_K: tl.constexpr, OUT_T: tl.constexpr = False,
):
    """out[s, b] = alpha * sum over split s of (a[b] * sa) @ (b[b] * sb).T for one BLOCK_M x BLOCK_N tile;
    OUT_T: each (M, N) slab is stored transposed, (N, M).

    Grid: (tiles, batch, SPLIT_K). Batch strides are 0 for an operand without a batch dim.
    """
    K_STEPS: tl.constexpr = (K + BLOCK_K - 1) // BLOCK_K
    MASK_K: tl.constexpr = K % BLOCK_K != 0
    NUM_K_UNITS: tl.constexpr = (K // VEC + 3) // 4

    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)

    a_base = a_ptr + batch * A_BATCH_STRIDE + (pid_m * BLOCK_M).to(tl.int64) * (K // A_PER_BYTE)
    b_base = b_ptr + batch * B_BATCH_STRIDE + (pid_n * BLOCK_N).to(tl.int64) * (K // B_PER_BYTE)
    a_scale_base = a_scale_ptr + batch * A_SCALE_BATCH_STRIDE
    b_scale_base = b_scale_ptr + batch * B_SCALE_BATCH_STRIDE
    # Rows past M / N are clamped to the last one (in bounds, never stored) instead of masked.
    a_rows = tl.minimum(tl.arange(0, BLOCK_M), M - 1 - pid_m * BLOCK_M)
    b_rows = tl.minimum(tl.arange(0, BLOCK_N), N - 1 - pid_n * BLOCK_N)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_begin, k_end = k_tile_range(K_STEPS, SPLIT_K)
    for k_step in range(k_begin, k_end):
        a = load_value_tile(a_base, a_rows, k_step, K // A_PER_BYTE, BLOCK_K // A_PER_BYTE, MASK_K)
        b = load_value_tile(b_base, b_rows, k_step, K // B_PER_BYTE, BLOCK_K // B_PER_BYTE, MASK_K)
        b_scale = _load_scale_tile(b_scale_base, pid_n, k_step, (N + 127) // 128, NUM_K_UNITS,
                                   BLOCK_N, BLOCK_K, VEC, MASK_K)
        if A_SCALED:
            a_scale = _load_scale_tile(a_scale_base, pid_m, k_step, (M + 127) // 128, NUM_K_UNITS,
                                       BLOCK_M, BLOCK_K, VEC, MASK_K)
            acc = tl.dot_scaled(a, a_scale, A_FORMAT, b.T, b_scale, B_FORMAT, acc)
        else:
            acc = tl.dot_scaled(a, None, A_FORMAT, b.T, b_scale, B_FORMAT, acc)

    out_base = out_ptr + batch * OUT_BATCH_STRIDE + split.to(tl.int64) * OUT_SPLIT_STRIDE
    store_alpha_tile(acc, alpha_ptr, out_base, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, OUT_T)


def _scale_vec(p: GemmProblem) -> int:
    return SCALE_BLOCK[p.b_kind]


def check_config(p: GemmProblem, config: TileConfig) -> None:
    """Raises ValueError for tiles the 5D scale unpacking cannot serve."""
    vec = _scale_vec(p)
    if config.block_m % 128 or config.block_n % 128:
        raise ValueError(f"BLOCK_M/BLOCK_N must be multiples of 128 (one tcgen05 scale unit), got {config}")
    if config.block_k % (4 * vec):
        raise ValueError(f"BLOCK_K must be a multiple of {4 * vec} (4 scale columns), got {config.block_k}")
    for n in (config.block_m, config.block_n, config.block_k // (4 * vec)):
        if n & (n - 1):
            raise ValueError(f"tile sizes must be powers of two (tl.arange), got {config}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")


def kernel_constexprs(p: GemmProblem, config: TileConfig) -> dict:
    """The constexpr arguments of `scaled_gemm_kernel` for one problem (batch folded into M unless
    `p.b_batched`); shared by `launch` and the cross-compilation tests."""
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"dot_scaled_nvidia does not handle {p.a_kind} x {p.b_kind}; see SUPPORTED")
    check_config(p, config)
    vec = _scale_vec(p)
    rows = p.m if p.b_batched else p.batch * p.m
    a_per_byte, b_per_byte = ELEMENTS_PER_BYTE.get(p.a_kind, 1), ELEMENTS_PER_BYTE.get(p.b_kind, 1)
    k_units = -(-(p.k // vec) // 4)  # 4-column scale units along K (the 5D layout pads to whole units)

    def scale_units(r: int) -> int:
        return -(-r // 128) * k_units * _SCALE_UNIT

    batched = p.b_batched
    return dict(
        M=rows, N=p.n, K=p.k,
        A_BATCH_STRIDE=p.m * p.k // a_per_byte if batched else 0,
        A_SCALE_BATCH_STRIDE=scale_units(p.m) if batched else 0,
        B_BATCH_STRIDE=p.n * p.k // b_per_byte if batched else 0,
        B_SCALE_BATCH_STRIDE=scale_units(p.n) if batched else 0,
        OUT_BATCH_STRIDE=p.m * p.n if batched else 0,
        OUT_SPLIT_STRIDE=p.batch * p.m * p.n,
        A_FORMAT=DOT_FORMAT[p.a_kind], B_FORMAT=DOT_FORMAT[p.b_kind], A_SCALED=p.a_kind not in DENSE_KINDS,
        A_PER_BYTE=a_per_byte, B_PER_BYTE=b_per_byte, VEC=vec,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, SPLIT_K=config.split_k,
    )


POINTER_TYPES = {"e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "e2m3": "*fp8e4nv", "e3m2": "*fp8e5", "e2m1": "*u8",
                  NVFP4: "*u8", "bf16": "*bf16", "fp16": "*fp16"}


def pointer_signature(p: GemmProblem) -> dict[str, str]:
    """Triton types of the kernel's pointer arguments as `launch` passes them (for cross-compiling)."""
    scale_type = {NVFP4: "*fp8e4nv"}.get(p.a_kind, "*u8")
    return {
        "a_ptr": POINTER_TYPES[p.a_kind], "a_scale_ptr": scale_type,
        "b_ptr": POINTER_TYPES[p.b_kind], "b_scale_ptr": {NVFP4: "*fp8e4nv"}.get(p.b_kind, "*u8"),
        "alpha_ptr": "*fp32", "out_ptr": jt.triton_pointer_type(OUT_DTYPES[p.out_dtype]),
    }


def grid(p: GemmProblem, config: TileConfig) -> tuple[int, int, int]:
    rows = p.m if p.b_batched else p.batch * p.m
    tiles = math.ceil(rows / config.block_m) * math.ceil(p.n / config.block_n)
    return (tiles, p.batch if p.b_batched else 1, config.split_k)


def _split_k_for(p: GemmProblem, block_m: int, block_n: int, block_k: int) -> int:
    """Split K while the grid covers under half the SMs and each split keeps >= 4 K-steps (decode)."""
    rows = p.m if p.b_batched else p.batch * p.m
    tiles = math.ceil(rows / block_m) * math.ceil(p.n / block_n) * (p.batch if p.b_batched else 1)
    k_steps = math.ceil(p.k / block_k)
    split = 1
    while tiles * split * 2 <= _SM_COUNT and k_steps // (split * 2) >= 4:
        split *= 2
    return split


def default_config(p: GemmProblem, target: str = "") -> TileConfig:
    """128 x 128 tiles (the tcgen05 M and one scale unit); BLOCK_K = 128 bytes of the narrower operand
    for fp4 (256 elements), 128 elements otherwise; split-K for grids too small to fill the GPU."""
    fp4_both = ELEMENTS_PER_BYTE.get(p.a_kind, 1) == 2 and ELEMENTS_PER_BYTE.get(p.b_kind, 1) == 2
    block_k = 256 if fp4_both else 128
    dense = p.a_kind in DENSE_KINDS
    # Stages: 4 x (16 KB + 16 KB) for 8-bit tiles; a bf16 A tile is twice as large.
    stages = 3 if dense else 4
    split_k = _split_k_for(p, 128, 128, block_k)
    return TileConfig(block_m=128, block_n=128, block_k=block_k, group_m=8, num_warps=4,
                      num_stages=stages, split_k=split_k)


@functools.lru_cache(maxsize=None)
def _fp6_table(kind: str) -> np.ndarray:
    """64-entry table: fp6 code -> the same value in the wider fp8 type (exact)."""
    fp6, fp8 = FP6_WIDENED[kind]
    return np.arange(64, dtype=np.uint8).view(fp6).astype(fp8)


def widen_fp6(codes: jax.Array, kind: str) -> jax.Array:
    """fp6 codes (uint8, low 6 bits, sign in bit 5) -> e4m3 (e2m3) or e5m2 (e3m2) values, exactly."""
    return jnp.asarray(_fp6_table(kind))[codes.astype(jnp.int32) & 0x3F]


def _kernel_operand(values: jax.Array, scales: jax.Array, kind: str, fold_batch: bool):
    """Values and scales as the kernel reads them: fp6 widened to fp8, scales in the 5D layout.

    With `fold_batch`, (B, R, ...) becomes (B * R, ...) first, so that the 128-row scale units run over
    the folded rows exactly as the kernel's row blocks do. Dense operands keep their dummy scales.
    """
    if fold_batch:
        values = values.reshape(-1, values.shape[-1])
        scales = scales.reshape(-1, scales.shape[-1])
    if kind in FP6_WIDENED:
        values = widen_fp6(values, kind)
    if kind not in DENSE_KINDS:
        scales = layouts.to_blackwell_scales(scales)
    return values, scales


# The kernel can write the product transposed (OUT_T): `primitive` asks for it with transpose_out=True when one
# (M, N) product is wanted as (N, M), e.g. a (K, N) weight's gradient (recipes' wgrad), so that no XLA
# transpose pass follows the GEMM.
WRITES_TRANSPOSED = True


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array,
           b_scales: jax.Array, alpha: jax.Array, *, config: TileConfig,
           compute_capability: int, transpose_out: bool = False) -> jax.Array:
    """The (p.batch, p.m, p.n) product of the contract's operands (see problem.py), as p.out_dtype; with
    transpose_out (p.batch == 1 only), (1, p.n, p.m): the product transposed, stored so by the kernel."""
    if NVFP4 in (p.a_kind, p.b_kind) and compute_capability < 100:
        raise ValueError(f"nvfp4 needs sm_100+ (tcgen05 kind::mxf4nvf4); Triton 3.6 has no emulation of it "
                         f"for sm_{compute_capability}")
    if transpose_out and p.batch != 1:
        raise ValueError(f"transpose_out takes one (M, N) product, got a batch of {p.batch}")
    constexprs = dict(kernel_constexprs(p, config), OUT_T=bool(transpose_out))
    out_dtype = OUT_DTYPES[p.out_dtype]
    slab = (p.n, p.m) if transpose_out else (p.m, p.n)
    if config.split_k > 1:
        out_shape = jax.ShapeDtypeStruct((config.split_k, p.batch) + slab, jnp.float32)
    else:
        out_shape = jax.ShapeDtypeStruct((p.batch,) + slab, out_dtype)
    a_values, a_scales = _kernel_operand(a_values, a_scales, p.a_kind, fold_batch=not p.b_batched)
    b_values, b_scales = _kernel_operand(b_values, b_scales, p.b_kind, fold_batch=False)
    out = jt.call(
        scaled_gemm_kernel, a_values, a_scales, b_values, b_scales,
        jnp.asarray(alpha, jnp.float32).reshape(1),
        out_shape=out_shape, grid=grid(p, config), num_warps=config.num_warps,
        num_stages=config.num_stages, compute_capability=compute_capability,
        name=f"dot_scaled_sm100_{p.a_kind}_{p.b_kind}", **constexprs,
    )
    if config.split_k > 1:
        out = out.sum(axis=0).astype(out_dtype)
    return out
