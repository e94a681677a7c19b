"""Session-31 experiment: decode_wgmma's fp4 decode on decode_fp8's streaming structure (Gluon, sm_90).

Persistent stream-K programs, each an equal contiguous range of the (64-row tile, K slot) sequence; one TMA ring
per program whose slots hold SC chunks of 256 codes (SC boxes of 64 rows x 128 bytes, the cp.async ring's own
128-byte swizzle) and their scales (one box); the chunks are decoded into wgmma's register operand as in
decode_wgmma.py, the activations streamed through a 2-chunk ring. Tiles split across programs are reduced in
order (bitwise deterministic). bf16 activations only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma

from . import launch as scratch
from .block_fp8 import OUT_DTYPES
from .decode import tensor_scale_operands
from .decode_wgmma import NVFP4_FOLD_LOG2, _bytes_layout, _decode, _pow2, _slots, _stage_activations, _weight_layout
from .problem import GemmProblem, TileConfig


@gluon.constexpr_function
def _scale_view(rows, sc, cg):
    """(sc, rows, cg) view of a scale box (rows, sc * cg) bytes, row-major: chunk q's scales are view[q]."""
    return gl.SharedLinearLayout([[0, 0, b] for b in _pow2(cg)] + [[q, 0, 0] for q in _pow2(sc)]
                                 + [[0, r, 0] for r in _pow2(rows)])


@gluon.jit
def _owner(q, TOTAL: gl.constexpr, PROGRAMS: gl.constexpr):
    """The program whose range [p TOTAL / P, (p + 1) TOTAL / P) (floors) holds slot q."""
    return ((q + 1) * PROGRAMS - 1) // TOTAL


@gluon.jit
def _issue(w_desc, s_desc, w_ring, s_ring, ready, g, c, n, R: gl.constexpr, K: gl.constexpr, SLOT: gl.constexpr,
           SC: gl.constexpr, EPB: gl.constexpr, GROUP: gl.constexpr, STAGES: gl.constexpr):
    """TMA of global slot g (tile g / (K / SLOT), K slot g % (K / SLOT)), the program's c-th of n, into ring slot
    c % STAGES: SC weight boxes (R, SLOT / SC / EPB) and one scale box (R, SLOT / GROUP)."""
    if c < n:
        KS: gl.constexpr = K // SLOT
        n0 = (g // KS) * R
        k0 = (g % KS) * SLOT
        st = c % STAGES
        bar = ready.index(st)
        mbarrier.expect(bar, SC * w_desc.block_type.nbytes + s_desc.block_type.nbytes)
        for q in gl.static_range(SC):
            tma.async_copy_global_to_shared(w_desc, [n0, (k0 + q * (SLOT // SC)) // EPB], bar, w_ring.index(st * SC + q))
        tma.async_copy_global_to_shared(s_desc, [n0, k0 // GROUP], bar, s_ring.index(st))


@gluon.jit
def _epilogue(acc, tile, j, cnt, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, M: gl.constexpr, N: gl.constexpr,
              MMA: gl.constexpr):
    """One tile's (R, BM) fp32 sum from `cnt` programs, this one the j-th: stored directly when cnt == 1; else
    into workspace slot j, and the last to arrive sums slots 0 .. cnt - 1 in order and stores."""
    R: gl.constexpr = acc.shape[0]
    BM: gl.constexpr = acc.shape[1]
    alpha = gl.load(a_ts_ptr) * gl.load(b_ts_ptr)
    on = tile * R + gl.arange(0, R, layout=gl.SliceLayout(1, MMA))
    om = gl.arange(0, BM, layout=gl.SliceLayout(0, MMA))
    offs = om[None, :] * N + on[:, None]
    mask = (om[None, :] < M) & (on[:, None] < N)
    if cnt == 1:
        gl.store(out_ptr + offs, (acc * alpha).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        gl.store(ws_ptr + j * (M * N) + offs, acc, mask=mask)
        gl.thread_barrier()
        arrived = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == cnt - 1:
            total = gl.zeros([R, BM], gl.float32, layout=MMA)
            for s in range(cnt):
                total += gl.load(ws_ptr + s * (M * N) + offs, mask=mask, other=0.0, cache_modifier=".cg")
            gl.store(out_ptr + offs, (total * alpha).to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def decode_wgmma_tma_kernel(w_ptr, s_ptr, x_ptr, xs_ptr, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr,
                            M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BM: gl.constexpr, W_KIND: gl.constexpr,
                            X_KIND: gl.constexpr, SC: gl.constexpr, STAGES: gl.constexpr, PROGRAMS: gl.constexpr):
    W: gl.constexpr = gl.num_warps()
    R: gl.constexpr = 16 * W
    CHUNK: gl.constexpr = 256
    EPB: gl.constexpr = 2
    CB: gl.constexpr = CHUNK // EPB
    SLOT: gl.constexpr = CHUNK * SC
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    CG: gl.constexpr = CHUNK // GROUP              # scales per row and chunk
    KS: gl.constexpr = K // SLOT
    TOTAL: gl.constexpr = (N + R - 1) // R * KS
    NIBBLES: gl.constexpr = BM == 16
    L3: gl.constexpr = _weight_layout(W, CB, GROUP // EPB)
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[W, 1], instr_shape=[16, BM, 16])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    XL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [W, 1], [1, 0])
    XS: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    WB: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    SB: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)

    pid = gl.program_id(0)
    g0 = pid * TOTAL // PROGRAMS
    n = (pid + 1) * TOTAL // PROGRAMS - g0

    w_desc = tma.make_tensor_descriptor(w_ptr, [N, K // EPB], [K // EPB, 1], [R, CB], WB)
    s_desc = tma.make_tensor_descriptor(s_ptr, [N, K // GROUP], [K // GROUP, 1], [R, SLOT // GROUP], SB)
    w_ring = gl.allocate_shared_memory(w_ptr.dtype.element_ty, [STAGES * SC, R, CB], WB)
    s_ring = gl.allocate_shared_memory(s_ptr.dtype.element_ty, [STAGES, R, SLOT // GROUP], SB)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for j in gl.static_range(STAGES):
        mbarrier.init(ready.index(j), count=1)
    for c in gl.static_range(STAGES - 1):
        _issue(w_desc, s_desc, w_ring, s_ring, ready, g0 + c, c, n, R, K, SLOT, SC, EPB, GROUP, STAGES)
    x_smem = gl.allocate_shared_memory(gl.bfloat16, [2, BM, CHUNK], XS)
    xv = _stage_activations(x_ptr, xs_ptr, (g0 % KS) * SLOT, M, K, BM, CHUNK, X_KIND, XL)
    x_smem.index(0).store(_slots(xv, BM, CHUNK, 32, NIBBLES))
    fence_async_shared()

    zeros = gl.zeros([R, BM], gl.float32, layout=MMA)
    acc = zeros
    for c in range(n):
        g = g0 + c
        st = c % STAGES
        mbarrier.wait(ready.index(st), (c // STAGES) & 1)
        gl.thread_barrier()  # every warp is past slot c - 1, which the next issue overwrites
        _issue(w_desc, s_desc, w_ring, s_ring, ready, g + STAGES - 1, c + STAGES - 1, n, R, K, SLOT, SC, EPB, GROUP,
               STAGES)
        for q in gl.static_range(SC):
            # The next chunk's activations: this slot's next, or the next slot's first (a K offset only).
            if q + 1 < SC:
                k_next = (g % KS) * SLOT + (q + 1) * CHUNK
            else:
                k_next = ((g + gl.where(c + 1 < n, 1, 0)) % KS) * SLOT
            xv = _stage_activations(x_ptr, xs_ptr, k_next, M, K, BM, CHUNK, X_KIND, XL)
            packed = gl.reshape(w_ring.index(st * SC + q).load(_bytes_layout(W, CB)), [R, CG, GROUP // EPB])
            raw_s = s_ring.index(st).slice(q * CG, CG, dim=1).load(gl.SliceLayout(2, L3))
            w = gl.reshape(_decode(gl.convert_layout(packed, L3), raw_s, W_KIND), [R, CHUNK])
            a = gl.convert_layout(_slots(w, R, CHUNK, 32, NIBBLES), A_OP)
            # Synchronous: unrolled, an asynchronous wgmma left in flight made ptxas serialize them (C7515).
            acc = warpgroup_mma(a, x_smem.index(q % 2).permute((1, 0)), acc)
            x_smem.index((q + 1) % 2).store(_slots(xv, BM, CHUNK, 32, NIBBLES))
            fence_async_shared()
        if (g % KS == KS - 1) or (c == n - 1):  # this tile's last slot here
            if W_KIND == "nvfp4":
                acc = acc * (2.0 ** NVFP4_FOLD_LOG2)
            tile = g // KS
            first = _owner(tile * KS, TOTAL, PROGRAMS)
            cnt = _owner(tile * KS + KS - 1, TOTAL, PROGRAMS) - first + 1
            _epilogue(acc, tile, pid - first, cnt, a_ts_ptr, b_ts_ptr, out_ptr, ws_ptr, count_ptr, M, N, MMA)
            acc = zeros
    for j in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(j))


def contributors(n_tiles: int, ks: int, programs: int) -> int:
    """The most programs whose slot ranges meet one tile (the workspace's slots)."""
    total = n_tiles * ks
    owner = lambda q: ((q + 1) * programs - 1) // total  # noqa: E731
    return max(owner(t * ks + ks - 1) - owner(t * ks) + 1 for t in range(n_tiles))


def launch(p: GemmProblem, a_values, a_scales, b_values, b_scales, alpha, *, config: TileConfig,
           compute_capability: int, a_ts=None, b_ts=None, programs: int = 264, stages: int = 2, sc: int = 4):
    rows = p.batch * p.m
    if p.a_kind != "bf16" or p.b_kind not in ("e2m1", "nvfp4") or rows > 16 or p.k % (256 * sc) or p.b_batched:
        raise ValueError("decode_wgmma_tma: bf16 x fp4, <= 16 rows, K a multiple of 256 * sc")
    x = a_values.reshape(rows, a_values.shape[-1])
    a_ts, b_ts = tensor_scale_operands(alpha, a_ts, b_ts)
    n_tiles = triton.cdiv(p.n, 64)
    ks = p.k // (256 * sc)
    programs = min(programs, n_tiles * ks)
    slots = contributors(n_tiles, ks, programs)
    out, _, _ = scratch.scratch_call(
        decode_wgmma_tma_kernel, b_values, b_scales, x, x, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((rows, p.n), OUT_DTYPES[p.out_dtype]),
                   jax.ShapeDtypeStruct((slots * rows * p.n,), jnp.float32),
                   jax.ShapeDtypeStruct((n_tiles,), jnp.int32)],
        zeroed_outputs=(2,), grid=(programs,), num_warps=4, num_stages=stages, compute_capability=compute_capability,
        name=f"decode_wgmma_tma_{p.a_kind}_{p.b_kind}", M=rows, N=p.n, K=p.k, BM=16, W_KIND=p.b_kind,
        X_KIND=p.a_kind, SC=sc, STAGES=stages, PROGRAMS=programs,
    )
    return out.reshape(p.batch, p.m, p.n)
