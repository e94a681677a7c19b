"""16-bit activations x block FP8 weights (`_triton/dense_x_block_fp8.py`, block_fp8.py's kernel with X_DENSE), on the
CPU: what dispatch picks, what each target compiles it to, the configs it refuses, and its results in Triton's
interpreter through the whole `jb.matmul` GPU path (tests/_decode_interpret_check.py's harness) against the jnp
reference, at odd shapes: K pads to a multiple of 128, N spans a partial 128-row scale tile, M is not a power of
two (and once a folded batch), both operand orders, split-K, fp16 activations, bf16 output.
"""

import dataclasses
import re

import jax.numpy as jnp
import pytest

pytest.importorskip("triton")

import jax_blockscale as jb  # noqa: E402
from _interpret import run_matmul_cases  # noqa: E402
from jax_blockscale._triton import block_fp8, dense_x_block_fp8  # noqa: E402
from jax_blockscale._triton.compile import compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402


def _cfg(**changes):
    base = dict(block_m=64, block_n=32, block_k=128, group_m=2, num_warps=4, num_stages=2, split_k=1, swap_ab=True,
                kernel="dense_x_block_fp8")
    return dict(base, **changes)


CASES = [
    dict(fa="bf16", fb="fp8_block", batch=[], m=3, n=150, k=700, seed=1, out_dtype="float32", config=_cfg()),
    dict(fa="bf16", fb="fp8_block", batch=[], m=70, n=150, k=700, seed=2, out_dtype="float32",
         config=_cfg(block_m=32, block_n=64, swap_ab=False)),
    dict(fa="bf16", fb="fp8_block", batch=[], m=5, n=300, k=1024, seed=3, out_dtype="float32",
         config=_cfg(block_m=128, split_k=3)),
    dict(fa="fp16", fb="fp8_block", batch=[2], m=3, n=150, k=700, seed=4, out_dtype="float32",
         config=_cfg(block_n=16)),
    dict(fa="bf16", fb="fp8_block", batch=[], m=20, n=150, k=700, seed=5, out_dtype="bfloat16",
         config=_cfg(block_m=256, block_n=16, swap_ab=True)),
    # the weight widened to the activations' type by XLA before the kernel, both operand orders
    dict(fa="bf16", fb="fp8_block", batch=[], m=70, n=150, k=700, seed=7, out_dtype="float32", hopper=True,
         config=_cfg(block_m=64, block_n=64, widen_first=True)),
    dict(fa="fp16", fb="fp8_block", batch=[], m=70, n=150, k=700, seed=8, out_dtype="bfloat16", hopper=True,
         config=_cfg(block_m=32, block_n=64, swap_ab=False, split_k=2, widen_first=True)),
    # the default configuration (swapped decode tiles at 3 rows, split-K), named so the kernel runs here
    dict(fa="bf16", fb="fp8_block", batch=[], m=3, n=150, k=700, seed=6, out_dtype="float32",
         config=dataclasses.asdict(dense_x_block_fp8.default_config(
             GemmProblem(1, False, 3, 150, 768, "bf16", "block_fp8", "fp32")).replace(kernel="dense_x_block_fp8"))),
]


@pytest.fixture(scope="module")
def results():
    return run_matmul_cases(CASES)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_dense_x_block_fp8_matches_reference(results, index):
    result, case = results[index], CASES[index]
    assert result["case"] == case
    (launch,) = result["launches"]
    assert launch["name"].startswith("dense_x_block_fp8")
    assert launch["X_DENSE"] is True and launch["OUT_T"] == case["config"]["swap_ab"]
    assert launch["SPLIT_K"] == case["config"]["split_k"]
    assert result["finite"], result
    # exact products summed in fp32: only the summation order differs from the reference
    tolerance = 1e-5 if case["out_dtype"] == "float32" else 2 * 2.0**-8 + 1e-5
    assert result["rel_err"] < tolerance, result


def _w(n=7168, k=4096):
    return jb.quantize_operand(jnp.ones((n, k), jnp.float32), "fp8_block", side="b")


@pytest.mark.parametrize("target", ["sm_90", "sm_100", "gfx950"])
@pytest.mark.parametrize("rows", [1, 2, 64, 65, 4096])
def test_dispatch_runs_a_kernel_for_dense_activations_with_block_fp8_weights(target, rows):
    choice = jb.explain(jnp.zeros((rows, 4096), jnp.bfloat16), _w(), target=target)
    assert choice.path != "reference", choice
    # sm_90: one row takes decode.py's GEMV (measured faster there), 2 rows on the block FP8 kernel; elsewhere
    # decode.py up to 64 rows
    if target == "sm_90":
        expected = "decode" if rows == 1 else "dense_x_block_fp8"
    else:
        expected = "decode" if rows <= 64 else "dense_x_block_fp8"
    assert choice.kernel == expected, choice


def _compile(target, swap, rows=4096, n=7168, k=4096, block_m=128, block_n=128, warps=8, stages=3, x="*bf16"):
    sig = dict(a_ptr="*fp8e4nv" if swap else x, a_scale_ptr="*fp32" if swap else x,
               b_ptr=x if swap else "*fp8e4nv", b_scale_ptr=x if swap else "*fp32", alpha_ptr="*fp32",
               out_ptr="*bf16")
    constexprs = dict(M=n if swap else rows, N=rows if swap else n, K=k, BATCHES=1, B_BATCHED=False, BLOCK_M=block_m,
                      BLOCK_N=block_n, BLOCK_K=128, GROUP_M=8, SPLIT_K=1, WIDE=False, OUT_T=swap, X_DENSE=True,
                      **block_fp8.kernel_constexprs(swap))
    return compile_kernel(block_fp8.block_fp8_kernel, target=target, signature=sig, constexprs=constexprs,
                          num_warps=warps, num_stages=stages)


def test_hopper_takes_the_widened_weight_as_wgmma_register_operand():
    ptx = _compile("sm_90", swap=True).asm["ptx"]
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*(\S)", ptx)
    assert mma and set(mma) == {"{"}, mma        # A from registers, not a shared-memory descriptor
    assert "cp.async" in ptx and "e4m3" in ptx   # pipelined loads; the codes widened in registers


def test_hopper_widens_to_bf16_without_the_conversion_pipe():
    # e4m3 -> bf16 by way of fp16 and fp32 (block_fp8.widen_codes): Triton's direct route converts f16 -> bf16 one
    # element at a time with F2F, on the slow conversion pipe (1.27x slower at 4096 rows on the H200)
    from benchmarks._sass import disassemble

    sass = disassemble(_compile("sm_90", swap=True).asm["cubin"], "cuobjdump")
    assert re.search(r"\bF2FP\b", sass) and re.search(r"\bHADD2\.F32\b", sass)
    assert not re.search(r"\bF2F\.", sass)


@pytest.mark.parametrize("target,rows,widen", [("sm_90", 2048, True), ("sm_90", 1024, False), ("sm_100", 4096, False),
                                               ("gfx950", 4096, False)])
def test_hopper_widens_the_codes_first_from_2048_rows(target, rows, widen):
    p = GemmProblem(1, False, rows, 7168, 4096, "bf16", "block_fp8", "bf16")
    assert dense_x_block_fp8.WIDEN_FIRST_ROWS == 2048
    assert dense_x_block_fp8.default_config(p, target).widen_first == widen


def test_codes_widened_first_reach_wgmma_from_shared_memory_with_no_conversion():
    sig = dict(a_ptr="*bf16", a_scale_ptr="*fp32", b_ptr="*bf16", b_scale_ptr="*bf16", alpha_ptr="*fp32",
               out_ptr="*bf16")
    constexprs = dict(M=7168, N=4096, K=4096, BATCHES=1, B_BATCHED=False, BLOCK_M=128, BLOCK_N=128, BLOCK_K=128,
                      GROUP_M=8, SPLIT_K=1, WIDE=False, OUT_T=True, X_DENSE=True, **block_fp8.kernel_constexprs(True))
    ptx = compile_kernel(block_fp8.block_fp8_kernel, target="sm_90", signature=sig, constexprs=constexprs,
                         num_warps=8, num_stages=3).asm["ptx"]
    mma = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*(\S)", ptx)
    assert mma and "{" not in set(mma), mma       # A by shared-memory descriptor
    assert "e4m3" not in ptx and "cvt.f32.f16" not in ptx


def test_hopper_fp16_activations_run_an_fp16_wgmma():
    ptx = _compile("sm_90", swap=True, x="*fp16").asm["ptx"]
    assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n128k16\.f32\.f16\.f16", ptx)


def test_blackwell_and_gfx950_lower_to_their_16_bit_mma():
    assert re.search(r"tcgen05\.mma\.cta_group::1\.kind::f16", _compile("sm_100", swap=True).asm["ptx"])
    amdgcn = _compile("gfx950", swap=True, stages=2).asm["amdgcn"]
    assert re.search(r"v_mfma_f32_\w+_bf16", amdgcn)


@pytest.mark.parametrize("changes, match", [
    (dict(tma=True, swap_ab=False), "tma and persistent must be off"),
    (dict(persistent=True), "tma and persistent must be off"),
    (dict(block_k=256), "block_k in"),
])
def test_refuses_what_its_kernel_cannot_take(changes, match):
    p = GemmProblem(1, False, 4096, 7168, 4096, "bf16", "block_fp8", "bf16")
    cfg = dense_x_block_fp8.default_config(p).replace(**changes)
    with pytest.raises(ValueError, match=match):
        dense_x_block_fp8.check_config(p, cfg)


@pytest.mark.parametrize("compute_capability", [100, None])   # sm_100; gfx950 (no CUDA capability)
def test_widen_first_is_refused_off_hopper_before_any_compute(compute_capability):
    p = GemmProblem(1, False, 256, 256, 512, "bf16", "block_fp8", "bf16")
    w = jb.quantize_operand(jnp.ones((256, 512), jnp.float32), "fp8_block", side="b")
    x = jnp.ones((1, 256, 512), jnp.bfloat16)
    cfg = dense_x_block_fp8.default_config(p).replace(widen_first=True)
    with pytest.raises(ValueError, match="widen_first is a Hopper"):
        dense_x_block_fp8.launch(p, x, x, w.values, w.scales, jnp.ones((1,), jnp.float32), config=cfg,
                                 compute_capability=compute_capability)


def test_swap_needs_an_unbatched_weight():
    p = GemmProblem(2, True, 64, 256, 512, "bf16", "block_fp8", "bf16")
    assert not dense_x_block_fp8.default_config(p).swap_ab
    with pytest.raises(ValueError, match="unbatched weight"):
        dense_x_block_fp8.check_config(p, TileConfig(block_m=64, block_n=64, block_k=128, group_m=1, num_warps=4,
                                                     num_stages=2, swap_ab=True))
