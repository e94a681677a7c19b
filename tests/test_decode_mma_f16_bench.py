"""CPU checks of benchmarks/decode_mma_f16.py (an experiment kept with its result): the kernel it measured still
compiles for sm_90 to what its docstring says, and its launcher refuses what the kernel cannot take."""

import re

import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from benchmarks import decode_mma_f16 as dm
from benchmarks._sass import disassemble
from benchmarks.sass_count import classify, largest_loop
from jax_blockscale._triton import decode
from jax_blockscale._triton.compile import compile_kernel

_SIG = dict(w_ptr="*u8", s_ptr="*u8", x_ptr="*bf16", a_ts_ptr="*fp32", b_ts_ptr="*fp32", out_ptr="*bf16",
            ws_ptr="*fp32", count_ptr="*i32")


def _compile(w_kind, mode="dot", warps=4, tiles=1, unroll=1, split=4):
    sig = dict(_SIG, s_ptr="*fp8e4nv" if w_kind == "nvfp4" else "*u8")
    return compile_kernel(dm.gemv_mma_kernel, target="sm_90", signature=sig, num_warps=warps, num_stages=1,
                          constexprs=dict(N=7168, K=4096, W_KIND=w_kind, TILES=tiles, SPLIT_K=split, UNROLL=unroll,
                                          ATOMIC=False, WIDE=False, MODE=mode))


@pytest.mark.parametrize("w_kind", ["e2m1", "nvfp4"])
def test_fp16_mma_sync_from_e4m3_conversions(w_kind):
    ck = _compile(w_kind)
    ptx = ck.asm["ptx"]
    # two dots (low and high nibbles) of 4 k16 steps per 128-code chunk, in the peeled first step and the loop
    assert len(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.f16\.f16\.f32", ptx)) == 16
    assert "cvt.rn.f16x2.e4m3x2" in ptx
    if w_kind == "e2m1":  # no fp16 -> fp32 widening (nvfp4's e4m3 scales take that path, once per group)
        assert "cvt.f32.f16" not in ptx
    assert "cp.async." not in ptx and "wgmma.mma_async" not in ptx
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx)  # 16-byte weight vectors
    assert "ldmatrix" in ptx                              # the staged activation columns as the B operand


def test_k_loop_instructions_per_element():
    """The docstring's 2.45 SASS instructions per weight element (the GEMV's K loop: 4.40), and no byte
    repacking: the asm's fp16 pairs are the A fragment's registers (a PRMT per register before the split
    into low / high nibble dots)."""
    body = largest_loop(disassemble(_compile("e2m1").asm["cubin"]).splitlines())
    counts = classify(body)
    per_thread = 16 * 128 / 32  # a warp's 16 rows x 128 codes per iteration
    assert counts["mma"] == 8
    assert counts["total"] / per_thread < 2.6
    assert sum("PRMT" in line for line in body) <= 2


def test_control_modes_drop_the_math():
    ptx = _compile("e2m1", mode="stream").asm["ptx"]
    assert "mma.sync" not in ptx and "ldmatrix" not in ptx
    assert "st.shared" in ptx  # the activations are still staged
    unstaged = _compile("e2m1", mode="stream_unstaged").asm["ptx"]
    assert "st.shared" not in unstaged.split("atom")[0]


def test_decode_prefix_is_the_gemv_one():
    assert decode._fp4_e4m3_bytes_ptx("$4") in dm._fp4_f16_ptx()
    assert decode._fp4_e4m3_bytes_ptx("$8") in decode._fp4_f32_ptx()


def test_config_and_launch_checks():
    cfg = dm.parse_config("w2:t4:u2:s8")
    assert (cfg.num_warps, cfg.block_n, cfg.block_k, cfg.split_k) == (2, 128, 256, 8)
    assert dm.describe(cfg) == "w2:t4:u2:s8"
    w = jb.quantize_operand(jnp.ones((64, 7168)), "mxfp4", side="b")
    x = jnp.ones((1, 7168), jnp.bfloat16)
    with pytest.raises(ValueError, match="power of two"):
        dm.launch(x, w, dm.parse_config("w4:t1:u1:s1"))
    with pytest.raises(ValueError, match="multiple of block_k"):
        dm.launch(x, w, dm.parse_config("w4:t1:u4:s8"))
    with pytest.raises(ValueError, match="one activation row"):
        dm.launch(jnp.ones((2, 7168), jnp.bfloat16), w, dm.parse_config("w4:t1:u1:s7"))
    with pytest.raises(ValueError, match="m16 tiles per warp"):
        dm.launch(x, w, dm.parse_config("w3:t1:u1:s7"))
    with pytest.raises(ValueError, match="formats"):
        dm.launch(x, jb.quantize_operand(jnp.ones((64, 7168)), "mxfp8", side="b"), dm.parse_config("w4:t1:u1:s7"))
