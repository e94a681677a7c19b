"""fp8 1x128 quantization with its transposed copy in one pass, in Gluon (NVIDIA sm_90+): what the
fp8_deepseek recipe asks of every activation and gradient in a training step.

The recipe quantizes x (tokens M, features K) along K in (1, 128) groups for fprop and, for wgrad, along M:
dy in (1, 128) groups of dy^T (128 x 1 blocks of dy) and x in (128, 128) tiles of x^T. Both column sides
need a whole 128 x 128 tile of x per program (its rows' 128-wide groups and its columns' 128-tall ones).
`quantize_kernels.quantize_kernel` computes these bit-identically, but Triton picks one register layout for
the tile, coalesced along x's rows, so a column's 128 elements sit one per thread in 32 threads of 8 warps:
each column's amax is a cross-warp reduction through shared memory, and every thread redoes the column's
scale, reciprocal and Markstein terms for its single element (Nsight Compute on an H100, bf16 8192^2: 122
registers, 25% occupancy, 1.3 eligible warps per scheduler, 175.8 us = 0.54x an `x * 2` pass).

Gluon lets each side read the tile in its own layout (`CONFIGS` holds the measured sizes):

    rows     BlockedLayout([1, 16], ...)   a thread holds RC (16 or 32) columns of a row in runs of 16 at the
                                           lanes' stride: 16-byte loads of bf16 and 16-byte stores of codes
                                           that fill whole sectors (`RUN`); a row's 128 columns are 128 / RC
                                           lanes of one warp (2-3 shuffles per amax); strips of rows.
    columns  _column_layout(...)           a thread holds CR consecutive rows of CC columns; a column's 128
                                           rows are lanes of one warp (no shared memory), and a thread's CR
                                           codes of a column are consecutive bytes of x^T's row: 16-byte
                                           stores, no byte transpose. Two register orders of the same
                                           ownership: columns first for the loads, rows first for the stores.

The column side reads the tile a second time (an L1/L2 hit: DRAM still sees one read of x). Each per-block
value (scale, reciprocal) is computed by the few lanes that hold the block, for 16-32 elements each, where
the Triton kernel's column side computed it once per element.

The arithmetic is quantize_kernels' (the jnp quantizer's, quantize._quantize_block_fp8): scale RN32(amax *
float64(1/448)) (1 for an all-zero block, NaN for one holding NaN/Inf), elements RN32(x / scale) in float32
by the Markstein step (`quantize_kernels._quotient_parts`, `_quotient_signed`), codes by the sm_89+
conversion plus fix-up (`_encode_hw`). Bits are the jnp quantizer's: tests/test_gpu_quantize_fp8_gluon.py
compares them on the GPU (with the Triton kernel's too), tests/test_lowering_quantize_gluon.py checks the
dispatch and the instructions on the CPU (Gluon kernels do not run in Triton's interpreter).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from . import launch as scratch
from .quantize_kernels import _encode_hw, _fp8_block_scale, _quotient_parts, _quotient_signed
from .tiling import linear_bases

TILE = 128  # rows and columns of a program's tile: one block of each side (1 x 128 and 128 x 1 or 128 x 128)
# Elements a thread stores together on either side: 16 one-byte codes, one 16-byte store. Where a thread holds
# more (RC columns of a row, CR rows of a column), they are runs of RUN at a stride of the lanes' runs, so the
# lanes along a row (x^T's row) store adjacent runs and each store instruction fills whole 32-byte sectors;
# RC or CR consecutive elements per thread wrote every sector in two halves, one per store.
RUN = 16
ROW_RUN = gl.constexpr(RUN)


@gluon.constexpr_function
def _column_layout(num_warps, rows_per_thread, cols_per_thread, rows_first):
    """The column side's (128, columns) layout: a thread holds rows_per_thread rows (runs of RUN
    consecutive ones) of cols_per_thread columns, the lanes of a warp cover all 128 rows (a column's amax
    never leaves the warp), the warps sit side by side. Two register orders of the same ownership
    (converting between them moves no data): columns first, so a row's columns are one vector load; rows
    first, so a column's codes are one vector store into x^T's row."""
    def bits(n, step, axis):
        return linear_bases(2, axis, n, step)
    lanes_r = 128 // rows_per_thread
    lanes_c = 32 // lanes_r
    run = min(rows_per_thread, RUN)
    rows = bits(run, 1, 0) + bits(rows_per_thread // run, run * lanes_r, 0)
    cols = bits(cols_per_thread, 1, 1)
    lanes = bits(lanes_r, run, 0) + bits(lanes_c, cols_per_thread, 1)
    warps = bits(num_warps, cols_per_thread * lanes_c, 1)
    return gl.DistributedLinearLayout(rows + cols if rows_first else cols + rows, lanes, warps, [],
                                      [128, cols_per_thread * lanes_c * num_warps])


@gluon.jit
def _fp8_scale(amax_bits):
    """Per-block float32 scale from the block's amax bits (sign cleared), as quantize_kernels forms it."""
    return _fp8_block_scale(amax_bits.to(gl.float32, bitcast=True), amax_bits >= 0x7F800000).to(gl.float32)


@gluon.jit
def _codes(x, c, d_s, y, z, MBITS: gl.constexpr):
    """Element codes of RN32(x / d), the per-block parts broadcast against x (`_quotient_signed`)."""
    q, sign_src = _quotient_signed(x, c, d_s, y, z)
    return _encode_hw(q, sign_src, MBITS)


@gluon.jit
def quantize_fp8_1x128_t_kernel(x_ptr, rv_ptr, rs_ptr, cv_ptr, cs_ptr,
                                R: gl.constexpr, C: gl.constexpr, CQ: gl.constexpr, RQ: gl.constexpr,
                                COL_TILE: gl.constexpr, MBITS: gl.constexpr, CR: gl.constexpr, CC: gl.constexpr,
                                RC: gl.constexpr):
    """x (B, R, C) float -> row side: values (B, R, CQ) uint8 codes and scales (B, R, CQ / 128) float32
    (1 x 128 groups along C); column side: x^T's values (B, C, RQ) and scales, (B, C, RQ / 128) for
    COL_TILE 1 (128 x 1 blocks of x) or (B, cdiv(C, 128), RQ / 128) for COL_TILE 128 (128 x 128 tiles).
    CQ, RQ: C and R padded to 128 (the padding quantizes as zeros). Grid (cdiv(C, 128), cdiv(R, 128), B).
    Needs R * C < 2**31 (in-batch offsets are int32) and num_warps dividing 32."""
    W: gl.constexpr = gl.num_warps()
    SR: gl.constexpr = (32 * RC // 128) * W  # rows per row-side strip
    # A thread's RC columns of a row: RC / ROW_RUN runs (RUN above).
    ROWS: gl.constexpr = gl.BlockedLayout([1, ROW_RUN], [32 * RC // 128, 128 // RC], [W, 1], [1, 0])
    COLS: gl.constexpr = _column_layout(W, CR, CC, False)
    COLS_OUT: gl.constexpr = _column_layout(W, CR, CC, True)
    SC: gl.constexpr = CC * (32 // (128 // CR)) * W  # columns per column-side strip
    pid_c = gl.program_id(0)
    pid_r = gl.program_id(1)
    batch = gl.program_id(2).to(gl.int64)
    r0 = pid_r * 128
    c0 = pid_c * 128
    x_b = x_ptr + batch * (R * C)

    # Row side: 1 x 128 groups along C, strip by strip.
    cols = c0 + gl.arange(0, 128, layout=gl.SliceLayout(0, ROWS))
    tile_amax = gl.zeros([SR], gl.uint32, layout=gl.SliceLayout(1, ROWS))
    for s in gl.static_range(128 // SR):
        rows = r0 + s * SR + gl.arange(0, SR, layout=gl.SliceLayout(1, ROWS))
        inside = (rows[:, None] < R) & (cols[None, :] < C)
        x = gl.load(x_b + rows[:, None] * C + cols[None, :], mask=inside, other=0.0).to(gl.float32)
        amax_bits = gl.max(x.to(gl.uint32, bitcast=True) & 0x7FFFFFFF, axis=1)
        tile_amax = gl.maximum(tile_amax, amax_bits)
        scale = _fp8_scale(amax_bits)
        c, d_s, y, z = _quotient_parts(scale, False)
        codes = _codes(x, c[:, None], d_s[:, None], y[:, None], z[:, None], MBITS)
        gl.store(rv_ptr + batch * (R * CQ) + rows[:, None] * CQ + cols[None, :], codes,
                 mask=(rows[:, None] < R) & (cols[None, :] < CQ))
        gl.store(rs_ptr + batch * (R * (CQ // 128)) + rows * (CQ // 128) + pid_c, scale, mask=rows < R)

    # Column side: x^T along R, 128 x 1 blocks (COL_TILE 1) or the whole tile (COL_TILE 128).
    rows_c = r0 + gl.arange(0, 128, layout=gl.SliceLayout(1, COLS))
    if COL_TILE == 128:
        # One scale for the tile: stored as a scalar, used as a per-column vector (the quotient helper
        # needs tensors with a layout).
        t_bits = gl.max(tile_amax, axis=0)
        gl.store(cs_ptr + batch * (((C + 127) // 128) * (RQ // 128)) + pid_c * (RQ // 128) + pid_r,
                 _fp8_scale(t_bits))
        tc, td_s, ty, tz = _quotient_parts(_fp8_scale(gl.zeros([SC], gl.uint32, layout=gl.SliceLayout(0, COLS))
                                                      + t_bits), False)
        tc, td_s, ty, tz = tc[None, :], td_s[None, :], ty[None, :], tz[None, :]
    for s in gl.static_range(128 // SC):
        cols_c = c0 + s * SC + gl.arange(0, SC, layout=gl.SliceLayout(0, COLS))
        inside = (rows_c[:, None] < R) & (cols_c[None, :] < C)
        x = gl.load(x_b + rows_c[:, None] * C + cols_c[None, :], mask=inside, other=0.0).to(gl.float32)
        if COL_TILE == 128:
            codes = _codes(x, tc, td_s, ty, tz, MBITS)
        else:
            amax_bits = gl.max(x.to(gl.uint32, bitcast=True) & 0x7FFFFFFF, axis=0)
            scale = _fp8_scale(amax_bits)
            c, d_s, y, z = _quotient_parts(scale, False)
            codes = _codes(x, c[None, :], d_s[None, :], y[None, :], z[None, :], MBITS)
            gl.store(cs_ptr + batch * (C * (RQ // 128)) + cols_c * (RQ // 128) + pid_r, scale, mask=cols_c < C)
        codes = gl.convert_layout(codes, COLS_OUT)
        rows_o = r0 + gl.arange(0, 128, layout=gl.SliceLayout(1, COLS_OUT))
        cols_o = c0 + s * SC + gl.arange(0, SC, layout=gl.SliceLayout(0, COLS_OUT))
        gl.store(cv_ptr + batch * (C * RQ) + cols_o[None, :] * RQ + rows_o[:, None], codes,
                 mask=(cols_o[None, :] < C) & (rows_o[:, None] < RQ))


# ---------------------------------------------------------------------------------------------------------
# Host side.

_INT32_LIMIT = 2**31
_INPUT_DTYPES = ("bfloat16", "float16", "float32")
# Launch configuration per column-side tile (COL_TILE 1: 128 x 1 blocks, 128: 128 x 128): warps, the column
# side's register shape (rows, columns per thread), the row side's columns per thread and a register cap
# (maxnreg, 0: none). Measured on an H100 (2026-11-23, bf16 8192^2, kernel time, `benchmarks/quant_variants.py
# --gluon-variants`; the rate is ideal bytes against an `x * 2` pass; benchmarks/results/
# quant_variants_h100_2026-11-23_session11_*.md): 8 warps, 32 x 1, 32 columns, capped at 80 registers (96
# uncapped: 2 programs per SM, 3 with the cap), 1 x 128 + transposed 118.0 us (0.796x) and 1 x 128 + 128 x 128
# transposed 114.0 us (0.818x), against 124.1 / 125.6 us uncapped, 161.0 / 135.2 us capped at 64 (spills) and
# 141.2 / 117.5 us for 16 x 2, 16 columns uncapped. 2, 4 or 16 warps, 64 row columns and 16 x 4 / 8 x 4 column
# shapes were slower for both (up to 2.4x). Session 13 (after the quotient residual lost an FFMA per element;
# benchmarks/results/quant_fp8_gluon_h100_2026-11-23_session13_variants.md): for 1 x 128 + transposed, 16 x 2
# column tiles with 32 row columns, capped at 80, ran 114.9 us (0.820x) against 117.8-117.9 us (0.799-0.800x)
# for 32 x 1; the 128 x 128 case keeps 32 x 1 (112.7 us, 0.828x). Session 26, stores in runs of 16 (RUN;
# benchmarks/results/quant_decoded_columns_h100_2026-11-24_session26.md), same settings, same run: bf16 1 x 128 +
# transposed 115.0 -> 113.8 us (0.828x), + 128 x 128 transposed 112.6 -> 110.6 us (0.846x); float32 input
# 184.2 -> 163.8 us and 183.0 -> 160.5 us. The other settings tried there stayed within about 2% for bf16.
CONFIGS = {
    1: dict(num_warps=8, column_thread_tile=(16, 2), row_thread_columns=32, maxnreg=80),
    128: dict(num_warps=8, column_thread_tile=(32, 1), row_thread_columns=32, maxnreg=80),
}


def why_not(x_shape: tuple[int, ...], x_dtype, row, col, compute_capability) -> str | None:
    """None when this kernel computes the (row, column) pair of `Side`s for x (..., R, C), else why not."""
    from ..formats import BlockFP8Format

    if compute_capability is None or compute_capability < 90:
        return "needs NVIDIA sm_90+ (Gluon layouts and the sm_89+ fp8 conversion; sm_90 and sm_100 are tested)"
    rf, cf = row.fmt, col.fmt
    if not (isinstance(rf, BlockFP8Format) and rf.tile == (1, 128)):
        return f"row side {rf!r} is not fp8_block (1, 128)"
    if not (isinstance(cf, BlockFP8Format) and cf.tile in ((1, 128), (128, 128)) and cf.element == rf.element):
        return f"column side {cf!r} is not fp8_block (1, 128) or (128, 128) with the row side's element"
    if rf.element.bits != 8:
        return f"element {rf.element!r} is not an 8-bit float"
    if jnp.dtype(x_dtype).name not in _INPUT_DTYPES:
        return f"x dtype {x_dtype} is not one of {_INPUT_DTYPES}"
    r, c = x_shape[-2], x_shape[-1]
    rq, cq = -(-r // TILE) * TILE, -(-c // TILE) * TILE
    if rq * cq >= _INT32_LIMIT:
        return f"a batch element of {r} x {c} (padded {rq} x {cq}) needs 64-bit offsets"
    return None


def preferred(row, col) -> bool:
    """Whether dispatch takes this kernel for a `why_not`-approved pair: always (measured 1.5-1.6x the
    Triton kernel, `CONFIGS`)."""
    del row, col
    return True


def launch(x3, ts, row, col, out_shapes, compute_capability: int, cvt: str = "hw", **config) -> list:
    """Runs the kernel on x3 (B, R, C) for `why_not`-approved sides; ts: unused (fp8 blocks have no tensor
    scale; the Gluon quantizers share one signature); out_shapes: the quantization plan's four (shape,
    dtype) outputs (`quantize_kernels.plan`), which this kernel fills in the same layouts. cvt: "hw" only
    (the sm_89+ fp8 conversion). config: `CONFIGS` keys overriding the column tile's defaults
    (benchmarks/quant_variants.py)."""
    del ts
    if cvt != "hw":
        raise ValueError(f"the Gluon fp8 kernel encodes with the hardware fp8 conversion (cvt 'hw'), got {cvt!r}")
    b, r, c = x3.shape
    rq, cq = -(-r // TILE) * TILE, -(-c // TILE) * TILE
    col_tile = col.fmt.tile[0]
    unknown = set(config) - set(CONFIGS[col_tile])
    if unknown:
        raise ValueError(f"unknown launch settings {sorted(unknown)}; expected some of {sorted(CONFIGS[col_tile])}")
    cfg = {**CONFIGS[col_tile], **config}
    cr, cc = cfg["column_thread_tile"]
    rc = cfg["row_thread_columns"]
    if rc % RUN or 128 % rc or 128 % cr or 32 % (128 // cr):
        raise ValueError(f"a thread holds whole runs of {RUN} columns of a row ({rc} given) and of a 128-row "
                         f"block's rows, which 32 lanes cover ({cr} given)")
    return scratch.scratch_call(
        quantize_fp8_1x128_t_kernel, x3,
        out_shape=[jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in out_shapes],
        grid=(cq // TILE, rq // TILE, b), num_warps=cfg["num_warps"], num_stages=1,
        compute_capability=compute_capability, name="jbs_quantize_fp8_gluon", maxnreg=cfg["maxnreg"],
        R=r, C=c, CQ=cq, RQ=rq, COL_TILE=col_tile, MBITS=row.fmt.element.mbits, CR=cr, CC=cc,
        RC=cfg["row_thread_columns"])
