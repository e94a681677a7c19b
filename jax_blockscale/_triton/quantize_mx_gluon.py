"""MX (every element type and rounding) and nvfp4 quantization, optionally with the transposed side, in one
pass, in Gluon (NVIDIA sm_90+): the mxfp8 / nvfp4 recipes' activations and gradients.

`quantize_kernels.quantize_kernel` computes the same bits, but Triton picks one register layout for the
program's tile, coalesced along x's rows. The column side's blocks (32 or 16 rows of one column) then sit
one element per thread across lanes and warps: every column amax is a cross-thread reduction, every thread
redoes its column's per-block scale for a single element, and 4-bit codes cross threads to pair up (H100,
bf16 8192^2, kernel time against an `x * 2` pass counting ideal bytes: mxfp8 + transposed 0.71x, nvfp4 +
transposed 0.25x, nvfp4 + transposed mxfp8 0.53x; nvfp4 alone 0.58x).

Gluon lets each side read the tile in its own layout, so every block lives in one thread:

    rows     BlockedLayout([1, RT / RB, RB], ...)      over (rows, blocks, RB): a thread holds RT consecutive
                                                       columns of a row, RT / RB whole row blocks (RB: 32
                                                       MX, 16 nvfp4); amax, scale and 4-bit pairs stay in
                                                       it; 16-byte loads.
    columns  BlockedLayout([1, CB, CC], [CL, 1, ..])   over (CL blocks, CB rows, columns): a thread holds one
                                                       column block (CB rows) of CC adjacent columns; CL
                                                       lanes hold consecutive blocks of the same columns,
                                                       the other lanes and the warps lie along the columns.
                                                       Stored with the rows first in registers (the same
                                                       ownership: no data moves), so a thread's codes of a
                                                       column are consecutive bytes of x^T's row, and the
                                                       CL lanes' are adjacent: 32-64 contiguous bytes per
                                                       x^T row in each store (one lane per block row wrote
                                                       16-byte pieces to 32 rows per store: 0.54x).

The column side reads the tile a second time (an L1/L2 hit: DRAM still sees one read of x). Nothing goes
through shared memory. The arithmetic is quantize_kernels' (`_mx_block_scale`, `_nvfp4_block_scale`, the
float32 quotient `_quotient_parts` / `_quotient_signed` for nvfp4, `_encode_elements` for 6- and 8-bit
codes), with e2m1 pairs encoded by `_encode_e2m1_pairs` (one float add per element rounds to e2m1's grid;
pairs packed into bytes in the same inline PTX), all bit-identical to the jnp quantizer (quantize.py).
H100 (2026-11-23, same units, `CONFIGS`): mxfp8 + transposed 0.84x, nvfp4 alone 0.85x, nvfp4 + transposed
mxfp8 0.77x, mxfp4 + transposed 0.76x, nvfp4 + transposed 0.53x (both sides' element arithmetic, ~28 SASS
instructions per element and side, bounds it: the kernel issues instructions, not bytes).

nvfp4's short path (session 33): where the tensor scale lies in `quantize_kernels.SHORT_PATH_TS` (every tensor
scale that data gives short of float32's extremes, or an explicit one there), the per-block scale comes from
the hardware's e4m3 conversion and one float32 product, the divisor's reciprocal from rcp.rn, and the element
quotient skips the general path's rescaling (`quantize_kernels._nvfp4_parts_short`: same bits, proofs there);
the general path stays for the rest. H100, same run: nvfp4 alone 0.871x -> 0.950x, nvfp4 + transposed nvfp4
0.549x -> 0.608x, nvfp4 + transposed mxfp8 0.761x -> 0.790x
(benchmarks/results/quant_nvfp4_short_h100_2026-11-25_session33.md).
tests/test_gpu_quantize_mx_gluon.py compares the bits on the GPU with the jnp quantizer's and the Triton
kernel's; tests/test_lowering_quantize_mx_gluon.py checks dispatch and instructions on the CPU (Gluon
kernels do not run in Triton's interpreter); tests/test_e2m1_ptx.py checks the e2m1 encoder through a PTX
emulator.

DECODED (the MX / nvfp4 recipes' GEMM inputs on Hopper, `quantize_primitive.decoded_pair`): the same pass
writes each side's values dequantized to bf16 instead of codes and scales, decoded from the codes it just
encoded (8-bit ones by the hardware's e4m3x2 / e5m2x2 -> f16x2 conversion, the others from their bits),
times the block scale in float32 (exact), one rounding to bf16. H100 (2026-11-24, `DECODED_CONFIGS`): mxfp8 +
transposed 0.70x, nvfp4 + transposed mxfp8 0.88x, counting the bf16 written; since session 25 one-byte MX rows
put a block's lanes side by side (whole-sector stores): mxfp8 + transposed 200.9 -> 176.9 us (about 0.79x),
Nsight Compute at 8192^2; since session 26 one-byte MX columns too (a block's 32 rows over 4 lanes, 8 columns
per thread; `_decoded_columns`): kernel time mxfp8 + transposed 170.0 -> 155.7 us (0.89x), nvfp4 + transposed
mxfp8 157.9 -> 149.3 us (0.93x). tests/test_gpu_quantize_decoded.py compares the bits with the jnp path's.
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import launch as scratch
from .quantize_kernels import (_e4m3_value, _encode_e2m1_pairs, _encode_elements, _mx_block_scale,
                               _nvfp4_block_scale, _nvfp4_parts_short, _nvfp4_short_path, _quotient_parts,
                               _quotient_signed, _side_constexprs)
from .tiling import linear_bases
from .upcast import e8m0_to_f32, minifloat_to_f32


@gluon.jit
def _scaled(x, amax_bits, ts, SHORT: gl.constexpr, AXIS: gl.constexpr, KIND: gl.constexpr, ROUNDING: gl.constexpr,
            MBITS: gl.constexpr, EMAX: gl.constexpr, CMANT: gl.constexpr):
    """(elements to encode, their sign sources: float32 shaped like x; stored scales shaped like amax_bits)
    of x's blocks along AXIS, whose amax bit patterns (sign cleared) are amax_bits; ts: the nvfp4 tensor
    scale (float32 scalar); SHORT: nvfp4 takes its short path (`_nvfp4_parts_short`, where the program found
    `_nvfp4_short_path(ts)`), else the general one (both give the spec's bits)."""
    amax = amax_bits.to(gl.float32, bitcast=True)
    bad = amax_bits >= 0x7F800000
    if KIND == "nvfp4":
        if SHORT:  # no rescaling of x: c = 1 (`_nvfp4_parts_short`)
            scales, d, y, z = _nvfp4_parts_short(amax, bad, ts)
            scaled, sign_src = _quotient_signed(x, 1.0, gl.expand_dims(d, AXIS), gl.expand_dims(y, AXIS),
                                                gl.expand_dims(z, AXIS))
        else:
            scales, denom = _nvfp4_block_scale(amax, bad, ts)
            c, d_s, y, z = _quotient_parts(denom.to(gl.float32), True)
            scaled, sign_src = _quotient_signed(x, gl.expand_dims(c, AXIS), gl.expand_dims(d_s, AXIS),
                                                gl.expand_dims(y, AXIS), gl.expand_dims(z, AXIS))
    else:
        scales, factor = _mx_block_scale(amax_bits, amax, bad, MBITS, EMAX, CMANT, ROUNDING)
        scaled = x * gl.expand_dims(factor, AXIS)
        sign_src = scaled
    return scaled, sign_src, scales


@gluon.jit
def _scale_values(scales, KIND: gl.constexpr):
    """Stored scale codes (uint8) as float32: e4m3 (nvfp4; its tensor scale is left out) or e8m0 (MX), NaN
    for a block with NaN/Inf."""
    if KIND == "nvfp4":
        value = _e4m3_value(scales)
    else:
        value = e8m0_to_f32(scales)
    return value


@gluon.jit
def _bf16_values(values, scale):
    """values * scale (float32, exact) rounded to bf16 (cvt.rn.bf16x2.f32). A block whose scale is NaN (NaN or
    Inf in it) comes out as the conversion's canonical NaN 0x7FFF, as the jnp path writes it
    (`quantize_primitive._canonical_nan`)."""
    return (values * scale).to(gl.bfloat16)


# The sm_89+ conversion of four 8-bit codes (one register) to four f16 (two): exact, as every e4m3 / e5m2 value
# is an f16 value. Half the instructions of the bit placement minifloat_to_f32 does for the narrower kinds.
_FP8_DECODE_PTX = """{
.reg .b16 lo, hi;
mov.b32 {lo, hi}, $2;
cvt.rn.f16x2.KIND $0, lo;
cvt.rn.f16x2.KIND $1, hi;
}"""
_E4M3_DECODE_PTX = gl.constexpr(_FP8_DECODE_PTX.replace("KIND", "e4m3x2"))
_E5M2_DECODE_PTX = gl.constexpr(_FP8_DECODE_PTX.replace("KIND", "e5m2x2"))


@gluon.jit
def _element_values(codes, NBITS: gl.constexpr, MBITS: gl.constexpr):
    """One-code-per-byte elements (uint8) as float32, exactly: 8-bit kinds by the hardware conversion, 6-bit
    ones from their bits."""
    if NBITS == 8 and MBITS == 3:
        halves = gl.inline_asm_elementwise(_E4M3_DECODE_PTX, "=r,=r,r", [codes],
                                           dtype=gl.float16, is_pure=True, pack=4)
        value = halves.to(gl.float32)
    elif NBITS == 8:
        halves = gl.inline_asm_elementwise(_E5M2_DECODE_PTX, "=r,=r,r", [codes],
                                           dtype=gl.float16, is_pure=True, pack=4)
        value = halves.to(gl.float32)
    else:
        value = minifloat_to_f32(codes, NBITS - 1 - MBITS, MBITS, 0)
    return value


@gluon.jit
def _pair_values(packed, SHAPE: gl.constexpr, PERM: gl.constexpr):
    """Bytes of e2m1 pairs as float32, exactly, in the element order `_pairs` split them from: each byte's
    (low, high) nibble joined on a new minor axis, permuted by PERM (its own inverse in both uses) and
    reshaped to SHAPE (the pair axis whole)."""
    lo = minifloat_to_f32(packed, 2, 1, 0)
    hi = minifloat_to_f32(packed, 2, 1, 4)
    return gl.reshape(gl.permute(gl.join(lo, hi), PERM), SHAPE)


@gluon.jit
def _pairs(v, SHAPE: gl.constexpr, PERM: gl.constexpr):
    """v's elements 2j and 2j + 1 along one axis as two tensors: reshaped to SHAPE (that axis split into
    (j, 2)), permuted by PERM (the 2 last), split. Registers only: a thread holds both of each pair."""
    return gl.split(gl.permute(gl.reshape(v, SHAPE), PERM))


# Row side, DECODED: bf16 elements per lane (one 16-byte store).
DECODED_LANE_ELEMENTS = gl.constexpr(8)


@gluon.constexpr_function
def _decoded_block_lanes(blocks, lanes_per_block):
    """Lanes of a warp along consecutive blocks of a row (the rest along rows): all of the tile's blocks, at
    most a warp's worth."""
    return min(blocks, 32 // lanes_per_block)


@gluon.constexpr_function
def _column_block_lanes(block_rows, block_lanes):
    """Column side, DECODED: lanes along one block's rows (8 rows each where the warp has room for it)."""
    return min(block_rows // DECODED_LANE_ELEMENTS.value, 32 // block_lanes)


@gluon.constexpr_function
def _column_strip(block_rows, block_lanes, columns, warps, spread):
    """Columns one column-side pass covers: columns per thread times the lanes along neither consecutive
    blocks nor (spread: DECODED one-byte codes) a block's rows, times the warps."""
    lanes = _column_block_lanes(block_rows, block_lanes) if spread else 1
    return (32 // (block_lanes * lanes)) * columns * warps


def column_strip(col_fmt, cfg: dict, decoded: bool) -> int:
    """Host side of `_column_strip`: the columns one column-side pass of launch settings cfg covers."""
    return _column_strip(col_fmt.block, cfg["column_block_lanes"], cfg["column_thread_columns"], cfg["num_warps"],
                         decoded and col_fmt.elements_per_byte == 1)


@gluon.constexpr_function
def _decoded_columns(blocks, block_rows, lanes, columns, warps, rows_first):
    """Column side, DECODED: (blocks, block_rows, strip columns) with each lane holding block_rows / lanes
    consecutive rows of `columns` adjacent columns, `lanes` lanes along a block's rows, `blocks` lanes along
    consecutive blocks, the rest of the warp and the warps along columns. rows_first orders a lane's
    registers rows first (stores along x^T's rows), else columns first (loads along x's rows); lanes and warps
    are the same either way, so converting between the two moves no data."""
    def bases(dim, count, first):
        return linear_bases(3, dim, count, first)

    rows = block_rows // lanes
    column_lanes = 32 // (blocks * lanes)
    regs = (bases(1, rows, 1) + bases(2, columns, 1)) if rows_first else (bases(2, columns, 1) + bases(1, rows, 1))
    lane = bases(1, lanes, rows) + bases(2, column_lanes, columns) + bases(0, blocks, 1)
    warp = bases(2, warps, columns * column_lanes)
    return gl.DistributedLinearLayout(regs, lane, warp, [], [blocks, block_rows, columns * column_lanes * warps])


@gluon.jit
def _tile(x_ptr, ts_ptr, rv_ptr, rs_ptr, cv_ptr, cs_ptr,
          R: gl.constexpr, C: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr,
          RT: gl.constexpr, CC: gl.constexpr, CL: gl.constexpr,
          R_KIND: gl.constexpr, R_ROUNDING: gl.constexpr, R_TW: gl.constexpr, R_EPB: gl.constexpr,
          R_CQ: gl.constexpr, R_MBITS: gl.constexpr, R_MIN_EXP: gl.constexpr,
          R_MAX_BITS: gl.constexpr, R_NBITS: gl.constexpr, R_EMAX: gl.constexpr,
          R_CMANT: gl.constexpr,
          C_KIND: gl.constexpr, C_ROUNDING: gl.constexpr, C_TH: gl.constexpr, C_EPB: gl.constexpr,
          C_RQ: gl.constexpr, C_MBITS: gl.constexpr, C_MIN_EXP: gl.constexpr,
          C_MAX_BITS: gl.constexpr, C_NBITS: gl.constexpr, C_EMAX: gl.constexpr,
          C_CMANT: gl.constexpr, DECODED: gl.constexpr, SHORT: gl.constexpr):
    """The kernel's work on its tile (`quantize_mx_t_kernel`), with nvfp4 sides on their short path
    (`_nvfp4_parts_short`) where SHORT, else on the general one."""
    W: gl.constexpr = gl.num_warps()
    pid_c = gl.program_id(0)
    pid_r = gl.program_id(1)
    batch = gl.program_id(2).to(gl.int64)
    r0 = pid_r * TR
    c0 = pid_c * TC
    x_b = x_ptr + batch * (R * C)

    if R_KIND != "none":
        RB: gl.constexpr = R_TW
        NB: gl.constexpr = TC // RB
        if DECODED and R_EPB == 1:
            # 16 bytes of bf16 per lane, a block's lanes side by side (its amax reduced across them): every
            # store instruction fills whole 32-byte sectors. Whole blocks per thread (below) leave each
            # store half a sector, so each sector is written twice, and the L2 bounded the decoded pass
            # (Nsight Compute, mxfp8 + transposed 8192^2: L2 89%, DRAM 57%, 200.9 us; this layout: L2 77%,
            # DRAM 65%, 176.9 us). nvfp4 rows keep whole blocks: this layout ran nvfp4 + transposed mxfp8 at
            # 173.6 us against 164.6 (their quotient arithmetic, repeated on each of a block's lanes).
            LB: gl.constexpr = RB // DECODED_LANE_ELEMENTS
            LNB: gl.constexpr = _decoded_block_lanes(NB, LB)
            ROWS: gl.constexpr = gl.BlockedLayout([1, 1, DECODED_LANE_ELEMENTS], [32 // (LB * LNB), LNB, LB],
                                                  [W, 1, 1], [2, 1, 0])
            SR: gl.constexpr = (32 // (LB * LNB)) * W  # rows per strip
        else:
            ROWS: gl.constexpr = gl.BlockedLayout([1, RT // RB, RB], [32 * RT // TC, TC // RT, 1], [W, 1, 1],
                                                  [2, 1, 0])
            SR: gl.constexpr = (32 * RT // TC) * W  # rows per strip
        PAIRS: gl.constexpr = gl.BlockedLayout([1, RT // RB, RB // 2], [32 * RT // TC, TC // RT, 1], [W, 1, 1],
                                               [2, 1, 0])
        ts_r = gl.load(ts_ptr)
        rr = gl.arange(0, SR, layout=gl.SliceLayout(1, gl.SliceLayout(2, ROWS)))
        bb = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, ROWS)))
        ee = gl.arange(0, RB, layout=gl.SliceLayout(0, gl.SliceLayout(1, ROWS)))
        cols = c0 + bb[None, :, None] * RB + ee[None, None, :]
        for s in gl.static_range(TR // SR):
            rows = r0 + s * SR + rr
            x = gl.load(x_b + rows[:, None, None] * C + cols, mask=(rows[:, None, None] < R) & (cols < C),
                        other=0.0).to(gl.float32)
            amax_bits = gl.max(x.to(gl.uint32, bitcast=True) & 0x7FFFFFFF, axis=2)
            scaled, sign_src, scales = _scaled(x, amax_bits, ts_r, SHORT, 2, R_KIND, R_ROUNDING, R_MBITS, R_EMAX,
                                               R_CMANT)
            blk = c0 // RB + bb[None, :]
            if DECODED:
                scale_v = gl.expand_dims(_scale_values(scales, R_KIND), 2)
            else:
                gl.store(rs_ptr + batch * (R * (R_CQ // RB)) + rows[:, None] * (R_CQ // RB) + blk, scales,
                         mask=(rows[:, None] < R) & (blk < R_CQ // RB))
            if R_EPB == 2:  # two 4-bit codes per byte, the even element in the low nibble
                lo, hi = _pairs(scaled, [SR, NB, RB // 2, 2], [0, 1, 2, 3])
                slo, shi = _pairs(sign_src, [SR, NB, RB // 2, 2], [0, 1, 2, 3])
                packed = _encode_e2m1_pairs(lo, hi, slo, shi)
                if DECODED:
                    values = gl.convert_layout(_pair_values(packed, [SR, NB, RB], [0, 1, 2, 3]), ROWS)
                else:
                    packed = gl.convert_layout(packed, PAIRS)
                    rows_p = r0 + s * SR + gl.arange(0, SR, layout=gl.SliceLayout(1, gl.SliceLayout(2, PAIRS)))
                    bb_p = gl.arange(0, NB, layout=gl.SliceLayout(0, gl.SliceLayout(2, PAIRS)))
                    ee_p = gl.arange(0, RB // 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, PAIRS)))
                    bytes_ = c0 // 2 + bb_p[None, :, None] * (RB // 2) + ee_p[None, None, :]
                    gl.store(rv_ptr + batch * (R * (R_CQ // 2)) + rows_p[:, None, None] * (R_CQ // 2) + bytes_,
                             packed, mask=(rows_p[:, None, None] < R) & (bytes_ < R_CQ // 2))
            else:
                codes = _encode_elements(scaled, sign_src, "hw", R_MBITS, R_MIN_EXP, R_MAX_BITS, R_NBITS)
                if DECODED:
                    values = _element_values(codes, R_NBITS, R_MBITS)
                else:
                    gl.store(rv_ptr + batch * (R * R_CQ) + rows[:, None, None] * R_CQ + cols, codes,
                             mask=(rows[:, None, None] < R) & (cols < R_CQ))
            if DECODED:
                gl.store(rv_ptr + batch * (R * C) + rows[:, None, None] * C + cols, _bf16_values(values, scale_v),
                         mask=(rows[:, None, None] < R) & (cols < C))

    if C_KIND != "none":
        CB: gl.constexpr = C_TH
        if DECODED and C_EPB == 1:
            # A block's rows over CLB lanes (8 rows, 16 bytes of bf16 each), side by side along x^T's row, so
            # every store fills whole sectors, as on the row side (whole blocks per thread wrote each sector
            # in two halves).
            CLB: gl.constexpr = _column_block_lanes(CB, CL)
            COLS: gl.constexpr = _decoded_columns(CL, CB, CLB, CC, W, False)     # loads
            COLS_OUT: gl.constexpr = _decoded_columns(CL, CB, CLB, CC, W, True)  # stores
        else:  # CL lanes along consecutive blocks, each with whole blocks
            COLS: gl.constexpr = gl.BlockedLayout([1, CB, CC], [CL, 1, 32 // CL], [1, 1, W], [2, 1, 0])      # loads
            COLS_OUT: gl.constexpr = gl.BlockedLayout([1, CB, CC], [CL, 1, 32 // CL], [1, 1, W], [1, 2, 0])  # stores
        SC: gl.constexpr = _column_strip(CB, CL, CC, W, DECODED and C_EPB == 1)  # columns per strip
        COLS_PAIRS: gl.constexpr = gl.BlockedLayout([1, CB // 2, CC], [CL, 1, 32 // CL], [1, 1, W], [1, 2, 0])
        OUT: gl.constexpr = COLS_PAIRS if C_EPB == 2 else COLS_OUT
        ts_c = gl.load(ts_ptr + 1)
        ll = gl.arange(0, CL, layout=gl.SliceLayout(1, gl.SliceLayout(2, COLS)))
        jj = gl.arange(0, CB, layout=gl.SliceLayout(0, gl.SliceLayout(2, COLS)))
        cc = gl.arange(0, SC, layout=gl.SliceLayout(0, gl.SliceLayout(1, COLS)))
        ll_s = gl.arange(0, CL, layout=gl.SliceLayout(1, gl.SliceLayout(1, COLS)))
        cc_s = gl.arange(0, SC, layout=gl.SliceLayout(0, gl.SliceLayout(1, COLS)))
        ll_o = gl.arange(0, CL, layout=gl.SliceLayout(1, gl.SliceLayout(2, OUT)))
        jj_o = gl.arange(0, CB // C_EPB, layout=gl.SliceLayout(0, gl.SliceLayout(2, OUT)))
        cc_o = gl.arange(0, SC, layout=gl.SliceLayout(0, gl.SliceLayout(1, OUT)))
        ll_d = gl.arange(0, CL, layout=gl.SliceLayout(1, gl.SliceLayout(2, COLS_OUT)))
        jj_d = gl.arange(0, CB, layout=gl.SliceLayout(0, gl.SliceLayout(2, COLS_OUT)))
        cc_d = gl.arange(0, SC, layout=gl.SliceLayout(0, gl.SliceLayout(1, COLS_OUT)))
        for i in gl.static_range(TR // (CL * CB)):
            rb0 = r0 + i * (CL * CB)  # first row of this pass: CL blocks of CB rows
            rows_c = rb0 + ll[:, None, None] * CB + jj[None, :, None]
            for s in gl.static_range(TC // SC):
                cols_c = c0 + s * SC + cc[None, None, :]
                x = gl.load(x_b + rows_c * C + cols_c, mask=(rows_c < R) & (cols_c < C), other=0.0).to(gl.float32)
                amax_bits = gl.max(x.to(gl.uint32, bitcast=True) & 0x7FFFFFFF, axis=1)
                scaled, sign_src, scales = _scaled(x, amax_bits, ts_c, SHORT, 1, C_KIND, C_ROUNDING, C_MBITS,
                                                   C_EMAX, C_CMANT)
                cols_s = c0 + s * SC + cc_s[None, :]
                blk = rb0 // CB + ll_s[:, None]
                if DECODED:
                    scale_v = gl.convert_layout(gl.expand_dims(_scale_values(scales, C_KIND), 1), COLS_OUT)
                else:
                    gl.store(cs_ptr + batch * (C * (C_RQ // CB)) + cols_s * (C_RQ // CB) + blk, scales,
                             mask=(cols_s < C) & (blk < C_RQ // CB))
                # Rows first in registers (the same ownership: no data moves), for the stores along x^T's rows.
                scaled = gl.convert_layout(scaled, COLS_OUT)
                sign_src = gl.convert_layout(sign_src, COLS_OUT)
                if C_EPB == 2:  # pairs along R: the even row in the low nibble
                    lo, hi = _pairs(scaled, [CL, CB // 2, 2, SC], [0, 1, 3, 2])
                    slo, shi = _pairs(sign_src, [CL, CB // 2, 2, SC], [0, 1, 3, 2])
                    packed = _encode_e2m1_pairs(lo, hi, slo, shi)
                    if DECODED:
                        values = gl.convert_layout(_pair_values(packed, [CL, CB, SC], [0, 1, 3, 2]), COLS_OUT)
                    else:
                        codes = gl.convert_layout(packed, COLS_PAIRS)
                else:
                    codes = _encode_elements(scaled, sign_src, "hw", C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS)
                    if DECODED:
                        values = _element_values(codes, C_NBITS, C_MBITS)
                if DECODED:
                    rows_d = rb0 + ll_d[:, None, None] * CB + jj_d[None, :, None]
                    cols_d = c0 + s * SC + cc_d[None, None, :]
                    gl.store(cv_ptr + batch * (C * R) + cols_d * R + rows_d, _bf16_values(values, scale_v),
                             mask=(cols_d < C) & (rows_d < R))
                else:
                    inner = rb0 // C_EPB + ll_o[:, None, None] * (CB // C_EPB) + jj_o[None, :, None]
                    cols_o = c0 + s * SC + cc_o[None, None, :]
                    gl.store(cv_ptr + batch * (C * (C_RQ // C_EPB)) + cols_o * (C_RQ // C_EPB) + inner, codes,
                             mask=(cols_o < C) & (inner < C_RQ // C_EPB))


@gluon.jit
def quantize_mx_t_kernel(x_ptr, ts_ptr, rv_ptr, rs_ptr, cv_ptr, cs_ptr,
                         R: gl.constexpr, C: gl.constexpr, TR: gl.constexpr, TC: gl.constexpr,
                         RT: gl.constexpr, CC: gl.constexpr, CL: gl.constexpr,
                         R_KIND: gl.constexpr, R_ROUNDING: gl.constexpr, R_TW: gl.constexpr, R_EPB: gl.constexpr,
                         R_CQ: gl.constexpr, R_MBITS: gl.constexpr, R_MIN_EXP: gl.constexpr,
                         R_MAX_BITS: gl.constexpr, R_NBITS: gl.constexpr, R_EMAX: gl.constexpr,
                         R_CMANT: gl.constexpr,
                         C_KIND: gl.constexpr, C_ROUNDING: gl.constexpr, C_TH: gl.constexpr, C_EPB: gl.constexpr,
                         C_RQ: gl.constexpr, C_MBITS: gl.constexpr, C_MIN_EXP: gl.constexpr,
                         C_MAX_BITS: gl.constexpr, C_NBITS: gl.constexpr, C_EMAX: gl.constexpr,
                         C_CMANT: gl.constexpr, DECODED: gl.constexpr):
    """x (B, R, C) float -> row side (R_KIND "mx" / "nvfp4" / "none"): values (B, R, R_CQ / R_EPB) and scales
    (B, R, R_CQ / R_TW), blocks of R_TW along C; column side (C_KIND): x^T's values (B, C, C_RQ / C_EPB) and
    scales (B, C, C_RQ / C_TH), blocks of C_TH along R. R_CQ / C_RQ: C / R padded to a block (the padding
    quantizes as zeros). ts_ptr: the two float32 tensor scales (row, column), read by nvfp4 sides only.
    Program tile (TR, TC): TR a multiple of the column side's pass (CL blocks of C_TH rows) and of the row
    side's strip, TC of R_TW and of the column side's strip (`check_config`). Grid (cdiv(C, TC), cdiv(R, TR),
    B). Needs R * C < 2**31 (in-batch offsets are int32).

    DECODED: instead of codes and scales, each side writes its quantization's values, dequantized: bf16
    rv (B, R, C) and cv (B, C, R) (no padding; nvfp4's tensor scale left out), equal to
    `quantize.dequantize(q, bf16)` of the codes and scales it would have stored, NaN as 0x7FFF; rs / cs are
    not written."""
    # nvfp4 sides take the short path when every nvfp4 side's tensor scale allows it
    # (`quantize_kernels.SHORT_PATH_TS`): one branch for the whole program, so the general path's registers do
    # not stay live across the short path's code (a branch per strip took nvfp4 + transposed nvfp4 from 96 to
    # 116 registers). Kernels without an nvfp4 side get a constexpr False, so no branch is emitted (a runtime
    # constant would not do: Triton 3.6 fails to lower an scf.if on a constant condition).
    if R_KIND == "nvfp4" or C_KIND == "nvfp4":
        short = _nvfp4_short_path(gl.load(ts_ptr)) | (R_KIND != "nvfp4")
        short = short & (_nvfp4_short_path(gl.load(ts_ptr + 1)) | (C_KIND != "nvfp4"))
    else:
        short: gl.constexpr = False
    if short:
        _tile(x_ptr, ts_ptr, rv_ptr, rs_ptr, cv_ptr, cs_ptr, R, C, TR, TC, RT, CC, CL, R_KIND, R_ROUNDING, R_TW,
              R_EPB, R_CQ, R_MBITS, R_MIN_EXP, R_MAX_BITS, R_NBITS, R_EMAX, R_CMANT, C_KIND, C_ROUNDING, C_TH,
              C_EPB, C_RQ, C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS, C_EMAX, C_CMANT, DECODED, True)
    else:
        _tile(x_ptr, ts_ptr, rv_ptr, rs_ptr, cv_ptr, cs_ptr, R, C, TR, TC, RT, CC, CL, R_KIND, R_ROUNDING, R_TW,
              R_EPB, R_CQ, R_MBITS, R_MIN_EXP, R_MAX_BITS, R_NBITS, R_EMAX, R_CMANT, C_KIND, C_ROUNDING, C_TH,
              C_EPB, C_RQ, C_MBITS, C_MIN_EXP, C_MAX_BITS, C_NBITS, C_EMAX, C_CMANT, DECODED, False)


# ---------------------------------------------------------------------------------------------------------
# Host side.

_INT32_LIMIT = 2**31
_INPUT_DTYPES = ("bfloat16", "float16", "float32")
CONFIG_KEYS = ("num_warps", "tile", "row_thread_columns", "column_thread_columns", "column_block_lanes", "maxnreg")


# Launch settings per (row side, column side) kind (`_kind`: "nvfp4", "mxfp4", "mx" for MX with one-byte codes,
# None: no such side), from sweeps on an H100 (2026-11-23, bf16 8192^2, kernel time against an `x * 2` pass
# counting ideal bytes; `python -m benchmarks.quant_variants --gluon-variants`, benchmarks/results/
# quant_mx_gluon_h100_2026-11-23_session13*.md): num_warps, tile (rows, columns), the row side's columns per
# thread, the column side's columns per thread and lanes along consecutive blocks, a register cap (0: none).
# With a column side the lanes along blocks are what counts: one lane per block row (each lane's 16-byte code
# store to its own row of x^T) ran mxfp8 + transposed at 0.54x, 2-4 lanes (32-64 contiguous bytes per x^T
# row per store) at 0.79-0.84x. nvfp4 rows alone run fastest with one block per thread (0.84x against 0.77x
# for two). Register caps of 64 and 80 were slower everywhere (up to 1.4x). A pair not listed (a mixed pair
# other than the nvfp4 recipe's) takes the entry of its column side's kind on both sides.
CONFIGS = {
    ("nvfp4", None): dict(num_warps=4, tile=(32, 256), row_thread_columns=16),          # 0.85x
    ("mx", None): dict(num_warps=4, tile=(32, 256), row_thread_columns=32),             # 1.00x
    ("mxfp4", None): dict(num_warps=4, tile=(32, 256), row_thread_columns=32),
    ("mx", "mx"): dict(num_warps=8, tile=(128, 128), column_thread_columns=2, column_block_lanes=4),      # 0.84x
    ("nvfp4", "mx"): dict(num_warps=4, tile=(64, 128), column_thread_columns=2, column_block_lanes=2),    # 0.77x
    ("nvfp4", "nvfp4"): dict(num_warps=4, tile=(64, 64), column_thread_columns=2, column_block_lanes=4),  # 0.53x
    ("mxfp4", "mxfp4"): dict(num_warps=4, tile=(64, 128), column_thread_columns=2, column_block_lanes=2),  # 0.76x
}
_UNUSED = dict(row_thread_columns=32, column_thread_columns=2, column_block_lanes=4, maxnreg=0)
# Decoded values (DECODED: bf16 out, 2 bytes per element and side), where they differ from CONFIGS: same sweep
# with --decoded (benchmarks/results/quant_decoded_h100_2026-11-24_session20.md), then, with a one-byte MX
# column side's block over 4 lanes (session 26, benchmarks/results/quant_decoded_columns_h100_2026-11-24_
# session26.md): 8 columns per thread give 16-byte loads of x. mxfp8 + transposed 155.7 us (0.89x) against
# 170.0 us before the column layout; nvfp4 + transposed mxfp8 149.3 us (0.93x) against 157.9.
DECODED_CONFIGS = {
    ("mx", "mx"): dict(num_warps=8, tile=(128, 128), column_thread_columns=8, column_block_lanes=4),
    ("nvfp4", "mx"): dict(num_warps=8, tile=(64, 128), row_thread_columns=16, column_thread_columns=4,
                          column_block_lanes=2),
}


def _kind(side) -> Optional[str]:
    from ..formats import NVFP4Format

    if side.fmt is None:
        return None
    if isinstance(side.fmt, NVFP4Format):
        return "nvfp4"
    return "mxfp4" if side.fmt.element.bits == 4 else "mx"


def default_config(row, col, decoded: bool = False) -> dict:
    """Launch settings (`CONFIG_KEYS`) for a (row, column) pair of `Side`s, from `CONFIGS` (with `decoded`,
    `DECODED_CONFIGS` first)."""
    key = (_kind(row), _kind(col))
    tables = (DECODED_CONFIGS, CONFIGS) if decoded else (CONFIGS,)
    if not any(key in t for t in tables):
        key = (key[1], key[1])  # every kind has a row-only entry and a pair with itself
    cfg = {**_UNUSED, **next(t[key] for t in tables if key in t)}
    if row.fmt is not None:  # whole blocks per thread (the listed pair's row side may have had other blocks)
        cfg["row_thread_columns"] = max(cfg["row_thread_columns"], row.fmt.block)
    return cfg


def preferred(row, col) -> bool:
    """Whether dispatch takes this kernel for a `why_not`-approved pair, else the Triton kernel: with a
    transposed side or an nvfp4 side (H100, same runs as `CONFIGS`: mxfp8 + transposed 0.84x against
    0.71x, nvfp4 0.84x against 0.58x, nvfp4 + transposed 0.53x against 0.25x, nvfp4 + transposed mxfp8
    0.77x against 0.53x); MX rows alone keep the Triton kernel, which runs as fast (mxfp8 69.2-72.1 us
    against 70.2 us: both at the `x * 2` pass's rate)."""
    from ..formats import NVFP4Format

    return col.fmt is not None or isinstance(row.fmt, NVFP4Format)


def check_config(row, col, cfg: dict, decoded: bool = False) -> None:
    """ValueError unless cfg's tile holds whole strips and blocks of both sides (decoded: the kernel's
    DECODED layouts)."""
    w, (tr, tc) = cfg["num_warps"], cfg["tile"]
    rt, cc, cl = cfg["row_thread_columns"], cfg["column_thread_columns"], cfg["column_block_lanes"]
    if w not in (1, 2, 4, 8, 16) or cl > 32 or any(v <= 0 or v & (v - 1) for v in (tr, tc, rt, cc, cl)):
        raise ValueError(f"launch settings must be powers of two (warps 1-16, lanes <= 32): {cfg}")
    if row.fmt is not None:
        rb = row.fmt.block
        if rt % rb or tc % rt or tc // rt > 32 or tr % ((32 * rt // tc) * w):
            raise ValueError(f"row side ({rb}-element blocks): {rt} columns per thread must hold whole blocks, "
                             f"the tile's {tc} columns be at most 32 threads' worth, and its {tr} rows whole "
                             f"strips of {(32 * rt // max(tc, 1)) * w} rows")
    if col.fmt is not None:
        cb = col.fmt.block
        strip = column_strip(col.fmt, cfg, decoded)
        if tr % (cb * cl) or tc % strip:
            raise ValueError(f"column side ({cb}-row blocks, {cl} lanes along them): the tile's {tr} rows must "
                             f"hold whole passes of {cb * cl} rows and its {tc} columns whole strips of {strip}")


def why_not(x_shape: tuple[int, ...], x_dtype, row, col, compute_capability) -> Optional[str]:
    """None when this kernel computes the (row, column) pair of `Side`s for x (..., R, C), else why not."""
    from ..formats import MXFormat, NVFP4Format

    if compute_capability is None or compute_capability < 90:
        return "needs NVIDIA sm_90+ (Gluon layouts and the sm_89+ fp8 conversion; sm_90 and sm_100 are tested)"
    if row.fmt is None and col.fmt is None:
        return "no side to quantize"
    for name, side in (("row", row), ("column", col)):
        if side.fmt is not None and not isinstance(side.fmt, (MXFormat, NVFP4Format)):
            return f"{name} side {side.fmt!r} is neither MX nor nvfp4"
    if jnp.dtype(x_dtype).name not in _INPUT_DTYPES:
        return f"x dtype {x_dtype} is not one of {_INPUT_DTYPES}"
    # In-batch offsets are int32: x's (R * C), the row codes' (R * C padded to a row block) and x^T's codes'
    # (C * R padded to a column block); the padding can make the outputs larger than x (C = 2: 32 per row).
    r, c = x_shape[-2], x_shape[-1]
    rq = -(-r // col.fmt.block) * col.fmt.block if col.fmt is not None else r
    cq = -(-c // row.fmt.block) * row.fmt.block if row.fmt is not None else c
    if max(r * c, r * cq, c * rq) >= _INT32_LIMIT:
        return f"a batch element of {r} x {c} (padded to whole blocks: {rq} x {cq}) needs 64-bit offsets"
    return None


def kernel_constexprs(r: int, c: int, row, col, cfg: dict, decoded: bool = False) -> dict:
    """The kernel's constexprs for x (B, r, c), `Side`s row / col and launch settings cfg (`check_config`);
    decoded: write dequantized bf16 values instead of codes and scales (the kernel's DECODED)."""
    ce = {**_side_constexprs("R_", row, c), **_side_constexprs("C_", col, r)}
    keep = ("KIND", "ROUNDING", "EPB", "MBITS", "MIN_EXP", "MAX_BITS", "NBITS", "EMAX", "CMANT")
    tr, tc = cfg["tile"]
    return dict({k: v for k, v in ce.items() if k[2:] in keep},
                R_TW=ce["R_TW"], R_CQ=ce["R_CQ"], C_TH=ce["C_TH"], C_RQ=ce["C_RQ"], R=r, C=c, TR=tr, TC=tc,
                RT=cfg["row_thread_columns"], CC=cfg["column_thread_columns"], CL=cfg["column_block_lanes"],
                DECODED=decoded)


def launch(x3, ts, row, col, out_shapes, compute_capability: int, cvt: str = "hw", decoded: bool = False,
           **config) -> list:
    """Runs the kernel on x3 (B, R, C) for `why_not`-approved sides; ts: (2,) float32 tensor scales (row,
    column; nvfp4 sides read theirs); out_shapes: the quantization plan's four (shape, dtype) outputs
    (`quantize_kernels.plan`), which this kernel fills in the same layouts. cvt: "hw" only (NVIDIA inline
    PTX: the sm_89+ fp8 conversion, the e2m1 pair encoder). decoded: the kernel writes dequantized bf16
    values instead (out_shapes from `quantize_primitive.out_shapes(..., decoded=True)`; settings from
    `DECODED_CONFIGS` first). config: `CONFIG_KEYS` overriding `default_config`
    (benchmarks/quant_variants.py)."""
    if cvt != "hw":
        raise ValueError(f"the Gluon MX kernel encodes with NVIDIA inline PTX (cvt 'hw'), got {cvt!r}")
    unknown = set(config) - set(CONFIG_KEYS)
    if unknown:
        raise ValueError(f"unknown launch settings {sorted(unknown)}; expected some of {list(CONFIG_KEYS)}")
    cfg = {**default_config(row, col, decoded), **config}
    check_config(row, col, cfg, decoded)
    b, r, c = x3.shape
    tr, tc = cfg["tile"]
    return scratch.scratch_call(
        quantize_mx_t_kernel, x3, ts.astype(jnp.float32).reshape(2),
        out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in out_shapes],
        grid=(-(-c // tc), -(-r // tr), b), num_warps=cfg["num_warps"], num_stages=1,
        compute_capability=compute_capability, name="jbs_quantize_mx_gluon", maxnreg=cfg["maxnreg"],
        **kernel_constexprs(r, c, row, col, cfg, decoded))
