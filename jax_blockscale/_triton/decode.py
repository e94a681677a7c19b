"""Decode GEMM: few activation rows (M <= 64) times one unbatched weight, one kernel per matmul.

At decode a matmul streams its weight once and does little arithmetic per byte, so the kernel is built
around the weight read:

- Grid: (N tiles of BLOCK_N weight rows, SPLIT_K). Every program reads a contiguous (BLOCK_N, K/SPLIT_K)
  strip of the weight in (BLOCK_N, BLOCK_K) tiles whose rows are whole 16-byte vectors (fp4: BLOCK_K = 256
  codes = 128 bytes per row), pipelined `num_stages` deep, and all M activation rows (tiny, L2-resident).
- The weight is decoded in registers. fp4 on NVIDIA: one inline-PTX sequence per 4 packed bytes (below),
  three integer operations and two packed bf16 multiplies per pair of elements; the fp32 decode of `upcast.py`
  elsewhere (gfx950, fp6, fp8, and `config.asm_decode=False`).
- Two compute variants (`config.fma`): (a) the swapped MMA — the weight tile is the dot's M side (64 rows
  fill one wgmma), the activations padded to BLOCK_M >= 16 rows its N side; (b) CUDA-core FMAs — a
  broadcast multiply and a sum over K, no padding of M, for M of a few rows. Which is faster at which M is
  to be measured (`benchmarks/decode.py --variants`); the heuristic default uses FMAs for M <= 4.
- The streaming GEMV (`config.gemv`, the default for <= 4 rows): the first two variants, measured on an
  H100 (N=7168, K=4096), read mxfp4 weights at 337 GB/s (46 us, 11% of HBM): 224 programs of 4 KB tiles
  (1.7 per SM, the FMA variant's loads not pipelined) keep about 7 KB in flight per SM where ~25 KB are
  needed (latency x bandwidth / 132); the MMA variant's 112 programs leave 20 SMs idle and convert every
  decoded tile's layout through shared memory for the dot. The GEMV runs 16-row x 256-byte tiles (two
  16-byte vectors per thread), about four programs per SM (split-K only when N is short of that),
  `tl.range` pipelining (cp.async) plus an optional register prefetch; its tensors keep the load's layout
  (a thread holds whole scale groups), the codes decode unscaled, and each group's fp32 dot product is
  multiplied by the group's scale once (two fp32 FMA chains per group, no separate adds). The fp4 codes
  decode to fp32 through e4m3 bytes and the hardware's e4m3 -> fp16 conversion (`config.f16_decode`,
  `_fp4_f32_ptx`) where the bf16 decode and its integer widening left the kernel bound by sm_90's
  half-rate integer pipe (benchmarks/sass_count.py).
  FMAs make it compute-bound beyond a few rows (16 rows x 29M weights = 16 us of fp32 FMA on an H100), so
  more rows take the MMA variant.
- Split-K is reduced inside the same kernel. Default (bitwise deterministic): each split writes its fp32
  partial tile to a workspace, then bumps a per-tile counter with an acq_rel atomic; the program that sees
  SPLIT_K - 1 sums the partials in split order 0..SPLIT_K-1, applies alpha, casts and stores. Which
  program finishes last varies, the summation order does not. `config.atomic_split_k`: fp32 atomics into
  a zeroed accumulator instead (no workspace read-back, run-to-run results may differ in the last bits).
- Counters (and the atomic accumulator) must start at zero. They are outputs of the custom call listed in
  jax-triton's `zeroed_outputs`: the jaxlib Triton custom call itself issues a cudaMemsetAsync on them
  before the launch. In a profile that is one Memset activity of 4 bytes per N tile next to the kernel;
  there is no XLA kernel. A counter that resets itself at the end of a call would need a buffer that
  persists across calls, which XLA's functional buffers do not give. With SPLIT_K = 1 there is neither
  memset nor workspace.
- Tensor scales (nvfp4) arrive as two scalar pointers multiplied in the kernel, so no XLA multiply runs;
  dense activations get no scale operand at all (the primitive's dummy scales are dead code then).

Exactness as in `upcast.py`: every decoded element times its power-of-two (or e4m3) scale is exact in
bf16. block_fp8 weights: the e4m3 codes are exact in bf16, and each 128-wide K tile's fp32 product is
multiplied by the weight tile's fp32 scale and (block_fp8 activations) the activation group's
(DeepSeek's promotion interval), with a bf16 (not fp8) MMA, so nothing is truncated within a block.

CPU coverage: tests/test_decode_interpret.py runs this kernel in Triton's interpreter for every weight
format and variant, the PTX fp4 decode through an emulator (tests/_ptx_emulator.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
import triton.language as tl

from . import jt
from .gemv_tiles import BLOCK_FP8_GEMV_TILES, FP4_GEMV_TILES, FP8_GEMV_TILES, tile_fields
from .problem import (BLOCK_FP8, DECODE_MAX_ROWS, DENSE_KINDS, MX_KINDS, NVFP4, OUT_DTYPES, SCALE_BLOCK, GemmProblem,
                      TileConfig, check_operands)
from .tiling import k_tile_range
from .upcast import load_operand, load_scales, minifloat_to_f32, scales_to_f32

# Weight kinds x the activation kinds that pair with them (fp16 activations take the reference, as in
# upcast: the bf16 MMA would round them).
WEIGHT_KINDS = MX_KINDS + (NVFP4, BLOCK_FP8)
SUPPORTED: frozenset[tuple[str, str]] = frozenset(
    {("bf16", w) for w in WEIGHT_KINDS}
    | {(a, w) for a in MX_KINDS for w in MX_KINDS}
    | {(NVFP4, NVFP4), (BLOCK_FP8, BLOCK_FP8)}
)
_FMA_MAX_ROWS = 4  # heuristic, to be measured: below it the padded MMA wastes >= 75% of its N side
_GEMV_MAX_BLOCK_M = 16  # the GEMV's FMAs per weight element grow with the rows; tensor cores beyond
_TYPICAL_SM_COUNT = 132
_INT32_LIMIT = 2**31

# bf16x2 constants of the fp4 decode: 2**126 (exponent field 253) and -0.0 (the fma's exact addend).
_BF16X2_2_126 = "0x7E807E80"
_BF16X2_NEG0 = "0x80008000"


def _fp4_pair_ptx(scaled: bool = True, folded: bool = False) -> str:
    """PTX for `tl.inline_asm_elementwise(pack=4)`: 4 packed e2m1 bytes in $4 and their 4 bf16 scales in
    $5 (bytes 0, 1) and $6 (bytes 2, 3) -> the 4 low-nibble elements as bf16 in $0,$1 and the 4 high-nibble
    elements in $2,$3.

    The 4 elements of a pack are whatever 4 consecutive registers the layout gives one thread, which need
    not be 4 bytes of one scale group: for the FMA variant Triton lays the (rows, groups, bytes) tile out
    with 4 groups per thread along the group axis (nvfp4, sizePerThread [1, 4, 1]), so each pair of
    elements takes its own scale pair. (Applying $5 to all four gave wrong nvfp4 results on an H100.)

    prmt reorders the bytes to [b0, b2, b1, b3] so that two bytes sit 16 bits apart: nibble position p of
    each half-word holds lo(b0), lo(b1) (p = 0), hi(b0), hi(b1) (1), lo(b2), lo(b3) (2), hi(b2), hi(b3) (3).
    The word shifted left by 12 - 4p brings position p to bits 12..15 of each half-word, where the code's
    sign already is bf16's sign bit; its exponent and mantissa bits (e1 e0 m), masked and shifted right by
    6, land in bf16 bits 8..6 (one shift per position, then and/shr/and-or per pair: ptxas makes each pair
    3 integer ops where shifting and masking sign and magnitude separately took 5). A normal code then
    reads 2**(e - 127) * 1.m and the subnormal one (e = 0) the bf16 subnormal 2**-126 * 0.m, so one exact
    multiply by 2**126 gives e2m1's value (bias 1) for all of them, and a second the scale. bf16 fma keeps
    subnormals (no .ftz form exists).

    scaled=False (the GEMV variant, which scales each group's dot product instead): $4 only, no scale
    multiply; the outputs are e2m1's exact values.

    folded=True (decode_wgmma): one multiply per pair, by $5 / $6 already holding 2**126 times the scale
    (the caller's job to keep that in bf16's range), instead of the two.
    """
    def pair(dst: str, shift: int, scale: str) -> str:
        src = "q" if shift == 0 else "t"
        return (("" if shift == 0 else f"shl.b32 t, q, {shift};\n")
                + f"and.b32 a, {src}, 0x70007000;\n shr.b32 a, a, 6;\n"
                f"and.b32 b, {src}, 0x80008000;\n or.b32 a, a, b;\n"
                + (f"fma.rn.bf16x2 {dst}, a, {scale}, z;\n" if folded
                   else f"fma.rn.bf16x2 a, a, k, z;\nfma.rn.bf16x2 {dst}, a, {scale}, z;\n" if scaled
                   else f"fma.rn.bf16x2 {dst}, a, k, z;\n"))
    # bf16x2 fma takes no immediates: the constants go through registers.
    return ("{\n.reg .b32 q, t, a, b, k, z;\n"
            f"mov.b32 k, {_BF16X2_2_126};\n mov.b32 z, {_BF16X2_NEG0};\n"
            "prmt.b32 q, $4, 0, 0x3120;\n"
            + pair("$3", 0, "$6") + pair("$1", 4, "$6") + pair("$2", 8, "$5") + pair("$0", 12, "$5") + "}")


def _fp4_f32_ptx() -> str:
    """PTX for `tl.inline_asm_elementwise(pack=4)`: 4 packed e2m1 bytes in $8 -> their 4 low-nibble
    elements as fp32 in $0..$3 and their 4 high-nibble elements in $4..$7, each 2**-6 times e2m1's value
    (the GEMV multiplies each group's dot product by 2**6, `_FP4_F32_UNSCALE`).

    Why: the bf16 decode (`_fp4_pair_ptx`) and Triton's bf16 -> fp32 widening cost ~5 integer
    instructions per element, and sm_90 runs 32-bit integer/logic ops at half the rate of fp32 ones, which
    made the GEMV integer-bound. Here the integer work is 7 operations per 8 elements and the rest runs on
    the conversion and fp pipes: each nibble (s e1 e0 m) becomes an e4m3 byte s 0 0 e1 e0 m 0 0 in place
    (the low nibbles of the 4 bytes in one word, the high ones in another), which e4m3 reads as
    2**(e - 7) * 1.m or, for e = 0, its subnormal 2**-6 * 0.m: both 2**-6 times the e2m1 value, so the
    hardware's exact cvt.rn.f16x2.e4m3x2 (sm_89+) turns two of them into fp16 and cvt.f32.f16 widens each
    (exact: every value is a normal fp16 and fp32). Placing the bits for fp16 directly took ~2.2 integer
    operations per element (H100, 2026-11-24: GEMVs 1-13% slower on the same tiles)."""
    cvt = []
    for word, outs in (("l", ("$0", "$1", "$2", "$3")), ("h", ("$4", "$5", "$6", "$7"))):
        # bytes 0, 1 -> the low and high half of one f16x2; bytes 2, 3 -> another
        cvt.append(f"mov.b32 {{p0, p1}}, {word};\n"
                   "cvt.rn.f16x2.e4m3x2 a, p0;\ncvt.rn.f16x2.e4m3x2 b, p1;\n"
                   f"mov.b32 {{q0, q1}}, a;\ncvt.f32.f16 {outs[0]}, q0;\ncvt.f32.f16 {outs[1]}, q1;\n"
                   f"mov.b32 {{q0, q1}}, b;\ncvt.f32.f16 {outs[2]}, q0;\ncvt.f32.f16 {outs[3]}, q1;")
    return ("{\n.reg .b32 t, u, l, h, a, b;\n.reg .b16 p0, p1, q0, q1;\n" + _fp4_e4m3_bytes_ptx("$8")
            + "\n".join(cvt) + "\n}")


def _fp4_e4m3_bytes_ptx(src: str) -> str:
    """PTX (7 integer operations, scratch registers t, u) turning the 8 e2m1 codes of the 32-bit word `src`
    into e4m3 bytes `s 0 0 e1 e0 m 0 0`: the 4 low nibbles in l, the 4 high ones in h, byte for byte
    (`_fp4_f32_ptx`; also benchmarks/decode_mma_f16.py's fp16 decode)."""
    return (# low nibbles: the sign (bit 3) to bit 7, e1 e0 m (bits 0..2) to bits 2..4
            f"shl.b32 t, {src}, 4;\nand.b32 t, t, 0x80808080;\n"
            f"shl.b32 u, {src}, 2;\nand.b32 u, u, 0x1C1C1C1C;\nor.b32 l, t, u;\n"
            # high nibbles: the sign stays at bit 7, e1 e0 m (bits 4..6) to bits 2..4
            f"shr.b32 u, {src}, 2;\nand.b32 u, u, 0x1C1C1C1C;\n"
            f"and.b32 t, {src}, 0x80808080;\nor.b32 h, t, u;\n")


_FP4_PTX = tl.constexpr(_fp4_pair_ptx())
_FP4_F32_PTX = tl.constexpr(_fp4_f32_ptx())
_FP4_F32_UNSCALE = tl.constexpr(64.0)  # 2**6: what _fp4_f32_ptx's elements lack
_FP4_PTX_UNSCALED = tl.constexpr(_fp4_pair_ptx(scaled=False))
_FP4_FOLDED_PTX = tl.constexpr(_fp4_pair_ptx(folded=True))


@triton.jit
def e8m0_to_bf16(code):
    """2**(code - 127) as bf16 bits (bf16 has fp32's exponent): 0 -> the subnormal 2**-127, 0xFF -> NaN."""
    c = code.to(tl.uint16)
    bits = tl.where(c == 0, 0x0040, tl.where(c == 0xFF, 0x7FC0, c << 7)).to(tl.uint16)
    return bits.to(tl.bfloat16, bitcast=True)


@triton.jit
def load_fp4_weight_asm(w_ptr, s_ptr, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr):
    """A (rows, BLOCK_K) fp4 weight tile decoded by inline PTX, scales applied, as bf16. Loaded as
    (rows, groups, bytes per group), so each row's group is one contiguous 16-byte (mxfp4) or 8-byte
    (nvfp4) vector and its scale broadcasts along the last axis."""
    R: tl.constexpr = rows.shape[0]
    GROUP: tl.constexpr = 16 if KIND == "nvfp4" else 32
    G: tl.constexpr = BLOCK_K // GROUP
    BPG: tl.constexpr = GROUP // 2
    offs_g = k0 // GROUP + tl.arange(0, G)
    offs_b = tl.arange(0, BPG)
    ptrs = (w_ptr + rows[:, None, None] * (K // 2) + offs_g[None, :, None] * BPG + offs_b[None, None, :])
    packed = tl.load(ptrs)
    raw_s = tl.load(s_ptr + rows[:, None, None] * (K // GROUP) + offs_g[None, :, None])
    if KIND == "nvfp4":
        s = raw_s.to(tl.bfloat16)
    else:
        s = e8m0_to_bf16(raw_s)
    s = tl.broadcast_to(s, (R, G, BPG))
    lo, hi = tl.inline_asm_elementwise(
        _FP4_PTX, "=r,=r,=r,=r,r,r,r", [packed, s], dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
    return tl.reshape(tl.join(lo, hi), (R, BLOCK_K))


@triton.jit
def load_weight(w_ptr, s_ptr, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr,
                ASM: tl.constexpr):
    """The (rows, BLOCK_K) weight tile at k0 as bf16: scaled except block_fp8 (scaled after the dot)."""
    if KIND == "block_fp8":
        offs_k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + rows[:, None] * K + offs_k[None, :]).to(tl.bfloat16)
    elif ASM and (KIND == "e2m1" or KIND == "nvfp4"):
        w = load_fp4_weight_asm(w_ptr, s_ptr, rows, k0, K, KIND, BLOCK_K)
    else:
        s = load_scales(s_ptr, rows, k0, K, KIND, BLOCK_K, True)
        w = load_operand(w_ptr, s, rows, k0, K, KIND, BLOCK_K, True, False)
    return w


@triton.jit
def load_activations(x_ptr, s_ptr, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr):
    """The (rows, BLOCK_K) activation tile at k0 as bf16 (block_fp8: unscaled codes)."""
    if KIND == "block_fp8" or KIND == "bf16":
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * K + offs_k[None, :]).to(tl.bfloat16)
    else:
        s = load_scales(s_ptr, rows, k0, K, KIND, BLOCK_K, True)
        x = load_operand(x_ptr, s, rows, k0, K, KIND, BLOCK_K, True, False)
    return x


@triton.jit
def store_or_reduce(acc, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, offs_n, offs_m, pid_n, pid_k,
                    M: tl.constexpr, N: tl.constexpr, SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr):
    """Stores the (BLOCK_N, BLOCK_M) fp32 tile `acc` (one K split's partial) transposed into out (M, N), after
    the split-K reduction of the module docstring (ordered workspace, or fp32 atomics when ATOMIC)."""
    BLOCK_N: tl.constexpr = acc.shape[0]
    BLOCK_M: tl.constexpr = acc.shape[1]
    alpha = tl.load(a_ts_ptr) * tl.load(b_ts_ptr)
    out_ptrs = out_ptr + offs_m[None, :] * N + offs_n[:, None]
    mask = (offs_n[:, None] < N) & (offs_m[None, :] < M)
    if SPLIT_K == 1:
        tl.store(out_ptrs, (acc * alpha).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if ATOMIC:
            ws_tile = ws_ptr + offs_m[None, :] * N + offs_n[:, None]
            tl.atomic_add(ws_tile, acc, mask=mask, sem="relaxed", scope="gpu")
        else:
            ws_tile = ws_ptr + pid_k * (M * N) + offs_m[None, :] * N + offs_n[:, None]
            tl.store(ws_tile, acc, mask=mask)
        # Every thread's partial is written before one thread's release of the counter (bar.sync, then
        # a gpu-scope acq_rel atomic, cumulative under PTX's memory model); the last program's acquire
        # orders its reads after all of them.
        tl.debug_barrier()
        arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            if ATOMIC:
                total = tl.load(ws_tile, mask=mask, other=0.0, cache_modifier=".cg")
            else:
                total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):  # fixed order: bitwise the same on every run
                    total += tl.load(ws_ptr + s * (M * N) + offs_m[None, :] * N + offs_n[:, None], mask=mask,
                                     other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, (total * alpha).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def decode_kernel(
    w_ptr, w_scale_ptr, x_ptr, x_scale_ptr, a_ts_ptr, b_ts_ptr,  # inputs
    out_ptr, ws_ptr, count_ptr,  # outputs (jax-triton appends them after the inputs)
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, W_KIND: tl.constexpr, X_KIND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, FMA: tl.constexpr, ATOMIC: tl.constexpr, ASM: tl.constexpr, WIDE: tl.constexpr,
):
    """out (M, N) = ts_a * ts_b * decode(x) (M, K) @ decode(w).T, w (N, K / epb) the weight.

    ws: the split-K workspace, (SPLIT_K, M, N) fp32 partials (deterministic) or a zeroed (M, N) fp32
    accumulator (ATOMIC); count: cdiv(N, BLOCK_N) zeroed int32 counters. Both unused when SPLIT_K == 1.
    """
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    # Out-of-range rows read a valid row (unmasked loads vectorize); the store mask drops their results.
    rows_w = offs_n % N
    rows_x = offs_m % M
    if WIDE:
        rows_w = rows_w.to(tl.int64)

    K_TILES: tl.constexpr = K // BLOCK_K
    k_begin, k_end = k_tile_range(K_TILES, SPLIT_K, 1)  # split-K on grid axis 1

    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in range(k_begin, k_end):
        k0 = kt * BLOCK_K
        w = load_weight(w_ptr, w_scale_ptr, rows_w, k0, K, W_KIND, BLOCK_K, ASM)
        x = load_activations(x_ptr, x_scale_ptr, rows_x, k0, K, X_KIND, BLOCK_K)
        if FMA:
            part = tl.sum(w.to(tl.float32)[:, None, :] * x.to(tl.float32)[None, :, :], axis=2)
        else:
            part = tl.dot(w, tl.trans(x), out_dtype=tl.float32)
        if W_KIND == "block_fp8":
            # 128 x 128 weight tiles: one scale per weight row and 128-wide K tile (BLOCK_K == 128).
            w_s = tl.load(w_scale_ptr + (rows_w // 128) * (K // 128) + k0 // 128)
            if X_KIND == "block_fp8":
                x_s = tl.load(x_scale_ptr + rows_x * (K // 128) + k0 // 128)
                acc += part * w_s[:, None] * x_s[None, :]
            else:
                # Dense activations have no scales: x_scale_ptr is their values again (launch).
                acc += part * w_s[:, None]
        else:
            acc += part

    store_or_reduce(acc, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, offs_n, offs_m, pid_n, pid_k, M, N,
                    SPLIT_K, ATOMIC)


# ---------------------------------------------------------------------------------------------------------
# The streaming GEMV variant (`config.gemv`): few rows, CUDA-core FMAs, built for HBM bandwidth.


@triton.jit
def gemv_weight_tile(w_ptr, s_ptr, rows, k0, K: tl.constexpr, KIND: tl.constexpr, BLOCK_K: tl.constexpr):
    """The raw (rows, BLOCK_K) weight tile at k0, undecoded: codes (R, G, BPG) (G scale groups of BPG bytes)
    and the groups' raw scales (R, G). Each row's BLOCK_K / epb bytes are contiguous: 16-byte vector loads."""
    R: tl.constexpr = rows.shape[0]
    EPB: tl.constexpr = 2 if (KIND == "e2m1" or KIND == "nvfp4") else 1
    GROUP: tl.constexpr = 16 if KIND == "nvfp4" else (128 if KIND == "block_fp8" else 32)
    G: tl.constexpr = BLOCK_K // GROUP
    BYTES: tl.constexpr = BLOCK_K // EPB
    offs_b = k0 // EPB + tl.arange(0, BYTES)
    codes = tl.reshape(tl.load(w_ptr + rows[:, None] * (K // EPB) + offs_b[None, :]), (R, G, GROUP // EPB))
    offs_g = k0 // GROUP + tl.arange(0, G)
    if KIND == "block_fp8":
        s = tl.load(s_ptr + (rows // 128)[:, None] * (K // 128) + offs_g[None, :])  # 128 x 128 weight tiles
    else:
        s = tl.load(s_ptr + rows[:, None] * (K // GROUP) + offs_g[None, :])
    return codes, s


@triton.jit
def gemv_x_row(x_ptr, x_scale_ptr, m, k0, K: tl.constexpr, X_KIND: tl.constexpr, BLOCK_K: tl.constexpr):
    """Activation row m's BLOCK_K elements at k0 as fp32 (BLOCK_K,): quantized kinds decoded with their
    scales (exact in bf16, upcast.py), block_fp8 as unscaled codes."""
    x = load_activations(x_ptr, x_scale_ptr, m + tl.arange(0, 1), k0, K, X_KIND, BLOCK_K)
    return tl.reshape(x, (BLOCK_K,)).to(tl.float32)


@triton.jit
def gemv_tile(acc, codes, raw_s, x_ptr, x_scale_ptr, k0, M: tl.constexpr, K: tl.constexpr,
              W_KIND: tl.constexpr, X_KIND: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
              F16: tl.constexpr):
    """acc + this K tile's contribution. acc: (R, G) per-group partial sums when M == 1 (reduced over
    groups once, after the K loop), else (R, BLOCK_M) row sums.

    The weight codes decode to their exact unscaled values (a bit shuffle and one exact multiply by a
    power of two per element, upcast.minifloat_to_f32) once per tile; every activation row reuses them.
    Each group's fp32 dot product is multiplied by the group's scale once, not each element, so the
    per-element work is the decode and one FMA per row. All (R, G, BPG) tensors keep the load's layout
    (one thread holds whole 16-byte groups), so the sums over a group stay inside a thread."""
    G: tl.constexpr = codes.shape[1]
    BPG: tl.constexpr = codes.shape[2]
    FP4: tl.constexpr = W_KIND == "e2m1" or W_KIND == "nvfp4"
    if FP4 and ASM and F16:
        # to fp32 through e4m3 and fp16, 2**-6 times the values (_fp4_f32_ptx): undone on each group's sum
        w_lo, w_hi = tl.inline_asm_elementwise(_FP4_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [codes],
                                               dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
    elif FP4 and ASM:
        # two elements per bf16x2 instruction (_fp4_pair_ptx), then widened for the fp32 FMAs
        lo, hi = tl.inline_asm_elementwise(_FP4_PTX_UNSCALED, "=r,=r,=r,=r,r", [codes],
                                           dtype=(tl.bfloat16, tl.bfloat16), is_pure=True, pack=4)
        w_lo = lo.to(tl.float32)
        w_hi = hi.to(tl.float32)
    elif FP4:
        w_lo = minifloat_to_f32(codes, 2, 1, 0)  # element 2i: byte i's low nibble
        w_hi = minifloat_to_f32(codes, 2, 1, 4)
    elif W_KIND == "e2m3":
        w_lo = minifloat_to_f32(codes, 2, 3, 0)
        w_hi = w_lo
    elif W_KIND == "e3m2":
        w_lo = minifloat_to_f32(codes, 3, 2, 0)
        w_hi = w_lo
    else:  # e4m3 / e5m2 / block_fp8 codes arrive as float8 tensors
        w_lo = codes.to(tl.float32)
        w_hi = w_lo
    if W_KIND == "block_fp8":
        s = raw_s  # fp32 already
    else:
        s = scales_to_f32(raw_s, W_KIND)
    offs_g = k0 // (BLOCK_K // G) + tl.arange(0, G)
    for m in tl.static_range(M):
        x = gemv_x_row(x_ptr, x_scale_ptr, m, k0, K, X_KIND, BLOCK_K)
        if FP4:
            x_lo, x_hi = tl.split(tl.reshape(x, (G, BPG, 2)))
            part = tl.sum(w_lo * x_lo[None, :, :], axis=2) + tl.sum(w_hi * x_hi[None, :, :], axis=2)
        else:
            part = tl.sum(w_lo * tl.reshape(x, (G, BPG))[None, :, :], axis=2)
        if FP4 and ASM and F16:
            part = part * _FP4_F32_UNSCALE  # exact (a power of two), before the scale: no overflow of s * 2**6
        group_s = s
        if X_KIND == "block_fp8":
            # the activation group's fp32 scale (1 x 128 blocks), applied as the weight's
            group_s = s * tl.load(x_scale_ptr + m * (K // 128) + offs_g)[None, :]
        if M == 1:
            acc += part * group_s
        else:
            row = tl.sum(part * group_s, axis=1)
            acc += tl.where(tl.arange(0, acc.shape[1])[None, :] == m, row[:, None], 0.0)
    return acc


@triton.jit
def gemv_kernel(
    w_ptr, w_scale_ptr, x_ptr, x_scale_ptr, a_ts_ptr, b_ts_ptr,  # inputs
    out_ptr, ws_ptr, count_ptr,  # outputs (jax-triton appends them after the inputs)
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, W_KIND: tl.constexpr, X_KIND: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr, ATOMIC: tl.constexpr, WIDE: tl.constexpr, PREFETCH: tl.constexpr,
    NUM_STAGES: tl.constexpr, ASM: tl.constexpr, F16: tl.constexpr = False,
):
    """As decode_kernel (same operands, outputs and split-K reduction), computed by CUDA-core FMAs over
    small weight tiles: the launcher sizes the grid to several programs per SM so that many 16-byte loads
    are in flight on every SM (the decode kernel's 1-2 programs per SM left HBM idle).

    PREFETCH: the next K tile's raw codes and scales are loaded into registers before the current tile is
    decoded (a register double buffer, independent of the software pipeliner); NUM_STAGES goes to
    `tl.range` for Triton's own pipelining of the loads."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    rows_w = offs_n % N  # out-of-range rows read a valid row; the store mask drops them
    if WIDE:
        rows_w = rows_w.to(tl.int64)

    GROUP: tl.constexpr = 16 if W_KIND == "nvfp4" else (128 if W_KIND == "block_fp8" else 32)
    K_TILES: tl.constexpr = K // BLOCK_K
    k_begin, k_end = k_tile_range(K_TILES, SPLIT_K, 1)  # split-K on grid axis 1

    if M == 1:
        acc = tl.zeros((BLOCK_N, BLOCK_K // GROUP), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    if PREFETCH:
        codes, raw_s = gemv_weight_tile(w_ptr, w_scale_ptr, rows_w, k_begin * BLOCK_K, K, W_KIND, BLOCK_K)
        for kt in tl.range(k_begin, k_end, num_stages=NUM_STAGES):
            # The last program re-reads its last tile (an L2 hit) instead of branching on the load.
            k_next = tl.minimum(kt + 1, k_end - 1) * BLOCK_K
            next_codes, next_s = gemv_weight_tile(w_ptr, w_scale_ptr, rows_w, k_next, K, W_KIND, BLOCK_K)
            acc = gemv_tile(acc, codes, raw_s, x_ptr, x_scale_ptr, kt * BLOCK_K, M, K, W_KIND, X_KIND, BLOCK_K,
                            ASM, F16)
            codes, raw_s = next_codes, next_s
    else:
        for kt in tl.range(k_begin, k_end, num_stages=NUM_STAGES):
            codes, raw_s = gemv_weight_tile(w_ptr, w_scale_ptr, rows_w, kt * BLOCK_K, K, W_KIND, BLOCK_K)
            acc = gemv_tile(acc, codes, raw_s, x_ptr, x_scale_ptr, kt * BLOCK_K, M, K, W_KIND, X_KIND, BLOCK_K,
                            ASM, F16)
    if M == 1:
        total = tl.sum(acc, axis=1)[:, None]
    else:
        total = acc
    store_or_reduce(total, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, offs_n, offs_m,
                    pid_n, pid_k, M, N, SPLIT_K, ATOMIC)


# ---------------------------------------------------------------------------------------------------------
# Launcher.


def supports(p: GemmProblem) -> bool:
    return (p.a_kind, p.b_kind) in SUPPORTED and not p.b_batched and p.batch * p.m <= DECODE_MAX_ROWS


def _block_k(kind: str) -> int:
    # 128 bytes per weight row and tile: 256 fp4 codes, 128 one-byte codes. block_fp8 needs 128 anyway
    # (one weight scale per tile row).
    return 256 if kind in ("e2m1", NVFP4) else 128


def split_k_for(n_tiles: int, k_tiles: int, *, sms: int = _TYPICAL_SM_COUNT, min_tiles_per_split: int = 4) -> int:
    """Splits until about two programs per SM exist, keeping >= min_tiles_per_split K tiles per split."""
    split = 1
    while n_tiles * split * 2 <= 2 * sms and k_tiles // (split * 2) >= min_tiles_per_split:
        split *= 2
    return split


def _gemv_block_k(p: GemmProblem, row_bytes: int = 256) -> int:
    """`row_bytes` bytes of each weight row per K tile (fp4: 2 * row_bytes codes), or the largest power of
    two below that which divides K (the primitive pads K to a multiple of 256)."""
    block_k = row_bytes * (2 if p.b_kind in ("e2m1", NVFP4) else 1)
    while p.k % block_k:
        block_k //= 2
    return max(block_k, 128 if p.b_kind == BLOCK_FP8 else SCALE_BLOCK.get(p.b_kind, 32))


def gemv_config(p: GemmProblem, *, sms: int = _TYPICAL_SM_COUNT, block_n: int = 16, row_bytes: int = 256,
                num_warps: int = 4, num_stages: int = 2, programs_per_sm: int = 4, asm: bool = True) -> TileConfig:
    """The streaming GEMV's tiles: (block_n, row_bytes) weight bytes per K tile (4 KB: two 16-byte loads
    per thread at 4 warps), split-K only until about `programs_per_sm` programs per SM exist (each
    split adds a counter memset and a workspace round trip), keeping >= 2 K tiles per split."""
    rows = p.batch * p.m
    block_k = _gemv_block_k(p, row_bytes)
    n_tiles, k_tiles = triton.cdiv(p.n, block_n), p.k // block_k
    split = 1
    while n_tiles * split < programs_per_sm * sms and k_tiles // (split * 2) >= 2:
        split *= 2
    return TileConfig(block_m=max(1, triton.next_power_of_2(rows)), block_n=block_n, block_k=block_k, group_m=1,
                      num_warps=num_warps, num_stages=num_stages, split_k=split, gemv=True, prefetch=True,
                      asm_decode=asm)


# The best configurations of `benchmarks/decode.py --variants` on an H100 (2026-11-22, N=7168, K=4096,
# CUPTI kernel time), per weight kind: (GEMV for <= 4 rows, swapped MMA above). M=1: mxfp4 11.3 us, nvfp4
# 11.4, mxfp8 13.8 (24.5 us XLA bf16); M=16: mxfp4 20.3, nvfp4 17.0, mxfp8 18.5 (24.6); mxfp8 M=64 22.9.
# The fp4 GEMVs take the fp16-route decode (f16_decode): same loads, 30% fewer instructions per weight
# element in the K loop (benchmarks/sass_count.py: e2m1 M=1 7.2 -> 5.0, integer-pipe ops 3.3 -> 2.2);
# measured (--gemv-decode, same run): mxfp4 M=1 11.33 -> 9.43 us, nvfp4 11.96 -> 10.21. mxfp8's MMA tile
# for 5-16 rows: 64 weight rows on 2 warps, split-K 4 (--mma16: M=16 16.76 us against 18.61 for the
# earlier 128-row, 4-warp, split-2 tile; M=8 16.25 vs 18.14).
_SM90_TUNED = {
    "e2m1": (dict(block_n=8, block_k=2048, split_k=1, num_warps=4, num_stages=4, prefetch=False, f16_decode=True),
             dict(block_n=32, block_k=512, split_k=1, num_warps=2, num_stages=3, prefetch=True)),
    NVFP4: (dict(block_n=8, block_k=2048, split_k=1, num_warps=4, num_stages=2, prefetch=False, f16_decode=True),
            dict(block_n=32, block_k=256, split_k=2, num_warps=2, num_stages=4, prefetch=True, asm_decode=False)),
    "e4m3": (dict(block_n=32, block_k=256, split_k=4, num_warps=4, num_stages=1, prefetch=False),
             dict(block_n=64, block_k=128, split_k=4, num_warps=2, num_stages=3, prefetch=True)),
}
_SM90_TUNED["e5m2"] = _SM90_TUNED["e4m3"]
# The GEMV's measured tiles by rows and K, and their lookup: gemv_tiles.py (dispatch reads the same rule).


def _tuned(p: GemmProblem, rows: int, target: str) -> TileConfig | None:
    """The measured sm_90 configuration for this weight kind, where its tiles fit the problem."""
    if target != "sm_90" or p.b_kind not in _SM90_TUNED:
        return None
    gemv = rows <= _FMA_MAX_ROWS
    fields = dict(_SM90_TUNED[p.b_kind][0 if gemv else 1])
    if gemv:
        if p.b_kind in ("e2m1", NVFP4):
            fields.update(tile_fields(FP4_GEMV_TILES, rows, p.n, p.k, programs_per_sm=2))
        else:
            # where no tile applies, the table's default (K split 4 ways, for N too short to fill the SMs)
            tile = tile_fields(FP8_GEMV_TILES, rows, p.n, p.k)
            if tile:
                fields.update(tile, split_k=1)
        # K not a multiple of the tuned block_k (K = 7168 = 7 * 1024): the same tile bytes as more, shorter
        # rows. Without this, K = 7168 fell to the heuristic config at 44% of a same-size read (H100,
        # 2026-11-22, mxfp4 N=7168: 23.6 us against 10.4; `block_k` 1024 with 16 rows kept 69% at K = 4096).
        # At most down to 512 (256 bytes of fp4 per row): shorter tiles would need so many rows per program
        # that small N leaves SMs idle; those K take the heuristic below.
        while p.k % fields["block_k"] and fields["block_k"] > 512:
            fields["block_k"] //= 2
            fields["block_n"] *= 2
    block_m = max(1, triton.next_power_of_2(rows)) if gemv else max(16, triton.next_power_of_2(rows))
    config = TileConfig(block_m=block_m, group_m=1, gemv=gemv, **fields)
    try:
        check_config(p, config)
    except ValueError:
        return None
    return config


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """On sm_90 the measured configuration of the weight kind (`_SM90_TUNED`) where it fits; otherwise
    the heuristic: the streaming GEMV (CUDA-core FMAs, many small programs per SM) for <= 4 rows, else
    the swapped MMA with 64 weight rows (one wgmma M side) and the rows padded to >= 16, 128-byte weight
    rows per K tile, 4 stages, split-K to about two programs per SM, deterministic reduction, PTX fp4
    decode on NVIDIA targets."""
    rows = p.batch * p.m
    tuned = _tuned(p, rows, target)
    if tuned is not None:
        return tuned
    if target == "sm_90" and p.b_kind == BLOCK_FP8:
        fields = tile_fields(BLOCK_FP8_GEMV_TILES, rows, p.n, p.k)
        if fields:
            return TileConfig(block_m=1, group_m=1, split_k=1, gemv=True, prefetch=False, **fields)
    if rows <= _FMA_MAX_ROWS:
        return gemv_config(p, asm=target.startswith("sm_"))
    block_n = 64
    block_m = max(16, triton.next_power_of_2(rows))
    block_k = _block_k(p.b_kind)
    split = split_k_for(triton.cdiv(p.n, block_n), p.k // block_k)
    return TileConfig(block_m=block_m, block_n=block_n, block_k=block_k, group_m=1, num_warps=4,
                      num_stages=4, split_k=split, fma=False, asm_decode=target.startswith("sm_"))


def _check_gemv(p: GemmProblem, config: TileConfig) -> None:
    group = 128 if p.b_kind == BLOCK_FP8 else SCALE_BLOCK[p.b_kind]
    groups = {SCALE_BLOCK[k] for k in (p.a_kind, p.b_kind) if k in SCALE_BLOCK}
    if config.block_m > _GEMV_MAX_BLOCK_M:
        raise ValueError(f"the GEMV variant takes <= {_GEMV_MAX_BLOCK_M} rows (CUDA-core FMAs), block_m={config.block_m}")
    for name in ("block_m", "block_n", "block_k"):
        v = getattr(config, name)
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    if config.block_k % group or any(config.block_k % g for g in groups) or p.k % config.block_k:
        raise ValueError(f"block_k ({config.block_k}) must divide K ({p.k}) and be a multiple of every scale "
                         f"block {sorted(groups | {group})}")
    if p.b_kind == BLOCK_FP8 and 128 % config.block_n and config.block_n % 128:
        raise ValueError("block_fp8 weights need block_n dividing 128 (or a multiple of it)")
    if config.split_k < 1 or config.split_k > p.k // config.block_k:
        raise ValueError(f"split_k must be in [1, K / block_k = {p.k // config.block_k}], got {config.split_k}")


def check_config(p: GemmProblem, config: TileConfig) -> None:
    rows = p.batch * p.m
    if p.b_batched:
        raise ValueError("the decode kernel needs an unbatched weight")
    if rows > DECODE_MAX_ROWS or config.block_m < rows:
        raise ValueError(f"the decode kernel takes <= {DECODE_MAX_ROWS} rows in one tile: rows={rows}, "
                         f"block_m={config.block_m}")
    if config.gemv:
        _check_gemv(p, config)
        return
    if not config.fma and config.block_m < 16:
        raise ValueError("the MMA variant needs block_m >= 16 (the dot's smallest N side here)")
    if p.k % config.block_k:
        raise ValueError(f"K ({p.k}) must be a multiple of block_k ({config.block_k}); the primitive pads K to 256")
    groups = {SCALE_BLOCK[k] for k in (p.a_kind, p.b_kind) if k in SCALE_BLOCK}
    if any(config.block_k % g for g in groups):
        raise ValueError(f"block_k ({config.block_k}) must be a multiple of every scale block {sorted(groups)}")
    if p.b_kind == BLOCK_FP8 and (config.block_k != 128 or (128 % config.block_n and config.block_n % 128)):
        raise ValueError("block_fp8 weights need block_k == 128 and block_n dividing 128 (or a multiple of it)")
    if config.split_k < 1 or config.split_k > p.k // config.block_k:
        raise ValueError(f"split_k must be in [1, K / block_k = {p.k // config.block_k}], got {config.split_k}")


def kernel_constexprs(p: GemmProblem, config: TileConfig, *, asm: bool, wide: bool) -> tuple:
    """(kernel, constexprs) for `config`: gemv_kernel or decode_kernel (also used by
    benchmarks/sass_count.py to compile either alone)."""
    common = dict(M=p.batch * p.m, N=p.n, K=p.k, W_KIND=p.b_kind, X_KIND=p.a_kind, BLOCK_M=config.block_m,
                  BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                  ATOMIC=config.atomic_split_k, WIDE=wide, ASM=asm)
    if config.gemv:
        return gemv_kernel, dict(common, PREFETCH=config.prefetch, NUM_STAGES=config.num_stages,
                                 F16=bool(asm and config.f16_decode))
    return decode_kernel, dict(common, FMA=config.fma)


def tensor_scale_operands(alpha: jax.Array, a_ts, b_ts) -> tuple[jax.Array, jax.Array]:
    """The kernels' two (1,) float32 tensor-scale operands, multiplied in the kernel: `a_ts` / `b_ts` (the
    nvfp4 tensor scales, scalars) where given, else `alpha` (1,) and one."""
    if a_ts is None or b_ts is None:
        a_ts, b_ts = alpha.reshape(1).astype(jnp.float32), jnp.ones((1,), jnp.float32)
    return tuple(jnp.asarray(t, jnp.float32).reshape(1) for t in (a_ts, b_ts))


def split_k_workspace(rows: int, n: int, config: TileConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(workspace shape, zeroed output indices) of the in-kernel split-K reduction (module docstring), for
    outputs (out, workspace, counters): nothing to reduce without a split; a zeroed fp32 accumulator and
    zeroed counters for fp32 atomics; one fp32 partial per split and zeroed counters otherwise."""
    if config.split_k == 1:
        return (1,), ()
    if config.atomic_split_k:
        return (rows * n,), (1, 2)
    return (config.split_k * rows * n,), (2,)


# The primitive passes nvfp4 tensor scales separately (`a_ts`, `b_ts`), multiplied in the kernel.
TAKES_TENSOR_SCALES = True


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability, a_ts=None, b_ts=None) -> jax.Array:
    """Decode GEMM (module docstring); returns (p.batch, p.m, p.n) of p.out_dtype.

    `alpha` (1,) is used when `a_ts`/`b_ts` (the nvfp4 tensor scales, scalars) are not given; the primitive
    passes them separately so their product is taken in the kernel rather than by an XLA multiply.
    """
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the decode kernel does not take {p.a_kind} x {p.b_kind}")
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    rows = p.batch * p.m
    x_values = a_values.reshape(rows, a_values.shape[-1])
    # Dense activations have no scales: pass the values again as the (unread) pointer, so the primitive's
    # dummy scales are dead code and XLA builds none.
    x_scales = x_values if p.a_kind in DENSE_KINDS else a_scales.reshape(rows, a_scales.shape[-1])
    a_ts, b_ts = tensor_scale_operands(alpha, a_ts, b_ts)
    n_tiles = triton.cdiv(p.n, config.block_n)
    split = config.split_k
    ws_shape, zeroed = split_k_workspace(rows, p.n, config)
    wide = max(p.n * p.k, split * rows * p.n) >= _INT32_LIMIT
    asm = bool(config.asm_decode and compute_capability is not None and compute_capability >= 90)
    kernel, constexprs = kernel_constexprs(p, config, asm=asm, wide=wide)
    variant = "gemv" if config.gemv else "fma" if config.fma else "mma"
    name = f"decode_{p.a_kind}_{p.b_kind}_{variant}"
    out, _, _ = jt.jax_triton().triton_call(
        b_values, b_scales, x_values, x_scales, a_ts, b_ts,
        kernel=kernel,
        out_shape=(jax.ShapeDtypeStruct((rows, p.n), OUT_DTYPES[p.out_dtype]),
                   jax.ShapeDtypeStruct(ws_shape, jnp.float32),
                   jax.ShapeDtypeStruct((n_tiles if split > 1 else 1,), jnp.int32)),
        zeroed_outputs=zeroed,
        grid=(n_tiles, split),
        name=name, num_warps=config.num_warps, num_stages=config.num_stages,
        compute_capability=compute_capability, **constexprs,
    )
    return out.reshape(p.batch, p.m, p.n)
