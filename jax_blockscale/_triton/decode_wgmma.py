"""Decode GEMM on Hopper: the weight decoded straight into wgmma's register operand (Gluon).

Weights mxfp4, nvfp4 or mxfp8 (e4m3 / e5m2) w (N, K) at 2-64 activation rows, with bf16 activations or quantized
ones of the weight's scale family (MX with MX, nvfp4 with nvfp4), one kernel per matmul: a serving step, where
the matmul streams the weight once. Dispatch (backends.KERNEL_TABLE) sends it fp4 weights: bf16 or MX
activations x mxfp4 at 2-64 rows (fp4 ones at 2-32), bf16 activations x nvfp4 at 2-64, nvfp4 x nvfp4 at
2-32 and, from K = 7168, 33-64; and bf16 activations x mxfp8 weights (e4m3, e5m2) at 3-64 rows. Quantized
activations x mxfp8 weights are opt-in: 8-bit MX on both sides measured 0.90-1.21x decode_fp8, which keeps
them; fp4 activations x mxfp8 weights are not measured.

Why another decode kernel (`decode.py` keeps the CUDA-core GEMV, fastest at one row, and the Triton swapped
MMA): its FMAs grow with the rows (the GEMV at 4 rows ran at 32% of a same-size read on an H100), and in
Triton the decoded weight reaches the MMA through a layout conversion in shared memory (the swapped MMA ran
at 1.1-1.5x XLA's bf16 dot at 8-16 rows). Gluon lets the kernel hold the weight in the layout wgmma's A
operand has in registers:

- The weight is the MMA's M side (64 rows per warp group), the activations, padded to 16, 32 or 64 rows, its
  N side (wgmma m64n16k16 / m64n32k16 / m64n64k16, A from registers, B from shared memory). Thread `4g + t`
  of warp `w` holds, for every k16 step, rows `16w + g` and `16w + g + 8` at K slots {2t, 2t+1, 2t+8, 2t+9}.
- The dot product is a sum over K, so K may be relabelled, identically in both operands. `_slots` gives
  thread t of a row quad the t-th 16 bytes of every 64-byte piece of the row (32 consecutive fp4 codes):
  one 16-byte shared-memory load per piece lands exactly in its A fragment, with no ldmatrix and no
  shuffle (the layout conversion compiles to nothing; a CPU test checks the instructions). The activations
  take the same relabelling on their way into shared memory. fp4 at 16 rows: the relabelling also pairs
  the two low (or high) nibbles of adjacent bytes in a slot pair, as the decode produces them, so no
  weight register is re-paired (`_slots(NIBBLES)`; the activations, a quarter as many, are instead).
- The weight streams through a ring of `STAGES` chunks in shared memory filled by cp.async (16 bytes per
  thread and row piece; 4-byte copies for the scales), one commit group per chunk.
- fp4 codes become bf16 by bit placement (`decode._fp4_pair_ptx`), then exact bf16 multiplies: mxfp4 two
  per pair (the e2m1 bias 2**126, then the e8m0 scale: their product leaves bf16's range past 2**1); nvfp4
  one, by the e4m3 scale times 2**(126 - NVFP4_FOLD_LOG2), which bf16 always holds, the fp32 sums then
  times 2**NVFP4_FOLD_LOG2 (and the tensor scales). 8-bit codes: the hardware's exact conversion to
  f16x2, widened to bf16, one bf16 multiply by the scale (`_fp8_quad_ptx`). 16-byte vectors hold 32 fp4 or
  16 8-bit codes; `_slots` relabels K for either.
- Quantized activations are decoded with their scales while they are staged into shared memory, once per
  program (`_stage_activations`), by the weight's instructions: the activations are tiny next to the weight,
  but every program decodes them again (at 64 rows as many codes per program as the weight's). A split's
  activations are staged whole up to `STAGED_BYTES` (two chunks at 16 rows, K = 1024 at 32, 512 at 64);
  past it they stream through a 2-chunk ring beside the weight's (STREAM_X): chunk i + 1's loads issued
  before chunk i's MMA, which stays in flight (asynchronous wgmma) while they are stored.
- Grid (cdiv(N, 64), SPLIT_K), `default_config`: few, long programs, 2 K splits (from K = 1024 at 2-32 rows,
  4096 at 64) of 256-code chunks (128 at 64 rows) through a 2-chunk ring, the activations streamed. At 16
  rows this replaced ~6 short programs per SM of 2 staged chunks each (1.03-1.48x faster, session 30);
  deeper rings, 1 or 4 splits and two warp groups measured slower (`_SPLIT`).

Split-K (as decode.py): default bitwise deterministic: each split stores its fp32 partial into a
workspace, bumps a per-tile counter (acq_rel), and the program that arrives last sums the partials in split
order and writes the output. `atomic_split_k`: fp32 atomics into a zeroed accumulator instead, then the
last program casts (not bitwise reproducible). Counters and the atomic accumulator are zeroed by the
custom call (a memset beside the kernel, no XLA kernel).

What bounds it (H100, Nsight Compute, 7168 x 4096, 16 rows, session 30): latency, not DRAM or issue. The
224 programs leave 1.7 warps per scheduler (117 registers; 0.42 waves), each issuing once per 3.8 cycles:
0.45 instructions per cycle and scheduler, DRAM at 30% of peak. With the decode's instructions removed
altogether (a control run, wrong results, the staged configuration of session 16) the kernel ran only
1.03-1.19x faster, so fewer instructions per element cannot reach issue #12's 75% of a same-size read (the
kernel: 46-71%). Nor did more bytes in flight or better-placed ones (session 31,
benchmarks/results/decode_wgmma_structure_h100_2026-11-24_session31.md): a TMA-fed weight ring ran 0.76-0.93x
this cp.async one, slots of 2-4 chunks 0.64-1.03x, a tile-major weight within 5%, stream-K persistent programs
0.63-0.96x, and all of those together (decode_fp8's structure with this decode) 0.55-0.85x; with neither
activation loads nor decode (wrong results) this structure reads at 54-75%.

At 64 rows (bf16 x mxfp4, 1.23-1.45x XLA's bf16 dot, 28-32% of a same-size read): every program re-reads
all 64 activation rows of its split from L2 for its 64 weight rows, 4 bytes of activations per weight byte
(58.7 MB at 7168 x 4096 against a 15.6 MB weight), besides the wgmma work itself (3.8 GFLOP, ~4 us at the
H100's dense bf16 peak). Those re-reads are not what bounds it (session 34,
benchmarks/results/decode_wgmma_rows64_bounds_h100_2026-11-25_session34.md): two m64 tiles per warp group
(half the re-reads) ran 0.81-0.92x, activations two chunks ahead 0.75-0.96x, and a stmatrix store of the
activations (a K relabelling with 3x fewer bank conflicts) 0.91-0.99x. Nsight Compute at 7168 x 4096: L2 at
27% of peak, L1 66%, 1.7 warps per scheduler issuing in 34% of cycles, 24% of SM cycles idle (224 programs
on 132 SMs): latency inside each program's instruction stream, with too few programs per SM.

Hopper only: wgmma is sm_90a's instruction (sm_100 keeps decode.py, whose Triton source lowers to tcgen05).
Gluon kernels do not run in Triton's interpreter: tests/test_gpu_decode_wgmma.py checks results on the GPU
against the jnp reference, tests/test_lowering_decode_wgmma.py the dispatch and instructions on the CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from . import launch as scratch
from .decode import _FP4_FOLDED_PTX, _FP4_PTX, e8m0_to_bf16, split_k_workspace, tensor_scale_operands
from .problem import HOPPER_SMS, NVFP4, OUT_DTYPES, GemmProblem, TileConfig, check_operands

# Weights: fp4 (mxfp4, nvfp4) and 8-bit MX (mxfp8 e4m3 / e5m2). Activations: bf16, or quantized ones of the
# weight's scale family (MX 8-bit or fp4 with an MX weight, nvfp4 with nvfp4), decoded once per program.
_W_KINDS = ("e2m1", NVFP4, "e4m3", "e5m2")
_MX_X_KINDS = ("e4m3", "e5m2", "e2m1")
SUPPORTED: frozenset[tuple[str, str]] = frozenset(
    {("bf16", w) for w in _W_KINDS} | {(x, w) for x in _MX_X_KINDS for w in _W_KINDS if w != NVFP4} | {(NVFP4, NVFP4)})
# The activations padded to wgmma's N side. At 64 rows a program streams them through a 2-chunk ring
# (`streams_activations`): staged whole, they forced 8-16 K splits, 1.2-2.1x slower than the upcast path
# (benchmarks/results/decode_wgmma_rows17_64_h100_2026-11-23_session12.md); streamed, 2 splits run 1.2-1.4x
# faster than it (H100, bf16 x mxfp4, session 29).
BLOCK_MS = (16, 32, 64)
ROWS_PER_WARP = 16  # weight rows per warp: a warp group's m64 tile is four warps' 16
_INT32_LIMIT = 2**31


def _fp8_quad_ptx(kind: str) -> str:
    """PTX for `inline_asm_elementwise(pack=4)`: 4 e4m3 / e5m2 codes in $2 and their 4 bf16 scales in $3
    (codes 0, 1) and $4 (codes 2, 3) -> the 4 scaled values as bf16 in $0 (0, 1) and $1 (2, 3).

    cvt to f16x2 is exact (every e4m3 / e5m2 value is an f16 value) and one instruction per pair; f16 to f32
    and the pack to bf16x2 are exact again (at most 4 significant bits); the scale multiply is exact where the
    product stays in bf16's range (module docstring). Triton's own widening ran the multiply in f32: 3
    instructions per element against these 2.5 (sm_90 SASS)."""
    return ("{\n.reg .b16 c01, c23, h0, h1, h2, h3;\n.reg .b32 p01, p23, z;\n.reg .f32 f0, f1, f2, f3;\n"
            "mov.b32 z, 0x80008000;\n"  # -0.0 x2: the fma's exact addend (bf16x2 fma has no immediates)
            "mov.b32 {c01, c23}, $2;\n"
            f"cvt.rn.f16x2.{kind}x2 p01, c01;\ncvt.rn.f16x2.{kind}x2 p23, c23;\n"
            "mov.b32 {h0, h1}, p01;\nmov.b32 {h2, h3}, p23;\n"
            "cvt.f32.f16 f0, h0;\ncvt.f32.f16 f1, h1;\ncvt.f32.f16 f2, h2;\ncvt.f32.f16 f3, h3;\n"
            "cvt.rn.bf16x2.f32 p01, f1, f0;\ncvt.rn.bf16x2.f32 p23, f3, f2;\n"
            "fma.rn.bf16x2 $0, p01, $3, z;\nfma.rn.bf16x2 $1, p23, $4, z;\n}")


_E4M3_PTX = gl.constexpr(_fp8_quad_ptx("e4m3"))
_E5M2_PTX = gl.constexpr(_fp8_quad_ptx("e5m2"))


@gluon.constexpr_function
def _pow2(n: int) -> list[int]:
    """1, 2, 4, ... below n (a power of two): the bases of a linear layout dimension of size n."""
    return [1 << i for i in range(n.bit_length() - 1)]


@gluon.constexpr_function
def _weight_layout(num_warps, chunk_bytes, group_bytes, tiles=1):
    """(rows, groups, bytes) layout of a (16 * num_warps * tiles, chunk_bytes / group_bytes, group_bytes)
    chunk of weight bytes: thread 4g + t of warp w holds rows 16w + g and 16w + g + 8 (of each of `tiles`
    m16 tiles, 16 * num_warps rows apart: benchmarks/decode_mma_f16.py takes several per warp) and, of each
    64-byte piece of their bytes, the t-th 16 bytes (one vector; a row quad's load covers 64 contiguous
    bytes), i.e. wgmma's A fragment of those rows after `_slots`."""
    def at(byte):  # a byte offset within the row's chunk -> (group, byte in group)
        return [0, byte // group_bytes, byte % group_bytes]
    regs = ([at(b) for b in _pow2(16)] + [at(64 * h) for h in _pow2(chunk_bytes // 64)] + [[8, 0, 0]]
            + [[16 * num_warps * i, 0, 0] for i in _pow2(tiles)])
    lanes = [at(16), at(32)] + [[r, 0, 0] for r in (1, 2, 4)]
    warps = [[16 * w, 0, 0] for w in _pow2(num_warps)]
    return gl.DistributedLinearLayout(regs, lanes, warps, [],
                                      [16 * num_warps * tiles, chunk_bytes // group_bytes, group_bytes])


@gluon.constexpr_function
def _bytes_layout(num_warps, chunk_bytes, tiles=1):
    """`_weight_layout` as a 2D (rows, chunk_bytes) layout: what a thread reads from the ring."""
    regs = ([[0, b] for b in _pow2(16)] + [[0, 64 * h] for h in _pow2(chunk_bytes // 64)] + [[8, 0]]
            + [[16 * num_warps * i, 0] for i in _pow2(tiles)])
    lanes = [[0, 16], [0, 32], [1, 0], [2, 0], [4, 0]]
    warps = [[16 * w, 0] for w in _pow2(num_warps)]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [16 * num_warps * tiles, chunk_bytes])


@gluon.jit
def _slots(v, R: gl.constexpr, CHUNK: gl.constexpr, V: gl.constexpr, NIBBLES: gl.constexpr = False):
    """(R, CHUNK) in true K order -> (R, CHUNK) in wgmma slot order, for V codes per 16-byte vector (32 fp4,
    16 8-bit): quarter t of each 4V-code piece h (k = 4V h + V t + 4 j + 2 eh + el) becomes slots
    {2t, 2t + 1, 2t + 8, 2t + 9} of k16 step (V / 4) h + j. Reshapes and a permute only: with the layouts
    above, no data moves. NIBBLES (fp4 weights, 16 rows): eh and el trade places (slots 2t + eh + 8 el), so
    that a slot pair holds codes 4j and 4j + 2 (the low nibbles of bytes 2j, 2j + 1), as the PTX decode pairs
    them: the weight's registers need no re-pairing, the activations' do (2 byte permutes per 4 values)."""
    v = gl.reshape(v, [R, CHUNK // (4 * V), 4, V // 4, 2, 2])
    if NIBBLES:
        v = gl.permute(v, [0, 1, 3, 5, 2, 4])   # (h, j, el, t, eh)
    else:
        v = gl.permute(v, [0, 1, 3, 4, 2, 5])   # (h, j, eh, t, el)
    return gl.reshape(v, [R, CHUNK])            # slot = 16 ((V / 4) h + j) + 8 eh + 2 t + el (NIBBLES: swapped)


# nvfp4 weights: the e2m1 bias 2**126 times the e4m3 scale (at most 448 < 2**9) overflows bf16, 2**(126 -
# NVFP4_FOLD_LOG2) times it does not, and code x scale x 2**-8 (>= 2**-18) stays exact: one bf16 multiply per
# pair instead of two; the kernel multiplies its fp32 sums by 2**NVFP4_FOLD_LOG2 (exact: a power of two) instead.
# H100, bf16 x nvfp4 at the 16-row default: with the re-pairing (`_slots`) 1.05-1.07x (mxfp4, re-pairing alone:
# 1.03-1.07x); 32 rows 0.98-0.99x, 64 rows 1.01-1.02x (session 30). mxfp4 keeps two multiplies: 2**126 times an
# e8m0 scale leaves bf16 past 2**1 (checking the scales per program cost more than it saved).
NVFP4_FOLD_LOG2 = gl.constexpr(8)


@gluon.jit
def _scales_bf16(raw, KIND: gl.constexpr):
    """Raw group scales -> bf16, exactly: e4m3 codes for nvfp4 (a subset of bf16), e8m0 for MX."""
    if KIND == "nvfp4":
        s = raw.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16)
    else:
        s = e8m0_to_bf16(raw)
    return s


@gluon.jit
def _scaled_codes(codes, s, KIND: gl.constexpr, PTX: gl.constexpr = _FP4_PTX):
    """Codes times their bf16 scales s (one per code byte), in bf16: fp4 bytes (..., bytes) -> (..., bytes, 2),
    the even code (the low nibble) first, by `PTX` (`decode._fp4_pair_ptx`: bit placement, then the bias and
    scale multiplies, or one folded multiply); e4m3 / e5m2 (...) -> (...), by the hardware's conversion to
    f16x2, widened to bf16, then one exact bf16 multiply (`_fp8_quad_ptx`)."""
    if KIND == "e2m1" or KIND == "nvfp4":
        lo, hi = gl.inline_asm_elementwise(PTX, "=r,=r,=r,=r,r,r,r", [codes, s], dtype=(gl.bfloat16, gl.bfloat16),
                                           is_pure=True, pack=4)
        v = gl.join(lo, hi)
    else:
        ptx: gl.constexpr = _E4M3_PTX if KIND == "e4m3" else _E5M2_PTX
        v = gl.inline_asm_elementwise(ptx, "=r,=r,r,r,r", [codes.to(gl.uint8, bitcast=True), s], dtype=gl.bfloat16,
                                      is_pure=True, pack=4)
    return v


@gluon.jit
def _decode(packed, raw_s, W_KIND: gl.constexpr):
    """Weight bytes (R, groups, bytes) and their raw scales (R, groups) -> the codes' scaled values in bf16:
    fp4 (R, groups, bytes, 2), the even code (the low nibble) first; 8-bit codes (R, groups, bytes). Either
    is (R, CHUNK) in K order once reshaped. Exact (module docstring); nvfp4's values come out
    2**-NVFP4_FOLD_LOG2 times the true ones (the kernel scales its fp32 sums back)."""
    s = _scales_bf16(raw_s, W_KIND)
    if W_KIND == "nvfp4":  # exact: a power of two times an e4m3 value stays a bf16 normal (<= 448 * 2**118)
        s = s * 2.0 ** (126 - NVFP4_FOLD_LOG2)
    s = gl.broadcast(s[:, :, None], packed)[0]
    return _scaled_codes(packed, s, W_KIND, _FP4_FOLDED_PTX if W_KIND == "nvfp4" else _FP4_PTX)


@gluon.jit
def _stage_activations(x_ptr, xs_ptr, k0, M: gl.constexpr, K: gl.constexpr, BM: gl.constexpr,
                       CHUNK: gl.constexpr, X_KIND: gl.constexpr, XL: gl.constexpr):
    """Activation rows 0..BM-1 (rows >= M zero) at K offset k0 as (BM, CHUNK) bf16 in K order. Quantized
    kinds are decoded with their scales here, once per program, by the weight's instructions (`_decode`):
    fp4 codes by bit placement, 8-bit ones by the hardware's conversion, then one bf16 multiply by the
    scale (e8m0 for MX, e4m3 for nvfp4, whose tensor scale multiplies the fp32 result). Every code times
    its scale is exact in bf16 unless it leaves bf16's range, where one rounding of the exact product
    remains, as in an fp32 product rounded to bf16: the same bits."""
    xm = gl.arange(0, BM, layout=gl.SliceLayout(1, XL))
    xk = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, XL))
    in_m = xm[:, None] < M
    if X_KIND == "bf16":
        x = gl.load(x_ptr + xm[:, None] * K + k0 + xk[None, :], mask=in_m, other=0.0)
    elif X_KIND == "e2m1" or X_KIND == "nvfp4":
        GROUP: gl.constexpr = 16 if X_KIND == "nvfp4" else 32
        # (BM, CHUNK / 2) bytes, 4 per thread: the 8 codes XL gives a thread, once the nibbles are joined.
        XB: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [gl.num_warps(), 1], [1, 0])
        bm = gl.arange(0, BM, layout=gl.SliceLayout(1, XB))
        bc = gl.arange(0, CHUNK // 2, layout=gl.SliceLayout(0, XB))
        # Rows past M: code 0 (+0) times row M - 1's scale (no float8 `other` exists), a column of the
        # product that is never stored.
        byte = gl.load(x_ptr + bm[:, None] * (K // 2) + k0 // 2 + bc[None, :], mask=bm[:, None] < M, other=0)
        raw = gl.load(xs_ptr + gl.minimum(bm, M - 1)[:, None] * (K // GROUP) + (k0 + 2 * bc[None, :]) // GROUP)
        x = gl.reshape(_scaled_codes(byte, _scales_bf16(raw, X_KIND), X_KIND), [BM, CHUNK])  # byte j: codes 2j, 2j + 1
    else:  # e4m3 / e5m2 codes, e8m0 scales per 32
        rows = gl.minimum(xm, M - 1)[:, None]  # rows past M read row M - 1 and are zeroed below
        codes = gl.load(x_ptr + rows * K + k0 + xk[None, :])
        raw = gl.load(xs_ptr + rows * (K // 32) + (k0 + xk[None, :]) // 32)
        v = _scaled_codes(codes, _scales_bf16(raw, X_KIND), X_KIND)
        x = gl.where(in_m, v, 0.0)
    return x


@gluon.jit
def _copy_chunk(w_ptr, s_ptr, w_ring, s_ring, c, n0, k_begin, R: gl.constexpr, N: gl.constexpr, K: gl.constexpr,
                GROUP: gl.constexpr, CHUNK: gl.constexpr, EPB: gl.constexpr, NC: gl.constexpr, STAGES: gl.constexpr,
                CL: gl.constexpr, SCL: gl.constexpr, WIDE: gl.constexpr):
    """cp.async of chunk c of the program's split (if it has one: c < NC) into ring slot c % STAGES: weight
    bytes (R, CHUNK / EPB) and raw scales (R, CHUNK / GROUP) of rows n0 .. n0 + R - 1. Rows past N read row
    N - 1; their results are never stored. One commit group per call, empty past the last chunk, so that
    wait_group counts chunks."""
    if c < NC:
        k0 = k_begin + c * CHUNK
        rows = gl.minimum(n0 + gl.arange(0, R, layout=gl.SliceLayout(1, CL)), N - 1)
        if WIDE:
            rows = rows.to(gl.int64)
        cols = gl.arange(0, CHUNK // EPB, layout=gl.SliceLayout(0, CL))
        async_copy.async_copy_global_to_shared(w_ring.index(c % STAGES),
                                               w_ptr + (rows[:, None] * (K // EPB) + k0 // EPB + cols[None, :]))
        s_rows = gl.minimum(n0 + gl.arange(0, R, layout=gl.SliceLayout(1, SCL)), N - 1)
        s_cols = gl.arange(0, CHUNK // GROUP, layout=gl.SliceLayout(0, SCL))
        async_copy.async_copy_global_to_shared(s_ring.index(c % STAGES),
                                               s_ptr + (s_rows[:, None] * (K // GROUP) + k0 // GROUP + s_cols[None, :]))
    async_copy.commit_group()


@gluon.jit
def split_k_epilogue(acc, tile, pid_k, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, M: gl.constexpr,
                     N: gl.constexpr, SPLIT_K: gl.constexpr, ATOMIC: gl.constexpr, MMA: gl.constexpr):
    """Stores one N tile's (R, BM) fp32 partial transposed into out (M, N), after the split-K reduction of
    the module docstring (ordered workspace, or fp32 atomics when ATOMIC); also decode_fp8.py's. The Gluon twin
    of `decode.store_or_reduce`, which a Gluon kernel cannot call: it builds tensors without layouts."""
    R: gl.constexpr = acc.shape[0]
    BM: gl.constexpr = acc.shape[1]
    alpha = gl.load(a_ts_ptr) * gl.load(b_ts_ptr)
    on = tile * R + gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, MMA))
    offs = om[None, :] * N + on[:, None]
    mask = (om[None, :] < M) & (on[:, None] < N)
    if SPLIT_K == 1:
        gl.store(out_ptr + offs, (acc * alpha).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        if ATOMIC:
            gl.atomic_add(ws_ptr + offs, acc, mask=mask, sem="relaxed")
        else:
            gl.store(ws_ptr + pid_k * (M * N) + offs, acc, mask=mask)
        # Every thread's partial is written before one thread's release of the counter (bar.sync, then a
        # gpu-scope acq_rel atomic, cumulative under PTX's memory model); the last program's acquire orders
        # its reads after all of them.
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            if ATOMIC:
                total = gl.load(ws_ptr + offs, mask=mask, other=0.0, cache_modifier=".cg")
            else:
                total = gl.zeros([R, BM], gl.float32, layout=MMA)
                for s in range(SPLIT_K):  # fixed order: bitwise the same on every run
                    total += gl.load(ws_ptr + s * (M * N) + offs, mask=mask, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + offs, (total * alpha).to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def decode_wgmma_kernel(w_ptr, s_ptr, x_ptr, xs_ptr, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr,
                        M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr,
                        W_KIND: gl.constexpr, X_KIND: gl.constexpr, CHUNK: gl.constexpr, SPLIT_K: gl.constexpr,
                        STAGES: gl.constexpr, ATOMIC: gl.constexpr, WIDE: gl.constexpr, STREAM_X: gl.constexpr = False):
    """out (M, N) = a_ts * b_ts * decode(x (M, K), xs) @ decode(w (N, K / epb), s (N, K / group)).T. xs: the
    activations' scales (unread for bf16 ones). ws: (SPLIT_K, M, N) fp32 partials, or a zeroed (M, N) fp32
    accumulator (ATOMIC); count: zeroed int32 per N tile; both unused when SPLIT_K == 1. Grid
    (cdiv(N, 16 * num_warps), SPLIT_K); K a multiple of CHUNK * SPLIT_K. STREAM_X: the activations go through
    a 2-chunk ring beside the weight's (`streams_activations`) instead of being staged for the whole split."""
    W: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 16 * W                      # weight rows per program: one m64 tile per warp group
    KS: gl.constexpr = K // SPLIT_K
    NC: gl.constexpr = KS // CHUNK
    FP4: gl.constexpr = W_KIND == "e2m1" or W_KIND == "nvfp4"
    EPB: gl.constexpr = 2 if FP4 else 1           # codes per weight byte
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    CB: gl.constexpr = CHUNK // EPB               # bytes of a weight row per chunk
    # fp4 at 16 rows: K relabelled so that the decode's bf16 pairs are A-fragment registers as they come (no
    # re-pairing of the weight; the activations, a quarter as many elements, take it instead). H100, bf16 x
    # mxfp4 at the 16-row default: 1.03-1.07x; at 32 and 64 rows, where the activations are half as many and
    # as many as the weight's elements, 0.94-0.97x (session 30, the results file named at `STAGED_BYTES`).
    NIBBLES: gl.constexpr = FP4 and BM == 16
    L3: gl.constexpr = _weight_layout(W, CB, GROUP // EPB)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BM, 16])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [W, 1], [1, 0])
    XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    # cp.async: 16 bytes per thread of a row's codes; >= 4 bytes per copy, so 4 scales (chunk / group >= 4).
    CL: gl.constexpr = gl.BlockedLayout([1, 16], [32 // (CB // 16), CB // 16], [W, 1], [1, 0])
    SCL: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (CHUNK // GROUP // 4), CHUNK // GROUP // 4], [W, 1], [1, 0])
    # The ring's 16-byte vectors swizzled across 8 rows: a row quad's loads hit distinct banks.
    WR: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, order=[1, 0])
    SR: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    n0 = pid_n * R
    k_begin = pid_k * KS

    w_ring = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [STAGES, R, CB], WR)
    s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, R, CHUNK // GROUP], SR)
    for c in gl.static_range(STAGES - 1):  # in flight while the activations are staged
        _copy_chunk(w_ptr, s_ptr, w_ring, s_ring, c, n0, k_begin, R, N, K, GROUP, CHUNK, EPB, NC, STAGES, CL, SCL,
                    WIDE)

    # This split's activations, decoded and relabelled like the weight, in shared memory: (NC, BM, CHUNK), or,
    # streamed, chunk i in slot i % 2 of a (2, BM, CHUNK) ring, chunk i + 1's global loads issued before
    # chunk i's MMA and stored after it.
    if STREAM_X:
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BM, CHUNK], XS)
        xv = _stage_activations(x_ptr, xs_ptr, k_begin, M, K, BM, CHUNK, X_KIND, XL)
        x_smem.index(0).store(_slots(xv, BM, CHUNK, 16 * EPB, NIBBLES))
    else:
        x_smem = gl.allocate_shared_memory(gl.bfloat16, [NC, BM, CHUNK], XS)
        for c in gl.static_range(NC):
            xv = _stage_activations(x_ptr, xs_ptr, k_begin + c * CHUNK, M, K, BM, CHUNK, X_KIND, XL)
            x_smem.index(c).store(_slots(xv, BM, CHUNK, 16 * EPB, NIBBLES))
    fence_async_shared()

    acc = gl.zeros([R, BM], gl.float32, layout=MMA)
    for i in range(NC):
        if STREAM_X:  # the next chunk's activations (the last program re-reads its own: an L1 hit)
            xv = _stage_activations(x_ptr, xs_ptr, k_begin + gl.minimum(i + 1, NC - 1) * CHUNK, M, K, BM, CHUNK,
                                    X_KIND, XL)
        async_copy.wait_group(STAGES - 2)  # chunk i's group has landed (this thread's copies) ...
        gl.thread_barrier()                # ... and every thread's; the slot read last iteration is free
        if STAGES - 1 < NC:  # else the prologue issued every chunk (and Triton 3.6 fails on the dead copies)
            _copy_chunk(w_ptr, s_ptr, w_ring, s_ring, i + STAGES - 1, n0, k_begin, R, N, K, GROUP, CHUNK, EPB, NC,
                        STAGES, CL, SCL, WIDE)
        else:
            async_copy.commit_group()  # an empty group: wait_group counts one group per chunk
        packed = gl.reshape(w_ring.index(i % STAGES).load(_bytes_layout(W, CB)), [R, CHUNK // GROUP, GROUP // EPB])
        raw_s = s_ring.index(i % STAGES).load(gl.SliceLayout(2, L3))
        w = gl.reshape(_decode(gl.convert_layout(packed, L3), raw_s, W_KIND), [R, CHUNK])
        a = gl.convert_layout(_slots(w, R, CHUNK, 16 * EPB, NIBBLES), A_OP)  # the layouts agree: no data moves
        if STREAM_X:
            # In flight while the next chunk's activations are stored and its weight decoded (at 64 rows 0.5-7%
            # faster than a synchronous wgmma with bf16 activations, within 1% with quantized ones); waiting for
            # one outstanding retires chunk i - 1's, the last reader of the slot stored next.
            acc = warpgroup_mma(a, x_smem.index(i % 2).permute((1, 0)), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a))[0]
            x_smem.index((i + 1) % 2).store(_slots(xv, BM, CHUNK, 16 * EPB, NIBBLES))
            fence_async_shared()
        else:
            acc = warpgroup_mma(a, x_smem.index(i).permute((1, 0)), acc)
    if STREAM_X:
        acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
    async_copy.wait_group(0)
    if W_KIND == "nvfp4":
        acc = acc * (2.0 ** NVFP4_FOLD_LOG2)  # exact: what `_decode`'s folded scales left out
    split_k_epilogue(acc, pid_n, pid_k, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, M, N, SPLIT_K, ATOMIC, MMA)


# ---------------------------------------------------------------------------------------------------------
# Host side.

CHUNKS = (128, 256)  # K codes per step: 64 or 128 bytes of each weight row (16 or 32 per thread), both GPU-tested
# Per padded row count, the most bytes of activations (block_m x K / split_k x 2) a program stages whole in
# shared memory before its first MMA; past it they stream through a 2-chunk ring (`streams_activations`).
# H100, kernel time, 2026-11-24 (benchmarks/results/decode_wgmma_rows16_h100_2026-11-24_session30.md): at 16
# rows, 2 splits streamed beat the same splits staged (32-64 KiB) by 1.03-1.07x (bf16 x mxfp4, 7168 x 2048 /
# 4096; 4 splits by 1.07x, bf16 x nvfp4 at 7168 x 4096, across two runs), so 16 rows stage at most two
# 256-code chunks; at 32 rows 2 splits of K = 2048 staged (64 KiB) beat streamed by 1.01-1.03x; at 64 rows
# staging forced 8-16 splits, 1.2-2.1x slower than the upcast path (session 12).
STAGED_BYTES = {16: 16 * 1024, 32: 64 * 1024, 64: 64 * 1024}
MAX_STAGES = 8
# The weight ring beside the staged activations (the H100 gives a program up to 227 KiB): 8 x 16 KiB at 128
# rows of 256 fp4 codes, or 4 stages of 256 8-bit codes there.
RING_BYTES = 128 * 1024
# `_SPLIT` K splits of the largest chunk through a 2-chunk ring, from the K that gives each split `_MIN_CHUNKS`
# chunks or more (else one split): few, long programs, the activations streamed. H100, kernel time, bf16 x
# fp4, interleaved rounds:
# - 16 rows, 2026-11-24 (session 30, benchmarks/results/decode_wgmma_rows16_h100_2026-11-24_session30.md): 2
#   streamed splits ran 1.03-1.48x faster than session 16's ~768 programs of 2 staged chunks each (7168 x 4096
#   bf16 x mxfp4: 13.20 against 14.34 us; 28672 x 8192: 60.58 against 89.08). Against 2 splits: 1 split
#   0.58-0.98x, 4 splits 0.92-1.05x (bf16 x nvfp4: 1.05x at 8192^2, 0.92x at 7168 x 2048), 3-4 stages
#   0.88-0.98x, two warp groups 0.77-0.89x. Quantized activations: mxfp8 x mxfp4 1.00-1.10x, nvfp4 x nvfp4
#   0.97-1.05x.
# - 32 rows (session 29, run 5 of benchmarks/results/decode_wgmma_rows64_h100_2026-11-24_session29.md): 2 splits
#   of 256-code chunks beat the staged 4-8 splits by 1.10-1.49x (17.67 against 21.83 us at 7168 x 4096).
# - 64 rows (session 29): 2 splits of 128-code chunks beat 1 by 1.03-1.25x and 4 by 1.09-1.14x (7168 x 4096:
#   23.6 against 25.4 and 26.9 us; 8192 x 8192: 40.2 against 48.5 and 43.9), 256-code chunks by 1.01-1.15x,
#   3 stages by 1.03-1.08x, two warp groups by 1.02-1.24x; at K = 2048 one split beat two (13.5 against
#   14.8 us).
_SPLIT = 2
_MIN_CHUNKS = 2
# Per padded row count: the largest chunk (at 64 rows 256-code chunks cost registers: 211 per thread against
# 146) and the least K for `_SPLIT` splits (`_MIN_CHUNKS` chunks each at 2-32 rows; at 64 one split beat two at
# K = 2048).
_CHUNK_AND_SPLIT_K = {16: (256, _SPLIT * _MIN_CHUNKS * 256), 32: (256, _SPLIT * _MIN_CHUNKS * 256), 64: (128, 4096)}
# 8-bit weights at 16 padded rows, K <= 4096 and at most one 64-row tile per SM: one program per tile through a
# 3-chunk ring (256 codes are 256 bytes a row, twice fp4's). H100, 2026-11-25, bf16 x mxfp8, interleaved rounds
# at 4 / 16 rows (benchmarks/results/mxfp8_weights_dispatch_h100_2026-11-25_session35.md, runs 4-5): against 2
# stages and 2 splits, 7168 x 2048 8.70 / 8.96 against 9.56 / 10.21 us, 7168 x 4096 14.74 / 15.46 against
# 14.98 / 15.95. Not elsewhere: at K = 7168 and 8192 (2 splits) 3 stages ran 0.99-1.04x, and at 28672 x 8192
# (448 tiles) 0.91-0.97x.
_8BIT_STAGES, _8BIT_MAX_K = 3, 4096


def check_rows_and_k_steps(p: GemmProblem, config: TileConfig, kernel: str, block_ms: tuple[int, ...],
                           block_ks: tuple[int, ...], k_step: str) -> None:
    """The Gluon decode kernels' shared rules (here and decode_fp8.py): the activation rows padded to a
    `block_m` of `block_ms` (wgmma's N side), `block_k` (what `k_step` names) one of `block_ks`, and K a
    multiple of block_k * split_k."""
    rows = p.batch * p.m
    if config.block_m not in block_ms or rows > config.block_m:
        raise ValueError(f"{kernel} pads the activation rows to block_m in {block_ms} (wgmma's N): "
                         f"rows={rows}, block_m={config.block_m}")
    if config.block_k not in block_ks:
        raise ValueError(f"block_k ({k_step}) must be one of {block_ks}, got {config.block_k}")
    if config.split_k < 1 or p.k % (config.block_k * config.split_k):
        raise ValueError(f"K ({p.k}) must be a multiple of block_k * split_k ({config.block_k} x {config.split_k})")


def check_config(p: GemmProblem, config: TileConfig) -> None:
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the wgmma decode kernel takes mxfp4 / nvfp4 / mxfp8 weights with bf16 activations or "
                         f"quantized ones of the weight's scale family (MX with MX, nvfp4 with nvfp4), got "
                         f"{p.a_kind} x {p.b_kind}")
    if p.b_batched:
        raise ValueError("the wgmma decode kernel needs an unbatched weight")
    check_rows_and_k_steps(p, config, "the wgmma decode kernel", BLOCK_MS, CHUNKS, "the chunk of K per step")
    if config.num_warps not in (4, 8) or config.block_n != ROWS_PER_WARP * config.num_warps:
        raise ValueError(f"block_n must be {ROWS_PER_WARP} weight rows per warp with 4 or 8 warps (one or two "
                         f"m64 warp groups), got block_n={config.block_n}, num_warps={config.num_warps}")
    if not 2 <= config.num_stages <= MAX_STAGES:
        raise ValueError(f"num_stages (the weight ring's chunks) must be in [2, {MAX_STAGES}], got {config.num_stages}")
    ring = config.num_stages * config.block_n * config.block_k // p.elements_per_byte("b")
    if ring > RING_BYTES:
        raise ValueError(f"the weight ring ({config.num_stages} stages x {config.block_n} rows x {config.block_k} codes) "
                         f"takes {ring // 1024} KiB of shared memory, over {RING_BYTES // 1024}; lower num_stages")


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """64 weight rows (4 warps) through a 2-chunk ring, the activations padded to 16, 32 or 64 rows: `_SPLIT`
    K splits where K gives each `_MIN_CHUNKS` chunks (64 rows: K >= 4096), else one; 256-code chunks (128 at
    64 rows, or where K is no multiple of 256). 8-bit weights at 16 padded rows up to K = 4096, where N has at
    most one tile per SM: a 3-chunk ring, one split. Deterministic split-K."""
    del target
    block_m = next(b for b in BLOCK_MS if b >= p.batch * p.m)
    largest_chunk, min_k = _CHUNK_AND_SPLIT_K[block_m]
    chunk = min(256 if p.k % 256 == 0 else 128, largest_chunk)
    split = _SPLIT if p.k >= min_k and p.k % (chunk * _SPLIT) == 0 else 1
    stages = 2
    if p.b_kind in ("e4m3", "e5m2") and block_m == 16 and p.k <= _8BIT_MAX_K and triton.cdiv(p.n, 64) <= HOPPER_SMS:
        stages, split = _8BIT_STAGES, 1
    return TileConfig(block_m=block_m, block_n=64, block_k=chunk, group_m=1, num_warps=4, num_stages=stages,
                      split_k=split, kernel="decode_wgmma")


def streams_activations(p: GemmProblem, config: TileConfig) -> bool:
    """Whether a program streams its activations through a 2-chunk ring (STREAM_X) rather than staging its whole
    split at once: where the split's activations exceed `STAGED_BYTES` for its padded rows."""
    return config.block_m * (p.k // config.split_k) * 2 > STAGED_BYTES[config.block_m]


# The primitive passes nvfp4 tensor scales separately (`a_ts`, `b_ts`), multiplied in the kernel.
TAKES_TENSOR_SCALES = True


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int, a_ts=None, b_ts=None) -> jax.Array:
    """The decode GEMM (module docstring); returns (p.batch, p.m, p.n) of p.out_dtype. `alpha` (1,) is used
    when the tensor scales `a_ts` / `b_ts` (scalars, multiplied in the kernel) are not given."""
    if compute_capability != 90:
        raise ValueError(f"the wgmma decode kernel runs on sm_90 (wgmma), got compute capability {compute_capability}")
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    rows = p.batch * p.m
    x = a_values.reshape(rows, a_values.shape[-1])
    # bf16 activations have no scales: their values again as the (unread) pointer, so the primitive's dummy
    # scales are dead code (as in decode.py).
    xs = x if p.a_kind == "bf16" else a_scales.reshape(rows, a_scales.shape[-1])
    a_ts, b_ts = tensor_scale_operands(alpha, a_ts, b_ts)
    n_tiles = triton.cdiv(p.n, config.block_n)
    split = config.split_k
    ws_shape, zeroed = split_k_workspace(rows, p.n, config)
    out, _, _ = scratch.scratch_call(
        decode_wgmma_kernel, b_values, b_scales, x, xs, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((rows, p.n), OUT_DTYPES[p.out_dtype]),
                   jax.ShapeDtypeStruct(ws_shape, jnp.float32),
                   jax.ShapeDtypeStruct((n_tiles if split > 1 else 1,), jnp.int32)],
        zeroed_outputs=zeroed, grid=(n_tiles, split), num_warps=config.num_warps, num_stages=config.num_stages,
        compute_capability=compute_capability, name=f"decode_wgmma_{p.a_kind}_{p.b_kind}",
        maxnreg=config.max_registers, M=rows, N=p.n, K=p.k, BM=config.block_m, W_KIND=p.b_kind, X_KIND=p.a_kind,
        CHUNK=config.block_k, SPLIT_K=split, STAGES=config.num_stages, ATOMIC=bool(config.atomic_split_k),
        WIDE=p.n * (p.k // p.elements_per_byte("b")) >= _INT32_LIMIT, STREAM_X=streams_activations(p, config),
    )
    return out.reshape(p.batch, p.m, p.n)
