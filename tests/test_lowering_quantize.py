"""The quantization primitive lowered for CUDA on a CPU machine: one fused kernel, no XLA transposes.

On one device `jb.quantize` and `quantize_with_transpose` lower to a single Triton call; a recipe's
forward + backward lowers with the quantized operands produced by those calls only (no XLA transpose or
copy of a quantized buffer: the transposed layouts come out of the kernel).
"""

import jax
import jax.numpy as jnp
import pytest

import jax_blockscale as jb

from _jax_triton import require_jax_triton

jt = require_jax_triton()


def _stablehlo(fn, *args):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "nvfp4", "fp8_block"])
def test_quantize_lowers_to_one_kernel(hopper, fmt):
    x = jnp.zeros((256, 512), jnp.bfloat16)
    lowered = jax.jit(lambda x: jb.quantize_with_transpose(x, fmt)).trace(x).lower(lowering_platforms=("cuda",))
    assert len(jt.lowered_kernels(lowered)) == 1
    assert not _quantized_transposes(lowered.as_text())


QUANTIZED = ("f8E4M3FN", "f8E5M2", "xui8>")


def _quantized_transposes(text: str) -> list[str]:
    """StableHLO transposes whose result is a quantized buffer (codes or e8m0/e4m3 scales). (nvfp4's
    tensor amax of the transposed side reads x through a transpose that XLA fuses into the reduction.)"""
    return [line for line in text.splitlines()
            if "stablehlo.transpose" in line and any(t in line.split("->")[-1] for t in QUANTIZED)]


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp8_deepseek"])
def test_training_step_has_no_transpose_of_a_quantized_tensor(hopper, recipe):
    x = jnp.zeros((512, 1024), jnp.bfloat16)
    w = jnp.zeros((768, 1024), jnp.bfloat16)

    def step(x, w):
        return jax.value_and_grad(lambda x, w: jb.recipe_matmul(x, w, recipe).astype(jnp.float32).sum(),
                                  (0, 1))(x, w)

    offending = _quantized_transposes(_stablehlo(step, x, w))
    assert not offending, "\n".join(offending)
    # x, W and dy are each read once by a quantization kernel (both layouts), plus three GEMMs.
    lowered = jax.jit(step).trace(x, w).lower(lowering_platforms=("cuda",))
    names = [k for k in jt.lowered_kernels(lowered)]
    assert len(names) == 6, len(names)


@pytest.mark.parametrize("fmt,cvt", [("mxfp8", "e4m3x2"), ("mxfp8_e5m2", "e5m2x2"), ("fp8_block", "e4m3x2"),
                                     ("mxfp4", None)])
def test_fp8_codes_use_the_hardware_conversion_on_hopper(hopper, fmt, cvt):
    """On sm_90 the primitive's plan takes cvt="hw" (quantize_kernels.default_cvt): 8-bit element codes come
    from cvt.rn.satfinite (two per instruction), not the integer encoder; fp4 keeps the integer encoder."""
    x = jnp.zeros((256, 512), jnp.bfloat16)
    lowered = jax.jit(lambda x: jb.quantize_with_transpose(x, fmt)).trace(x).lower(lowering_platforms=("cuda",))
    (ptx,) = [k.decode("latin-1") for k in jt.lowered_kernels(lowered)]
    if cvt is None:
        assert "cvt.rn.satfinite.e" not in ptx
        return
    assert f"cvt.rn.satfinite.{cvt}.f32" in ptx


@pytest.mark.parametrize("fmt", ["mxfp8", "fp8_block"])
def test_transposed_codes_go_through_shared_memory_as_words(fmt):
    """plan t_words: the column side's codes go through shared memory as 32-bit words; what stays narrower
    is mostly the (per-block) scales' transpose. Counted: shared loads and stores of 8 / 16 bits."""
    import re

    from jax_blockscale._triton import quantize_kernels as qk
    from jax_blockscale._triton.compile import compile_kernel
    from jax_blockscale.formats import get_format

    f = get_format(fmt, block=(1, 128) if fmt == "fp8_block" else None)
    counts = {}
    for words in (False, True):
        p = qk.plan(1, 512, 1024, qk.Side(f), qk.Side(f), cvt="hw", t_words=words)
        sig = dict(x_ptr="*bf16", ts_ptr="*fp32", rv_ptr="*u8", rs_ptr="*u8", cv_ptr="*u8", cs_ptr="*u8")
        if fmt == "fp8_block":
            sig.update(rs_ptr="*fp32", cs_ptr="*fp32")
        ptx = compile_kernel(qk.quantize_kernel, target="sm_90", signature=sig, constexprs=p.constexprs,
                             num_warps=p.num_warps, num_stages=1).asm["ptx"]
        counts[words] = len(re.findall(r"(?:ld|st)\.shared(?:\.v[24])?\.[ub](?:8|16)\b", ptx))
    assert counts[True] * 2 <= counts[False], counts


@pytest.mark.parametrize("target,cvt", [("sm_100", "hw"), ("gfx950", "int")])
def test_quantize_kernel_cross_compiles(target, cvt):
    """The kernel with the target's default encoder (the primitive's `default_cvt`) compiles for Blackwell
    and MI355; gfx950's assembly has no NVIDIA conversion, sm_100's PTX has it."""
    from jax_blockscale._triton import quantize_kernels as qk
    from jax_blockscale._triton.compile import assembly, compile_kernel
    from jax_blockscale.formats import get_format

    assert qk.default_cvt(100 if target == "sm_100" else None) == cvt
    fmt = get_format("mxfp8")
    p = qk.plan(1, 256, 512, qk.Side(fmt), qk.Side(fmt), cvt=cvt, t_words=True)  # the word transpose too
    sig = dict(x_ptr="*bf16", ts_ptr="*fp32", rv_ptr="*u8", rs_ptr="*u8", cv_ptr="*u8", cs_ptr="*u8")
    asm = assembly(compile_kernel(qk.quantize_kernel, target=target, signature=sig, constexprs=p.constexprs,
                                  num_warps=p.num_warps, num_stages=1))
    assert ("cvt.rn.satfinite.e4m3x2.f32" in asm) == (cvt == "hw")


def test_strips_validated_and_cut_registers():
    """plan strips=: each side in passes over strips of the tile. Rejected where a strip would cut a block or
    there is nothing to split; for fp8 1x128 + transposed (a 128 x 128 tile) it takes the kernel off
    255 registers per thread (sm_90 cubin, cuobjdump's resource usage)."""
    from benchmarks._sass import registers
    from jax_blockscale._triton import quantize_kernels as qk
    from jax_blockscale._triton.compile import compile_kernel
    from jax_blockscale.formats import get_format

    f8 = get_format("fp8_block", block=(1, 128))
    sq = get_format("fp8_block", block=(128, 128))
    mx = get_format("mxfp8")
    for row, col, strips, kw in [(f8, None, 2, {}), (sq, sq, 2, {}), (f8, f8, 3, {}),
                                 (mx, mx, 64, dict(tile=(32, 64))), (mx, mx, 0, {})]:
        with pytest.raises(ValueError, match="strips"):
            qk.plan(1, 512, 1024, qk.Side(row), qk.Side(col), strips=strips, **kw)
    # mxfp8 + transposed, 32 x 256 tile: 16-row strips hold the 1 x 32 row blocks, 128-column ones the
    # 32 x 1 column blocks
    assert qk.plan(1, 512, 1024, qk.Side(mx), qk.Side(mx), strips=2).constexprs["STRIPS"] == 2
    regs = {}
    for strips in (1, 2):
        p = qk.plan(1, 8192, 8192, qk.Side(f8), qk.Side(f8), cvt="hw", strips=strips)
        sig = dict(x_ptr="*bf16", ts_ptr="*fp32", rv_ptr="*u8", rs_ptr="*fp32", cv_ptr="*u8", cs_ptr="*fp32")
        regs[strips] = registers(compile_kernel(qk.quantize_kernel, target="sm_90", signature=sig,
                                                constexprs=p.constexprs, num_warps=p.num_warps,
                                                num_stages=1).asm["cubin"])
    assert regs[1] >= 240 and regs[2] <= 128, regs  # one pass at the register limit (254-255), strips half


@pytest.mark.parametrize("recipe,weight_transposes,k,n,tokens", [
    ("mxfp8", 0, 256, 384, 128), ("nvfp4", 0, 256, 384, 128), ("fp8_deepseek", 1, 256, 384, 128),
    ("fp8_deepseek", 0, 2048, 2048, 1024)])
def test_flax_dense_training_step_transposes_no_weight(hopper, recipe, weight_transposes, k, n, tokens):
    """A Flax Dense passes its (in, out) kernel as it lies (quantized_dense w_layout="kn"): the quantization
    kernel writes the (N, K) layout and the wgrad GEMM dW as (K, N), so no StableHLO transpose of a
    weight-shaped tensor remains. fp8_deepseek's wgrad pair (1x128 x 128x128) has no swapped kernel: its
    GEMM writes dW transposed (matmul transpose_out), which the Gluon kernel does in its epilogue from
    2048 x 2048 x 1024 up; below that the Triton kernel's dW is transposed by XLA (the one left)."""
    import re

    from jax_blockscale.nn.linen import Dense

    layer = Dense(n, recipe=recipe, dtype=jnp.bfloat16)
    x = jnp.zeros((tokens, k), jnp.bfloat16)
    params = layer.init(jax.random.key(0), x)

    def step(params, x):
        return jax.grad(lambda p: layer.apply(p, x).astype(jnp.float32).sum())(params)

    text = _stablehlo(step, params, x)
    shapes = {f"{k}x{n}", f"{n}x{k}"}
    found = [line for line in text.splitlines() if "stablehlo.transpose" in line
             and re.search(r"->\s*tensor<(\d+x\d+)x", line).group(1) in shapes]
    assert len(found) == weight_transposes, "\n".join(found)
