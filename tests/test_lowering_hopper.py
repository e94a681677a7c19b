"""CPU tests: the Hopper kernels cross-compile to the tensor-core instructions they are written for.

No GPU needed: Triton compiles for sm_90 / sm_100 / gfx950 on a CPU, and jax-triton lowers a jitted launcher
for the `cuda` platform given an explicit compute capability. Instruction spellings are Triton 3.6's:
  sm_90  block_fp8: wgmma.mma_async.sync.aligned.m64n<N>k32.f32.e4m3.e4m3
  sm_90  upcast:    wgmma.mma_async.sync.aligned.m64n<N>k16.f32.bf16.bf16 (f16.f16 for fp16 x fp16)
  sm_100 block_fp8: tcgen05.mma.cta_group::1.kind::f8f6f4
  gfx950 block_fp8: v_mfma_f32_<M>x<N>x<K>_f8f6f4;  upcast: v_mfma_f32_<M>x<N>x<K>_bf16
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jax_blockscale._triton import block_fp8, upcast  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import SCALE_BLOCK, GemmProblem, TileConfig, operand_dtypes  # noqa: E402

WGMMA_FP8 = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k32\.f32\.e4m3\.e4m3")
WGMMA_BF16 = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16")
WGMMA_FP16 = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.f16\.f16")
TCGEN05_F8 = re.compile(r"tcgen05\.mma\.cta_group::1\.kind::f8f6f4")
MFMA_F8 = re.compile(r"v_mfma_f32_\d+x\d+x\d+_f8f6f4")
MFMA_BF16 = re.compile(r"v_mfma_f32_\d+x\d+x\d+_bf16")

_POINTER = {
    jnp.dtype(jnp.float8_e4m3fn): "*fp8e4nv", jnp.dtype(jnp.float8_e5m2): "*fp8e5", jnp.dtype(jnp.uint8): "*u8",
    jnp.dtype(jnp.bfloat16): "*bf16", jnp.dtype(jnp.float16): "*fp16", jnp.dtype(jnp.float32): "*fp32",
}
# Small tiles where the instruction, not the tuning, is under test: they compile fastest.
FAST = TileConfig(block_m=64, block_n=64, block_k=64, group_m=4, num_warps=4, num_stages=2)


def signature(p: GemmProblem) -> dict[str, str]:
    """The kernel's pointer signature as jax-triton builds it: five operands, then the output."""
    pointers = {}
    for side, kind in (("a", p.a_kind), ("b", p.b_kind)):
        values, scales = operand_dtypes(kind)
        pointers[f"{side}_ptr"] = _POINTER[values]
        pointers[f"{side}_scale_ptr"] = _POINTER[scales if scales is not None else values]
    order = ("a_ptr", "a_scale_ptr", "b_ptr", "b_scale_ptr")
    return {**{k: pointers[k] for k in order}, "alpha_ptr": "*fp32", "out_ptr": "*bf16"}


def gemm_constexprs(p: GemmProblem, config: TileConfig) -> dict:
    batches, rows = (p.batch, p.m) if p.b_batched else (1, p.batch * p.m)
    return dict(M=rows, N=p.n, K=p.k, BATCHES=batches, B_BATCHED=p.b_batched, BLOCK_M=config.block_m,
                BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m, SPLIT_K=config.split_k,
                WIDE=block_fp8.needs_wide_offsets(p, config), OUT_T=config.swap_ab)


def cross_compile(kernel, p: GemmProblem, config: TileConfig, target: str, **extra) -> str:
    compiled = compile_kernel(kernel, target=target, signature=signature(p),
                              constexprs={**gemm_constexprs(p, config), **extra},
                              num_warps=config.num_warps, num_stages=config.num_stages)
    return assembly(compiled)


def operand_structs(p: GemmProblem) -> list[jax.ShapeDtypeStruct]:
    """Abstract operands in the contract's layouts (problem.py)."""
    structs = []
    b_lead = (p.batch,) if p.b_batched else ()
    for side, kind, rows, lead in (("a", p.a_kind, p.m, (p.batch,)), ("b", p.b_kind, p.n, b_lead)):
        values, scales = operand_dtypes(kind)
        structs.append(jax.ShapeDtypeStruct(lead + (rows, p.k // p.elements_per_byte(side)), values))
        if kind == "block_fp8":  # a: 1 x 128 groups, b: 128 x 128 tiles
            scale_shape = (rows if side == "a" else -(-rows // 128), p.k // 128)
        elif scales is None:
            scale_shape, scales = (rows, 1), values
        else:
            scale_shape = (rows, p.k // SCALE_BLOCK[kind])
        structs.append(jax.ShapeDtypeStruct(lead + scale_shape, scales))
    return structs + [jax.ShapeDtypeStruct((1,), jnp.float32)]


def lowered_ptx(module, p: GemmProblem, config: TileConfig) -> str:
    """PTX of the Triton kernel(s) in `module.launch` jitted and lowered for cuda sm_90 through jax-triton."""
    from jax_blockscale._triton import jt

    try:
        jt.jax_triton()  # not pytest.importorskip: jax-triton's import blanks TRITON_CACHE_DIR; jt restores it
    except ImportError as e:
        pytest.skip(str(e))
    lowered = jax.jit(lambda *xs: module.launch(p, *xs, config=config, compute_capability=90)).trace(
        *operand_structs(p)).lower(lowering_platforms=("cuda",))
    kernels = jt.lowered_kernels(lowered)
    assert len(kernels) == 1
    return kernels[0].decode("latin-1")


# ---------------------------------------------------------------------------------------------------------
# block_fp8


BLOCK_FP8_PROBLEM = GemmProblem(1, False, 1000, 1000, 1024, "block_fp8", "block_fp8", "bf16")


def test_block_fp8_sm90_uses_fp8_wgmma():
    cfg = block_fp8.default_config(BLOCK_FP8_PROBLEM)
    assert WGMMA_FP8.search(cross_compile(block_fp8.block_fp8_kernel, BLOCK_FP8_PROBLEM, cfg, "sm_90",
                                          **block_fp8.kernel_constexprs(False)))


@pytest.mark.parametrize("block_n", [64, 256])
def test_block_fp8_sm90_tile_widths(block_n):
    # 64 divides a 128-row weight block (one scalar scale), 256 spans two (per-column scales).
    cfg = FAST.replace(block_k=128, block_n=block_n)
    assert WGMMA_FP8.search(cross_compile(block_fp8.block_fp8_kernel, BLOCK_FP8_PROBLEM, cfg, "sm_90",
                                          **block_fp8.kernel_constexprs(False)))


def test_block_fp8_sm100_uses_tcgen05_f8f6f4():
    cfg = block_fp8.default_config(BLOCK_FP8_PROBLEM, "sm_100")
    assert TCGEN05_F8.search(cross_compile(block_fp8.block_fp8_kernel, BLOCK_FP8_PROBLEM, cfg, "sm_100",
                                            **block_fp8.kernel_constexprs(False)))


def test_block_fp8_gfx950_uses_fp8_mfma():
    cfg = block_fp8.default_config(BLOCK_FP8_PROBLEM, "gfx950")
    assert MFMA_F8.search(cross_compile(block_fp8.block_fp8_kernel, BLOCK_FP8_PROBLEM, cfg, "gfx950",
                                         **block_fp8.kernel_constexprs(False)))


def test_block_fp8_lowered_through_jax_triton():
    p = GemmProblem(2, False, 129, 300, 512, "block_fp8", "block_fp8", "bf16")
    ptx = lowered_ptx(block_fp8, p, block_fp8.default_config(p).replace(tma=False))
    assert WGMMA_FP8.search(ptx)
    # jax-triton marks every array 16-byte aligned, which lets Triton pipeline the tile loads.
    assert "cp.async" in ptx


def test_block_fp8_decode_split_k_lowered():
    p = GemmProblem(1, True, 1, 4096, 7168, "block_fp8", "block_fp8", "fp16")
    cfg = block_fp8.default_config(p)
    assert cfg.split_k > 1
    assert "mma.sync" in lowered_ptx(block_fp8, p, cfg)


# ---------------------------------------------------------------------------------------------------------
# upcast


@pytest.mark.parametrize("a_kind,b_kind", sorted(upcast.SUPPORTED))
def test_upcast_sm90_uses_wgmma(a_kind, b_kind):
    # K = 96 is not a multiple of BLOCK_K, so the masked K tail compiles too.
    p = GemmProblem(1, False, 200, 200, 96, a_kind, b_kind, "bf16")
    asm = cross_compile(upcast.upcast_kernel, p, FAST, "sm_90", **upcast.kernel_constexprs(p))
    wgmma = WGMMA_FP16 if (a_kind, b_kind) == ("fp16", "fp16") else WGMMA_BF16
    assert wgmma.search(asm)
    # fp6/fp4 subnormal codes and e8m0's 2**-127 decode through fp32 subnormals: nothing may flush them.
    assert ".ftz" not in asm


def test_upcast_gfx950_nvfp4_uses_mfma():
    p = GemmProblem(1, False, 512, 512, 1024, "nvfp4", "nvfp4", "bf16")
    cfg = upcast.default_config(p, "gfx950").replace(num_stages=2)
    asm = cross_compile(upcast.upcast_kernel, p, cfg, "gfx950", **upcast.kernel_constexprs(p))
    assert MFMA_BF16.search(asm)
    assert ".amdhsa_float_denorm_mode_32 3" in asm  # fp32 subnormals kept (the decode relies on them)


@pytest.mark.parametrize("a_kind,b_kind,b_batched", [("nvfp4", "nvfp4", False), ("e4m3", "e2m1", True),
                                                     ("bf16", "e2m3", False)])
def test_upcast_lowered_through_jax_triton(a_kind, b_kind, b_batched):
    p = GemmProblem(2, b_batched, 129, 300, 512, a_kind, b_kind, "bf16")
    ptx = lowered_ptx(upcast, p, upcast.default_config(p))
    assert WGMMA_BF16.search(ptx)
    assert "cp.async" in ptx


def test_upcast_predecoded_lowered():
    # Large M and N: both operands are dequantized by XLA first; the kernel is a bf16 x bf16 GEMM.
    p = GemmProblem(1, False, 2048, 2048, 1024, "nvfp4", "e2m1", "bf16")
    cfg = upcast.default_config(p)
    assert upcast.predecoded_sides(p, cfg) == (True, True)
    assert WGMMA_BF16.search(lowered_ptx(upcast, p, cfg))


def test_upcast_decode_split_k_lowered():
    p = GemmProblem(1, False, 1, 4096, 4096, "nvfp4", "nvfp4", "bf16")
    cfg = upcast.default_config(p, "gfx950")
    assert cfg.split_k > 1 and not cfg.swap_ab
    assert "mma.sync" in lowered_ptx(upcast, p, cfg)


# ---------------------------------------------------------------------------------------------------------
# launcher checks (no compilation)


def test_launchers_reject_wrong_dtypes():
    p = GemmProblem(1, False, 8, 8, 128, "e4m3", "e4m3", "bf16")
    structs = operand_structs(p)
    structs[0] = jax.ShapeDtypeStruct(structs[0].shape, jnp.uint8)  # e4m3 values must be float8_e4m3fn
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        jax.jit(lambda *xs: upcast.launch(p, *xs, config=FAST, compute_capability=90)).trace(*structs)


def test_block_fp8_rejects_block_k_straddling_scale_groups():
    with pytest.raises(ValueError, match="block_k"):
        block_fp8.check_config(BLOCK_FP8_PROBLEM, TileConfig(block_k=256))
