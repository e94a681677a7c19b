"""An experiment kept with its result: the one-row fp4 GEMV on fp16 mma.sync, scales applied per group column.

    python -m benchmarks.decode_mma_f16                                  # 7168x4096, 8192x8192, mxfp4
    python -m benchmarks.decode_mma_f16 --shapes 7168x2048 --formats nvfp4 --configs w4:t1:u2:s8
    python -m benchmarks.decode_mma_f16 --mode stream                    # the control: no decode, no MMA

The question (issue #12): `decode.py`'s CUDA-core GEMV at one row spends ~4.4 SASS instructions per weight
element in its K loop (sm_90): the fp4 decode, an fp16 -> fp32 widening and an FFMA per element, and reads
a 7168 x 4096 mxfp4 weight in 8.8 us where a same-size read takes 6.5. Does the tensor core remove the
per-element FMA work without the exact per-pair scale multiply that made session 21's mma.sync kernel
(`benchmarks/decode_mma_sync.py`) lose?

The kernel (`gemv_mma_kernel`, Gluon, sm_90):

- **Decode.** Each nibble becomes an e4m3 byte `s 0 0 e1 e0 m 0 0` (7 integer operations per 8 codes,
  `decode._fp4_e4m3_bytes_ptx`, shared with the GEMV) and `cvt.rn.f16x2.e4m3x2` makes two fp16 of them:
  2**-6 times the e2m1 value, subnormals included, exact. The low nibbles and the high nibbles are two dots
  of 64 codes each, so that a register of the conversion's output is a register of mma.sync's A fragment
  as it is (interleaving them in K order cost a PRMT per register).
- **Scales after the MMA, one column per group.** mma.sync m16n8k16's 8 columns would be 7 wasted copies of
  the one activation row. Instead, column j of the B operand holds the activations of one scale group only
  (zeros elsewhere): thread t of a row quad loads the t-th 16 bytes of every 64-byte piece of its rows
  (32 codes: one mxfp4 group, two nvfp4 groups), and `decode_wgmma._slots` relabels K so that those bytes are
  exactly the thread's A fragment. Column t collects quarter t's codes (nvfp4: column t + 4 the quarter's
  second 16). After a 128-code chunk, C[row, j] is group j's dot product and `acc += C * scale * factor_j`
  applies the scale: 4 FFMAs per thread per 16 rows x 128 codes, not one per element.
- **Activations in fp16, exactly.** mma.sync has no bf16 x fp16 form and bf16's range is not fp16's: each
  32-code quarter of x is multiplied by the power of two that puts its largest magnitude in [2**14, 2**15);
  bf16's 8 significant bits fit fp16's 11 exactly down to 2**-28 of that maximum, and elements below 2**-39
  of it are flushed (their products lie below the fp32 rounding of the group's sum). The power of two and
  e2m1's 2**-6 return in factor_j. Products are exact in the MMA, sums fp32.
- The activations are staged once per program in shared memory as B tiles (read by ldmatrix), SB chunks
  per store; the weight goes from 16-byte global loads (one load per step of UNROLL chunks) into registers.
  Split-K reduced in the kernel, deterministic, as decode_wgmma (`split_k_epilogue`).

`--mode stream` replaces the decode and the MMAs by a sum of the loaded bytes (same loads, staging, grid
and split-K epilogue); `stream_unstaged` also drops the activation staging. They bound what the kernel's
structure alone costs.

Result (H100, 2026-11-24, benchmarks/results/decode_mma_f16_h100_2026-11-24_session28.md): not adopted. The K
loop has 2.45 SASS instructions per weight element (the GEMV: 4.40) and the fp32 results match the jnp
reference to ~1e-7, but the best configuration per shape ran 0.84x the GEMV at 7168 x 4096 (10.42 against 8.77
us), 0.83x at 8192 x 8192, 0.74x at 7168 x 2048, 0.81x at 28672 x 8192 and 0.87x for nvfp4 at 7168 x 4096. The
control says why: the same structure with no decode and no MMA takes 9.25-9.98 us at 7168 x 4096. Programs
that each stream 64-128 rows in 64-byte pieces per row and step, over a K split with a split-K epilogue, cost
more than the GEMV's one-shot tiles of whole 2 KB rows, whatever the arithmetic. (The first version staged the
activations chunk by chunk, a dependent chain per chunk, and took 13-19 us.) What it would take: the GEMV's
tile structure (a few rows, whole K, all loads at once, no split) with the B fragments built in registers
(with one group per column, each thread's B values are one quarter of x, so no shared-memory staging); not
done.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")  # torch (CUPTI) shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.ampere import mma_v2  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import launch as scratch  # noqa: E402
from jax_blockscale._triton.decode import (_fp4_e4m3_bytes_ptx, split_k_workspace,  # noqa: E402
                                           tensor_scale_operands)
from jax_blockscale._triton.decode_wgmma import _bytes_layout, _slots, _weight_layout, split_k_epilogue  # noqa: E402
from jax_blockscale._triton.problem import NVFP4, TileConfig  # noqa: E402
from jax_blockscale._triton.upcast import scales_to_f32  # noqa: E402

KINDS = {"mxfp4": "e2m1", "nvfp4": NVFP4}
MODES = ("dot", "stream", "stream_unstaged")
CODES = 128
CHUNK = gl.constexpr(CODES)  # codes per row and step: one 64-byte piece, 8 k16 steps, the span of one set of group columns


def _fp4_f16_ptx() -> str:
    """PTX for `inline_asm_elementwise(pack=4)`: 4 packed e2m1 bytes in $4 -> their 4 low-nibble codes as
    fp16 in $0 (bytes 0, 1) and $1 (2, 3), the 4 high-nibble codes in $2, $3; each 2**-6 times e2m1's
    value (module docstring)."""
    return ("{\n.reg .b32 t, u, l, h;\n.reg .b16 p0, p1;\n" + _fp4_e4m3_bytes_ptx("$4")
            + "mov.b32 {p0, p1}, l;\ncvt.rn.f16x2.e4m3x2 $0, p0;\ncvt.rn.f16x2.e4m3x2 $1, p1;\n"
            "mov.b32 {p0, p1}, h;\ncvt.rn.f16x2.e4m3x2 $2, p0;\ncvt.rn.f16x2.e4m3x2 $3, p1;\n}")


_FP4_F16_PTX = gl.constexpr(_fp4_f16_ptx())


@gluon.jit
def _stage_activations(x_ptr, x_smem, f_smem, k_begin, NC: gl.constexpr, W_KIND: gl.constexpr,
                       num_warps: gl.constexpr):
    """x[k_begin : k_begin + 128 NC] into shared memory: for chunk c, B (8, 128) fp16 (x_smem[2c] the low
    nibbles' codes, x_smem[2c + 1] the high ones', each (8, 64) in mma slot order; column j holds the codes
    of group column j, zeros elsewhere) and each column's fp32 factor 2**(6 - shift) (f_smem[c]; 0 for
    mxfp4's unused columns 4-7). SB chunks at a time, as one tensor: chunk by chunk, the staging was a
    chain of dependent steps per chunk that took a program longer than its weight (H100). Column j reads
    quarter j % 4 (each quarter twice: the activations are tiny next to the weight)."""
    SB: gl.constexpr = NC if NC < 8 else 8
    L4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 8, 1, 4], [num_warps, 1, 1, 1], [3, 2, 1, 0])
    QL: gl.constexpr = gl.SliceLayout(2, L4)                                  # (SB, 8 columns, 32 codes)
    sq = gl.arange(0, SB, layout=gl.SliceLayout(1, gl.SliceLayout(2, QL)))[:, None, None]
    jq = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, QL)))[None, :, None]
    eq = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, QL)))[None, None, :]
    j4 = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, L4))))[None, :, None, None]
    q4 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, L4))))[None, None, :, None]
    e4 = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, L4))))[None, None, None, :]
    # B[j, 32 q + e] = x[32 q + e] where column j takes it: quarter q = j % 4 (thread q of a row quad holds it,
    # `_slots`), and for nvfp4 its first 16 codes in column q, its second 16 (second scale group) in q + 4
    takes = q4 == j4 % 4
    if W_KIND == "nvfp4":
        takes = takes & (e4 // 16 == j4 // 4)
    else:
        takes = takes & (j4 < 4)
    jf = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, QL)))[None, :]
    # Flat views of the buffers, so that SB chunks are one store (the same bytes: the swizzle repeats every
    # 8 rows, one chunk's (8, 64) tile).
    x_flat = x_smem._reinterpret(gl.float16, [2 * NC * 8, CHUNK // 2], x_smem.layout)
    f_flat = f_smem._reinterpret(gl.float32, [NC * 8], f_smem.layout)
    for c0 in gl.static_range(0, NC, SB):
        x = gl.load(x_ptr + k_begin + (c0 + sq) * CHUNK + (jq % 4) * 32 + eq).to(gl.float32)  # (SB, 8, 32)
        amax = gl.max(gl.abs(x), axis=2)
        eb = (amax.to(gl.int32, bitcast=True) >> 23) & 0xFF          # biased exponent; NaN / Inf: 255
        shift = gl.minimum(141 - eb, 127)   # the largest magnitude to [2**14, 2**15); tiny quarters: 2**127
        up = ((127 + shift) << 23).to(gl.float32, bitcast=True)
        down = ((133 - shift) << 23).to(gl.float32, bitcast=True)    # 2**(6 - shift), within fp32's range
        xs = (x * up[:, :, None]).to(gl.float16)                     # exact (module docstring)
        xs4 = gl.broadcast(xs[:, :, None, :], takes)[0]
        b = gl.where(takes, xs4, gl.zeros_like(xs4))                 # (SB, 8, 4, 32): K order
        even, odd = gl.split(gl.reshape(b, [SB, 8, CHUNK // 2, 2]))  # the low / high nibbles' codes
        even = gl.reshape(_slots(gl.reshape(even, [SB * 8, CHUNK // 2]), SB * 8, CHUNK // 2, 16), [SB, 8, CHUNK // 2])
        odd = gl.reshape(_slots(gl.reshape(odd, [SB * 8, CHUNK // 2]), SB * 8, CHUNK // 2, 16), [SB, 8, CHUNK // 2])
        pair = gl.permute(gl.join(even, odd), [0, 3, 1, 2])          # (SB, 2, 8, 64): x_smem[2c + h]
        x_flat.slice(16 * c0, 16 * SB).store(gl.reshape(pair, [16 * SB, CHUNK // 2]))
        if W_KIND != "nvfp4":
            down = gl.where(jf < 4, down, 0.0)
        f_flat.slice(8 * c0, 8 * SB).store(gl.reshape(down, [8 * SB]))


@gluon.jit
def _load_scales(s_ptr, rows, k0, K: gl.constexpr, GROUP: gl.constexpr, W_KIND: gl.constexpr, MMA: gl.constexpr):
    """The raw scales (R, 8) of the 128-code chunk at k0 in the accumulator's layout, column j's group at
    [:, j] (mxfp4's columns 4-7 re-read 0-3: unused)."""
    j = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    if W_KIND == "nvfp4":
        g = 2 * (j % 4) + j // 4
    else:
        g = j % 4
    return gl.load(s_ptr + rows[:, None] * (K // GROUP) + k0 // GROUP + g[None, :])


@gluon.jit
def _load_step(w_ptr, s_ptr, rb, rows, k0, K: gl.constexpr, GROUP: gl.constexpr, W_KIND: gl.constexpr,
               UNROLL: gl.constexpr, BL: gl.constexpr, MMA: gl.constexpr):
    """UNROLL chunks at k0: their weight bytes (R, 64 UNROLL) with one load (all of its 16-byte vectors are
    issued before any is used; separate loads per chunk were scheduled after the first chunk's MMAs) and
    each chunk's raw scales (the unused ones repeat the first)."""
    cb = gl.arange(0, UNROLL * CHUNK // 2, layout=gl.SliceLayout(0, BL))
    packed = gl.load(w_ptr + rb[:, None] * (K // 2) + k0 // 2 + cb[None, :])
    s0 = _load_scales(s_ptr, rows, k0, K, GROUP, W_KIND, MMA)
    s1 = s0
    s2 = s0
    s3 = s0
    if UNROLL >= 2:
        s1 = _load_scales(s_ptr, rows, k0 + CHUNK, K, GROUP, W_KIND, MMA)
    if UNROLL == 4:
        s2 = _load_scales(s_ptr, rows, k0 + 2 * CHUNK, K, GROUP, W_KIND, MMA)
        s3 = _load_scales(s_ptr, rows, k0 + 3 * CHUNK, K, GROUP, W_KIND, MMA)
    return packed, s0, s1, s2, s3


@gluon.jit
def _step_dots(acc, zero, packed, s0, s1, s2, s3, x_smem, f_smem, i, R: gl.constexpr, GROUP: gl.constexpr,
               W_KIND: gl.constexpr, UNROLL: gl.constexpr, L3: gl.constexpr, MMA: gl.constexpr, MODE: gl.constexpr):
    """acc + the UNROLL chunks from i on (`_load_step`'s values): the bytes split into chunks (register
    renaming only: the chunk is a register dimension of the load's layout)."""
    if UNROLL == 1:
        acc = _chunk_dot(acc, zero, packed, s0, x_smem, f_smem, i, R, GROUP, W_KIND, L3, MMA, MODE)
    elif UNROLL == 2:
        p0, p1 = gl.split(gl.permute(gl.reshape(packed, [R, 2, CHUNK // 2]), [0, 2, 1]))
        acc = _chunk_dot(acc, zero, p0, s0, x_smem, f_smem, i, R, GROUP, W_KIND, L3, MMA, MODE)
        acc = _chunk_dot(acc, zero, p1, s1, x_smem, f_smem, i + 1, R, GROUP, W_KIND, L3, MMA, MODE)
    else:
        even, odd = gl.split(gl.permute(gl.reshape(packed, [R, 2, 2, CHUNK // 2]), [0, 3, 1, 2]))
        p0, p2 = gl.split(even)
        p1, p3 = gl.split(odd)
        acc = _chunk_dot(acc, zero, p0, s0, x_smem, f_smem, i, R, GROUP, W_KIND, L3, MMA, MODE)
        acc = _chunk_dot(acc, zero, p1, s1, x_smem, f_smem, i + 1, R, GROUP, W_KIND, L3, MMA, MODE)
        acc = _chunk_dot(acc, zero, p2, s2, x_smem, f_smem, i + 2, R, GROUP, W_KIND, L3, MMA, MODE)
        acc = _chunk_dot(acc, zero, p3, s3, x_smem, f_smem, i + 3, R, GROUP, W_KIND, L3, MMA, MODE)
    return acc


@gluon.jit
def _chunk_dot(acc, zero, packed, raw_s, x_smem, f_smem, i, R: gl.constexpr, GROUP: gl.constexpr,
               W_KIND: gl.constexpr, L3: gl.constexpr, MMA: gl.constexpr, MODE: gl.constexpr):
    """acc + chunk i's scaled group dot products (R, 8): decode, two mma.sync dots, the scales."""
    if MODE != "dot":
        # the experiment's control (module docstring): the bytes summed, no decode and no MMA
        t = gl.convert_layout(gl.sum(packed.to(gl.int32), axis=1).to(gl.float32), gl.SliceLayout(1, MMA))
        return acc + t[:, None] * raw_s.to(gl.float32)
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    B_OP: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=MMA, k_width=2)
    v = gl.convert_layout(gl.reshape(packed, [R, CHUNK // GROUP, GROUP // 2]), L3)
    lo, hi = gl.inline_asm_elementwise(_FP4_F16_PTX, "=r,=r,=r,=r,r", [v], dtype=(gl.float16, gl.float16),
                                       is_pure=True, pack=4)
    # Two dots of 64 codes each, the low nibbles' and the high nibbles': a register of the asm's output (two
    # bytes' codes of one nibble) is then a register of the A fragment as it is (_slots with 16 codes per
    # 16-byte vector), where interleaving them in K order cost a PRMT per register.
    a_lo = gl.convert_layout(_slots(gl.reshape(lo, [R, CHUNK // 2]), R, CHUNK // 2, 16), A_OP)
    a_hi = gl.convert_layout(_slots(gl.reshape(hi, [R, CHUNK // 2]), R, CHUNK // 2, 16), A_OP)
    c = mma_v2(a_lo, x_smem.index(2 * i).permute((1, 0)).load(B_OP), zero)
    c = mma_v2(a_hi, x_smem.index(2 * i + 1).permute((1, 0)).load(B_OP), c)
    f = f_smem.index(i).load(gl.SliceLayout(0, MMA))
    return acc + c * (scales_to_f32(raw_s, W_KIND) * f[None, :])


@gluon.jit
def gemv_mma_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr,
                    N: gl.constexpr, K: gl.constexpr, W_KIND: gl.constexpr, TILES: gl.constexpr,
                    SPLIT_K: gl.constexpr, UNROLL: gl.constexpr, ATOMIC: gl.constexpr, WIDE: gl.constexpr,
                    MODE: gl.constexpr = "dot"):
    """out (1, N) = a_ts * b_ts * x (1, K) bf16 @ decode(w (N, K / 2), s).T; ws / count_ptr as
    decode_wgmma_kernel's (split-K workspace and per-tile counters). Grid (cdiv(N, R), SPLIT_K), R = 16 *
    num_warps * TILES rows per program."""
    W: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 16 * W * TILES
    KS: gl.constexpr = K // SPLIT_K
    NC: gl.constexpr = KS // CHUNK
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[W, 1], instr_shape=[16, 8])
    L3: gl.constexpr = _weight_layout(W, CHUNK // 2, GROUP // 2, TILES)  # the A fragments' bytes (decode_wgmma)
    XS: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])
    FS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])

    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    k_begin = pid_k * KS
    rows = pid_n * R + gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
    rows = gl.minimum(rows, N - 1)    # rows past N read row N - 1: never stored
    if WIDE:
        rows = rows.to(gl.int64)
    BLU: gl.constexpr = _bytes_layout(W, UNROLL * CHUNK // 2, TILES)
    rb = gl.convert_layout(rows, gl.SliceLayout(1, BLU))
    # The first step's weight loads go out before the activations are staged.
    packed, s0, s1, s2, s3 = _load_step(w_ptr, s_ptr, rb, rows, k_begin, K, GROUP, W_KIND, UNROLL, BLU, MMA)
    x_smem = gl.allocate_shared_memory(gl.float16, [2 * NC, 8, CHUNK // 2], XS)
    f_smem = gl.allocate_shared_memory(gl.float32, [NC, 8], FS)
    if MODE != "stream_unstaged":
        _stage_activations(x_ptr, x_smem, f_smem, k_begin, NC, W_KIND, W)
        gl.thread_barrier()

    zero = gl.zeros([R, 8], gl.float32, layout=MMA)
    acc = _step_dots(zero, zero, packed, s0, s1, s2, s3, x_smem, f_smem, 0, R, GROUP, W_KIND, UNROLL, L3, MMA, MODE)
    for i in range(UNROLL, NC, UNROLL):
        # Loads carried into the next iteration would cross the loop as one register per byte, and repacking
        # them for the decode cost ~2 integer ops per 4 bytes: each step loads its own.
        packed, s0, s1, s2, s3 = _load_step(w_ptr, s_ptr, rb, rows, k_begin + i * CHUNK, K, GROUP, W_KIND, UNROLL,
                                            BLU, MMA)
        acc = _step_dots(acc, zero, packed, s0, s1, s2, s3, x_smem, f_smem, i, R, GROUP, W_KIND, UNROLL, L3, MMA, MODE)
    total = gl.sum(acc, axis=1)
    one = gl.arange(0, 8, layout=gl.SliceLayout(0, MMA))
    out = gl.where(one[None, :] == 0, total[:, None], 0.0)
    split_k_epilogue(out, pid_n, pid_k, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, 1, N, SPLIT_K, ATOMIC,
                     MMA)


# ---------------------------------------------------------------------------------------------------------
# Launcher and harness.

STAGED_BYTES = 64 * 1024  # activations staged per program: 16 bytes per code (8 fp16 columns) of its K split
DEFAULT_CONFIGS = "w4:t1:u2:s4,w4:t1:u2:s8,w4:t2:u2:s8,w2:t4:u2:s8,w4:t1:u4:s2,w8:t1:u2:s4"


def parse_config(spec: str) -> TileConfig:
    """'w4:t2:u2:s8' -> 4 warps of 2 m16 tiles (128 weight rows), 2 chunks of 128 codes per load, 8 K splits."""
    v = {t[0]: int(t[1:]) for t in spec.split(":")}
    return TileConfig(block_m=1, block_n=16 * v["w"] * v["t"], block_k=CODES * v["u"], group_m=1,
                      num_warps=v["w"], num_stages=1, split_k=v["s"])


def describe(cfg: TileConfig) -> str:
    return (f"w{cfg.num_warps}:t{cfg.block_n // (16 * cfg.num_warps)}:u{cfg.block_k // CODES}:s{cfg.split_k}")


def check(rows: int, n: int, k: int, cfg: TileConfig) -> None:
    """Refuses what the kernel cannot take, before anything compiles."""
    w = cfg.num_warps
    if rows != 1:
        raise ValueError(f"the mma.sync fp16 GEMV takes one activation row, got {rows}")
    if w not in (1, 2, 4, 8) or cfg.block_n % (16 * w) or cfg.block_n // (16 * w) not in (1, 2, 4):
        raise ValueError(f"block_n must be 1, 2 or 4 m16 tiles per warp (1, 2, 4 or 8 warps), got "
                         f"block_n={cfg.block_n}, num_warps={w}")
    if cfg.block_k not in (CODES, 2 * CODES, 4 * CODES):
        raise ValueError(f"block_k (codes per load) must be {CODES}, {2 * CODES} or {4 * CODES}, got {cfg.block_k}")
    if cfg.split_k < 1 or k % (cfg.block_k * cfg.split_k):
        raise ValueError(f"K ({k}) must be a multiple of block_k * split_k ({cfg.block_k} x {cfg.split_k})")
    chunks = k // cfg.split_k // CODES
    if chunks & (chunks - 1):
        raise ValueError(f"K per split / {CODES} must be a power of two (Gluon's shared-memory shapes), got {chunks}")
    if 16 * (k // cfg.split_k) > STAGED_BYTES:
        raise ValueError(f"K per split ({k} / {cfg.split_k}) exceeds {STAGED_BYTES // 16}: a program stages its "
                         f"activations in shared memory; raise split_k")


def launch(x: jax.Array, w: "jb.BlockScaledArray", cfg: TileConfig, out_dtype=jnp.bfloat16,
           mode: str = "dot") -> jax.Array:
    """x (1, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (1, N)."""
    if w.fmt.name not in KINDS or mode not in MODES:
        raise ValueError(f"formats {tuple(KINDS)} and modes {MODES}, got {w.fmt.name!r}, {mode!r}")
    (rows, _), (n, k) = x.shape, w.shape
    check(rows, n, k, cfg)
    # x's tensor scale is one; nvfp4's weight tensor scale multiplies the fp32 result in the kernel
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)
    ws_shape, zeroed = split_k_workspace(1, n, cfg)
    n_tiles = triton.cdiv(n, cfg.block_n)
    out, _, _ = scratch.scratch_call(
        gemv_mma_kernel, w.values, w.scales, x, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((1, n), out_dtype), jax.ShapeDtypeStruct(ws_shape, jnp.float32),
                   jax.ShapeDtypeStruct((n_tiles if cfg.split_k > 1 else 1,), jnp.int32)],
        zeroed_outputs=zeroed, grid=(n_tiles, cfg.split_k), num_warps=cfg.num_warps, num_stages=1,
        compute_capability=90, name=f"gemv_mma_f16_{KINDS[w.fmt.name]}", N=n, K=k, W_KIND=KINDS[w.fmt.name],
        TILES=cfg.block_n // (16 * cfg.num_warps), SPLIT_K=cfg.split_k, UNROLL=cfg.block_k // CODES, ATOMIC=False,
        WIDE=n * (k // 2) >= 2**31, MODE=mode)
    return out


def main(argv=None) -> None:
    from . import decode as bd

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="7168x4096,8192x8192", help="NxK,...")
    ap.add_argument("--formats", default="mxfp4", help="mxfp4,nvfp4")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="wW:tT:uU:sS,... (parse_config)")
    ap.add_argument("--mode", default="dot", choices=MODES)
    a = ap.parse_args(argv)
    torch = bd._torch()
    print(f"device {jax.devices()[0].device_kind}; us per matmul ({'CUPTI' if torch else 'WALL'}); mode {a.mode}")
    print("| format | N | K | kernel | us | % same-size read | vs XLA bf16 | vs dispatch | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for fmt in a.formats.split(","):
        for n, k in (tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")):
            ws, read, dense = bd.experiment_weights(torch, fmt, n, k)
            x = jax.random.normal(jax.random.key(7), (1, k), jnp.float32).astype(jnp.bfloat16)
            xla, disp, ref = bd.experiment_baselines(torch, x, ws, dense)
            row = f"| {fmt} | {n} | {k} |"
            print(f"{row} XLA bf16 | {xla:.2f} | | 1.00x | | |")
            print(f"{row} dispatch: {jb.explain(x, ws[0], rows=1).kernel} | {disp:.2f} | {read / disp:.0%} | "
                  f"{xla / disp:.2f}x | 1.00x | |", flush=True)
            for spec in a.configs.split(","):
                cfg = parse_config(spec)
                try:
                    check(1, n, k, cfg)
                except ValueError as e:
                    print(f"{row} {spec} | refused: {e} | | | | |")
                    continue
                out = np.asarray(jax.jit(lambda x, w: launch(x, w, cfg, jnp.float32, a.mode))(x, ws[0]), np.float64)
                err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                if a.mode == "dot" and not err < 1e-5:
                    print(f"{row} {describe(cfg)} | wrong | | | | {err:.1e} |")
                    continue
                us = bd.kernel_us(jax.jit(lambda x, w: launch(x, w, cfg, mode=a.mode)), [(x, w) for w in ws], torch)
                shown = f"{err:.1e}" if a.mode == "dot" else "(control)"
                print(f"{row} {describe(cfg)} | {us:.2f} | {read / us:.0%} | {xla / us:.2f}x | {disp / us:.2f}x | "
                      f"{shown} |", flush=True)


if __name__ == "__main__":
    main()
