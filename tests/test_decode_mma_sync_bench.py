"""CPU checks of benchmarks/decode_mma_sync.py (an experiment kept with its result): the kernel it measured
still compiles for sm_90 to what its docstring says, and its launcher refuses what the kernel cannot take."""

import re

import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from benchmarks import decode_mma_sync as dm
from jax_blockscale._triton.compile import compile_kernel

_SIG = dict(w_ptr="*u8", s_ptr="*u8", x_ptr="*bf16", xs_ptr="*bf16", a_ts_ptr="*fp32", b_ts_ptr="*fp32",
            out_ptr="*bf16", ws_ptr="*fp32", count_ptr="*i32")


@pytest.mark.parametrize("w_kind,bm,chunk", [("e2m1", 8, 256), ("nvfp4", 16, 128)])
def test_weight_goes_from_global_loads_into_mma_sync_operands(w_kind, bm, chunk):
    sig = dict(_SIG, s_ptr="*fp8e4nv" if w_kind == "nvfp4" else "*u8")
    ptx = compile_kernel(dm.decode_mma_sync_kernel, target="sm_90", signature=sig, num_warps=4, num_stages=1,
                         constexprs=dict(M=3, N=7168, K=4096, BM=bm, W_KIND=w_kind, CHUNK=chunk,
                                         SPLIT_K=8)).asm["ptx"]
    mmas = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32", ptx)
    assert len(mmas) == (chunk // 16) * (bm // 8)  # one per k16 step and n8 column block (loop not unrolled)
    assert "cp.async." not in ptx and "wgmma.mma_async" not in ptx  # no shared-memory ring, no warp-group MMA
    assert re.search(r"ld\.global(\.\w+)*\.v4\.b32", ptx)     # 16-byte weight vectors
    assert "ldmatrix" in ptx                                  # the staged activations as the B operand


def test_config_and_launch_checks():
    cfg = dm.parse_config("w2:k128:s16", rows=9)
    assert (cfg.num_warps, cfg.block_n, cfg.block_k, cfg.split_k, cfg.block_m) == (2, 32, 128, 16, 16)
    w = jb.quantize_operand(jnp.ones((64, 512)), "mxfp4", side="b")
    with pytest.raises(ValueError, match=r"multiple of block_k \* split_k"):
        dm.launch(jnp.ones((1, 512), jnp.bfloat16), w, dm.parse_config("w4:k256:s4", rows=1))
    with pytest.raises(ValueError, match="pads the activation rows"):
        dm.launch(jnp.ones((17, 512), jnp.bfloat16), w, dm.parse_config("w4:k256:s1", rows=17))
    with pytest.raises(ValueError, match="block_k"):
        dm.launch(jnp.ones((1, 512), jnp.bfloat16), w, dm.parse_config("w4:k64:s1", rows=1))
