"""An experiment: the one-row fp4 GEMV on mma.sync in the GEMV's own tile structure (issue #12, M = 1).

    python -m benchmarks.decode_gemv_mma                                 # 7168x4096, 7168x2048; mxfp4, nvfp4
    python -m benchmarks.decode_gemv_mma --shapes 7168x4096 --configs w8,w4
    python -m benchmarks.decode_gemv_mma --sass                          # CPU: SASS per weight element

Session 28's mma.sync GEMV (`benchmarks/decode_mma_f16.py`) cut the K loop to 2.45 SASS instructions per weight
element (the CUDA-core GEMV, `decode.gemv_kernel`: 4.40) and still ran 0.74-0.87x the GEMV, because its programs
streamed 64-128 rows in 64-byte pieces over a K split with a split-K epilogue: that structure alone, with no
decode and no MMA, took longer than the whole GEMV. What it left to try: the GEMV's structure (few rows, whole
K, every load issued at once, no split) with the MMA.

This kernel (`gemv_mma_kernel`, Gluon, sm_90) keeps session 28's arithmetic and changes the structure:

- A program owns one m16 tile (16 weight rows) and the whole of K. Its W warps split K: warp w takes the
  w-th K / W codes of all 16 rows. Each thread loads all its bytes at once (two rows x K / (2 W) bytes x 1/4:
  8 16-byte loads at K = 4096, W = 8), as the GEMV's whole-row tiles do.
- The MMA is batched over the warps (a rank-3 mma.sync: warp w multiplies its own K slice against its own
  activations), and the partial sums are added across warps once, at the end, in shared memory.
- Decode, K relabelling, one scale group per B column and the exact fp16 activations are session 28's
  (`decode_mma_f16`): 7 integer operations and 4 conversions per 8 codes, one mma per 8 codes and thread,
  4 FFMAs per thread per 16 rows x 128 codes for the scales.
- The activations are staged once per program (the whole of K, 2 bytes of shared memory per code, in slot
  order); each dot's B operand takes them in its group column and zeros elsewhere in registers.

Result (H200, 2026-12-02, session 39, `benchmarks/results/decode_gemv_experiments_h200_2026-12-02_session39.md`):
not adopted. Correct (relative error 6.4e-8 mxfp4, 1.3e-7 nvfp4) and 0.59-0.70x the GEMV: 7168 x 4096 mxfp4
14.09 us (8 warps) against 8.43, 7168 x 2048 7.18-7.80 against 5.03-5.07. The compiled kernel has 4.4-4.6 SASS
instructions per weight element at 8 warps (5.1-5.3 at 16), no fewer than the GEMV's 4.4: the decode and the
MMA take ~1.6, but building the B operand (the zero columns selected per register, which the compiler splits
and repacks per fp16 half) and staging the activations take the rest; the first version, with the zero columns
stored in shared memory (16 bytes per code), had 4.3. So neither the tensor cores (session 28) nor the GEMV's structure with them
(this) beat the CUDA-core GEMV at one row on Hopper.

Session 40 (config `wW[tT][m]`): TILES m16 tiles per program share each B operand, and MASK builds B's zero columns by
one AND per 32-bit register (`_AND_PTX`) instead of a select per fp16. SASS per weight element (sm_90, mxfp4 7168 x
4096): w8 4.62, w8m 3.88, w8t2m 3.06, w16t2m 3.47, w8t4m 2.67 (255 registers). Time on an H200 (2026-12-02, same
run, dispatch 8.41 us): w8 14.06, w8m 12.82, w8t2m 12.62, w16t2m 12.68, w16t4m 11.27, w8t4m 11.25 us (0.60-0.75x);
7168 x 2048 best 5.81 (w16t2m) against 5.02. Fewer instructions, still slower: the registers the tiles take leave
one program per SM, and each program loads everything, then computes
(`benchmarks/results/decode_gemv_experiments_h200_2026-12-02_session40.md`).
"""

from __future__ import annotations

import os
import re

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")  # torch (CUPTI) shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import launch as scratch  # noqa: E402
from jax_blockscale._triton.decode import tensor_scale_operands  # noqa: E402
from jax_blockscale._triton.decode_wgmma import _pow2, _slots  # noqa: E402
from jax_blockscale._triton.problem import NVFP4  # noqa: E402
from jax_blockscale._triton.upcast import scales_to_f32  # noqa: E402

from .decode_mma_f16 import _FP4_F16_PTX  # noqa: E402

KINDS = {"mxfp4": "e2m1", "nvfp4": NVFP4}
CODES = 128
CHUNK = gl.constexpr(CODES)      # codes per row and MMA step: one 64-byte piece of each row, 8 k16 steps
SMEM_LIMIT = 200 * 1024


@gluon.constexpr_function
def _bytes3(num_warps, chunk_bytes, tiles=1):
    """(warps, 16 tiles rows, chunk_bytes) layout of each warp's weight bytes: thread 4g + t of warp w holds rows
    16 i + g and 16 i + g + 8 of every m16 tile i and, of each 64-byte piece of its K slice, the t-th 16 bytes
    (`decode_wgmma._weight_layout`, the warps along K instead of rows)."""
    regs = ([[0, 0, b] for b in _pow2(16)] + [[0, 0, 64 * h] for h in _pow2(chunk_bytes // 64)] + [[0, 8, 0]]
            + [[0, 16 * i, 0] for i in _pow2(tiles)])
    lanes = [[0, 0, 16], [0, 0, 32], [0, 1, 0], [0, 2, 0], [0, 4, 0]]
    warps = [[w, 0, 0] for w in _pow2(num_warps)]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [num_warps, 16 * tiles, chunk_bytes])


@gluon.constexpr_function
def _groups4(num_warps, group_bytes, tiles=1):
    """`_bytes3` of one 64-byte chunk as (warps, 16 tiles rows, groups, bytes per group): the decode's operand."""
    def at(byte):
        return [0, 0, byte // group_bytes, byte % group_bytes]
    regs = [at(b) for b in _pow2(16)] + [[0, 8, 0, 0]] + [[0, 16 * i, 0, 0] for i in _pow2(tiles)]
    lanes = [at(16), at(32), [0, 1, 0, 0], [0, 2, 0, 0], [0, 4, 0, 0]]
    warps = [[w, 0, 0, 0] for w in _pow2(num_warps)]
    return gl.DistributedLinearLayout(regs, lanes, warps, [],
                                      [num_warps, 16 * tiles, 64 // group_bytes, group_bytes])


@gluon.jit
def _stage(x_ptr, x_smem, f_smem, NCW: gl.constexpr, KW: gl.constexpr, W: gl.constexpr, W_KIND: gl.constexpr,
           num_warps: gl.constexpr):
    """Warp w's chunk c (codes KW w + 128 c ...) of x into x_smem[(2c + h) W + w] (h: the low / high nibbles'
    codes): 64 fp16 in slot order, each 32-code quarter times 2**shift (its largest magnitude to [2**14, 2**15),
    decode_mma_f16's exact fp16 activations); f_smem[c W + w, j] = 2**(6 - shift) of group column j's quarter
    (0 for mxfp4's unused columns 4-7). Compact: the B operand's zero columns are made in registers."""
    L3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 4, 8], [num_warps, 1, 1], [2, 1, 0])
    wq = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3)))[:, None, None]
    qq = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))[None, :, None]
    eq = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))[None, None, :]
    FL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    jf = gl.arange(0, 8, layout=gl.SliceLayout(0, FL))[None, :]
    for c in gl.static_range(NCW):
        x = gl.load(x_ptr + wq * KW + c * CHUNK + qq * 32 + eq).to(gl.float32)  # (W, 4 quarters, 32)
        amax = gl.max(gl.abs(x), axis=2)
        eb = (amax.to(gl.int32, bitcast=True) >> 23) & 0xFF
        shift = gl.minimum(141 - eb, 127)
        up = ((127 + shift) << 23).to(gl.float32, bitcast=True)
        down = ((133 - shift) << 23).to(gl.float32, bitcast=True)     # (W, 4)
        xs = (x * up[:, :, None]).to(gl.float16)
        even, odd = gl.split(gl.reshape(xs, [W, CHUNK // 2, 2]))
        even = _slots(even, W, CHUNK // 2, 16)
        odd = _slots(odd, W, CHUNK // 2, 16)
        x_smem.slice(2 * c * W, 2 * W).store(gl.reshape(gl.permute(gl.join(even, odd), [2, 0, 1]),
                                                         [2 * W, CHUNK // 2]))
        d8 = gl.reshape(gl.join(down, down), [W, 8])                   # column j: quarter j // 2
        d8 = gl.convert_layout(d8, FL)
        # column j takes quarter j % 4: permute (q, copy) -> (copy, q)
        d8 = gl.reshape(gl.permute(gl.reshape(d8, [W, 4, 2]), [0, 2, 1]), [W, 8])
        d8 = gl.convert_layout(d8, FL)
        if W_KIND != "nvfp4":
            d8 = gl.where(jf < 4, d8, 0.0)
        f_smem.slice(c * W, W).store(d8)


# B's zero columns by a 32-bit AND of each register (two fp16) with a mask of the same shape, instead of a select
# per fp16 (which the compiler splits and repacks per half: ~2 instructions per value, session 39).
_AND_PTX = gl.constexpr("and.b32 $0, $1, $2;")


@gluon.jit
def _operand_b(x_smem, i, W: gl.constexpr, W_KIND: gl.constexpr, B_OP: gl.constexpr, MASK: gl.constexpr):
    """The B operand (W, 64, 8) of dot i (x_smem rows i W ...): slot s's value in its group column, zeros
    elsewhere (`_slots` with 16 values per vector: slot s holds value 16 t + 4 (s // 16) + ... of quarter
    t = (s % 8) // 2; nvfp4's second 16-code group of a quarter from s = 32 on). MASK: the zeros by an AND per
    register (`_AND_PTX`), else by a select per value."""
    XL: gl.constexpr = gl.SliceLayout(2, B_OP)
    xv = x_smem.slice(i * W, W).load(XL)                               # (W, 64)
    s = gl.arange(0, CHUNK // 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, B_OP)))[None, :, None]
    n = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, B_OP)))[None, None, :]
    col = (s % 8) // 2
    if W_KIND == "nvfp4":
        col = col + 4 * (s // 32)
    xb = gl.broadcast(gl.expand_dims(xv, 2), n)[0]
    if MASK:
        keep = gl.broadcast(gl.where(col == n, -1, 0).to(gl.int16), xb)[0]
        return gl.inline_asm_elementwise(_AND_PTX, "=r,r,r", [xb, keep], dtype=gl.float16, is_pure=True, pack=2)
    return gl.where(col == n, xb, gl.zeros_like(xb))


@gluon.jit
def _chunk_dot(acc, zero, packed, raw_s, x_smem, f_smem, c, W: gl.constexpr, GROUP: gl.constexpr,
               W_KIND: gl.constexpr, MMA: gl.constexpr, TILES: gl.constexpr, MASK: gl.constexpr):
    """acc + chunk c's scaled group dot products (W, 16 TILES, 8) of every warp: decode, two batched mma.sync
    dots (the low and the high nibbles; one B operand for the TILES m16 tiles), the scales."""
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    R: gl.constexpr = 16 * TILES
    G4: gl.constexpr = _groups4(W, GROUP // 2, TILES)
    v = gl.convert_layout(gl.reshape(packed, [W, R, CHUNK // GROUP, GROUP // 2]), G4)
    lo, hi = gl.inline_asm_elementwise(_FP4_F16_PTX, "=r,=r,=r,=r,r", [v], dtype=(gl.float16, gl.float16),
                                       is_pure=True, pack=4)
    a_lo = gl.reshape(_slots(gl.reshape(lo, [W * R, CHUNK // 2]), W * R, CHUNK // 2, 16), [W, R, CHUNK // 2])
    a_hi = gl.reshape(_slots(gl.reshape(hi, [W * R, CHUNK // 2]), W * R, CHUNK // 2, 16), [W, R, CHUNK // 2])
    cc = mma_v2(gl.convert_layout(a_lo, A_OP), _operand_b(x_smem, 2 * c, W, W_KIND, B_OP, MASK), zero)
    cc = mma_v2(gl.convert_layout(a_hi, A_OP), _operand_b(x_smem, 2 * c + 1, W, W_KIND, B_OP, MASK), cc)
    f = f_smem.slice(c * W, W).load(gl.SliceLayout(1, MMA))           # (W, 8)
    return acc + cc * (scales_to_f32(raw_s, W_KIND) * f[:, None, :])


@gluon.jit
def _scales(s_ptr, rows, c, KW: gl.constexpr, K: gl.constexpr, GROUP: gl.constexpr, W: gl.constexpr,
            W_KIND: gl.constexpr, MMA: gl.constexpr):
    """Raw scales (W, R, 8) of chunk c of every warp's slice for rows (1, R, 1), column j's group at [..., j]."""
    w = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, MMA)))[:, None, None]
    j = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, MMA)))[None, None, :]
    if W_KIND == "nvfp4":
        g = 2 * (j % 4) + j // 4
    else:
        g = j % 4
    return gl.load(s_ptr + rows * (K // GROUP) + (w * KW + c * CHUNK) // GROUP + g)


@gluon.jit
def gemv_mma_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
                    N: gl.constexpr, K: gl.constexpr, W_KIND: gl.constexpr, WIDE: gl.constexpr,
                    TILES: gl.constexpr = 1, MASK: gl.constexpr = False):
    """out (1, N) = a_ts * b_ts * x (1, K) bf16 @ decode(w (N, K / 2), s).T, fp4 weights (mxfp4 / nvfp4).
    Grid (cdiv(N, 16 TILES),): TILES m16 tiles per program, sharing each B operand; num_warps W splits K (K a
    multiple of 128 W, K / (128 W) in {1, 2, 4}). MASK: `_operand_b`'s AND."""
    W: gl.constexpr = gl.num_warps()
    KW: gl.constexpr = K // W                    # codes per warp
    NCW: gl.constexpr = KW // CHUNK              # chunks per warp
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1, 1], instr_shape=[1, 16, 8])
    R: gl.constexpr = 16 * TILES
    PB: gl.constexpr = _bytes3(W, KW // 2, TILES)
    XS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    FS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])

    pid = gl.program_id(0)
    # every load of the program goes out first: the weight bytes, then the scales
    wp = gl.arange(0, W, layout=gl.SliceLayout(1, gl.SliceLayout(2, PB)))[:, None, None]
    rp = pid * R + gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, PB)))[None, :, None]
    rp = gl.minimum(rp, N - 1)   # rows past N read row N - 1: never stored
    if WIDE:
        rp = rp.to(gl.int64)
    bp = gl.arange(0, KW // 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, PB)))[None, None, :]
    packed = gl.load(w_ptr + rp * (K // 2) + wp * (KW // 2) + bp)       # (W, R, KW / 2)
    rows = pid * R + gl.arange(0, R, layout=gl.SliceLayout(0, gl.SliceLayout(2, MMA)))[None, :, None]
    rows = gl.minimum(rows, N - 1)
    if WIDE:
        rows = rows.to(gl.int64)
    s0 = _scales(s_ptr, rows, 0, KW, K, GROUP, W, W_KIND, MMA)
    s1 = s0
    s2 = s0
    s3 = s0
    if NCW >= 2:
        s1 = _scales(s_ptr, rows, 1, KW, K, GROUP, W, W_KIND, MMA)
    if NCW == 4:
        s2 = _scales(s_ptr, rows, 2, KW, K, GROUP, W, W_KIND, MMA)
        s3 = _scales(s_ptr, rows, 3, KW, K, GROUP, W, W_KIND, MMA)

    x_smem = gl.allocate_shared_memory(gl.float16, [2 * NCW * W, CHUNK // 2], XS)
    f_smem = gl.allocate_shared_memory(gl.float32, [NCW * W, 8], FS)
    _stage(x_ptr, x_smem, f_smem, NCW, KW, W, W_KIND, W)
    gl.thread_barrier()

    zero = gl.zeros([W, R, 8], gl.float32, layout=MMA)
    if NCW == 1:
        acc = _chunk_dot(zero, zero, packed, s0, x_smem, f_smem, 0, W, GROUP, W_KIND, MMA, TILES, MASK)
    elif NCW == 2:
        p0, p1 = gl.split(gl.permute(gl.reshape(packed, [W, R, 2, CHUNK // 2]), [0, 1, 3, 2]))
        acc = _chunk_dot(zero, zero, p0, s0, x_smem, f_smem, 0, W, GROUP, W_KIND, MMA, TILES, MASK)
        acc = _chunk_dot(acc, zero, p1, s1, x_smem, f_smem, 1, W, GROUP, W_KIND, MMA, TILES, MASK)
    else:
        even, odd = gl.split(gl.permute(gl.reshape(packed, [W, R, 2, 2, CHUNK // 2]), [0, 1, 4, 2, 3]))
        p0, p2 = gl.split(even)
        p1, p3 = gl.split(odd)
        acc = _chunk_dot(zero, zero, p0, s0, x_smem, f_smem, 0, W, GROUP, W_KIND, MMA, TILES, MASK)
        acc = _chunk_dot(acc, zero, p1, s1, x_smem, f_smem, 1, W, GROUP, W_KIND, MMA, TILES, MASK)
        acc = _chunk_dot(acc, zero, p2, s2, x_smem, f_smem, 2, W, GROUP, W_KIND, MMA, TILES, MASK)
        acc = _chunk_dot(acc, zero, p3, s3, x_smem, f_smem, 3, W, GROUP, W_KIND, MMA, TILES, MASK)
    total = gl.sum(gl.sum(acc, axis=2), axis=0)                         # (R,): over columns, then warps
    alpha = gl.load(a_ts_ptr) * gl.load(b_ts_ptr)
    on = pid * R + gl.arange(0, R, layout=total.type.layout)
    gl.store(out_ptr + on, (total * alpha).to(out_ptr.dtype.element_ty), mask=on < N)


# ---------------------------------------------------------------------------------------------------------
# Launcher and harness.


def parse_config(spec: str) -> tuple[int, int, bool]:
    """'w8' -> (8 warps, 1 m16 tile per program, select); 'w8t2m' -> (8, 2, the AND mask): `gemv_mma_kernel`'s
    num_warps, TILES, MASK."""
    m = re.fullmatch(r"w(\d+)(?:t(\d+))?(m?)", spec)
    if m is None:
        raise ValueError(f"config {spec!r}: expected wW[tT][m], e.g. w8, w8t2m")
    return int(m.group(1)), int(m.group(2) or 1), m.group(3) == "m"


def describe(warps: int, tiles: int, mask: bool) -> str:
    return f"w{warps}" + (f"t{tiles}" if tiles > 1 else "") + ("m" if mask else "")


def check(rows: int, n: int, k: int, warps: int, tiles: int = 1) -> None:
    """Refuses what the kernel cannot take, before anything compiles."""
    if rows != 1:
        raise ValueError(f"the mma.sync GEMV takes one activation row, got {rows}")
    if warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {warps}")
    if tiles not in (1, 2, 4):
        raise ValueError(f"tiles (m16 tiles per program) must be 1, 2 or 4, got {tiles}")
    if k % (CODES * warps) or k // (CODES * warps) not in (1, 2, 4):
        raise ValueError(f"K / (128 num_warps) must be 1, 2 or 4, got K={k}, num_warps={warps}")
    if 2 * k + 32 * k // CODES > SMEM_LIMIT:
        raise ValueError(f"K={k}: the staged activations ({2 * k} bytes) exceed {SMEM_LIMIT}")


def launch(x: jax.Array, w: "jb.BlockScaledArray", warps: int, out_dtype=jnp.bfloat16, tiles: int = 1,
           mask: bool = False) -> jax.Array:
    """x (1, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (1, N)."""
    if w.fmt.name not in KINDS:
        raise ValueError(f"formats {tuple(KINDS)}, got {w.fmt.name!r}")
    (rows, _), (n, k) = x.shape, w.shape
    check(rows, n, k, warps, tiles)
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)
    (out,) = scratch.scratch_call(
        gemv_mma_kernel, w.values, w.scales, x, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((1, n), out_dtype)], grid=(-(-n // (16 * tiles)),), num_warps=warps,
        num_stages=1, compute_capability=90, name=f"gemv_mma_{KINDS[w.fmt.name]}", N=n, K=k,
        W_KIND=KINDS[w.fmt.name], WIDE=n * (k // 2) >= 2**31, TILES=tiles, MASK=mask)
    return out


def sass(configs, kinds, k: int = 4096, n: int = 7168) -> None:
    """CPU: compile for sm_90 and count SASS instructions per weight element (whole kernel, straight-line)."""
    from benchmarks.sass_quant import kernel_summary
    from jax_blockscale._triton.compile import compile_kernel

    for kind in kinds:
        for warps, tiles, mask in configs:
            sig = dict(w_ptr="*u8", s_ptr="*u8", x_ptr="*bf16", a_ts_ptr="*fp32", b_ts_ptr="*fp32", out_ptr="*bf16")
            ck = compile_kernel(gemv_mma_kernel, target="sm_90", signature=sig,
                                constexprs=dict(N=n, K=k, W_KIND=KINDS[kind], WIDE=False, TILES=tiles, MASK=mask),
                                num_warps=warps,
                                num_stages=1)
            print(f"{kind} {describe(warps, tiles, mask)} K={k}: "
                  + kernel_summary(ck, 32 * warps / (16 * tiles * k), top=24))


def main(argv=None) -> None:
    from .decode import experiment_main

    experiment_main(argv, __doc__.split("\n")[0], shapes="7168x4096,7168x2048", formats="mxfp4,nvfp4",
                    configs="w8,w16,w4", config_help="wW[tT][m],... (W warps splitting K, T m16 tiles per program, "
                    "m: B's zeros by an AND)", parse=parse_config, sass=sass,
                    variant=lambda c, fmt: (describe(*c), lambda n, k: check(1, n, k, c[0], c[1]),
                                            lambda x, w, dtype: launch(x, w, c[0], dtype, c[1], c[2])))


if __name__ == "__main__":
    main()
