"""CPU tests of the persistent Hopper block FP8 kernel (block_fp8_persistent.py), cross-compiled for sm_90.

What they prove without a GPU: the kernel loads tiles with TMA (`cp.async.bulk.tensor`) and multiplies with
fp8 e4m3 wgmma; warp specialization really happens (a producer warp group that gives registers back and
consumer warp groups that take them: `setmaxnreg`, 3 warp groups from a 4-warp kernel) and the default tile
does not spill; the switches (flatten, prefetch, transposed scales, pointer store) compile; sm_90 dispatch
picks it from the stated sizes, and the lead's switches (a config without `persistent`,
the entry made opt-in) send problems back to the old kernel; `jb.matmul` lowers to one launch
of NUM_SMS programs with their global scratch.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends  # noqa: E402
from jax_blockscale._triton import block_fp8, block_fp8_persistent as bp, jt  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402
from _dispatch import set_opt_in  # noqa: E402
from _jax_triton import lowered_for_cuda  # noqa: E402

from test_lowering_hopper_tma import SIG, TMA_LOAD, WGMMA_FP8, _ptxas_spill_bytes  # noqa: E402

SETMAXNREG = re.compile(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)")
BIG = GemmProblem(1, False, 8192, 8192, 8192, "block_fp8", "block_fp8", "bf16")


def _compile(config: TileConfig, *, m=8192, n=8192, k=8192, batches=1, b_batched=False, tma_store=True):
    constexprs = dict(M=m, N=n, K=k, BATCHES=batches, B_BATCHED=b_batched, BLOCK_M=config.block_m,
                      BLOCK_N=config.block_n, GROUP_M=config.group_m, NUM_SMS=config.num_sms,
                      NUM_STAGES=config.num_stages, WARP_SPECIALIZE=config.warp_specialize,
                      FLATTEN=config.flatten, TMA_STORE=tma_store, PREFETCH_SCALES=config.prefetch_scales,
                      A_SCALES_T=config.a_scales_t)
    return compile_kernel(bp.persistent_block_fp8_kernel, target="sm_90", signature=SIG, constexprs=constexprs,
                          num_warps=config.num_warps, num_stages=config.num_stages)


def test_default_is_the_measured_plain_persistent_loop():
    cfg = bp.default_config(BIG)
    assert cfg.persistent and not cfg.warp_specialize and cfg.prefetch_scales and cfg.num_warps == 8
    ptx = assembly(_compile(cfg))
    assert TMA_LOAD in ptx and WGMMA_FP8.search(ptx) and not SETMAXNREG.search(ptx)
    assert _ptxas_spill_bytes(ptx) == 0


def test_ws_config_is_warp_specialized_tma_fp8_wgmma_without_spills():
    cfg = bp.ws_config(BIG)
    assert cfg.persistent and cfg.warp_specialize and cfg.num_warps == 4
    compiled = _compile(cfg)
    ptx = assembly(compiled)
    assert TMA_LOAD in ptx and "cp.async.bulk.tensor.2d.global.shared" in ptx  # TMA loads and TMA store
    # Each consumer warp group multiplies its 64 rows of the 128-row tile: m64n128k32 e4m3.
    assert {int(n) for n in WGMMA_FP8.findall(ptx)} == {128}
    # Producer + two consumers: 12 warps; the producer hands registers to the consumers.
    assert compiled.metadata.num_warps == 12
    regs = SETMAXNREG.findall(ptx)
    assert ("dec", "40") in regs and any(kind == "inc" and int(n) >= 232 for kind, n in regs)
    assert compiled.metadata.global_scratch_size > 0  # descriptors are built in the kernel
    assert _ptxas_spill_bytes(ptx) == 0


def test_promotion_waits_for_each_k_blocks_wgmma_before_releasing_its_tiles():
    # Every K block's fp32 partial product is scaled and added to the accumulator (DeepSeek-V3's promotion),
    # so each consumer waits for all its wgmma (wait_group 0) before signalling the producer that the
    # shared-memory stage is free; a pending wgmma would otherwise read a tile being overwritten.
    ptx = assembly(_compile(bp.ws_config(BIG)))
    body = [ln.strip() for ln in ptx.splitlines()
            if re.search(r"wgmma\.wait_group|mbarrier\.arrive\.shared::cta|wgmma\.mma_async", ln)]
    waits = [i for i, ln in enumerate(body) if ln.startswith("wgmma.wait_group")]
    arrives = [i for i, ln in enumerate(body) if "mbarrier.arrive" in ln]
    assert waits and arrives
    assert all(ln.endswith(" 0;") for ln in body if ln.startswith("wgmma.wait_group"))
    for i in arrives:  # the last wgmma instruction before each release is a wait, not an issue
        prior = [ln for ln in body[:i] if "wgmma" in ln]
        assert prior and prior[-1].startswith("wgmma.wait_group")


@pytest.mark.parametrize("changes", [
    dict(warp_specialize=False, num_warps=8),
    dict(warp_specialize=False, num_warps=8, flatten=True),
    dict(warp_specialize=False, num_warps=8, prefetch_scales=True),
    dict(a_scales_t=True),
    dict(block_n=64),
], ids=str)
def test_variants_compile_to_tma_and_fp8_wgmma_without_spills(changes):
    ptx = assembly(_compile(bp.ws_config(BIG).replace(**changes)))
    assert TMA_LOAD in ptx and WGMMA_FP8.search(ptx)
    assert _ptxas_spill_bytes(ptx) == 0


def test_batched_weight_odd_shape_compiles_with_pointer_store():
    # Batched b: 3D descriptors; Triton 3.6's specializer fails on a 3D descriptor store, so the launcher
    # asks for the pointer store there (tma_store_ok).
    p = GemmProblem(2, True, 300, 520, 768, "block_fp8", "block_fp8", "fp32")
    cfg = bp.ws_config(p)
    assert not bp.tma_store_ok(p, cfg.warp_specialize, 2)
    compiled = _compile(cfg, m=300, n=520, k=768, batches=2, b_batched=True, tma_store=False)
    assert compiled.metadata.num_warps == 12 and WGMMA_FP8.search(assembly(compiled))


def test_one_k_block_runs_unspecialized():
    # K = 128: the K loop folds away and Triton 3.6's warp specializer fails; default_config and the
    # launcher fall back to the plain persistent loop.
    p = GemmProblem(1, False, 2048, 2048, 128, "block_fp8", "block_fp8", "bf16")
    assert not bp.ws_config(p).warp_specialize
    assert WGMMA_FP8.search(assembly(_compile(bp.ws_config(p), m=2048, n=2048, k=128)))


@pytest.mark.parametrize("changes,message", [
    (dict(block_k=64), "block_k must be 128"),
    (dict(num_warps=8), "warp_specialize needs num_warps=4"),
    (dict(flatten=True), "do not combine"),
    (dict(prefetch_scales=True), "prefetch_scales"),
    (dict(split_k=2), "split_k"),
    (dict(block_n=192), "block_n must divide 128"),
    (dict(num_sms=0), "num_sms"),
])
def test_check_config_refuses(changes, message):
    with pytest.raises(ValueError, match=message):
        bp.check_config(BIG, bp.ws_config(BIG).replace(**changes))


def test_dispatch_thresholds_and_switch(monkeypatch):
    lo_rows, lo_n, lo_k = backends.PERSISTENT_BLOCK_FP8_MIN
    big = dict(rows=lo_rows, n=lo_n, k=lo_k)
    assert backends.choose("sm_90", "block_fp8", "block_fp8", **big).kernel == "block_fp8_persistent"
    for field in big:  # one dimension under its threshold, or unknown (batched weight): the old kernel
        assert backends.choose("sm_90", "block_fp8", "block_fp8", **dict(big, **{field: big[field] - 1})).kernel \
            == "block_fp8"
        assert backends.choose("sm_90", "block_fp8", "block_fp8", **dict(big, **{field: None})).kernel == "block_fp8"
    for target in ("sm_100", "gfx950"):  # Blackwell and MI355 keep the generic kernel
        assert backends.choose(target, "block_fp8", "block_fp8", **big).kernel == "block_fp8"
    set_opt_in(monkeypatch, "sm_90", "block_fp8_persistent", "off for this test")  # the switch: opt-in
    assert backends.choose("sm_90", "block_fp8", "block_fp8", **big).kernel == "block_fp8"
    assert backends.choose("sm_90", "block_fp8", "block_fp8", kernel="block_fp8_persistent", **big).kernel \
        == "block_fp8_persistent"


def _quantized(m, n, k):
    rng = np.random.default_rng(0)
    a = jb.quantize_operand(jnp.asarray(rng.standard_normal((m, k)), jnp.float32), "fp8_block", side="a")
    b = jb.quantize_operand(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), "fp8_block", side="b")
    return a, b


_lowered = lowered_for_cuda


def test_matmul_lowers_large_block_fp8_to_one_persistent_launch():
    a, b = _quantized(2048, 1024, 1024)
    assert jb.explain(a, b, target="sm_90").kernel == "block_fp8_persistent"
    lowered = _lowered(lambda a, b: jb.matmul(a, b, target="sm_90"), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    text = kernel.decode("latin-1")
    assert ".entry persistent_block_fp8_kernel" in text
    assert TMA_LOAD in text and WGMMA_FP8.search(text)
    # 16 x 8 = 128 tiles: 128 programs (fewer tiles than SMs), each with its descriptors' scratch; no XLA
    # transpose of the scales by default (read with a stride in the kernel).
    hlo = lowered.as_text()
    assert re.search(r"stablehlo.custom_call @triton_kernel_call.*-> \(tensor<1x2048x1024xbf16>, "
                     r"tensor<\d+xui8>, tensor<128xui8>\)", hlo)
    assert "stablehlo.transpose" not in hlo


def test_config_without_persistent_runs_the_old_kernel():
    a, b = _quantized(2048, 1024, 1024)
    old = block_fp8.default_config(GemmProblem(1, False, 2048, 1024, 1024, "block_fp8", "block_fp8", "bf16"))
    lowered = _lowered(lambda a, b: jb.matmul(a, b, target="sm_90", config=old), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    text = kernel.decode("latin-1")
    assert ".entry block_fp8_kernel" in text and not SETMAXNREG.search(text)


def test_launch_uses_the_compiled_kernels_total_warps(monkeypatch):
    """The warp-specialized kernel is compiled for 4 warps and runs 12: the launch must ask for 12 threads
    groups (launched with the requested 4 it failed with CUDA_ERROR_INVALID_VALUE on an H100)."""
    from jax_blockscale._triton import launch

    real = launch._gpu_triton()
    seen = []

    class Recording:
        def __getattr__(self, name):
            return getattr(real, name)

        def TritonKernel(self, name, num_warps, *rest):  # noqa: N802 - jaxlib's name
            seen.append((name, num_warps))
            return real.TritonKernel(name, num_warps, *rest)

    monkeypatch.setattr(launch, "_gpu_triton", lambda: Recording())
    monkeypatch.setattr(bp, "ALLOW_WARP_SPECIALIZE", True)  # refused by default: wrong on an H100
    a, b = _quantized(2048, 1024, 1024)
    ws = bp.ws_config(GemmProblem(1, False, 2048, 1024, 1024, "block_fp8", "block_fp8", "bf16"))
    _lowered(lambda a, b: jb.matmul(a, b, target="sm_90", config=ws), a, b)
    assert seen == [("persistent_block_fp8_kernel", 12)]
