"""CPU tests of the Blackwell decode path on the block-scaled MMA (_triton/decode_sm100.py).

What they prove without a Blackwell GPU: the opt-in dispatch entry (`TileConfig(kernel="decode_sm100")`, for
quantized activations x a quantized weight at <= 64 rows on sm_100; dispatch keeps decode.py); the swapped
problem compiles for sm_100a to `tcgen05.mma ... block_scale` of the pair's kind with the weight as the MMA's
M side; the launcher hands the weight to `dot_scaled_nvidia.launch` as its a operand and the (folded)
activations as its b operand, and transposes the (N, rows) product back; and a whole jitted matmul lowered
for sm_100 embeds one such kernel. The kernel's numbers: tests/test_gpu_decode_sm100.py (Hopper, emulated
`dot_scaled`; Blackwell where one exists).
"""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends, primitive  # noqa: E402
from jax_blockscale._triton import decode_sm100, dot_scaled_nvidia  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem  # noqa: E402
from jax_blockscale._triton.tiling import store_alpha_tile  # noqa: E402, F401 - the interpreted kernel's helper

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from _interpret import run as interpret  # noqa: E402

# (activations, weight) -> the tcgen05 kind of the swapped product (the weight is the MMA's a operand)
KINDS = {("e4m3", "e2m1"): "kind::mxf8f6f4.block_scale", ("e4m3", "e4m3"): "kind::mxf8f6f4.block_scale",
         ("e5m2", "e4m3"): "kind::mxf8f6f4.block_scale", ("e2m3", "e3m2"): "kind::mxf8f6f4.block_scale",
         ("e2m1", "e2m1"): "kind::mxf4.block_scale", ("nvfp4", "nvfp4"): "kind::mxf4nvf4.block_scale"}


# An XLA transpose of a product (bf16 / f32): the scales' packing into the 5D tcgen05 layout (uint8) is not one.
_FLOAT_TRANSPOSE = re.compile(r"stablehlo\.transpose [^\n]*: \(tensor<[0-9x]*(?:bf16|f32)>\)")


def _problem(x_kind, w_kind, rows=16, n=7168, k=4096, batch=1):
    return GemmProblem(batch, False, rows // batch, n, k, x_kind, w_kind, "bf16")


@pytest.mark.parametrize("rows", [1, 16, 64])
@pytest.mark.parametrize("x_kind,w_kind", sorted(KINDS))
def test_opt_in_on_sm100_for_quantized_pairs_at_decode_rows(x_kind, w_kind, rows):
    """Opt-in (`TileConfig(kernel="decode_sm100")`): unmeasured against decode.py, which dispatch keeps."""
    assert backends.choose("sm_100", x_kind, w_kind, rows=rows).kernel == "decode"
    forced = backends.choose("sm_100", x_kind, w_kind, rows=rows, kernel="decode_sm100")
    assert forced.kernel == "decode_sm100" and forced.path == "native"
    for target in ("sm_90", "gfx950"):
        with pytest.raises(ValueError, match="no entry"):
            backends.choose(target, x_kind, w_kind, rows=rows, kernel="decode_sm100")


def test_the_entry_says_why_it_is_opt_in():
    (entry,) = [e for e in backends.KERNEL_TABLE["sm_100"] if e.module == "decode_sm100"]
    assert "not measured" in entry.opt_in and "one" in entry.opt_in and entry.max_rows == 64
    for pair in (("bf16", "e2m1"), ("bf16", "nvfp4"), ("block_fp8", "block_fp8")):
        assert pair not in entry.pairs  # bf16 activations: a kind::f16 MMA either way; block FP8: fp8 MMA


@pytest.mark.parametrize("x_kind,w_kind", sorted(KINDS))
def test_swapped_problem_compiles_to_the_block_scaled_mma(x_kind, w_kind):
    p = _problem(x_kind, w_kind, rows=16, n=1024, k=1024)
    ps = decode_sm100.swapped(p)
    assert (ps.m, ps.n, ps.a_kind, ps.b_kind) == (1024, 16, w_kind, x_kind)
    config = decode_sm100.default_config(p)
    compiled = compile_kernel(dot_scaled_nvidia.scaled_gemm_kernel, target="sm_100",
                              signature=dot_scaled_nvidia.pointer_signature(ps),
                              constexprs=dot_scaled_nvidia.kernel_constexprs(ps, config),
                              num_warps=config.num_warps, num_stages=config.num_stages)
    ptx = assembly(compiled)
    assert "tcgen05.mma" in ptx and KINDS[(x_kind, w_kind)] in ptx


def test_default_config_splits_k_for_the_weight_tiles():
    """N = 7168 is 56 weight tiles of 128 rows: split-K puts 112 programs on a B200's 148 SMs."""
    config = decode_sm100.default_config(_problem("e4m3", "e2m1"))
    assert (config.block_m, config.block_n, config.split_k) == (128, 128, 2)


def test_launch_swaps_operands_and_transposes_the_product(monkeypatch):
    """The launcher's own work, with the kernel replaced: which operand goes where, the folded batch, and the
    (N, rows) product asked for transposed, which is the (batch, M, N) result as it comes."""
    p = _problem("e4m3", "e2m1", rows=6, n=256, k=512, batch=2)
    seen = {}

    def fake_launch(ps, a_values, a_scales, b_values, b_scales, alpha, *, config, compute_capability,
                    transpose_out=False):
        seen.update(ps=ps, a=a_values, sa=a_scales, b=b_values, sb=b_scales, config=config, cc=compute_capability,
                    t=transpose_out)
        shape = (1, ps.n, ps.m) if transpose_out else (1, ps.m, ps.n)
        return jnp.arange(ps.m * ps.n, dtype=jnp.float32).reshape(shape)

    monkeypatch.setattr(dot_scaled_nvidia, "launch", fake_launch)
    x_values = (jnp.arange(2 * 3 * 512) % 251).astype(jnp.uint8).reshape(2, 3, 512)
    x_scales = jnp.ones((2, 3, 16), jnp.uint8)
    w_values = jnp.zeros((256, 256), jnp.uint8)
    w_scales = jnp.full((256, 16), 127, jnp.uint8)
    config = decode_sm100.default_config(p)
    out = decode_sm100.launch(p, x_values, x_scales, w_values, w_scales, jnp.ones((1,)), config=config,
                              compute_capability=100)
    assert seen["ps"] == decode_sm100.swapped(p) and seen["config"] == config and seen["cc"] == 100 and seen["t"]
    assert seen["a"] is w_values and seen["sa"] is w_scales
    np.testing.assert_array_equal(seen["b"], x_values.reshape(6, 512))
    np.testing.assert_array_equal(seen["sb"], x_scales.reshape(6, 16))
    want = np.arange(256 * 6, dtype=np.float32).reshape(2, 3, 256)  # (rows, N) as the kernel stores it
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("problem,message", [
    (GemmProblem(1, False, 16, 256, 512, "bf16", "e2m1", "bf16"), "quantized activations"),
    (GemmProblem(2, True, 16, 256, 512, "e4m3", "e2m1", "bf16"), "unbatched"),
    (GemmProblem(1, False, 65, 256, 512, "e4m3", "e2m1", "bf16"), "at most 64"),
])
def test_launch_refuses_what_it_does_not_take(problem, message):
    with pytest.raises(ValueError, match=message):
        decode_sm100.check_problem(problem)


@pytest.fixture
def lower_for_sm100(monkeypatch):
    """Lowers a jitted function for sm_100 through the cuda platform on this CPU (the CUDA plugin serializes the
    Triton call; the primitive sees a B200): (lowered, the embedded kernels' PTX)."""
    from jax._src.lib import gpu_triton

    from jax_blockscale._triton import jt

    if not hasattr(gpu_triton, "TritonKernel"):  # pragma: no cover - depends on the install
        pytest.skip("jaxlib's gpu_triton has no Triton call serializer (install jax-cuda13-plugin)")
    stand_in = types.SimpleNamespace(platform="cuda", device_kind="NVIDIA B200", compute_capability="10.0")
    monkeypatch.setattr(primitive, "_lowering_device", lambda ctx: stand_in)

    def lower(fn, *args):
        lowered = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
        return lowered, [k.decode("latin-1") for k in jt.lowered_kernels(lowered)]
    return lower


def test_jitted_matmul_lowers_to_one_block_scaled_kernel(lower_for_sm100):
    """jb.matmul of 16 mxfp8 rows and an mxfp4 weight with the kernel named, lowered for sm_100: one embedded
    kernel, the swapped block-scaled MMA, and no transpose after it."""
    x = jb.quantize_operand(jax.random.normal(jax.random.key(0), (2, 8, 512)), "mxfp8", side="a")
    w = jb.quantize_operand(jax.random.normal(jax.random.key(1), (384, 512)), "mxfp4", side="b")
    config = decode_sm100.default_config(GemmProblem(2, False, 8, 384, 512, "e4m3", "e2m1", "bf16"))
    lowered, kernels = lower_for_sm100(
        lambda x, w: jb.matmul(x, w, target="sm_100", config=config.replace(kernel="decode_sm100")), x, w)
    assert len(kernels) == 1 and "kind::mxf8f6f4.block_scale" in kernels[0]
    assert ".entry scaled_gemm_kernel" in kernels[0]  # dot_scaled_nvidia's kernel, not decode.py's
    assert not _FLOAT_TRANSPOSE.search(lowered.as_text())  # the kernel stores the swapped product transposed


# ---------------------------------------------------------------------------------------------------------
# dot_scaled_nvidia's transposed store (OUT_T), which this path and the recipes' wgrad on sm_100 use


def test_transposed_store_changes_only_the_store():
    """With OUT_T the sm_100a kernel keeps its block-scaled MMA and stores along the output's columns (the
    (N, M) slab's rows); without it the code is what it was (the store: 16-byte vectors along N)."""
    p = GemmProblem(1, False, 300, 520, 1024, "e4m3", "e2m1", "bf16")
    config = dot_scaled_nvidia.default_config(p)

    def ptx(out_t):
        constexprs = dict(dot_scaled_nvidia.kernel_constexprs(p, config), OUT_T=out_t)
        return assembly(compile_kernel(dot_scaled_nvidia.scaled_gemm_kernel, target="sm_100",
                                       signature=dot_scaled_nvidia.pointer_signature(p), constexprs=constexprs,
                                       num_warps=config.num_warps, num_stages=config.num_stages))

    plain, transposed = ptx(False), ptx(True)
    for text in (plain, transposed):
        assert "kind::mxf8f6f4.block_scale" in text
    assert "st.global.v4.b32" in plain and "st.global.v4.b32" not in transposed
    assert "st.global.v2.b32" in transposed


def test_matmul_transpose_out_on_sm100_is_one_kernel_and_no_transpose(lower_for_sm100):
    """The recipes' wgrad asks for dW transposed: on sm_100 the MX GEMM now writes it so (WRITES_TRANSPOSED),
    as the Hopper block FP8 kernel does, instead of an XLA transpose after it."""
    assert dot_scaled_nvidia.WRITES_TRANSPOSED
    a = jb.quantize_operand(jax.random.normal(jax.random.key(0), (256, 512)), "mxfp8", side="a")
    b = jb.quantize_operand(jax.random.normal(jax.random.key(1), (384, 512)), "mxfp8", side="b")
    lowered, (kernel,) = lower_for_sm100(lambda a, b: jb.matmul(a, b, target="sm_100", transpose_out=True), a, b)
    assert lowered.out_info.shape == (384, 256)
    assert "kind::mxf8f6f4.block_scale" in kernel and not _FLOAT_TRANSPOSE.search(lowered.as_text())


def test_transposed_store_takes_one_product():
    p = GemmProblem(2, False, 16, 256, 512, "e4m3", "e4m3", "bf16")
    with pytest.raises(ValueError, match="one"):
        dot_scaled_nvidia.launch(p, None, None, None, None, None, config=dot_scaled_nvidia.default_config(p),
                                 compute_capability=100, transpose_out=True)


@triton.jit
def _store_kernel(acc_ptr, alpha_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, OUT_T: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) tile of a row-major (M, N) float32 array through `store_alpha_tile`."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    acc = tl.load(acc_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask, other=0.0)
    store_alpha_tile(acc, alpha_ptr, out_ptr, pid_m, pid_n, M, N, BLOCK_M, BLOCK_N, OUT_T)


@pytest.mark.parametrize("out_t", [False, True])
def test_store_alpha_tile_in_the_interpreter(out_t):
    """The store itself, run on the CPU by Triton's interpreter: ragged tiles (70 x 45 in 32 x 16 tiles), alpha
    applied, every element in its place of the (M, N) or, with OUT_T, (N, M) output and nothing past it."""
    m, n = 70, 45
    acc = np.arange(m * n, dtype=np.float32).reshape(m, n)
    out = np.full((n, m) if out_t else (m, n), -1.0, np.float32)
    interpret(_store_kernel, (3, 3), acc, np.asarray([0.5], np.float32), out, M=m, N=n, BLOCK_M=32, BLOCK_N=16,
              OUT_T=out_t)
    np.testing.assert_array_equal(out, 0.5 * (acc.T if out_t else acc))
