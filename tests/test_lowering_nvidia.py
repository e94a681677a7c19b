"""CPU proof of the Blackwell dot_scaled kernel: cross-compile for sm_100 (and sm_90) and read the PTX.

No GPU is needed: Triton 3.6 compiles for any target, and jax lowers for "cuda" with the CUDA plugin
installed, so the jax -> jax-triton -> PTX path is checked too. Instructions asserted are the ones Triton
3.6 emits (see dot_scaled_nvidia's docstring).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from jax_blockscale import layouts  # noqa: E402
from jax_blockscale._triton import dot_scaled_nvidia as nv  # noqa: E402
from jax_blockscale._triton import jt  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

_MMA = "tcgen05.mma.cta_group::1."
MXF8F6F4 = _MMA + "kind::mxf8f6f4.block_scale.scale_vec::1X"
MXF4 = _MMA + "kind::mxf4.block_scale.scale_vec::2X"
MXF4NVF4 = _MMA + "kind::mxf4nvf4.block_scale.scale_vec::4X"
F16 = _MMA + "kind::f16"  # dense x MX: Triton upcasts the MX operand, no block scaling in hardware


def expected_mma(a_kind: str, b_kind: str) -> str:
    if a_kind == "nvfp4":
        return MXF4NVF4
    if a_kind in ("bf16", "fp16"):
        return F16
    if (a_kind, b_kind) == ("e2m1", "e2m1"):
        return MXF4
    return MXF8F6F4


# Every kind on both sides, the fp6 kinds (widened to fp8 in jnp) included; together with
# test_supported_pairs_are_covered this reaches every (A_FORMAT, B_FORMAT, VEC) the kernel is built with.
SM100_PAIRS = [
    ("e4m3", "e4m3"), ("e5m2", "e5m2"), ("e2m1", "e2m1"), ("e2m3", "e2m3"), ("e3m2", "e3m2"),
    ("e4m3", "e2m1"), ("e2m1", "e4m3"), ("e5m2", "e2m1"), ("e2m1", "e3m2"), ("e4m3", "e5m2"),
    ("e3m2", "e2m3"), ("nvfp4", "nvfp4"),
    ("bf16", "e4m3"), ("bf16", "e5m2"), ("bf16", "e2m1"), ("fp16", "e2m3"), ("fp16", "e3m2"), ("fp16", "e2m1"),
]
SM90_PAIRS = [("e4m3", "e4m3"), ("e2m1", "e2m1"), ("e4m3", "e2m1"), ("e2m3", "e3m2"), ("bf16", "e2m1")]


def _problem(a_kind: str, b_kind: str, *, m: int = 129, n: int = 200, k: int = 1024, batch: int = 1,
             b_batched: bool = False, out_dtype: str = "bf16") -> GemmProblem:
    return GemmProblem(batch, b_batched, m, n, k, a_kind, b_kind, out_dtype)


def _ptx(p: GemmProblem, target: str, config: TileConfig | None = None) -> str:
    config = config or nv.default_config(p)
    compiled = compile_kernel(nv.scaled_gemm_kernel, target=target, signature=nv.pointer_signature(p),
                              constexprs=nv.kernel_constexprs(p, config), num_warps=config.num_warps,
                              num_stages=config.num_stages)
    return assembly(compiled)


def _mma_instructions(ptx: str) -> set[str]:
    return set(re.findall(r"tcgen05\.mma\.[\w.:]+", ptx))


@pytest.mark.parametrize("a_kind,b_kind", SM100_PAIRS)
def test_sm100_block_scaled_mma(a_kind, b_kind):
    assert _mma_instructions(_ptx(_problem(a_kind, b_kind), "sm_100")) == {expected_mma(a_kind, b_kind)}


@pytest.mark.parametrize("config", [
    TileConfig(block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=3, split_k=3),
    TileConfig(block_m=256, block_n=128, block_k=256, num_warps=8, num_stages=2),
], ids=["k_tail_split3", "bm256"])
def test_sm100_other_tiles(config):
    # K = 1056 is no multiple of BLOCK_K (masked K tail); batched B uses grid axis 1.
    p = _problem("e4m3", "e2m1", m=1, n=300, k=1056, batch=3, b_batched=True, out_dtype="fp32")
    assert _mma_instructions(_ptx(p, "sm_100", config)) == {MXF8F6F4}


def test_sm100_nvfp4_k_tail():
    # nvfp4 scales are float8 pointers: the masked K-tail path must build for them too.
    p = _problem("nvfp4", "nvfp4", m=200, n=130, k=1056, out_dtype="fp16")
    assert _mma_instructions(_ptx(p, "sm_100")) == {MXF4NVF4}


def test_supported_pairs_are_covered():
    """Every supported pair compiles to a kernel specialization one of the tests above built."""
    def specialization(a, b):
        c = nv.kernel_constexprs(_problem(a, b), TileConfig())
        return c["A_FORMAT"], c["B_FORMAT"], c["VEC"], c["A_SCALED"]
    tested = {specialization(a, b) for a, b in SM100_PAIRS}
    assert {specialization(a, b) for a, b in nv.SUPPORTED} <= tested


@pytest.mark.parametrize("a_kind,b_kind", SM90_PAIRS)
def test_sm90_emulated_compiles(a_kind, b_kind):
    """On Hopper dot_scaled is emulated (MX operands upcast to bf16, wgmma): it must still compile."""
    ptx = _ptx(_problem(a_kind, b_kind), "sm_90")
    assert "wgmma.mma_async" in ptx and "tcgen05" not in ptx


def test_sm90_nvfp4_is_unsupported():
    with pytest.raises(Exception):  # Triton 3.6: TritonGPUAccelerateMatmul fails, no nvfp4 emulation
        _ptx(_problem("nvfp4", "nvfp4"), "sm_90")
    p = _problem("nvfp4", "nvfp4")
    with pytest.raises(ValueError, match="sm_100"):
        nv.launch(p, *_abstract_operands(p), config=nv.default_config(p), compute_capability=90)


def test_fp6_widening_is_exact():
    from jax_blockscale import elements
    from jax_blockscale.formats import E2M3, E3M2
    codes = jnp.arange(64, dtype=jnp.uint8)
    for kind, elem, dtype in (("e2m3", E2M3, jnp.float8_e4m3fn), ("e3m2", E3M2, jnp.float8_e5m2)):
        widened = nv.widen_fp6(codes | 0xC0, kind)  # the high bits of a code byte are ignored
        assert widened.dtype == dtype
        np.testing.assert_array_equal(np.asarray(widened.astype(jnp.float32)),
                                      np.asarray(elements.decode(codes, elem)))


def test_scale_unpacking_inverts_blackwell_layout():
    """numpy mirror of `_load_scale_tile`: unit addressing + reshape/trans recover row-major scales."""
    rows, cols, block_rows, block_k, vec = 300, 40, 256, 512, 32
    scales = np.random.default_rng(0).integers(0, 255, (rows, cols), dtype=np.uint8)
    packed = np.asarray(layouts.to_blackwell_scales(jnp.asarray(scales))).reshape(-1)
    num_row_units, num_k_units = -(-rows // 128), -(-cols // 4)
    rep_rows, rep_k = block_rows // 128, block_k // vec // 4
    for row_block in range(-(-rows // block_rows)):
        for k_step in range(-(-cols * vec // block_k)):
            row_unit = np.minimum(row_block * rep_rows + np.arange(rep_rows), num_row_units - 1)
            k_unit = k_step * rep_k + np.arange(rep_k)
            offs = (row_unit[:, None, None] * num_k_units + k_unit[None, :, None]) * 512 + np.arange(512)
            tile = np.where((k_unit < num_k_units)[None, :, None], packed[np.minimum(offs, packed.size - 1)], 0)
            tile = tile.reshape(rep_rows, rep_k, 32, 4, 4).transpose(0, 3, 2, 1, 4).reshape(block_rows, -1)
            r0, c0 = row_block * block_rows, k_step * rep_k * 4
            want = scales[r0:r0 + block_rows, c0:c0 + rep_k * 4]
            np.testing.assert_array_equal(tile[:want.shape[0], :want.shape[1]], want)


# ---- the jax path: jnp launcher -> jax-triton -> PTX, lowered for "cuda" on this CPU machine ----

def _abstract_operands(p: GemmProblem):
    def side(kind: str, rows: int, lead: tuple[int, ...]):
        if kind in ("bf16", "fp16"):
            dense_dtype = jnp.bfloat16 if kind == "bf16" else jnp.float16
            return (jax.ShapeDtypeStruct(lead + (rows, p.k), dense_dtype),
                    jax.ShapeDtypeStruct(lead + (rows, 1), jnp.uint8))
        per_byte = 2 if kind in ("e2m1", "nvfp4") else 1
        value_dtype = {"e4m3": jnp.float8_e4m3fn, "e5m2": jnp.float8_e5m2}.get(kind, jnp.uint8)
        vec, scale_dtype = (16, jnp.float8_e4m3fn) if kind == "nvfp4" else (32, jnp.uint8)
        return (jax.ShapeDtypeStruct(lead + (rows, p.k // per_byte), value_dtype),
                jax.ShapeDtypeStruct(lead + (rows, p.k // vec), scale_dtype))

    a_values, a_scales = side(p.a_kind, p.m, (p.batch,))
    b_values, b_scales = side(p.b_kind, p.n, (p.batch,) if p.b_batched else ())
    return a_values, a_scales, b_values, b_scales, jax.ShapeDtypeStruct((1,), jnp.float32)


@pytest.mark.parametrize("a_kind,b_kind,batch,b_batched,m", [
    ("e4m3", "e4m3", 2, False, 129),
    ("e2m1", "e2m1", 1, False, 1),
    ("nvfp4", "nvfp4", 2, True, 64),
    ("e2m3", "e2m1", 1, False, 256),
    ("bf16", "e4m3", 3, False, 7),
])
def test_jax_lowering_contains_block_scaled_mma(a_kind, b_kind, batch, b_batched, m):
    try:  # through jt, which keeps TRITON_CACHE_DIR (a bare `import jax_triton` blanks it)
        jt.jax_triton()
    except ImportError as e:
        pytest.skip(f"jax_triton cannot be imported: {e}")
    p = _problem(a_kind, b_kind, m=m, n=384, k=2048, batch=batch, b_batched=b_batched)
    config = nv.default_config(p)
    lowered = jax.jit(lambda *xs: nv.launch(p, *xs, config=config, compute_capability=100)).trace(
        *_abstract_operands(p)).lower(lowering_platforms=("cuda",))
    kernels = jt.lowered_kernels(lowered)
    assert len(kernels) == 1
    assert _mma_instructions(kernels[0].decode("latin-1")) == {expected_mma(a_kind, b_kind)}
    out = lowered.out_info
    assert out.shape == (batch, m, 384) and out.dtype == jnp.bfloat16
