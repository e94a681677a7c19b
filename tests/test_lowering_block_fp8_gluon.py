"""CPU tests of the Gluon Hopper block FP8 kernel (block_fp8_gluon.py), cross-compiled for sm_90.

What they prove without a GPU: the kernel builds its TMA descriptors in the kernel (global scratch), loads
with TMA and multiplies with fp8 e4m3 wgmma; each K block's wgmma is asynchronous (`wgmma.wait_group 1`:
one wgmma stays in flight while the previous block is promoted); the launcher's checks refuse what the
kernel cannot take; the dispatch table reaches it only when a config names it, and `jb.matmul` with its
default config then lowers to one launch of min(NUM_SMS, tiles) programs; `launch.scratch_call` passes a
register cap through to the PTX. GPU results: test_gpu_block_fp8_persistent.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.experimental.gluon")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends  # noqa: E402
from jax_blockscale._triton import block_fp8_gluon as bg, block_fp8_persistent as bp  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from test_lowering_hopper_tma import TMA_LOAD, WGMMA_FP8  # noqa: E402

SIG = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
       "alpha_ptr": "*fp32", "out_ptr": "*bf16"}
BIG = GemmProblem(1, False, 8192, 8192, 8192, "block_fp8", "block_fp8", "bf16")


def _compile(m=8192, n=8192, k=8192, tma_store=True, stages=4):
    constexprs = dict(M=m, N=n, K=k, BLOCK_M=128, BLOCK_N=128, GROUP_M=8, NUM_SMS=132, STAGES=stages, NUM_WARPS=8,
                      TMA_STORE=tma_store)
    return compile_kernel(bg.block_fp8_gluon_kernel, target="sm_90", signature=SIG, constexprs=constexprs,
                          num_warps=8, num_stages=stages)


@pytest.mark.parametrize("k", [128, 1536, 8320])  # one K block; an even and an odd number of K blocks
def test_async_fp8_wgmma_with_one_in_flight(k):
    compiled = _compile(k=k)
    ptx = assembly(compiled)
    assert TMA_LOAD in ptx and {int(n) for n in WGMMA_FP8.findall(ptx)} == {128}
    waits = {int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)}
    assert waits == ({0} if k == 128 else {0, 1})  # one K block: nothing to overlap
    assert compiled.metadata.global_scratch_size > 0  # the descriptors are built in the kernel
    assert compiled.metadata.num_warps == 8


def test_pointer_store_when_rows_are_not_16_byte_aligned():
    ptx = assembly(_compile(n=1100, tma_store=False))
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx and "st.global" in ptx


@pytest.mark.parametrize("problem,changes,message", [
    (BIG, dict(block_n=64), "128 x 128 x 128"),
    (BIG, dict(num_warps=4), "8 warps"),
    (BIG, dict(num_warps=12), "8 warps"),
    (BIG, dict(num_stages=1), "num_stages"),
    (BIG, dict(num_sms=0), "num_sms"),
    (GemmProblem(2, True, 256, 256, 256, "block_fp8", "block_fp8", "bf16"), {}, "unbatched weight"),
    (GemmProblem(1, False, 256, 256, 200, "block_fp8", "block_fp8", "bf16"), {}, "multiple of 128"),
])
def test_check_config_refuses(problem, changes, message):
    with pytest.raises(ValueError, match=message):
        bg.check_config(problem, bg.default_config(problem).replace(**changes))


def test_dispatch_reaches_it_only_when_named():
    big = dict(rows=8192, n=8192, k=8192)
    assert backends.choose("sm_90", "block_fp8", "block_fp8", **big).kernel == "block_fp8_persistent"
    assert backends.choose("sm_90", "block_fp8", "block_fp8", kernel="block_fp8_gluon", **big).kernel \
        == "block_fp8_gluon"
    assert bg.default_config(BIG).kernel == "block_fp8_gluon"
    for target in ("sm_100", "gfx950"):  # Hopper's wgmma only
        with pytest.raises(ValueError, match="no entry"):
            backends.choose(target, "block_fp8", "block_fp8", kernel="block_fp8_gluon", **big)


def test_matmul_with_its_default_config_lowers_to_one_launch():
    from _jax_triton import lowered_for_cuda
    from jax_blockscale._triton import jt

    rng = np.random.default_rng(0)
    a = jb.quantize_operand(jnp.asarray(rng.standard_normal((2048, 1024)), jnp.float32), "fp8_block", side="a")
    b = jb.quantize_operand(jnp.asarray(rng.standard_normal((1024, 1024)), jnp.float32), "fp8_block", side="b")
    lowered = lowered_for_cuda(lambda a, b: jb.matmul(a, b, target="sm_90", config=bg.default_config(BIG)), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    assert ".entry block_fp8_gluon_kernel" in kernel.decode("latin-1")
    # 16 x 8 = 128 tiles: 128 programs, one output plus the descriptors' scratch; no XLA transpose.
    hlo = lowered.as_text()
    assert re.search(r"stablehlo.custom_call @triton_kernel_call.*-> \(tensor<2048x1024xbf16>, "
                     r"tensor<\d+xui8>, tensor<128xui8>\)", hlo)
    assert "stablehlo.transpose" not in hlo


def test_scratch_call_caps_registers():
    from jax_blockscale._triton import launch

    constexprs = dict(M=8192, N=8192, K=8192, BATCHES=1, B_BATCHED=False, BLOCK_M=128, BLOCK_N=128, GROUP_M=8,
                      NUM_SMS=132, NUM_STAGES=2, WARP_SPECIALIZE=False, FLATTEN=False, TMA_STORE=True,
                      PREFETCH_SCALES=True, A_SCALES_T=False)
    sig = tuple(SIG.items())
    capped = launch._compile(bp.persistent_block_fp8_kernel, sig, tuple(sorted(constexprs.items())), 8, 2, "sm_90",
                             128)
    assert ".maxnreg 128" in assembly(capped)
    with pytest.raises(ValueError, match="max_registers"):
        bp.check_config(BIG, TileConfig(persistent=True, num_warps=8, max_registers=300))
