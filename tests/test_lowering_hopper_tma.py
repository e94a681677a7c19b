"""CPU tests of the Hopper speed paths: TMA kernels, swapped decode launches and the tuned-config tables.

Cross-compiled for sm_90 (no GPU needed). What they prove: the TMA kernels load tiles with
`cp.async.bulk.tensor` and multiply with wgmma; the chosen tiles fit the register file (ptxas reports no
spills); the swapped decode launch gives wgmma an N side as small as the activation rows; the scratch
launcher hands the kernel its global scratch; the config tables parse and pick what they say.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile

import pytest

pytest.importorskip("triton")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale._triton import block_fp8, configs, hopper_tma, jt, upcast  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402
from _jax_triton import lowered_for_cuda  # noqa: E402

TMA_LOAD = "cp.async.bulk.tensor"
WGMMA_FP8 = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k32\.f32\.e4m3\.e4m3")
WGMMA_BF16 = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16\.f32\.bf16\.bf16")
SIG = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
       "alpha_ptr": "*fp32", "out_ptr": "*bf16"}


def _tma_constexprs(config: TileConfig, scaled: bool, m=4096, n=4096, k=4096) -> dict:
    return dict(M=m, N=n, K=k, BATCHES=1, B_BATCHED=False, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                BLOCK_K=config.block_k, GROUP_M=config.group_m, NUM_STAGES=config.num_stages, SCALED=scaled)


def _compile_tma(config: TileConfig, scaled: bool):
    sig = SIG if scaled else dict(SIG, a_ptr="*bf16", b_ptr="*bf16")
    return compile_kernel(hopper_tma.tma_gemm_kernel, target="sm_90", signature=sig,
                          constexprs=_tma_constexprs(config, scaled), num_warps=config.num_warps,
                          num_stages=config.num_stages)


def _ptxas_spill_bytes(ptx: str) -> int:
    """Spill stores ptxas reports for sm_90a (Triton ships ptxas)."""
    import triton

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    result = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True,
                            text=True, check=True)
    os.unlink(f.name)
    return sum(int(x) for x in re.findall(r"(\d+) bytes spill stores", result.stderr))


BIG_FP8 = GemmProblem(1, False, 4096, 4096, 4096, "block_fp8", "block_fp8", "bf16")
BIG_MX = GemmProblem(1, False, 4096, 4096, 4096, "e4m3", "e4m3", "bf16")


@pytest.mark.parametrize("m", [256, 4096])
def test_tma_block_fp8_uses_tma_and_fp8_wgmma_without_spills(m):
    # 256 rows: the heuristic's own TMA config; 4096: the 128 x 128 two-warpgroup tile.
    p = GemmProblem(1, False, m, 4096, 4096, "block_fp8", "block_fp8", "bf16")
    cfg = block_fp8.default_config(p, "sm_90")
    if m > 256:
        cfg = cfg.replace(tma=True)
    assert cfg.tma
    compiled = _compile_tma(cfg, scaled=True)
    ptx = assembly(compiled)
    assert TMA_LOAD in ptx and WGMMA_FP8.search(ptx)
    assert compiled.metadata.global_scratch_size > 0  # descriptors built in the kernel live in scratch
    assert _ptxas_spill_bytes(ptx) == 0


def test_tma_block_fp8_128x256_tile_spills():
    # Why the default stays at 128 x 128: the promoted accumulator and the block's partial product need
    # 2 x 128 fp32 registers per thread at 128 x 256 over two warpgroups.
    cfg = TileConfig(block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=3, tma=True)
    assert _ptxas_spill_bytes(assembly(_compile_tma(cfg, scaled=True))) > 0


def test_tma_bf16_default_for_predecoded_mx_uses_tma_and_bf16_wgmma_without_spills():
    cfg = upcast.default_config(BIG_MX, "sm_90")
    assert cfg.tma and upcast.predecoded_sides(BIG_MX, cfg) == (True, True)
    ptx = assembly(_compile_tma(cfg, scaled=False))
    assert TMA_LOAD in ptx and WGMMA_BF16.search(ptx)
    assert _ptxas_spill_bytes(ptx) == 0


_lowered = lowered_for_cuda


def _quantized(m, n, k, fmt_a, fmt_b):
    rng = np.random.default_rng(0)
    a = jb.quantize_operand(jnp.asarray(rng.standard_normal((m, k)), jnp.float32), fmt_a, side="a")
    b = jb.quantize_operand(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), fmt_b, side="b")
    return a, b


def test_matmul_lowers_block_fp8_to_tma_kernel_with_scratch_outputs():
    a, b = _quantized(256, 384, 512, "fp8_block", "fp8_block")  # 65-256 rows: the TMA kernel
    lowered = _lowered(lambda a, b: jb.matmul(a, b, target="sm_90"), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    assert TMA_LOAD.encode() in kernel and WGMMA_FP8.search(kernel.decode("latin-1"))
    # The custom call returns the product plus the two scratch buffers Triton's kernel signature ends with.
    # 4 x 3 = 12 programs of 64 x 128, 256 bytes of descriptors each.
    assert re.search(r"%\d+:3 = stablehlo.custom_call @triton_kernel_call.*-> \(tensor<1x256x384xbf16>, "
                     r"tensor<3072xui8>, tensor<128xui8>\)", lowered.as_text())


def test_predecode_passes_carry_the_dequantize_scope():
    # Large MX operands are dequantized by XLA before the bf16 TMA kernel; the pass is named so that a
    # profile can tell its fused kernels from the model's own (benchmarks/_kernel_time.reclassify).
    a, b = _quantized(512, 1024, 256, "mxfp8", "mxfp8")
    lowered = _lowered(lambda a, b: jb.matmul(a, b, target="sm_90"), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    assert TMA_LOAD.encode() in kernel and WGMMA_BF16.search(kernel.decode("latin-1"))  # bf16 x bf16 after it
    locs = re.findall(r'loc\("([^"]*jbs_dequantize[^"]*)"', lowered.as_text(debug_info=True))
    assert any(loc.endswith("jbs_dequantize/convert_element_type") for loc in locs)  # the pass's bf16 result


# Where sm_90 dispatch takes the swapped kernels at <= 64 rows (block FP8; fp4 weights above 16 rows: the
# decode kernel measured slower there): the weight on wgmma's M side, the activation rows as N.
@pytest.mark.parametrize("m,fmt_a,fmt_b,wgmma", [
    (16, "fp8_block", "fp8_block", WGMMA_FP8),
    (1, "fp8_block", "fp8_block", WGMMA_FP8),
    (33, "mxfp8", "mxfp4", WGMMA_BF16),
    (64, "bf16", "nvfp4", WGMMA_BF16),
])
def test_decode_swaps_operands_so_wgmma_n_is_the_activation_rows(m, fmt_a, fmt_b, wgmma):
    a, b = _quantized(m, 7168 // 4, 1024, fmt_a, fmt_b)
    if fmt_a == "bf16":
        a = jnp.zeros((m, 1024), jnp.bfloat16)
    lowered = _lowered(lambda a, b: jb.matmul(a, b, target="sm_90"), a, b)
    kernels = [k.decode("latin-1") for k in jt.lowered_kernels(lowered)]
    assert len(kernels) == 1
    widths = {int(n) for n in wgmma.findall(kernels[0])}
    # the activation rows (a power of two >= 16), not a 64-row weight tile
    assert widths and max(widths) <= max(16, 1 << (m - 1).bit_length())


def test_swap_is_never_chosen_or_accepted_with_a_batched_weight():
    # The swapped launch needs one shared weight: the heuristic must not offer it, check_config must refuse it.
    p = GemmProblem(2, True, 8, 256, 512, "block_fp8", "block_fp8", "bf16")
    assert not block_fp8.default_config(p, "sm_90").swap_ab  # batched weight: no swap
    with pytest.raises(ValueError, match="swap_ab"):
        block_fp8.check_config(p, TileConfig(block_k=128, swap_ab=True, tma=True))


@pytest.mark.parametrize("target", ["sm_100", "gfx950"])
def test_hopper_variants_stay_on_hopper(target):
    for p in (BIG_FP8, GemmProblem(1, False, 16, 7168, 4096, "block_fp8", "block_fp8", "bf16")):
        cfg = block_fp8.default_config(p, target)
        assert not (cfg.tma or cfg.swap_ab)
    assert not upcast.default_config(BIG_MX, target).tma


# ---------------------------------------------------------------------------------------------------------
# Config tables


def test_device_slug():
    assert configs.device_slug("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"
    assert configs.device_slug("NVIDIA H200") == "nvidia_h200"


def test_lookup_takes_first_matching_rule_and_falls_back_to_heuristic():
    table = {"kernels": {"block_fp8": [
        {"rows": [1, 16], "n": [7168, 7168], "config": {"block_m": 64, "block_n": 16, "swap_ab": True, "split_k": 2}},
        {"rows": [1, 64], "config": {"block_m": 64, "block_n": 64, "swap_ab": True}},
    ]}}
    decode = GemmProblem(1, False, 16, 7168, 4096, "block_fp8", "block_fp8", "bf16")
    assert configs.lookup(table, "block_fp8", decode).split_k == 2
    assert configs.lookup(table, "block_fp8", GemmProblem(4, False, 16, 7168, 4096, "block_fp8", "block_fp8",
                                                          "bf16")).block_n == 64  # 64 rows: second rule
    assert configs.lookup(table, "block_fp8", BIG_FP8) is None
    assert configs.lookup(table, "upcast", decode) is None
    assert configs.select("block_fp8", block_fp8, BIG_FP8, "sm_90", None) == block_fp8.default_config(BIG_FP8)


@pytest.mark.parametrize("path", sorted(configs.TABLE_DIR.glob("*.json")), ids=lambda p: p.stem)
def test_shipped_tables_are_valid(path):
    table = json.loads(path.read_text())
    modules = {"block_fp8": block_fp8, "upcast": upcast}
    assert table["device_kind"] and configs.device_slug(table["device_kind"]) == path.stem
    for kernel, rules in table["kernels"].items():
        for rule in rules:
            cfg = TileConfig(**rule["config"])
            lo = rule.get("rows", [1, 1])[0]
            kinds = ("block_fp8", "block_fp8") if kernel == "block_fp8" else ("e4m3", "e2m1")
            p = GemmProblem(1, False, lo, rule.get("n", [4096])[0], max(rule.get("k", [4096])[0], 256), *kinds,
                            "bf16")
            modules[kernel].check_config(p, cfg)
