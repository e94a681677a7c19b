"""CPU checks of benchmarks/decode_gemv_mma.py, decode_gemv_tma.py (session 39), decode_gemv_persistent.py and
decode_gemv_gluon.py (session 40), one-row GEMV experiments kept with their results: each kernel still compiles for sm_90 to what its
docstring says, and each launcher refuses what its kernel cannot take, before anything compiles."""

import re

import pytest

from benchmarks import decode_gemv_gluon as gluon_gemv
from benchmarks import decode_gemv_mma as mma
from benchmarks import decode_gemv_persistent as persistent
from benchmarks import decode_gemv_tma as tma_gemv
from jax_blockscale._triton.compile import compile_kernel

_SIG = dict(w_ptr="*u8", s_ptr="*u8", x_ptr="*bf16", a_ts_ptr="*fp32", b_ts_ptr="*fp32", out_ptr="*bf16")


def _sig(w_kind):
    return dict(_SIG, s_ptr="*fp8e4nv" if w_kind == "nvfp4" else "*u8")


@pytest.mark.parametrize("w_kind", ["e2m1", "nvfp4"])
def test_mma_gemv_is_a_batched_mma_sync_over_warps_splitting_k(w_kind):
    ck = compile_kernel(mma.gemv_mma_kernel, target="sm_90", signature=_sig(w_kind), num_warps=8, num_stages=1,
                        constexprs=dict(N=7168, K=4096, W_KIND=w_kind, WIDE=False))
    ptx = ck.asm["ptx"]
    # per warp: 4 chunks of 128 codes x 2 dots (low / high nibbles) x 4 k16 steps, every load issued up front
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", ptx)) == 32
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx)       # 16-byte weight vectors
    assert "wgmma" not in ptx and "cp.async" not in ptx
    # the activations are staged compactly: 2 bytes per code plus the per-column factors
    assert ck.metadata.shared < 16 * 1024


def test_mma_gemv_tiles_share_one_b_operand_and_mask_its_zero_columns():
    sig = _sig("e2m1")
    one = compile_kernel(mma.gemv_mma_kernel, target="sm_90", signature=sig, num_warps=8, num_stages=1,
                         constexprs=dict(N=7168, K=4096, W_KIND="e2m1", WIDE=False))
    two = compile_kernel(mma.gemv_mma_kernel, target="sm_90", signature=sig, num_warps=8, num_stages=1,
                         constexprs=dict(N=7168, K=4096, W_KIND="e2m1", WIDE=False, TILES=2, MASK=True))
    mmas = r"mma\.sync\.aligned\.m16n8k16"
    assert len(re.findall(mmas, two.asm["ptx"])) == 2 * len(re.findall(mmas, one.asm["ptx"]))
    # the B operand's zero columns: one AND per 32-bit register instead of a select per fp16
    assert "and.b32" in two.asm["ptx"] and two.asm["ptx"].count("selp.b16") < one.asm["ptx"].count("selp.b16")


@pytest.mark.parametrize("w_kind", ["e2m1", "nvfp4"])
def test_persistent_gemv_pipelines_its_weight_tiles(w_kind):
    ck = compile_kernel(persistent.gemv_persistent_kernel, target="sm_90", signature=_sig(w_kind), num_warps=8,
                        num_stages=3, constexprs=dict(N=7168, K=4096, W_KIND=w_kind, BLOCK_N=8, BLOCK_K=4096,
                                                      NUM_STAGES=3, WIDE=False))
    ptx = ck.asm["ptx"]
    assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx   # Triton's pipeline
    assert "cvt.rn.f16x2.e4m3x2" in ptx                                          # the GEMV's decode
    assert ck.metadata.shared >= 2 * 8 * 2048   # at least two stages of 8 rows x 2048 bytes


@pytest.mark.parametrize("w_kind", ["e2m1", "nvfp4"])
def test_gluon_gemv_loads_the_activations_straight_into_the_products_layout(w_kind):
    ck = compile_kernel(gluon_gemv.gemv_gluon_kernel, target="sm_90", signature=_sig(w_kind), num_warps=8,
                        num_stages=1, constexprs=dict(N=7168, K=4096, W_KIND=w_kind, BLOCK_N=8, BLOCK_K=4096, WARPS_N=2,
                                                      PREFETCH=False, WIDE=False))
    ptx = ck.asm["ptx"]
    assert "cvt.rn.f16x2.e4m3x2" in ptx                                  # the GEMV's decode
    # the activations' 64 bytes per thread as 16-byte vectors (mxfp4's weight too; nvfp4's 8-byte groups as 8-byte ones)
    assert len(re.findall(r"ld\.global(\.\w+)*\.v4\.b32", ptx)) >= (8 if w_kind == "e2m1" else 4)
    assert ck.metadata.shared <= 512                                     # only the row sums' cross-warp reduction


@pytest.mark.parametrize("w_kind", ["e2m1", "nvfp4"])
def test_tma_gemv_streams_the_weight_through_a_tma_ring(w_kind):
    ck = compile_kernel(tma_gemv.gemv_tma_kernel, target="sm_90", signature=_sig(w_kind), num_warps=8, num_stages=1,
                        constexprs=dict(N=7168, K=4096, NV=int(w_kind == "nvfp4"), STAGES=4, PROGRAMS=132))
    ptx = ck.asm["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx                      # TMA boxes into the ring
    assert "mbarrier.try_wait" in ptx
    assert "cvt.rn.f16x2.e4m3x2" in ptx                          # the GEMV's decode
    # 4 stages of 8 rows x 1024 bytes, activations as fp32 (8 bytes per 2 codes)
    assert ck.metadata.shared >= 4 * 8 * 1024 + 4 * 4096


def test_warp_specialized_tma_gemv_releases_stages_by_named_barrier():
    ck = compile_kernel(tma_gemv.gemv_ws_kernel, target="sm_90", signature=_sig("e2m1"), num_warps=8, num_stages=1,
                        constexprs=dict(N=7168, K=4096, NV=0, STAGES=4, PROGRAMS=132))
    ptx = ck.asm["ptx"]
    assert "cp.async.bulk.tensor.2d" in ptx
    assert "bar.arrive" in ptx and "bar.sync" in ptx    # the consumers' releases, the loader's waits


@pytest.mark.parametrize("check, args, match", [
    (mma.check, (2, 7168, 4096, 8), "one activation row"),
    (mma.check, (1, 7168, 4096, 4), "K / \\(128 num_warps\\) must be 1, 2 or 4"),
    (mma.check, (1, 7168, 4096, 3), "num_warps must be"),
    (mma.check, (1, 7168, 4096, 8, 3), "tiles \\(m16 tiles per program\\) must be 1, 2 or 4"),
    (persistent.check, (2, 7168, 4096, persistent.parse_config("n8:k4096:w8:s3:p2")), "one activation row"),
    (persistent.check, (1, 7168, 3072, persistent.parse_config("n8:k2048:w8:s3:p2")), "divide K"),
    (persistent.check, (1, 7168, 4096, persistent.parse_config("n6:k4096:w8:s3:p2")), "block_n must be a power"),
    (persistent.check, (1, 7168, 4096, persistent.parse_config("n8:k4096:w8:s0:p2")), "stages and programs"),
    (persistent.check, (1, 8192, 8192, persistent.parse_config("n8:k4096:w8:s3:p2:x")), "need one K tile"),
    (gluon_gemv.check, (2, 7168, 4096, gluon_gemv.parse_config("n8:k4096:w8:r2")), "one activation row"),
    (gluon_gemv.check, (1, 7168, 4096, gluon_gemv.parse_config("n8:k4096:w8:r16")), "must not exceed"),
    (gluon_gemv.check, (1, 7168, 2048, gluon_gemv.parse_config("n8:k2048:w4:r1")), "hold 32 codes"),
    (tma_gemv.check, (2, 7168, 4096, 4), "one activation row"),
    (tma_gemv.check, (1, 7168, 3072, 4), "multiple of 2048"),
    (tma_gemv.check, (1, 7168, 49152, 8), "shared memory"),
    (tma_gemv.check, (1, 7168, 4096, 9, True), "1 to 8 stages, got 9"),
])
def test_launchers_refuse_what_the_kernels_cannot_take(check, args, match):
    with pytest.raises(ValueError, match=match):
        check(*args)


def test_config_names():
    assert mma.parse_config("w8") == (8, 1, False)
    assert mma.parse_config("w16t2m") == (16, 2, True)
    assert persistent.parse_config("n8:k4096:w8:s3:p2") == dict(block_n=8, block_k=4096, warps=8, stages=3, per_sm=2,
                                                                hoist_x=False)
    assert persistent.parse_config("n4:k8192:w8:s3:p2:x")["hoist_x"]
    assert gluon_gemv.parse_config("n16:k1024:w4:r4:p") == dict(block_n=16, block_k=1024, warps=4, warps_n=4,
                                                                prefetch=True)
    for parse, bad in ((mma.parse_config, "w8x"), (persistent.parse_config, "n8:k4096"),
                       (gluon_gemv.parse_config, "n8:k4096:w8")):
        with pytest.raises(ValueError, match="expected"):
            parse(bad)


def test_tma_config_names():
    assert tma_gemv.parse_config("p2:s3") == (2, 3, False)
    assert tma_gemv.parse_config("ws:p2:s6") == (2, 6, True)
