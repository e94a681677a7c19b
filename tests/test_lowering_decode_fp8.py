"""The block FP8 decode kernel (`_triton/decode_fp8.py`), dispatched and compiled on a CPU machine.

Checked: which problems dispatch sends it (sm_90, block FP8 x block FP8 at 1-64 activation rows), its
configuration rules and errors, and what the compiled kernel promises: the weight and activations arrive by
TMA (cp.async.bulk.tensor into an mbarrier ring; no per-thread global loads of codes), the codes go to an fp8
wgmma as they are (m64nBMk32 e4m3 x e4m3, both operands from shared memory), and a matmul lowers to this one
kernel. Results are tested on the GPU (tests/test_gpu_decode_fp8.py).
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale._triton import decode_fp8 as df
from jax_blockscale._triton.compile import compile_kernel
from jax_blockscale._triton.problem import GemmProblem

from _jax_triton import require_jax_triton

jt = require_jax_triton()

SIGNATURE = dict(w_ptr="*fp8e4nv", w_scale_ptr="*fp32", x_ptr="*fp8e4nv", x_scale_ptr="*fp32", a_ts_ptr="*fp32",
                 b_ts_ptr="*fp32", out_ptr="*bf16", ws_ptr="*fp32", count_ptr="*i32")


def _problem(m=16, n=7168, k=4096):
    return GemmProblem(1, False, m, n, k, "block_fp8", "block_fp8", "bf16")


@pytest.mark.parametrize("target,rows,n,k,want", [
    ("sm_90", 16, 7168, 4096, "decode_fp8"), ("sm_90", 64, 7168, 4096, "decode_fp8"),
    ("sm_90", 2, 7168, 4096, "decode_fp8"),
    # one row: decode.py's GEMV on whole weight rows where its measured tiles apply (gemv_tiles.tile_fields: K of
    # 2048 / 4096 on 8-row tiles, other multiples of 1024 on 16-row ones, N at least a program per SM), decode_fp8
    # elsewhere
    ("sm_90", 1, 7168, 4096, "decode"), ("sm_90", 1, 28672, 8192, "decode"), ("sm_90", 1, 1056, 4096, "decode"),
    ("sm_90", 1, 7168, 1536, "decode_fp8"), ("sm_90", 1, 1024, 4096, "decode_fp8"),
    ("sm_90", 1, 2048, 8192, "decode_fp8"),
    ("sm_90", 65, 7168, 4096, "block_fp8"),      # 65-256 rows: the TMA kernel (block_fp8 with tma=True)
    ("sm_100", 16, 7168, 4096, "decode"),        # wgmma is Hopper's; Blackwell keeps decode.py's tcgen05 path
])
def test_dispatch(target, rows, n, k, want):
    assert backends.choose(target, "block_fp8", "block_fp8", rows=rows, n=n, k=k).kernel == want


def test_one_block_fp8_row_takes_the_whole_row_gemv_tile():
    from jax_blockscale._triton import decode

    cfg = decode.default_config(GemmProblem(1, False, 1, 7168, 4096, "block_fp8", "block_fp8", "bf16"))
    assert (cfg.gemv, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.split_k) == (True, 8, 4096, 8, 1)


def test_a_callers_own_config_skips_it_and_naming_it_reaches_it():
    assert backends.choose("sm_90", "block_fp8", "block_fp8", rows=16, configured=True).kernel == "block_fp8"
    assert backends.choose("sm_90", "block_fp8", "block_fp8", rows=16, kernel="decode_fp8").kernel == "decode_fp8"
    pairs = set()
    for entry in backends.KERNEL_TABLE["sm_90"]:
        if entry.module == "decode_fp8":
            pairs |= entry.pairs
    assert pairs == df.SUPPORTED


@pytest.mark.parametrize("m,k,block_m,block_k,stages", [
    (1, 4096, 16, 512, 2), (16, 7168, 16, 512, 2), (17, 2048, 32, 512, 2), (64, 8192, 64, 256, 3),
    (33, 1152, 64, 128, 6), (5, 1280, 16, 256, 3),
])
def test_default_config(m, k, block_m, block_k, stages):
    cfg = df.default_config(_problem(m=m, k=k))
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_stages) == (block_m, 64, block_k, stages)
    assert (cfg.split_k, cfg.atomic_split_k, cfg.kernel, cfg.num_sms) == (1, False, "decode_fp8", 264)
    df.check_config(_problem(m=m, k=k), cfg)


@pytest.mark.parametrize("changes,match", [
    (dict(block_m=16), "pads the activation rows"),           # 17 rows do not fit 16
    (dict(block_m=128), "pads the activation rows"),
    (dict(block_n=128), "64 weight rows"),
    (dict(block_k=384), "block_k"),
    (dict(split_k=3), "multiple of block_k"),
    (dict(num_stages=1), "num_stages"),
    (dict(num_stages=5), "shared memory"),                     # 5 x (64 + 32) x 512 bytes
    (dict(num_sms=0), "num_sms"),
    (dict(num_warps=8), "4-warp group"),
])
def test_check_config_refuses_before_any_compute(changes, match):
    p = _problem(m=17)
    with pytest.raises(ValueError, match=match):
        df.check_config(p, df.default_config(p).replace(**changes))


def test_check_config_refuses_other_problems():
    with pytest.raises(ValueError, match="block_fp8 x block_fp8"):
        df.check_config(GemmProblem(1, False, 4, 256, 256, "bf16", "block_fp8", "bf16"), df.default_config(_problem()))
    with pytest.raises(ValueError, match="unbatched"):
        df.check_config(GemmProblem(2, True, 4, 256, 256, "block_fp8", "block_fp8", "bf16"),
                        df.default_config(_problem()))


@pytest.mark.parametrize("bm,boxes,split", [(16, 4, 1), (32, 4, 1), (64, 2, 2)])
def test_compiled_kernel_streams_by_tma_into_fp8_wgmma(bm, boxes, split):
    c = compile_kernel(df.decode_fp8_kernel, target="sm_90", signature=SIGNATURE, num_warps=4, num_stages=2,
                       constexprs=dict(M=bm - 3, N=7168, K=4096, BM=bm, BOXES=boxes, SPLIT_K=split, STAGES=2,
                                       PROGRAMS=264, ATOMIC=False))
    ptx = c.asm["ptx"]
    # the codes multiply as they are: fp8 wgmma with both operands from shared memory (descriptors)
    assert set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.\S+", ptx)) == {
        f"wgmma.mma_async.sync.aligned.m64n{bm}k32.f32.e4m3.e4m3"}
    assert not re.search(r"wgmma\.mma_async[^;]*\{[^}]*\},\s*\{", ptx)  # no A operand from registers
    # weight and activations by TMA into the ring (one weight and one activation box per 128-wide K block)
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier") == 2 * boxes * 2  # prologue+loop
    assert "mbarrier.try_wait.parity" in ptx
    # no byte or vector global loads of codes: the only global loads are the fp32 scales (and the counters)
    assert not re.search(r"ld\.global(\.\w+)*\.(u8|b8|v2|v4)", ptx)
    if split > 1:
        assert "atom.acq_rel.gpu.global.add" in ptx or re.search(r"atom\.global\.gpu\.acq_rel\.add", ptx)


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8"])
def test_matmul_lowers_to_this_one_kernel(fmt):
    n, k = 7168, 4096
    w = jax.eval_shape(lambda: jb.quantize_operand(jnp.zeros((n, k)), fmt, side="b"))
    x = jax.eval_shape(lambda: jb.quantize_operand(jnp.zeros((16, k)), fmt, side="a"))
    lowered = jax.jit(lambda x, w: jb.matmul(x, w, target="sm_90")).trace(x, w).lower(
        lowering_platforms=("cuda",))
    kernels = jt.lowered_kernels(lowered)
    assert len(kernels) == 1 and b"decode_fp8_kernel" in kernels[0]
    assert lowered.as_text().count("stablehlo.custom_call") == 1


# 8-bit MX on both sides: the same kernel, one k32 wgmma per 32-wide group.
@pytest.mark.parametrize("a_kind,b_kind,rows,want", [
    ("e4m3", "e4m3", 2, "decode_fp8"), ("e5m2", "e4m3", 16, "decode_fp8"), ("e4m3", "e5m2", 64, "decode_fp8"),
    ("e4m3", "e4m3", 1, "decode"),    # one row: decode.py's GEMV measured faster
    ("e4m3", "e4m3", 65, "upcast"),
    ("bf16", "e4m3", 16, "decode_wgmma"),  # bf16 activations: no fp8 wgmma, the weight decoded to bf16
    ("e2m1", "e4m3", 16, "decode"),   # fp4 activations neither
])
def test_mx_dispatch(a_kind, b_kind, rows, want):
    assert backends.choose("sm_90", a_kind, b_kind, rows=rows, n=7168, k=4096).kernel == want
    assert backends.choose("sm_100", a_kind, b_kind, rows=rows, n=7168, k=4096).kernel != "decode_fp8"


def test_mx_default_config_and_refusals():
    p = GemmProblem(1, False, 16, 7168, 4096, "e4m3", "e5m2", "bf16")
    cfg = df.default_config(p)
    assert (cfg.block_m, cfg.block_k, cfg.num_stages, cfg.split_k, cfg.num_sms) == (16, 256, 3, 1, 264)
    df.check_config(p, cfg)
    # up to 8 rows pad to wgmma's n8; 64 rows with 8192 / 32 decoded activation scales leave room for one program
    assert df.default_config(p.__class__(1, False, 5, 7168, 4096, "e4m3", "e4m3", "bf16")).block_m == 8
    wide = p.__class__(1, False, 64, 7168, 8192, "e4m3", "e4m3", "bf16")
    assert df.default_config(wide).num_sms == 132
    df.check_config(wide, df.default_config(wide))
    with pytest.raises(ValueError, match="8-bit MX"):
        df.check_config(GemmProblem(1, False, 16, 7168, 4096, "e2m1", "e4m3", "bf16"), cfg)


@pytest.mark.parametrize("w,x,bm,boxes,split", [("fp8e4nv", "fp8e4nv", 16, 4, 1), ("fp8e5", "fp8e4nv", 32, 2, 2),
                                                ("fp8e4nv", "fp8e5", 64, 2, 1)])
def test_compiled_mx_kernel_runs_one_wgmma_per_group(w, x, bm, boxes, split):
    sig = dict(SIGNATURE, w_ptr="*" + w, x_ptr="*" + x, w_scale_ptr="*u8", x_scale_ptr="*u8")
    c = compile_kernel(df.decode_fp8_kernel, target="sm_90", signature=sig, num_warps=4, num_stages=2,
                       constexprs=dict(M=bm - 3, N=7168, K=4096, BM=bm, BOXES=boxes, SPLIT_K=split, STAGES=2,
                                       PROGRAMS=264, ATOMIC=False))
    ptx = c.asm["ptx"]
    name = {"fp8e4nv": "e4m3", "fp8e5": "e5m2"}
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.\S+", ptx)
    assert set(wgmma) == {f"wgmma.mma_async.sync.aligned.m64n{bm}k32.f32.{name[w]}.{name[x]}"}
    assert len(wgmma) == 4 * boxes  # one per 32-wide group of a ring slot: each promoted with its own scales
    assert ptx.count("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier") == 2 * boxes * 2
    # a block's four groups in flight together: one wait per 128-wide block, not one per group
    assert ptx.count("wgmma.wait_group.sync.aligned 0") == boxes
    # the codes never go through per-thread loads; the activations' scale bytes are read once per program,
    # before the loop (staged decoded in shared memory); in the loop the weight's come as one 32-bit word per
    # row and 128-wide block
    assert not re.search(r"ld\.global(\.\w+)*\.(v2|v4)", ptx)
    loop = ptx[ptx.index("wgmma.mma_async"):]
    assert re.search(r"ld\.global(\.\w+)*\.b8", ptx) and not re.search(r"ld\.global(\.\w+)*\.(u8|b8)", loop)
    assert re.search(r"ld\.global(\.\w+)*\.b32", loop) and "ld.shared" in loop



@pytest.mark.parametrize("rows", [2, 8, 9, 16, 17, 32, 33, 64])
def test_mx_dispatch_stops_where_the_staged_scales_would_not_fit(rows):
    # the largest K dispatch sends at these rows compiles a default config that fits shared memory; twice it
    # does not go there
    padded = max(8, 1 << (rows - 1).bit_length())
    k = backends.MX8_STAGED_SCALES // padded * 32
    assert backends.choose("sm_90", "e4m3", "e4m3", rows=rows, n=7168, k=k).kernel == "decode_fp8"
    p = GemmProblem(1, False, rows, 7168, k, "e4m3", "e4m3", "bf16")
    df.check_config(p, df.default_config(p))
    assert backends.choose("sm_90", "e4m3", "e4m3", rows=rows, n=7168, k=2 * k).kernel != "decode_fp8"
    assert backends.choose("sm_90", "e4m3", "e4m3", rows=rows, n=7168).kernel != "decode_fp8"  # K unknown
