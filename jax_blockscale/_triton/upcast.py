"""Upcasting block-scaled GEMM: element codes decoded to bf16 in registers, then a bf16 `tl.dot`.

Hopper has no tensor-core instruction for MX / nvfp4 scales (wgmma takes plain fp8 at most), and gfx950's
scaled MFMA does not take nvfp4's e4m3 scales, so on those targets this kernel decodes every element and
applies its block scale before a bf16 dot (wgmma bf16 on sm_90, MFMA bf16 on gfx950). Decoding costs ALU
work in every program that reads a tile, so an operand that many programs would read (large M and N) is
instead dequantized to bf16 by XLA first (`predecoded_sides`); the fused decode serves decode-sized M.

Exactness: bf16 has float32's exponent range and 8 significant bits, and every e2m1/e2m3/e3m2/e4m3/e5m2 value
has at most 4; times an e8m0 power of two, or an e4m3 nvfp4 scale (4 bits, product <= 8 bits), the decoded
element is exact in bf16 unless it leaves bf16's normal range. The fp32 accumulation then matches the
dequantize-and-matmul reference up to summation order. nvfp4's tensor scales (alpha) apply in the epilogue.

Dense operands (bf16/fp16) pass through; the dot runs in fp16 only when both sides are fp16 (an fp16 operand
next to a scaled one is rounded to bf16, as scaled elements can exceed fp16's range).
"""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from ..formats import get_format
from ..quantize import BlockScaledArray, dequantize
from .block_fp8 import run_gemm, store_tile, swapped_decode_config, with_split_k
from .tiling import grouped_tile, k_tile_range
from .problem import (DENSE_KINDS, DEQUANTIZE_SCOPE, ELEMENTS_PER_BYTE, MX_KINDS, NVFP4, SCALE_BLOCK, GemmProblem,
                      TileConfig, check_operands)

_UPCAST_KINDS = MX_KINDS + (NVFP4,) + DENSE_KINDS
SUPPORTED: frozenset[tuple[str, str]] = frozenset(itertools.product(_UPCAST_KINDS, repeat=2))

_FORMAT_NAMES = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2", "e2m3": "mxfp6_e2m3", "e3m2": "mxfp6_e3m2",
                 "e2m1": "mxfp4", NVFP4: "nvfp4"}
# See predecoded_sides. Measured on an H200 (8192 x 7168 x 2048, mxfp4 x mxfp4): in-register decoding of both
# operands ran at 0.24x of cuBLAS bf16, dominated by decode ALU work repeated across 56-64 reuses.
_PREDECODE_REUSE = 4
_PREDECODE_MIN_ROWS = 256



# ---------------------------------------------------------------------------------------------------------
# Decoding, all exact (module docstring). Codes arrive as uint8 tensors.


@triton.jit
def e8m0_to_f32(code):
    """2**(code - 127) built from bits; code 0 (2**-127) is an fp32 subnormal, and 0xFF is NaN."""
    c = code.to(tl.uint32)
    bits = tl.where(c == 0, 0x00400000, tl.where(c == 0xFF, 0x7FC00000, c << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def minifloat_to_f32(byte, EBITS: tl.constexpr, MBITS: tl.constexpr, SHIFT: tl.constexpr):
    """The fp6/fp4 code at bit SHIFT of `byte` (sign above EBITS exponent and MBITS mantissa bits; no
    Inf/NaN encodings) to fp32.

    The exponent and mantissa bits drop unchanged into fp32's fields: a normal code then reads as
    2**(e - 127) * (1.m) and a subnormal one (e = 0) as the fp32 subnormal 2**-126 * 0.m, so one multiply
    by 2**(127 - bias) gives the value of both exactly, with no select. This needs fp32 subnormals kept:
    Triton emits mul.f32 without .ftz (and e2m1's 0.5 is subnormal, so a flush fails every test).
    """
    BIAS: tl.constexpr = (1 << (EBITS - 1)) - 1
    BITS: tl.constexpr = EBITS + MBITS
    c = byte.to(tl.uint32)
    magnitude = (c & (((1 << BITS) - 1) << SHIFT)) << (23 - MBITS - SHIFT)
    sign = (c & (1 << (BITS + SHIFT))) << (31 - BITS - SHIFT)
    return (magnitude | sign).to(tl.float32, bitcast=True) * (2.0 ** (127 - BIAS))


@triton.jit
def codes_to_f32(code, KIND: tl.constexpr):
    """Elements as fp32: one code per byte, or for the packed fp4 kinds the pair (even, odd) of a byte
    joined on a new minor axis (low nibble first)."""
    if KIND == "e2m3":
        value = minifloat_to_f32(code, 2, 3, 0)
    elif KIND == "e3m2":
        value = minifloat_to_f32(code, 3, 2, 0)
    elif KIND == "e2m1" or KIND == "nvfp4":
        value = tl.join(minifloat_to_f32(code, 2, 1, 0), minifloat_to_f32(code, 2, 1, 4))
    else:  # e4m3 / e5m2 arrive as float8 tensors, converted natively
        value = code.to(tl.float32)
    return value


@triton.jit
def scales_to_f32(scale, KIND: tl.constexpr):
    if KIND == "nvfp4":
        value = scale.to(tl.float32)
    else:
        value = e8m0_to_f32(scale)
    return value


@triton.jit
def load_scales(s_ptr, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr,
                EVEN_K: tl.constexpr):
    """The fp32 scales of the (rows, BLOCK_K) tile at K offset k0: (rows, BLOCK_K / block); dense kinds
    have none and get an unused (rows, 1) of ones."""
    R: tl.constexpr = rows.shape[0]
    if KIND == "bf16" or KIND == "fp16":
        s = tl.full((R, 1), 1.0, tl.float32)
    else:
        GROUP: tl.constexpr = 16 if KIND == "nvfp4" else 32
        offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
        s_ptrs = s_ptr + rows[:, None] * (K // GROUP) + offs_g[None, :]
        if EVEN_K:
            s = scales_to_f32(tl.load(s_ptrs), KIND)
        else:
            # Groups past K scale zero padding: any finite scale does (0 * NaN would not). Filled after
            # decoding, as Triton cannot cast an integer `other` to fp8.
            in_k = offs_g[None, :] < K // GROUP
            s = tl.where(in_k, scales_to_f32(tl.load(s_ptrs, mask=in_k), KIND), 1.0)
    return s


@triton.jit
def load_operand(v_ptr, s, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr,
                 EVEN_K: tl.constexpr, DOT_FP16: tl.constexpr):
    """The (rows, BLOCK_K) tile at K offset k0 of one operand, decoded, times its scales `s`
    (from load_scales), in the dot's dtype. `v_ptr` points at this batch's values; `rows` are in range."""
    R: tl.constexpr = rows.shape[0]
    if KIND == "bf16" or KIND == "fp16":
        offs_k = k0 + tl.arange(0, BLOCK_K)
        ptrs = v_ptr + rows[:, None] * K + offs_k[None, :]
        if EVEN_K:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_k[None, :] < K, other=0.0)
    else:
        GROUP: tl.constexpr = 16 if KIND == "nvfp4" else 32
        if KIND == "e2m1" or KIND == "nvfp4":
            offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            ptrs = v_ptr + rows[:, None] * (K // 2) + offs_b[None, :]
            if EVEN_K:
                packed = tl.load(ptrs)
            else:
                packed = tl.load(ptrs, mask=offs_b[None, :] < K // 2, other=0)
            values = codes_to_f32(packed, KIND)
        else:
            offs_k = k0 + tl.arange(0, BLOCK_K)
            ptrs = v_ptr + rows[:, None] * K + offs_k[None, :]
            if EVEN_K:
                values = codes_to_f32(tl.load(ptrs), KIND)
            else:
                in_k = offs_k[None, :] < K
                values = tl.where(in_k, codes_to_f32(tl.load(ptrs, mask=in_k), KIND), 0.0)
        values = tl.reshape(values, (R, BLOCK_K // GROUP, GROUP))
        x = tl.reshape(values * s[:, :, None], (R, BLOCK_K))
    if DOT_FP16:
        x = x.to(tl.float16)
    else:
        x = x.to(tl.bfloat16)
    return x


@triton.jit
def upcast_kernel(
    a_ptr, a_scale_ptr, b_ptr, b_scale_ptr, alpha_ptr, out_ptr,  # jax-triton appends outputs last
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, BATCHES: tl.constexpr, B_BATCHED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, WIDE: tl.constexpr,
    A_KIND: tl.constexpr, B_KIND: tl.constexpr, A_EPB: tl.constexpr, B_EPB: tl.constexpr,
    A_SCALE_COLS: tl.constexpr, B_SCALE_COLS: tl.constexpr, DOT_FP16: tl.constexpr, OUT_T: tl.constexpr,
):
    """out[batch] = alpha * decode(a) @ decode(b).T; a (BATCHES, M, K/A_EPB) with scales (.., M, A_SCALE_COLS),
    b ([BATCHES,] N, K/B_EPB) likewise; dense kinds have (.., rows, 1) dummy scales."""
    EVEN_K: tl.constexpr = K % BLOCK_K == 0
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    batch = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Out-of-range rows read a valid row (unmasked loads vectorize); the store mask drops them.
    rows_a = offs_m % M
    rows_b = offs_n % N
    if WIDE:
        rows_a = rows_a.to(tl.int64)
        rows_b = rows_b.to(tl.int64)
        batch = batch.to(tl.int64)
    a_values = a_ptr + batch * (M * (K // A_EPB))
    a_scales = a_scale_ptr + batch * (M * A_SCALE_COLS)
    # No batch term for an unbatched b: `0 * (N * K)` would be built as an int32 constant, which Triton
    # refuses once the weight holds 2**31 elements.
    b_values = b_ptr
    b_scales = b_scale_ptr
    if B_BATCHED:
        b_values += batch * (N * (K // B_EPB))
        b_scales += batch * (N * B_SCALE_COLS)

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    K_TILES: tl.constexpr = triton.cdiv(K, BLOCK_K)
    k_begin, k_end = k_tile_range(K_TILES, SPLIT_K)
    for kt in range(k_begin, k_end):
        k0 = kt * BLOCK_K
        a_s = load_scales(a_scales, rows_a, k0, K, A_KIND, BLOCK_K, EVEN_K)
        b_s = load_scales(b_scales, rows_b, k0, K, B_KIND, BLOCK_K, EVEN_K)
        a = load_operand(a_values, a_s, rows_a, k0, K, A_KIND, BLOCK_K, EVEN_K, DOT_FP16)
        b = load_operand(b_values, b_s, rows_b, k0, K, B_KIND, BLOCK_K, EVEN_K, DOT_FP16)
        acc = tl.dot(a, tl.trans(b), acc)

    store_tile(acc, alpha_ptr, out_ptr, offs_m, offs_n, tl.program_id(1), M, N, BATCHES, SPLIT_K, WIDE, OUT_T)


# ---------------------------------------------------------------------------------------------------------
# Launcher.


def _scale_cols(kind: str, k: int) -> int:
    """Columns of the scales array: one per block along K, or the dense kinds' (rows, 1) dummy."""
    return k // SCALE_BLOCK[kind] if kind in SCALE_BLOCK else 1


def kernel_constexprs(p: GemmProblem) -> dict:
    """The kind-dependent constexprs of `upcast_kernel` (beyond the shared GEMM ones)."""
    return dict(
        A_KIND=p.a_kind, B_KIND=p.b_kind,
        A_EPB=ELEMENTS_PER_BYTE.get(p.a_kind, 1), B_EPB=ELEMENTS_PER_BYTE.get(p.b_kind, 1),
        A_SCALE_COLS=_scale_cols(p.a_kind, p.k), B_SCALE_COLS=_scale_cols(p.b_kind, p.k),
        DOT_FP16=p.a_kind == "fp16" and p.b_kind == "fp16",
    )


def check_config(p: GemmProblem, config: TileConfig) -> None:
    groups = {SCALE_BLOCK[kind] for kind in (p.a_kind, p.b_kind) if kind in SCALE_BLOCK}
    for group in groups:
        if config.block_k % group or p.k % group:
            raise ValueError(f"block_k ({config.block_k}) and K ({p.k}) must be multiples of the scale block {group}")
    if config.block_k < 16 or config.block_k & (config.block_k - 1):
        raise ValueError(f"block_k must be a power of two >= 16 (bf16 MMA K step), got {config.block_k}")
    if config.split_k < 1:
        raise ValueError(f"split_k must be >= 1, got {config.split_k}")


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """Heuristic tiles for shapes the per-device tables (configs.py) do not hold.

    Hopper decode (<= 64 activation rows, unbatched weight): operands swapped so the decoded weight fills
    wgmma's 64-row M side (see block_fp8.run_gemm), split-K to about two programs per SM. Large problems
    whose operands are both predecoded run the TMA bf16 kernel with 128 x 256 tiles. Otherwise
    wgmma-sized tiles; BLOCK_K 64 keeps the decoded fp32 tiles within the register budget, and two
    warpgroups share a 128-row tile."""
    rows = p.m if p.b_batched else p.batch * p.m
    if target == "sm_90" and rows <= 64 and not p.b_batched:
        return swapped_decode_config(p.n, rows, p.k)
    if rows <= 16:
        base = TileConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=4)
    elif rows <= 64:
        base = TileConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=4)
    else:
        base = TileConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    config = with_split_k(p, base)
    tma = TileConfig(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=4, tma=True)
    if target == "sm_90" and tma_ready(p, tma):
        return tma
    return config


def tma_ready(p: GemmProblem, config: TileConfig) -> bool:
    """Whether `config` can run the TMA kernel: both kernel operands bf16 (dense, or predecoded) and K in
    whole tiles (the primitive pads K to 256; a direct launch may not)."""
    predecode_a, predecode_b = predecoded_sides(p, config)
    return ((p.a_kind == "bf16" or predecode_a) and (p.b_kind == "bf16" or predecode_b)
            and p.k % config.block_k == 0)


def predecoded_sides(p: GemmProblem, config: TileConfig) -> tuple[bool, bool]:
    """Which operands to dequantize to bf16 in XLA before the kernel, rather than in its registers.

    In-register decoding is ALU work repeated by every program that reads a tile: each B tile once per row
    tile, each A tile once per column tile. One XLA pass that writes the operand as bf16 (memory-bound, about
    4 extra bytes per element) costs less once a tile is read _PREDECODE_REUSE times or more; operands of
    fewer than _PREDECODE_MIN_ROWS rows (decode activations) stay fused, as the extra launch would dominate.
    """
    rows = p.m if p.b_batched else p.batch * p.m
    a_block, b_block = (config.block_n, config.block_m) if config.swap_ab else (config.block_m, config.block_n)
    a_reuse = triton.cdiv(p.n, b_block)
    b_reuse = triton.cdiv(rows, a_block)
    predecode_a = p.a_kind not in DENSE_KINDS and a_reuse >= _PREDECODE_REUSE and rows >= _PREDECODE_MIN_ROWS
    predecode_b = p.b_kind not in DENSE_KINDS and b_reuse >= _PREDECODE_REUSE and p.n >= _PREDECODE_MIN_ROWS
    return predecode_a, predecode_b


def _dequantize_bf16(kind: str, values: jax.Array, scales: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """(bf16 values, dummy scales): exact (module docstring). nvfp4's tensor scale stays in alpha."""
    fmt = get_format(_FORMAT_NAMES[kind])
    tensor_scale = jnp.float32(1.0) if kind == NVFP4 else None
    q = BlockScaledArray(values, scales, fmt, axis=-1, length=k, tensor_scale=tensor_scale)
    with jax.named_scope(DEQUANTIZE_SCOPE):
        dense = dequantize(q, jnp.bfloat16)
    return dense, jnp.zeros(dense.shape[:-1] + (1,), jnp.bfloat16)


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int) -> jax.Array:
    """Upcasting GEMM (see module docstring); returns (p.batch, p.m, p.n) of p.out_dtype."""
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the upcast kernel does not take {p.a_kind} x {p.b_kind}")
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    predecode_a, predecode_b = predecoded_sides(p, config)
    if predecode_a:
        a_values, a_scales = _dequantize_bf16(p.a_kind, a_values, a_scales, p.k)
    if predecode_b:
        b_values, b_scales = _dequantize_bf16(p.b_kind, b_values, b_scales, p.k)
    kernel_problem = dataclasses.replace(p, a_kind="bf16" if predecode_a else p.a_kind,
                                         b_kind="bf16" if predecode_b else p.b_kind)
    name = f"upcast_gemm_{kernel_problem.a_kind}_{kernel_problem.b_kind}"
    if config.tma:
        if {kernel_problem.a_kind, kernel_problem.b_kind} != {"bf16"}:
            raise ValueError("the TMA kernel multiplies bf16 operands: both sides must be predecoded "
                             f"(got {kernel_problem.a_kind} x {kernel_problem.b_kind} for this config)")
        from . import hopper_tma

        return hopper_tma.launch_gemm(kernel_problem, a_values, a_scales, b_values, b_scales, alpha,
                                      config=config, compute_capability=compute_capability, scaled=False,
                                      name=name + "_tma")
    # Swapped launches (decode) pass the weight as the kernel's `a`: its constexprs describe that order.
    roles = dataclasses.replace(kernel_problem, a_kind=kernel_problem.b_kind, b_kind=kernel_problem.a_kind) \
        if config.swap_ab else kernel_problem
    return run_gemm(upcast_kernel, kernel_problem, a_values, a_scales, b_values, b_scales, alpha, config=config,
                    compute_capability=compute_capability, name=name + ("_swapped" if config.swap_ab else ""),
                    **kernel_constexprs(roles))
