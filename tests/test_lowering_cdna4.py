"""CPU proof of the CDNA4 (gfx950) dot_scaled kernel: cross-compile and read the AMDGCN.

jax-triton's ROCm lowering asks the device for its architecture, so these tests call `compile_kernel`
directly (the path jax would take, minus jax). `matrix_instr_nonkdim` picks the scaled-MFMA shape; the
jax-triton path cannot set it and gets Triton's choice, which must be the 32x32x64 shape the launcher's
default scale shuffle is built for.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("triton")

import jax.numpy as jnp  # noqa: E402

from jax_blockscale import layouts  # noqa: E402
from jax_blockscale._triton import dot_scaled_cdna4 as cdna4  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

MFMA_INSTRUCTION = {16: "v_mfma_scale_f32_16x16x128_f8f6f4", 32: "v_mfma_scale_f32_32x32x64_f8f6f4"}

# mxfp4 x mxfp4, mxfp8 x mxfp8, mixed both ways, e5m2 and the fp6 kinds (widened to fp8 in jnp).
PAIRS = [("e2m1", "e2m1"), ("e4m3", "e4m3"), ("e4m3", "e2m1"), ("e2m1", "e4m3"), ("e5m2", "e5m2"),
         ("e2m3", "e3m2")]


def _problem(a_kind: str, b_kind: str, *, m: int = 129, n: int = 200, k: int = 1024, batch: int = 1,
             b_batched: bool = False) -> GemmProblem:
    return GemmProblem(batch, b_batched, m, n, k, a_kind, b_kind, "bf16")


def _amdgcn(p: GemmProblem, mfma: int, nonkdim: int, config: TileConfig | None = None) -> str:
    config = config or cdna4.default_config(p)
    compiled = compile_kernel(
        cdna4.scaled_gemm_kernel_cdna4, target="gfx950", signature=cdna4.pointer_signature(p),
        constexprs=cdna4.kernel_constexprs(p, config, mfma), num_warps=config.num_warps,
        num_stages=config.num_stages, **cdna4.compile_options(nonkdim))
    return assembly(compiled)


def _mfma_instructions(asm: str) -> set[str]:
    return set(re.findall(r"v_mfma\w*", asm))


# Both MFMA shapes for the three headline pairs; the 32x32x64 (jax-triton's) for every pair.
MFMA_CASES = [(a, b, 32) for a, b in PAIRS] + [(a, b, 16) for a, b in PAIRS[:3]]


@pytest.mark.parametrize("a_kind,b_kind,mfma", MFMA_CASES)
def test_gfx950_scaled_mfma(a_kind, b_kind, mfma):
    asm = _amdgcn(_problem(a_kind, b_kind), mfma, nonkdim=mfma)
    assert _mfma_instructions(asm) == {MFMA_INSTRUCTION[mfma]}


@pytest.mark.parametrize("a_kind,b_kind,m,batch,b_batched,k", [
    ("e4m3", "e2m1", 1, 1, False, 4096),  # decode: 32-row tile, split-K
    ("e2m1", "e2m1", 64, 3, True, 1056),  # batched B on grid axis 1, masked K tail
])
def test_gfx950_default_choice_matches_jax_triton_layout(a_kind, b_kind, m, batch, b_batched, k):
    """Under jax-triton matrix_instr_nonkdim stays 0: Triton must then pick the 32x32x64 MFMA for our
    default tiles, the shape `launch`'s default (mfma=32) shuffle serves."""
    p = _problem(a_kind, b_kind, m=m, n=4096 if m == 1 else 200, k=k, batch=batch, b_batched=b_batched)
    asm = _amdgcn(p, cdna4.JAX_TRITON_MFMA, nonkdim=0)
    assert _mfma_instructions(asm) == {MFMA_INSTRUCTION[cdna4.JAX_TRITON_MFMA]}


def test_supported_pairs_are_covered():
    def specialization(a, b):
        c = cdna4.kernel_constexprs(_problem(a, b), TileConfig(block_k=256))
        return c["A_FORMAT"], c["B_FORMAT"]
    tested = {specialization(a, b) for a, b in PAIRS}
    formats = {"e4m3", "e5m2", "e2m1"}
    # Every format on each side and every fp4/fp8 mix is built above; pairs of two different fp8 formats
    # (e4m3 x e5m2) use the same f8f6f4 MFMA with other type codes.
    assert {specialization(a, b)[0] for a, b in cdna4.SUPPORTED} <= {a for a, _ in tested} == formats
    assert {specialization(a, b)[1] for a, b in cdna4.SUPPORTED} <= {b for _, b in tested} == formats


def test_nvfp4_is_not_supported():
    assert ("nvfp4", "nvfp4") not in cdna4.SUPPORTED
    with pytest.raises(ValueError, match="does not handle"):
        cdna4.kernel_constexprs(_problem("nvfp4", "nvfp4"), TileConfig(block_k=256))


def test_config_checks():
    with pytest.raises(ValueError, match="multiple of 256"):
        cdna4.check_config(TileConfig(block_k=128))
    with pytest.raises(ValueError, match="multiples of 32"):
        cdna4.check_config(TileConfig(block_m=16, block_k=256))


@pytest.mark.parametrize("mfma", cdna4.MFMA_VARIANTS)
def test_scale_unshuffle_inverts_cdna4_layout(mfma):
    """numpy mirror of `_load_scale_tile`: unit addressing + reshape/permute recover row-major scales."""
    rows, cols, block_rows, block_k = 100, 40, 64, 512
    scales = np.random.default_rng(mfma).integers(0, 255, (rows, cols), dtype=np.uint8)
    shuffled = np.asarray(layouts.to_cdna4_scales(jnp.asarray(scales), mfma=mfma))
    unit_row_bytes = shuffled.shape[1]
    k_units = block_k // 256
    for row_block in range(-(-rows // block_rows)):
        for k_step in range(-(-cols * 32 // block_k)):
            first_unit = row_block * (block_rows // 32)
            unit = np.minimum(first_unit + np.arange(block_rows // 32), shuffled.shape[0] - 1)
            col = k_step * block_k + np.arange(block_k)
            packed = np.where(col < unit_row_bytes, shuffled[unit][:, np.minimum(col, unit_row_bytes - 1)], 0)
            if mfma == 32:
                tile = packed.reshape(block_rows // 32, k_units, 2, 32, 4).transpose(0, 3, 1, 4, 2)
            else:
                tile = packed.reshape(block_rows // 32, k_units, 4, 16, 2, 2).transpose(0, 5, 3, 1, 4, 2)
            tile = tile.reshape(block_rows, block_k // 32)
            r0, c0 = row_block * block_rows, k_step * block_k // 32
            want = scales[r0:r0 + block_rows, c0:c0 + block_k // 32]
            np.testing.assert_array_equal(tile[:want.shape[0], :want.shape[1]], want)
