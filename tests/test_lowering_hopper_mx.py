"""CPU tests of the Hopper MX GEMM with the decode inside the kernel (`_triton/hopper_mx.py`).

Cross-compiled for sm_90 (no GPU needed). What they prove: a large MX / nvfp4 matmul on sm_90 lowers to
one Triton kernel and nothing else that computes (no XLA dequantize pass, no scalar multiply), that kernel
loads its tiles by TMA and multiplies with bf16 wgmma (or fp8 wgmma for the promoted mxfp8 variant), the
default tiles fit the register file, and the old predecode path can still be forced for comparison.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from _dispatch import enable_entry  # noqa: E402
import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends  # noqa: E402
from jax_blockscale._triton import hopper_mx, upcast  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from _jax_triton import require_jax_triton  # noqa: E402
from test_lowering_hopper_tma import TMA_LOAD, WGMMA_BF16, WGMMA_FP8, _ptxas_spill_bytes  # noqa: E402

_VALUE_TYPES = {"e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "e2m3": "*u8", "e3m2": "*u8", "e2m1": "*u8",
                "nvfp4": "*u8", "bf16": "*bf16"}
_SCALE_TYPES = {"nvfp4": "*fp8e4nv", "bf16": "*bf16"}
# The suite's formats (benchmarks/_cases.py) plus fp6, as kernel kinds.
PAIRS = [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("nvfp4", "nvfp4"), ("e4m3", "e2m1"), ("bf16", "e2m1"),
         ("bf16", "nvfp4"), ("e2m3", "e3m2"), ("e5m2", "e4m3")]
# Everything in a lowered program besides the kernel's custom call that computes nothing on the device.
_NO_COMPUTE = {"stablehlo.custom_call", "stablehlo.constant", "stablehlo.reshape", "stablehlo.broadcast_in_dim"}


SHIPPED_SM90 = backends.KERNEL_TABLE["sm_90"]  # before the fixture below turns hopper_mx on


@pytest.fixture(autouse=True)
def _hopper_mx_dispatched(monkeypatch):
    """These tests check hopper_mx where dispatch would send it; the entry is opt-in on sm_90."""
    enable_entry(monkeypatch, "sm_90", "hopper_mx")

def _compile(p: GemmProblem, config: TileConfig):
    sig = {"a_ptr": _VALUE_TYPES[p.a_kind], "a_scale_ptr": _SCALE_TYPES.get(p.a_kind, "*u8"),
           "b_ptr": _VALUE_TYPES[p.b_kind], "b_scale_ptr": _SCALE_TYPES.get(p.b_kind, "*u8"),
           "a_ts_ptr": "*fp32", "b_ts_ptr": "*fp32", "out_ptr": "*bf16"}
    constexprs = dict(M=p.m, N=p.n, K=p.k, BATCHES=1, B_BATCHED=False, BLOCK_M=config.block_m,
                      BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                      NUM_STAGES=config.num_stages, A_KIND=p.a_kind, B_KIND=p.b_kind, FP8_MMA=config.fp8_mma,
                      WARP_SPECIALIZE=config.warp_specialize, ASM=config.asm_decode)
    return compile_kernel(hopper_mx.mx_gemm_kernel, target="sm_90", signature=sig, constexprs=constexprs,
                          num_warps=config.num_warps, num_stages=config.num_stages)


def _big(a_kind: str, b_kind: str) -> GemmProblem:
    return GemmProblem(1, False, 4096, 4096, 4096, a_kind, b_kind, "bf16")


@pytest.mark.parametrize("a_kind,b_kind", PAIRS)
def test_default_config_uses_tma_and_bf16_wgmma_without_spills(a_kind, b_kind):
    p = _big(a_kind, b_kind)
    ptx = assembly(_compile(p, hopper_mx.default_config(p)))
    assert TMA_LOAD in ptx and WGMMA_BF16.search(ptx)
    assert _ptxas_spill_bytes(ptx) == 0


def test_fp8_variant_uses_fp8_wgmma_per_mx_block_without_spills_at_128x128():
    p = _big("e4m3", "e4m3")
    cfg = TileConfig(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=4, fp8_mma=True)
    ptx = assembly(_compile(p, cfg))
    assert TMA_LOAD in ptx and {int(n) for n in WGMMA_FP8.findall(ptx)} == {128}
    assert not WGMMA_BF16.search(ptx)
    assert _ptxas_spill_bytes(ptx) == 0


def test_fp8_variant_at_128x256_spills():
    # Why the fp8 variant needs 128 x 128 tiles: the accumulator and the block's partial product are
    # 2 x 128 fp32 registers per thread at 128 x 256 over two warpgroups.
    cfg = TileConfig(block_m=128, block_n=256, block_k=32, num_warps=8, num_stages=3, fp8_mma=True)
    assert _ptxas_spill_bytes(assembly(_compile(_big("e4m3", "e4m3"), cfg))) > 0


def test_check_config_refuses_what_the_kernel_cannot_do():
    with pytest.raises(ValueError, match="fp8_mma needs"):
        hopper_mx.check_config(_big("e2m1", "e2m1"), TileConfig(block_k=32, fp8_mma=True))
    with pytest.raises(ValueError, match="block_k must be 32"):
        hopper_mx.check_config(_big("e4m3", "e4m3"), TileConfig(block_k=64, fp8_mma=True))
    with pytest.raises(ValueError, match="power of two >= 32"):
        hopper_mx.check_config(_big("e2m1", "e2m1"), TileConfig(block_k=16))
    with pytest.raises(ValueError, match="multiple of block_k"):
        hopper_mx.check_config(GemmProblem(1, False, 256, 256, 96, "e4m3", "e4m3", "bf16"), TileConfig(block_k=64))
    with pytest.raises(ValueError, match="does not take"):
        hopper_mx.check_config(_big("fp16", "e2m1"), TileConfig(block_k=64))


# ---------------------------------------------------------------------------------------------------------
# Dispatch and whole lowered programs


def test_dispatch_is_opt_in_and_when_on_takes_hopper_mx_above_decode_rows(monkeypatch):
    (entry,) = [e for e in SHIPPED_SM90 if e.module == "hopper_mx"]
    assert entry.opt_in and "H100" in entry.opt_in  # measured slower than upcast: not chosen by default
    with monkeypatch.context() as patch:
        patch.setitem(backends.KERNEL_TABLE, "sm_90", SHIPPED_SM90)
        for a_kind, b_kind in PAIRS:
            assert backends.choose("sm_90", a_kind, b_kind, rows=8192).kernel == "upcast"
            assert backends.choose("sm_90", a_kind, b_kind, rows=8192, kernel="hopper_mx").kernel == "hopper_mx"
    for a_kind, b_kind in PAIRS:  # the fixture's table: hopper_mx on
        assert backends.choose("sm_90", a_kind, b_kind, rows=65).kernel == "hopper_mx"
        assert backends.choose("sm_90", a_kind, b_kind).kernel == "hopper_mx"  # batched weight
        assert backends.choose("sm_90", a_kind, b_kind, rows=8192, kernel="upcast").kernel == "upcast"
    # Decode sizes on sm_90, as measured: fp4 weights at 2-16 rows (bf16, MX or nvfp4 activations) take the Gluon
    # decode kernel (bf16 x fp4 up to 64 rows), one row and mxfp8 weights decode.py up to 16 rows; above that
    # and block FP8 the swapped kernels (the full decode entry stays reachable, opt-in). bf16 activations x block
    # FP8 weights: decode.py's GEMV at one row (its own entry), dense_x_block_fp8 from 2 rows; block FP8 activations
    # take the GEMV at one row (another entry) where its measured tiles apply.
    assert [e.opt_in is not None for e in backends.KERNEL_TABLE["sm_90"] if e.module == "decode"] == [
        False, False, False, True]
    assert backends.choose("sm_90", "bf16", "block_fp8", rows=1).kernel == "decode"
    assert backends.choose("sm_90", "block_fp8", "block_fp8", rows=1, n=7168, k=4096).kernel == "decode"
    assert backends.choose("sm_90", "bf16", "block_fp8", rows=2).kernel == "dense_x_block_fp8"
    assert backends.choose("sm_90", "bf16", "block_fp8", rows=8192).kernel == "dense_x_block_fp8"
    assert backends.choose("sm_90", "bf16", "nvfp4", rows=16).kernel == "decode_wgmma"
    assert backends.choose("sm_90", "bf16", "nvfp4", rows=1).kernel == "decode"
    assert backends.choose("sm_90", "nvfp4", "nvfp4", rows=16).kernel == "decode_wgmma"
    assert backends.choose("sm_90", "nvfp4", "nvfp4", rows=1).kernel == "decode"
    assert backends.choose("sm_90", "e4m3", "e4m3", rows=16).kernel == "decode"
    assert backends.choose("sm_90", "e4m3", "e4m3", rows=64).kernel == "upcast"
    assert backends.choose("sm_90", "e2m1", "e2m1", rows=64).kernel == "upcast"
    assert backends.choose("sm_90", "bf16", "nvfp4", rows=32).kernel == "decode_wgmma"
    assert backends.choose("sm_90", "bf16", "nvfp4", rows=64).kernel == "decode_wgmma"
    assert backends.choose("sm_90", "block_fp8", "block_fp8", rows=1).kernel == "decode_fp8"
    assert backends.choose("sm_90", "block_fp8", "block_fp8", rows=65).kernel == "block_fp8"
    assert backends.choose("sm_90", "bf16", "nvfp4", rows=64, kernel="decode").kernel == "decode"
    assert backends.choose("sm_100", "e4m3", "e4m3", rows=4096).kernel != "hopper_mx"
    with pytest.raises(ValueError, match="no entry"):
        backends.choose("sm_90", "e4m3", "e4m3", kernel="dot_scaled_nvidia")


def _quantized(m, n, k, fmt_a, fmt_b, batch=()):
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((*batch, m, k)), jnp.float32)
    b = jnp.asarray(rng.standard_normal((*batch, n, k)), jnp.float32)
    a = a.astype(jnp.bfloat16) if fmt_a == "bf16" else jb.quantize_operand(a, fmt_a, side="a")
    return a, jb.quantize_operand(b, fmt_b, side="b")


def _lower(fmt_a, fmt_b, config=None, m=1024, n=1024, k=512, batch=()):
    jt = require_jax_triton()
    a, b = _quantized(m, n, k, fmt_a, fmt_b, batch)
    lowered = jax.jit(lambda a, b: jb.matmul(a, b, target="sm_90", config=config)).trace(a, b).lower(
        lowering_platforms=("cuda",))
    return jt, lowered


@pytest.mark.parametrize("fmt_a,fmt_b", [("mxfp8", "mxfp8"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"),
                                         ("mxfp8", "mxfp4"), ("bf16", "mxfp4"), ("mxfp6_e2m3", "mxfp6_e2m3")])
def test_matmul_is_one_kernel_with_no_xla_decode(fmt_a, fmt_b):
    jt, lowered = _lower(fmt_a, fmt_b)
    (kernel,) = jt.lowered_kernels(lowered)
    ptx = kernel.decode("latin-1")
    assert TMA_LOAD in ptx and WGMMA_BF16.search(ptx)
    text = lowered.as_text()
    assert set(re.findall(r"stablehlo\.\w+", text)) <= _NO_COMPUTE
    assert len(re.findall(r"stablehlo\.custom_call", text)) == 1
    assert "upcast_gemm" not in text


def test_batched_weight_lowers_to_one_kernel():
    jt, lowered = _lower("mxfp4", "mxfp4", m=200, n=300, k=512, batch=(3,))
    assert len(jt.lowered_kernels(lowered)) == 1
    assert set(re.findall(r"stablehlo\.\w+", lowered.as_text())) <= _NO_COMPUTE


def test_forcing_the_old_path_brings_back_the_xla_dequantize():
    p = GemmProblem(1, False, 1024, 1024, 512, "e2m1", "e2m1", "bf16")
    old = upcast.default_config(p, "sm_90").replace(kernel="upcast")
    jt, lowered = _lower("mxfp4", "mxfp4", config=old)
    assert len(jt.lowered_kernels(lowered)) == 1  # the bf16 TMA GEMM; the decode is XLA's
    ops = set(re.findall(r"stablehlo\.\w+", lowered.as_text()))
    assert {"stablehlo.shift_right_logical", "stablehlo.bitcast_convert"} <= ops


def test_forced_fp8_variant_lowers_with_fp8_wgmma():
    cfg = TileConfig(block_m=128, block_n=128, block_k=32, num_warps=8, num_stages=4, fp8_mma=True,
                     kernel="hopper_mx")
    jt, lowered = _lower("mxfp8", "mxfp8", config=cfg)
    (kernel,) = jt.lowered_kernels(lowered)
    assert WGMMA_FP8.search(kernel.decode("latin-1"))
