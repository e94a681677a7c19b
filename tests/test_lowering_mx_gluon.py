"""CPU tests of the opt-in Gluon MX GEMM (`_triton/mx_gluon.py`: bf16 activations x MX / nvfp4 weights, the
weight decoded in registers into wgmma's A operand).

Cross-compiled for sm_90 (no GPU needed). What they prove: the kernel multiplies with bf16 wgmma whose A
operand comes from registers (the decoded weight never goes through shared memory), the activations arrive
by TMA, the weight by 8-byte vector loads, ptxas neither spills nor serializes a wgmma; dispatch leaves it
opt-in and a config naming it lowers to its one kernel; its checks refuse what it cannot run.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

import jax.numpy as jnp  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends  # noqa: E402
from jax_blockscale._triton import mx_gluon as mg  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from test_lowering_block_fp8_gluon import _ptxas  # noqa: E402

_VALUE_TYPES = {"e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "e2m1": "*u8", "nvfp4": "*u8"}
KINDS = ("e2m1", "nvfp4", "e4m3", "e5m2")


def _problem(kind: str, m=8192, n=8192, k=8192, out="bf16") -> GemmProblem:
    return GemmProblem(1, False, m, n, k, "bf16", kind, out)


def _compile(kind: str, config: TileConfig, out="bf16", n=8192):
    sig = {"x_ptr": "*bf16", "w_ptr": _VALUE_TYPES[kind], "s_ptr": "*fp8e4nv" if kind == "nvfp4" else "*u8",
           "a_ts_ptr": "*fp32", "b_ts_ptr": "*fp32", "out_ptr": "*bf16" if out == "bf16" else "*fp32"}
    constexprs = dict(M=8192, N=n, K=8192, BLOCK_X=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
                      NUM_SMS=132, STAGES=config.num_stages, W_KIND=kind, TMA_STORE=n % 8 == 0)
    return compile_kernel(mg.mx_gluon_kernel, target="sm_90", signature=sig, constexprs=constexprs, num_warps=4,
                          num_stages=config.num_stages, maxnreg=mg.MAX_REGISTERS)


@pytest.mark.parametrize("kind", KINDS)
def test_default_config_compiles_to_register_a_wgmma_without_spills(kind, tmp_path):
    config = mg.default_config(_problem(kind))
    ptx = assembly(_compile(kind, config))
    # m64n256k16 with A from registers ({%r..} before B's descriptor): 4 per 64-wide K step, both consumers.
    wgmma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s+\{[^}]*\},\s*\{", ptx)
    assert len(wgmma) == 2 * config.block_k // 16
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx  # the activations by TMA
    assert re.search(r"ld\.global(\.\w+)*\.v2\.b32", ptx)  # the weight codes as 8-byte vectors
    report = _ptxas(ptx, tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report
    assert "C7514" not in report and "C7515" not in report  # no wgmma serialized


def test_fp32_output_and_pointer_store_compile(tmp_path):
    config = mg.default_config(_problem("e2m1", out="fp32"))
    assert config.num_stages == 2  # an fp32 output's buffers leave room for two stages
    report = _ptxas(assembly(_compile("e2m1", config, out="fp32")), tmp_path)
    assert "0 bytes spill stores, 0 bytes spill loads" in report
    ptx = assembly(_compile("e2m1", mg.default_config(_problem("e2m1", n=1100)), n=1100))  # rows not 16-byte aligned
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx and "st.global" in ptx


def test_checks_refuse_what_the_kernel_cannot_run():
    p = _problem("e2m1")
    good = mg.default_config(p)
    mg.check_config(p, good)
    with pytest.raises(ValueError, match="bf16 activations"):
        mg.check_config(GemmProblem(1, False, 256, 256, 256, "e2m1", "e2m1", "bf16"), good)
    with pytest.raises(ValueError, match="unbatched"):
        mg.check_config(GemmProblem(2, True, 256, 256, 256, "bf16", "e2m1", "bf16"), good)
    with pytest.raises(ValueError, match="two K steps"):
        mg.check_config(_problem("e2m1", k=64), good)
    with pytest.raises(ValueError, match="block_n"):
        mg.check_config(p, good.replace(block_n=512))
    with pytest.raises(ValueError, match="block_k"):
        mg.check_config(p, good.replace(block_k=128))  # spills
    with pytest.raises(ValueError, match="shared memory"):
        mg.check_config(_problem("e2m1", out="fp32"), good.replace(num_stages=4))
    with pytest.raises(ValueError, match="num_warps"):
        mg.check_config(p, good.replace(num_warps=8))
    with pytest.raises(ValueError, match="register split"):  # shared with block_fp8_gluon's checks
        mg.check_config(p, good.replace(max_registers=128))


def test_dispatch_leaves_it_opt_in_and_a_named_config_lowers_to_it():
    (entry,) = [e for e in backends.KERNEL_TABLE["sm_90"] if e.module == "mx_gluon"]
    assert entry.opt_in and "H100" in entry.opt_in and entry.named_configs_only
    for kind in KINDS:
        assert backends.choose("sm_90", "bf16", kind, rows=8192).kernel == "upcast"
        assert backends.choose("sm_90", "bf16", kind, rows=8192, kernel="mx_gluon").kernel == "mx_gluon"
    from _jax_triton import lowered_for_cuda

    x = jnp.zeros((1000, 1024), jnp.bfloat16)
    w = jb.quantize_operand(jnp.ones((1100, 1024), jnp.float32), "mxfp4", side="b")
    config = TileConfig(block_m=128, block_n=256, block_k=64, num_warps=4, num_stages=4, kernel="mx_gluon")
    text = lowered_for_cuda(lambda a, b: jb.matmul(a, b, config=config, target="sm_90"), x, w).as_text()
    assert text.count("stablehlo.custom_call") == 1 and "stablehlo.dot_general" not in text
