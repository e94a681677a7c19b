"""An experiment: the one-row fp4 GEMV streamed through a TMA ring in shared memory (issue #12, M = 1).

    python -m benchmarks.decode_gemv_tma                                 # 7168x4096, 7168x2048; mxfp4, nvfp4
    python -m benchmarks.decode_gemv_tma --configs p1:s4,p1:s6,p2:s3
    python -m benchmarks.decode_gemv_tma --configs ws:p1:s4,ws:p2:s4     # the warp-specialized variant

The question. `decode.gemv_kernel` at one row reads a 7168 x 4096 mxfp4 weight in 8.4 us on an H200, where a
same-size read takes 5.0 and its own arithmetic (4.4 SASS instructions per weight element) would issue in ~3.9
us over the GPU: close to the sum of the two rather than the larger. The hypothesis tested: its 896 programs (4
per SM, 1.7 waves) each load their whole tile, then compute, so a wave's loads and arithmetic do not overlap.
(Measured after this experiment, `python -m benchmarks.decode --l2`: with its weight resident in L2 the GEMV takes
7.84 of those 8.35 us, so its arithmetic, not its reads, sets its time; the hypothesis was wrong.) Session 38's persistent variant that
prefetched the next tile into registers doubled its registers and halved the programs, and lost (0.31-0.75x).

This kernel (`gemv_tma_kernel`, Gluon, sm_90) keeps the bytes in flight out of the registers: persistent
programs (`p` per SM) walk their 8-row tiles, K in steps of 1024 bytes per row, through a ring of `s` stages in
shared memory filled by TMA (4 boxes of 8 x 256 bytes per step; an mbarrier per stage). Each step, every thread
reads its 2 rows x 16 bytes from the stage, the CTA syncs, one thread refills that stage with the step `s` ahead,
and the arithmetic runs while the ring streams. The arithmetic is the GEMV's: the e4m3 decode
(`decode._FP4_F32_PTX`: 2**-6 times the e2m1 values as fp32), one FMA per element with the activations (staged
once per program as fp32 in shared memory, shared by a thread's two rows), each group's sum times 2**6 and its
scale (loaded one step ahead into registers), the 8 row sums reduced across threads once per tile.

Result (H200, 2026-12-02, session 39, `benchmarks/results/decode_gemv_experiments_h200_2026-12-02_session39.md`):
not adopted. Correct (relative error 6.5e-8 mxfp4, 1.3e-7 nvfp4, as the GEMV's), and 0.36-0.54x the GEMV on
every shape and configuration tried (1-4 programs per SM, 2-8 stages; 7168 x 4096 mxfp4 15.56 us at best against
8.40). More stages made it slower: the ring was not what was short. The single-partition loop has six CTA-wide
bar.sync per step, which Triton 3.6's membar analysis places around the TMA issue and the mbarrier operations;
`gemv_ws_kernel` (configs `ws:pP:sS`) removes them: a 1-warp TMA partition, stages released by named barriers as
in block_fp8_gluon.py. It ran the same, 0.45-0.54x (15.52 us at best). So the consumers' instruction stream is
the bound: the loop has 430 SASS instructions per step and thread (369 warp-specialized; 64 codes: 6.7 and 5.8
per code, where the GEMV's has 4.4), the decode, the products and their group sums plus the activation loads
from shared memory, the scale prefetch's address arithmetic and the per-step control, issued by 8 warps per
program.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")  # torch (CUPTI) shares the GPU

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import launch as scratch  # noqa: E402
from jax_blockscale._triton.block_fp8_gluon import _named_barrier  # noqa: E402
from jax_blockscale._triton.decode import _FP4_F32_PTX, _FP4_F32_UNSCALE, tensor_scale_operands  # noqa: E402
from jax_blockscale._triton.upcast import scales_to_f32  # noqa: E402

FORMATS = ("mxfp4", "nvfp4")
ROWS = gl.constexpr(8)  # weight rows per tile
STEP_BYTES = 1024   # bytes of each row per step: 4 TMA boxes of 256 (a box's largest dimension)
SMS = 132
SMEM_LIMIT = 220 * 1024


# The warp-specialized variant (`gemv_ws_kernel`): a 1-warp TMA partition fills the ring; the 8 consumer warps
# release each stage with bar.arrive on named barrier WS_BAR0 + s (the loader bar.syncs on it before refilling),
# as block_fp8_gluon.py does, so that no CTA-wide bar.sync sits in the consumers' loop.
WS_BAR0 = gl.constexpr(8)
WS_MAX_STAGES = 8                 # named barriers 8-15
WS_THREADS = gl.constexpr(8 * 32 + 32)


@gluon.jit
def _ring(w_ptr, N: gl.constexpr, K: gl.constexpr, STAGES: gl.constexpr):
    """The weight's TMA descriptor (8 x 256-byte boxes), the ring (TMA's view: one box per buffer; the threads'
    view: one (4 boxes x 8 rows, 256) stage per buffer) and its stages' mbarriers."""
    W_SL: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8, rank=2)
    w_desc = tma.make_tensor_descriptor(w_ptr, [N, K // 2], [K // 2, 1], [ROWS, 256], W_SL)
    w_bufs = gl.allocate_shared_memory(gl.uint8, [STAGES * 4, ROWS, 256], W_SL)
    w_stages = w_bufs._reinterpret(gl.uint8, [STAGES, 4 * ROWS, 256], W_SL)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    return w_desc, w_bufs, w_stages, ready


@gluon.jit
def _fill(w_desc, w_bufs, ready, step, s, pred, N: gl.constexpr, K: gl.constexpr, PROGRAMS: gl.constexpr):
    """Issues this program's step `step` (tile pid + (step // steps per tile) * PROGRAMS, 1024 bytes of each of
    its rows) into stage s, where pred."""
    SPT: gl.constexpr = K // 2 // 1024
    t = gl.program_id(0) + (step // SPT) * PROGRAMS
    kb = (step % SPT) * 1024
    mbarrier.expect(ready.index(s), 4 * ROWS * 256, pred=pred)
    for j in gl.static_range(4):
        tma.async_copy_global_to_shared(w_desc, [t * ROWS, kb + 256 * j], ready.index(s), w_bufs.index(4 * s + j),
                                        pred=pred)


@gluon.jit
def _stage_x(x_ptr, K: gl.constexpr):
    """The activations as fp32 in shared memory, even and odd codes apart, viewed per step: (K / 2048, 4 boxes,
    256) each."""
    XS: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[1, 0])
    xe_smem = gl.allocate_shared_memory(gl.float32, [K // 512, 256], XS)
    xo_smem = gl.allocate_shared_memory(gl.float32, [K // 512, 256], XS)
    XSL: gl.constexpr = gl.BlockedLayout([1, 8, 2], [1, 32, 1], [gl.num_warps(), 1, 1], [2, 1, 0])
    bi = gl.arange(0, K // 512, layout=gl.SliceLayout(1, gl.SliceLayout(2, XSL)))[:, None, None]
    yi = gl.arange(0, 256, layout=gl.SliceLayout(0, gl.SliceLayout(2, XSL)))[None, :, None]
    ni = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, XSL)))[None, None, :]
    x_even, x_odd = gl.split(gl.load(x_ptr + bi * 512 + yi * 2 + ni).to(gl.float32))
    xe_smem.store(x_even)
    xo_smem.store(x_odd)
    gl.thread_barrier()
    return (xe_smem._reinterpret(gl.float32, [K // 2048, 4, 256], XS),
            xo_smem._reinterpret(gl.float32, [K // 2048, 4, 256], XS))


@gluon.jit
def _consume(w_desc, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr, w_bufs, w_stages, ready, xe_steps, xo_steps,
             N: gl.constexpr, K: gl.constexpr, NV: gl.constexpr, STAGES: gl.constexpr, PROGRAMS: gl.constexpr,
             WS: gl.constexpr):
    """Every step of this program: wait for its stage, read it, hand the stage back (WS: bar.arrive for the
    loader partition; else the CTA syncs and refills it with the step STAGES ahead), then the GEMV's arithmetic;
    each tile's 8 sums stored after its last step. NV: nvfp4 weights (else mxfp4). (Numbers only in the
    signature: a warp-specialized partition's string arguments do not reach it.)"""
    GROUP: gl.constexpr = 32 - 16 * NV
    GB: gl.constexpr = GROUP // 2                           # bytes per scale group
    SPT: gl.constexpr = K // 2 // 1024                      # steps per tile
    TILES: gl.constexpr = (N + 7) // 8
    # a stage as (4 boxes x 8 rows, 256 bytes): a thread holds 2 rows x 16 bytes of one box; the layouts of its
    # (box, row, byte) view and of the group sums, traced from a constant (folded away)
    L2: gl.constexpr = gl.BlockedLayout([2, 16], [2, 16], [8, 1], [1, 0])
    probe = gl.reshape(gl.zeros([4 * ROWS, 256], gl.float32, L2), [4, ROWS, 256])
    XL: gl.constexpr = gl.SliceLayout(1, probe.type.layout)  # (box, byte): activations
    SL: gl.constexpr = gl.sum(gl.reshape(probe, [4, ROWS, 256 // GB, GB]), axis=3).type.layout
    pid = gl.program_id(0)
    total = ((TILES - pid + PROGRAMS - 1) // PROGRAMS) * SPT
    jj = gl.arange(0, 4, layout=gl.SliceLayout(1, gl.SliceLayout(2, SL)))[:, None, None]
    rr = gl.arange(0, ROWS, layout=gl.SliceLayout(0, gl.SliceLayout(2, SL)))[None, :, None]
    gg = gl.arange(0, 256 // GB, layout=gl.SliceLayout(0, gl.SliceLayout(1, SL)))[None, None, :]
    acc = gl.zeros([4, ROWS, 256 // GB], gl.float32, layout=SL)
    # scales of step 0, then each step loads the next one's (past the last step: a valid address, never used)
    s_next = gl.load(s_ptr + gl.minimum(pid * ROWS + rr, N - 1) * (K // GROUP) + (jj * 256 + gg * GB) // GB)
    alpha = gl.load(a_ts_ptr) * gl.load(b_ts_ptr)
    for step in range(total):
        s = step % STAGES
        tile = pid + (step // SPT) * PROGRAMS
        raw_s = s_next
        nstep = step + 1
        nrows = gl.minimum((pid + (nstep // SPT) * PROGRAMS) * ROWS + rr, N - 1)
        s_next = gl.load(s_ptr + nrows * (K // GROUP) + ((nstep % SPT) * 1024 + jj * 256 + gg * GB) // GB)
        mbarrier.wait(ready.index(s), (step // STAGES) & 1)
        w = gl.reshape(w_stages.index(s).load(L2), [4, ROWS, 256])      # (box, row, byte) uint8
        if WS:
            _named_barrier(WS_BAR0 + s, WS_THREADS, True, 8)         # stage s read: the loader may refill it
        else:
            gl.thread_barrier()                                      # every thread has read stage s
            fence_async_shared()
            _fill(w_desc, w_bufs, ready, step + STAGES, s, step + STAGES < total, N, K, PROGRAMS)
        lo, hi = gl.inline_asm_elementwise(_FP4_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [w],
                                           dtype=(gl.float32, gl.float32), is_pure=True, pack=4)
        xe = xe_steps.index(step % SPT).load(XL)                     # (4, 256)
        xo = xo_steps.index(step % SPT).load(XL)
        prod = lo * gl.expand_dims(xe, 1) + hi * gl.expand_dims(xo, 1)
        part = gl.sum(gl.reshape(prod, [4, ROWS, 256 // GB, GB]), axis=3)
        if NV:
            sv = scales_to_f32(raw_s, "nvfp4")
        else:
            sv = scales_to_f32(raw_s, "e2m1")
        acc += part * (sv * _FP4_F32_UNSCALE)
        if step % SPT == SPT - 1:
            total_r = gl.sum(gl.sum(acc, axis=2), axis=0)            # (8,)
            on = tile * ROWS + gl.arange(0, ROWS, layout=total_r.type.layout)
            gl.store(out_ptr + on, (total_r * alpha).to(out_ptr.dtype.element_ty), mask=on < N)
            acc = gl.zeros([4, ROWS, 256 // GB], gl.float32, layout=SL)


@gluon.jit
def _ws_loader(w_desc, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr, w_bufs, w_stages, ready, xe_steps, xo_steps,
               N: gl.constexpr, K: gl.constexpr, NV: gl.constexpr, STAGES: gl.constexpr, PROGRAMS: gl.constexpr,
               WS: gl.constexpr):
    """The TMA partition: every step of this program into stage step % STAGES, once the consumers released it
    (the consumers' signature; most arguments unused)."""
    SPT: gl.constexpr = K // 2 // 1024
    TILES: gl.constexpr = (N + 7) // 8
    total = ((TILES - gl.program_id(0) + PROGRAMS - 1) // PROGRAMS) * SPT
    for step in range(total):
        s = step % STAGES
        if step >= STAGES:
            _named_barrier(WS_BAR0 + s, WS_THREADS, False, 1)
        _fill(w_desc, w_bufs, ready, step, s, True, N, K, PROGRAMS)
    # every arrival on a named barrier is waited for before the program ends
    for i in range(gl.maximum(total - STAGES, 0), total):
        _named_barrier(WS_BAR0 + i % STAGES, WS_THREADS, False, 1)


@gluon.jit
def gemv_tma_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
                    N: gl.constexpr, K: gl.constexpr, NV: gl.constexpr, STAGES: gl.constexpr,
                    PROGRAMS: gl.constexpr):
    """out (1, N) = a_ts * b_ts * x (1, K) bf16 @ decode(w (N, K / 2), s).T, w mxfp4 (NV 0) or nvfp4 (NV 1), read
    through a TMA descriptor made in the kernel. Grid (PROGRAMS,), 8 warps; K a multiple of 2048."""
    w_desc, w_bufs, w_stages, ready = _ring(w_ptr, N, K, STAGES)
    SPT: gl.constexpr = K // 2 // 1024
    TILES: gl.constexpr = (N + 7) // 8
    total = ((TILES - gl.program_id(0) + PROGRAMS - 1) // PROGRAMS) * SPT
    for i in gl.static_range(STAGES):  # the ring's first STAGES steps go out before anything else
        _fill(w_desc, w_bufs, ready, i, i, i < total, N, K, PROGRAMS)
    xe_steps, xo_steps = _stage_x(x_ptr, K)
    _consume(w_desc, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr, w_bufs, w_stages, ready, xe_steps, xo_steps, N, K, NV,
             STAGES, PROGRAMS, 0)


@gluon.jit
def gemv_ws_kernel(w_ptr, s_ptr, x_ptr, a_ts_ptr, b_ts_ptr, out_ptr,
                   N: gl.constexpr, K: gl.constexpr, NV: gl.constexpr, STAGES: gl.constexpr,
                   PROGRAMS: gl.constexpr):
    """`gemv_tma_kernel`'s product, warp-specialized (`_ws_loader`, `_consume`). Launched with 8 warps (the
    consumers); the loader adds one. STAGES <= 8."""
    w_desc, w_bufs, w_stages, ready = _ring(w_ptr, N, K, STAGES)
    xe_steps, xo_steps = _stage_x(x_ptr, K)
    # (the argument tuples written out: a tuple bound to a name first turns its numbers into tensors)
    gl.warp_specialize([
        (_consume, (w_desc, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr, w_bufs, w_stages, ready, xe_steps, xo_steps, N, K,
                    NV, STAGES, PROGRAMS, 1)),
        (_ws_loader, (w_desc, s_ptr, a_ts_ptr, b_ts_ptr, out_ptr, w_bufs, w_stages, ready, xe_steps, xo_steps, N, K,
                      NV, STAGES, PROGRAMS, 1)),
    ], [1], [48])


def check(rows: int, n: int, k: int, stages: int, ws: bool = False) -> None:
    if rows != 1:
        raise ValueError(f"the TMA GEMV takes one activation row, got {rows}")
    if k % 2048:
        raise ValueError(f"K must be a multiple of 2048, got {k}")
    smem = stages * ROWS * STEP_BYTES + 4 * k + 1024
    if smem > SMEM_LIMIT:
        raise ValueError(f"{stages} stages and K={k} need {smem} bytes of shared memory (> {SMEM_LIMIT})")
    if ws and not 1 <= stages <= WS_MAX_STAGES:
        raise ValueError(f"the warp-specialized kernel releases each stage by its own named barrier "
                         f"({WS_BAR0.value}-15): 1 to {WS_MAX_STAGES} stages, got {stages}")


def launch(x: jax.Array, w: "jb.BlockScaledArray", programs_per_sm: int, stages: int,
           out_dtype=jnp.bfloat16, ws: bool = False) -> jax.Array:
    """x (1, K) bf16 @ w (N, K) mxfp4 / nvfp4 (quantize_operand(..., side="b")).T -> (1, N)."""
    if w.fmt.name not in FORMATS:
        raise ValueError(f"formats {FORMATS}, got {w.fmt.name!r}")
    (rows, _), (n, k) = x.shape, w.shape
    check(rows, n, k, stages, ws)
    a_ts, b_ts = tensor_scale_operands(jnp.ones((1,), jnp.float32), 1.0, w.tensor_scale)
    tiles = -(-n // ROWS)
    programs = min(tiles, SMS * programs_per_sm)
    (out,) = scratch.scratch_call(
        gemv_ws_kernel if ws else gemv_tma_kernel, w.values, w.scales, x, a_ts, b_ts,
        out_shape=[jax.ShapeDtypeStruct((1, n), out_dtype)], grid=(programs,), num_warps=8, num_stages=1,
        # the warp-specialized kernel takes as many registers as one program per SM allows unless capped
        maxnreg=(65536 // (WS_THREADS.value * programs_per_sm)) // 8 * 8 if ws and programs_per_sm > 1 else 0,
        compute_capability=90, name=f"gemv_{'ws' if ws else 'tma'}_{w.fmt.name}", N=n, K=k,
        NV=int(w.fmt.name == "nvfp4"), STAGES=stages, PROGRAMS=programs)
    return out


def parse_config(spec: str) -> tuple[int, int, bool]:
    """'p1:s4' -> (programs per SM, ring stages, False); 'ws:p2:s6' -> the warp-specialized kernel."""
    parts = spec.split(":")
    ws = parts[0] == "ws"
    v = {t[0]: int(t[1:]) for t in parts[ws:]}
    return v["p"], v["s"], ws


def sass(configs, kinds, n: int = 7168, k: int = 4096) -> None:
    """CPU: compile for sm_90; registers, shared memory and the loop's SASS per weight element."""
    from jax_blockscale._triton.compile import compile_kernel
    from benchmarks._sass import disassemble, registers

    for kind in kinds:
        for p, st, ws in configs:
            sig = dict(w_ptr="*u8", s_ptr="*u8", x_ptr="*bf16", a_ts_ptr="*fp32", b_ts_ptr="*fp32", out_ptr="*bf16")
            ck = compile_kernel(gemv_ws_kernel if ws else gemv_tma_kernel, target="sm_90", signature=sig,
                                constexprs=dict(N=n, K=k, NV=int(kind == "nvfp4"), STAGES=st, PROGRAMS=SMS * p),
                                num_warps=8, num_stages=1)
            text = disassemble(ck.asm["cubin"], "cuobjdump")
            n_inst = sum(1 for line in text.splitlines() if line.strip().startswith("/*") and ";" in line)
            print(f"{kind} {'ws:' if ws else ''}p{p}:s{st}: regs {registers(ck.asm['cubin'])}, smem {ck.metadata.shared}, "
                  f"{n_inst} SASS instructions (static)")


def main(argv=None) -> None:
    from .decode import experiment_main

    def variant(config, fmt):
        p, st, wsp = config
        return (f"{'ws:' if wsp else ''}p{p}:s{st}", lambda n, k: check(1, n, k, st, wsp),
                lambda x, w, dtype: launch(x, w, p, st, dtype, ws=wsp))

    experiment_main(argv, __doc__.split("\n")[0], shapes="7168x4096,7168x2048,8192x8192", formats="mxfp4,nvfp4",
                    configs="p1:s4,p1:s6,p2:s3", config_help="[ws:]pP:sS,... (programs per SM, ring stages)",
                    parse=parse_config, sass=sass, variant=variant, again=False)


if __name__ == "__main__":
    main()
