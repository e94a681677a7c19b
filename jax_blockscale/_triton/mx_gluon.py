"""Hopper GEMM for bf16 activations x MX / nvfp4 weights in Gluon: the weight decoded in registers, as
wgmma's A operand, while the other consumer's wgmma runs. Opt-in (`TileConfig(kernel="mx_gluon")`): it
measured slower than the upcast path that dispatch keeps (below).

Why it was tried (issue #13): Hopper has no block-scaled MMA, so an MX weight is decoded to bf16 before a
bf16 wgmma. The upcast path decodes it in XLA first (a memory pass that writes the bf16 weight, which the
bf16 TMA GEMM reads back), and `hopper_mx.py` decodes inside a single-stream Triton loop, where the tensor
cores idle during each decode (0.39-0.47x XLA bf16). Here the decode runs beside the MMA instead:

    loader     (1 warp)   TMA: (BLOCK_X, BLOCK_K) bf16 activation tiles into STAGES stages.
    consumer 0 (4 warps)  weight rows 0-63 of the tile   } per K step: issue this step's wgmma, wait for the
    consumer 1 (4 warps)  weight rows 64-127 of the tile } previous one, decode the next step's weight while
                                                           this one runs; codes loaded two steps ahead.

The product is computed transposed (out.T = w @ x.T): the weight is wgmma's M side (64 rows per consumer),
so its decoded tile never goes through shared memory; only the activations do, by TMA, as in a bf16 GEMM.

The weight fragment: thread 4g + t of warp w holds, per k16 step, rows 16w + g and 16w + g + 8 at K
{2t, 2t + 1, 2t + 8, 2t + 9} (wgmma's bf16 A fragment, true K order). `_items_layout` gives the weight
items (fp4: bytes, each a pair of codes; 8-bit: codes) in that layout with each group's scale broadcast
along its items, so that decoding (decode_wgmma.py's exact PTX: bit placement and a bf16 multiply by the
scale) lands in the fragment with no data movement. The codes are loaded as 8-byte vectors (its `vectors`)
and moved into the fragment within each row quad when used (one 16-byte shared-memory store and one
ldmatrix per step): loading the fragment's items directly took sixteen 1-byte loads per step.

Measured (H100, 2026-11-24, kernel time, benchmarks/results/mx_gluon_h100_2026-11-24_session22.md): 128 x 256
tiles, 64-wide K steps, 4 stages: 0.70-0.76x XLA's bf16 dot (bf16 product) and 0.78-0.90x the upcast path
for bf16 x mxfp4 / nvfp4 at 8192^3 and the Llama M = 4096 shapes; bf16 x mxfp8 0.65x. A K step takes
~1650 cycles against the 1024 its two m64n256k64 wgmma need: the consumer's decode (~280 SASS instructions
per thread and step for 32 fp4 codes, one warp per scheduler per consumer) is on each consumer's path from
one wgmma to the next. 128-column tiles, which halve the MMA per step, took ~1350 cycles per step (0.45x):
the step costs about the same whatever the MMA, and the decode is repeated for every activation tile (M /
256 times per weight element), where the upcast path decodes each element once. 128-wide K steps spill
(two decoded A operands beside the 128-register accumulator).

A weight layout prepared for the fragment (session 23: codes permuted so that each thread loads two 32-bit
words per row and step and decodes them without byte shuffles, 226 instead of 281 instructions per step) ran
0.80-0.89x XLA bf16; without the decode at all this pipeline runs 1.01-1.10x, and Nsight Compute finds the
consumers' decode instructions, not wgmma waits, filling the step
(benchmarks/results/mx_gluon_prepared_h100_2026-11-24_session23.md, with the patch).

Layouts: x (M, K) bf16; w (N, K / epb) codes with scales (N, K / group) as the contract gives them (nvfp4:
e4m3 scales, its tensor scales multiply the fp32 result); out (M, N). Unbatched w; K a multiple of
BLOCK_K, at least two K steps. Weight rows past N read row N - 1 (their output columns are never stored);
the TMA zero-fills activation rows past M.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from . import launch as scratch
# The register split and shared-memory budget of block_fp8_gluon's warp-specialized layout (one loader warp,
# two 4-warp consumers), which this kernel shares.
from .block_fp8_gluon import (CONSUMER_REGISTERS, LOADER_REGISTERS, MAX_REGISTERS, SMEM_BYTES, _program_tiles,
                              _tile_origin, check_warp_specialized, stage_barriers)
from .decode import tensor_scale_operands
from .decode_wgmma import _decode
from .problem import NVFP4, OUT_DTYPES, GemmProblem, TileConfig, check_operands, out_rows_tma_aligned

W_KINDS = ("e2m1", NVFP4, "e4m3", "e5m2")
SUPPORTED: frozenset[tuple[str, str]] = frozenset({("bf16", w) for w in W_KINDS})
BLOCK_W = 128  # weight rows per tile: two consumers of 64 (wgmma's M)
_BLOCK_W = gl.constexpr(BLOCK_W)


@gluon.constexpr_function
def _items_layout(rows, block_k, group, epb, vectors):
    """(rows, block_k / group, group / epb) layout of weight items (fp4: bytes of two codes; 8-bit: codes),
    a group's items along the last axis (where its scale broadcasts), rows = 16 * warps.

    vectors=False: wgmma's bf16 A fragment (module docstring) in true K order. Register order: the code pair
    (8-bit: item bit 0; fp4: the pair is one byte, joined after the decode), row + 8, K + 8, then the k16
    steps. vectors=True: the same rows and warps, with the four lanes of a row quad each holding 8
    contiguous bytes of the row (one 8-byte load) instead of the fragment's scattered 1- or 2-byte items, so
    that the conversion to the fragment stays within each quad."""
    per_group = group // epb
    log_items = (block_k // epb).bit_length() - 1

    def item(i):  # a power-of-two item offset along the row -> (row, group, item in group)
        return [0, i // per_group, i % per_group]

    row_lanes = [[1, 0, 0], [2, 0, 0], [4, 0, 0]]
    if vectors:  # 8 bytes: items 0-7 for 8-bit codes, bytes 0-7 (16 codes) for fp4
        regs = [item(1), item(2), item(4), [8, 0, 0]] + [item(1 << b) for b in range(5, log_items)]
        lanes = [item(8), item(16)] + row_lanes
    elif epb == 1:
        regs = [item(1), [8, 0, 0], item(8)] + [item(1 << b) for b in range(4, log_items)]
        lanes = [item(2), item(4)] + row_lanes
    else:
        regs = [[8, 0, 0], item(4)] + [item(1 << b) for b in range(3, log_items)]
        lanes = [item(1), item(2)] + row_lanes
    warps = [[16 << w, 0, 0] for w in range(rows.bit_length() - 5)]
    return gl.DistributedLinearLayout(regs, lanes, warps, [], [rows, block_k // group, per_group])


@gluon.jit
def _load_weight(w_ptr, s_ptr, w0, k0, N: gl.constexpr, K: gl.constexpr, R: gl.constexpr, BLOCK_K: gl.constexpr,
                 GROUP: gl.constexpr, EPB: gl.constexpr, L3: gl.constexpr, LL: gl.constexpr):
    """Weight items (R, BLOCK_K / GROUP, GROUP / EPB) of rows w0.. at K offset k0 in LL (`_fragment` converts
    them when they are used, a step later: converting here would wait for the load) and their raw scales
    (R, BLOCK_K / GROUP) in L3's slice. Rows past N read row N - 1."""
    PER_GROUP: gl.constexpr = GROUP // EPB
    rows = gl.minimum(w0 + gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, LL))), N - 1)
    groups = gl.arange(0, BLOCK_K // GROUP, layout=gl.SliceLayout(0, gl.SliceLayout(2, LL)))
    items = gl.arange(0, PER_GROUP, layout=gl.SliceLayout(0, gl.SliceLayout(1, LL)))
    offs = (rows[:, None, None] * (K // EPB) + k0 // EPB + groups[None, :, None] * PER_GROUP
            + items[None, None, :])
    codes = gl.load(w_ptr + offs)
    s_rows = gl.minimum(w0 + gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, L3))), N - 1)
    s_groups = gl.arange(0, BLOCK_K // GROUP, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    raw_s = gl.load(s_ptr + s_rows[:, None] * (K // GROUP) + k0 // GROUP + s_groups[None, :])
    return codes, raw_s


@gluon.jit
def _fragment(codes, raw_s, W_KIND: gl.constexpr, BLOCK_K: gl.constexpr, L3: gl.constexpr, A_OP: gl.constexpr):
    """Loaded weight items and scales -> the (64, BLOCK_K) bf16 A operand: the items move within each row
    quad into the fragment layout, then decode there (exact, decode_wgmma._decode)."""
    w = _decode(gl.convert_layout(codes, L3), raw_s, W_KIND)
    return gl.convert_layout(gl.reshape(w, [64, BLOCK_K]), A_OP)


@gluon.jit
def _loader(descs, bufs, bars, ptrs, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BLOCK_X: gl.constexpr,
            BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr,
            W_KIND: gl.constexpr, TMA_STORE: gl.constexpr, WG: gl.constexpr):
    """The TMA partition: the activation tile of every (tile, K step) of this program, in order."""
    x_desc = descs[0]
    x_bufs = bufs[0]
    ready, empty = bars
    K_STEPS: gl.constexpr = K // BLOCK_K
    step = 0
    for t in range(_program_tiles(N, M, _BLOCK_W, BLOCK_X, NUM_SMS)):
        x0 = _tile_origin(t, N, M, GROUP_M, _BLOCK_W, BLOCK_X, NUM_SMS)[1]
        for kb in range(K_STEPS):
            s = step % STAGES
            mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)  # a fresh barrier: the first pass is free
            mbarrier.expect(ready.index(s), x_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(x_desc, [x0, kb * BLOCK_K], ready.index(s), x_bufs.index(s))
            step += 1


@gluon.jit
def _consumer(descs, bufs, bars, ptrs, M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BLOCK_X: gl.constexpr,
              BLOCK_K: gl.constexpr, GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr,
              W_KIND: gl.constexpr, TMA_STORE: gl.constexpr, WG: gl.constexpr):
    """Weight rows WG * 64 .. + 63 of every tile: decode, wgmma, and the transposed epilogue."""
    out_desc = descs[1]
    x_bufs, c_bufs = bufs
    ready, empty = bars
    w_ptr, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr = ptrs
    FP4: gl.constexpr = W_KIND == "e2m1" or W_KIND == "nvfp4"
    EPB: gl.constexpr = 2 if FP4 else 1
    GROUP: gl.constexpr = 16 if W_KIND == "nvfp4" else 32
    K_STEPS: gl.constexpr = K // BLOCK_K
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_X, 16])
    A_OP: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2)
    L3: gl.constexpr = _items_layout(64, BLOCK_K, GROUP, EPB, False)
    LL: gl.constexpr = _items_layout(64, BLOCK_K, GROUP, EPB, True)
    alpha = gl.load(a_ts_ptr) * gl.load(b_ts_ptr)
    tiles = _program_tiles(N, M, _BLOCK_W, BLOCK_X, NUM_SMS)
    # Weight codes run two K steps ahead of the wgmma: steps 0 and 1 of the first tile here (K_STEPS >= 2).
    w0 = _tile_origin(0, N, M, GROUP_M, _BLOCK_W, BLOCK_X, NUM_SMS)[0] + WG * 64
    codes, raw_s = _load_weight(w_ptr, s_ptr, w0, 0, N, K, 64, BLOCK_K, GROUP, EPB, L3, LL)
    a = _fragment(codes, raw_s, W_KIND, BLOCK_K, L3, A_OP)
    codes, raw_s = _load_weight(w_ptr, s_ptr, w0, BLOCK_K, N, K, 64, BLOCK_K, GROUP, EPB, L3, LL)
    acc = gl.zeros([64, BLOCK_X], gl.float32, layout=MMA)
    a_prev = a
    step = 0
    for t in range(tiles):
        w0, x0 = _tile_origin(t, N, M, GROUP_M, _BLOCK_W, BLOCK_X, NUM_SMS)
        # The next tile's weight rows (this program's last tile: its own, loaded again and unused).
        next_w0 = _tile_origin(gl.minimum(t + 1, tiles - 1), N, M, GROUP_M, _BLOCK_W, BLOCK_X, NUM_SMS)[0]
        for kb in range(K_STEPS):
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            acc = warpgroup_mma(a, x_bufs.index(s).permute((1, 0)), acc, use_acc=kb > 0, is_async=True)
            # One wgmma stays queued: wait for the previous step's (its A registers live until then).
            acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
            if kb > 0:
                mbarrier.arrive(empty.index((step - 1) % STAGES), count=1)  # both consumers' arrivals free it
            a_prev = a
            # The next step's weight decodes while this wgmma runs; its codes were loaded a step ago.
            a = _fragment(codes, raw_s, W_KIND, BLOCK_K, L3, A_OP)
            ahead = gl.where(kb + 2 < K_STEPS, w0, next_w0) + WG * 64
            codes, raw_s = _load_weight(w_ptr, s_ptr, ahead, ((kb + 2) % K_STEPS) * BLOCK_K, N, K, 64, BLOCK_K,
                                        GROUP, EPB, L3, LL)
            step += 1
        acc, a_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a_prev))
        mbarrier.arrive(empty.index((step - 1) % STAGES), count=1)
        out = (acc * alpha).to(out_ptr.dtype.element_ty)
        c_smem = c_bufs.index(WG)
        if TMA_STORE:
            tma.store_wait(pendings=0)  # the previous tile's store has read the buffer
            c_smem.permute((1, 0)).store(out)
            fence_async_shared()
            tma.async_copy_shared_to_global(out_desc, [x0, w0 + WG * 64], c_smem)
        else:
            cols = w0 + WG * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, MMA))
            rows = x0 + gl.arange(0, BLOCK_X, layout=gl.SliceLayout(0, MMA))
            gl.store(out_ptr + rows[None, :].to(gl.int64) * N + cols[:, None], out,
                     mask=(rows[None, :] < M) & (cols[:, None] < N))
    if TMA_STORE:
        tma.store_wait(pendings=0)


@gluon.jit
def mx_gluon_kernel(
    x_ptr, w_ptr, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
    M: gl.constexpr, N: gl.constexpr, K: gl.constexpr, BLOCK_X: gl.constexpr, BLOCK_K: gl.constexpr,
    GROUP_M: gl.constexpr, NUM_SMS: gl.constexpr, STAGES: gl.constexpr, W_KIND: gl.constexpr,
    TMA_STORE: gl.constexpr,
):
    """out (M, N) = a_ts * b_ts * x (M, K) @ decode(w (N, K / epb), s (N, K / group)).T.

    Grid (NUM_SMS,), every program with at least one tile; launched with num_warps=4 (consumer 0), the
    partitions add a 4-warp consumer and the 1-warp loader."""
    x_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_X, BLOCK_K], gl.bfloat16)
    x_desc = tma.make_tensor_descriptor(x_ptr, [M, K], [K, 1], [BLOCK_X, BLOCK_K], x_layout)
    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_X, BLOCK_K], x_layout)
    ready, empty = stage_barriers(STAGES)
    out_ty: gl.constexpr = out_ptr.dtype.element_ty
    c_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_X, 64], out_ty)
    if TMA_STORE:
        out_desc = tma.make_tensor_descriptor(out_ptr, [M, N], [N, 1], [BLOCK_X, 64], c_layout)
        c_bufs = gl.allocate_shared_memory(out_ty, [2, BLOCK_X, 64], c_layout)
    else:  # placeholders of the partitions' common signature; the pointer store uses neither
        out_desc = x_desc
        c_bufs = gl.allocate_shared_memory(out_ty, [2, 8, 64], c_layout)
    descs = (x_desc, out_desc)
    bufs = (x_bufs, c_bufs)
    bars = (ready, empty)
    ptrs = (w_ptr, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr)
    gl.warp_specialize([
        (_consumer, (descs, bufs, bars, ptrs, M, N, K, BLOCK_X, BLOCK_K, GROUP_M, NUM_SMS, STAGES, W_KIND,
                     TMA_STORE, 0)),
        (_consumer, (descs, bufs, bars, ptrs, M, N, K, BLOCK_X, BLOCK_K, GROUP_M, NUM_SMS, STAGES, W_KIND,
                     TMA_STORE, 1)),
        (_loader, (descs, bufs, bars, ptrs, M, N, K, BLOCK_X, BLOCK_K, GROUP_M, NUM_SMS, STAGES, W_KIND,
                   TMA_STORE, 0)),
    ], [4, 1], [CONSUMER_REGISTERS, LOADER_REGISTERS])


# ---------------------------------------------------------------------------------------------------------
# jnp side.

# 64 activation rows measured 0.22x XLA bf16 (first version, 8192^3: the same decode per step for half the MMA).
BLOCK_XS = (128, 256)
# 128-wide K steps spill (two decoded A operands of 32 registers each beside the 128-register accumulator).
BLOCK_KS = (64,)


def _smem_bytes(config: TileConfig, out_dtype) -> int:
    stages = config.num_stages * config.block_n * config.block_k * 2
    return stages + 2 * config.block_n * 64 * jnp.dtype(out_dtype).itemsize + 4096  # + barriers, alignment


def check_config(p: GemmProblem, config: TileConfig) -> None:
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"the Gluon MX kernel takes bf16 activations x {'/'.join(W_KINDS)} weights, got "
                         f"{p.a_kind} x {p.b_kind}")
    if p.b_batched:
        raise ValueError("the Gluon MX kernel takes an unbatched weight")
    if config.block_m != BLOCK_W or config.block_n not in BLOCK_XS or config.block_k not in BLOCK_KS:
        raise ValueError(f"the Gluon MX kernel runs {BLOCK_W} weight rows (block_m) x block_n in {BLOCK_XS} "
                         f"activation rows x block_k in {BLOCK_KS}, got {config.block_m} x {config.block_n} x "
                         f"{config.block_k}")
    if p.k % config.block_k or p.k < 2 * config.block_k:
        # The consumers load the weight two K steps ahead, the second of them possibly in the next tile.
        raise ValueError(f"K ({p.k}) must be a multiple of block_k ({config.block_k}), at least two K steps")
    check_warp_specialized(config, "the Gluon MX kernel", _smem_bytes(config, OUT_DTYPES[p.out_dtype]),
                           f"{config.num_stages} stages of {config.block_n} x {config.block_k} activations and the "
                           f"output tiles")


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """The measured best: 256 activation rows per tile, 64-wide K steps, 4 stages (3 stages within 3%; 128
    rows 0.6x as fast; 128-wide K steps spill), or as many stages as fit beside an fp32 output's buffers."""
    del target
    config = TileConfig(block_m=BLOCK_W, block_n=256, block_k=64, group_m=8, num_warps=4, num_stages=4,
                        kernel="mx_gluon")
    out_dtype = OUT_DTYPES[p.out_dtype]
    while config.num_stages > 2 and _smem_bytes(config, out_dtype) > SMEM_BYTES:
        config = config.replace(num_stages=config.num_stages - 1)
    return config


# The primitive passes nvfp4 tensor scales separately (`a_ts`, `b_ts`), multiplied in the kernel.
TAKES_TENSOR_SCALES = True


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int, a_ts=None, b_ts=None) -> jax.Array:
    """bf16 x MX / nvfp4 GEMM on the Gluon kernel; returns (p.batch, p.m, p.n) of p.out_dtype. `a_scales`
    (bf16 activations have none) is checked and not read."""
    if compute_capability != 90:
        raise ValueError(f"the Gluon MX kernel runs on sm_90 (wgmma), got compute capability {compute_capability}")
    check_config(p, config)
    check_operands(p, a_values, a_scales, b_values, b_scales)
    rows = p.batch * p.m
    x = a_values.reshape(rows, p.k)
    a_ts, b_ts = tensor_scale_operands(alpha, a_ts, b_ts)
    tiles = triton.cdiv(p.n, BLOCK_W) * triton.cdiv(rows, config.block_n)
    programs = min(config.num_sms, tiles)
    out_dtype = OUT_DTYPES[p.out_dtype]
    out = scratch.scratch_call(
        mx_gluon_kernel, x, b_values, b_scales, a_ts, b_ts,
        out_shape=jax.ShapeDtypeStruct((rows, p.n), out_dtype), grid=(programs, 1, 1), num_warps=4,
        num_stages=config.num_stages, compute_capability=compute_capability, name=f"mx_gluon_bf16_{p.b_kind}",
        maxnreg=MAX_REGISTERS, M=rows, N=p.n, K=p.k, BLOCK_X=config.block_n, BLOCK_K=config.block_k,
        GROUP_M=config.group_m, NUM_SMS=programs, STAGES=config.num_stages, W_KIND=p.b_kind,
        TMA_STORE=out_rows_tma_aligned(p),
    )
    return out.reshape(p.batch, p.m, p.n)
