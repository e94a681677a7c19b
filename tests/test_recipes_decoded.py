"""Recipes with decoded GEMM inputs (`Recipe.gemm_inputs`), on the CPU: the quantization's bf16 values
(`quantize_primitive.quantize_sides(..., decoded=True)`) against `dequantize` of the codes, training
gradients against the codes path, the choice "auto" makes, errors, and what a decoded training step lowers to for Hopper (the Gluon
quantizer writing bf16, XLA dots, no dequantize pass, no Triton GEMM). The kernel's bits are tested on the
GPU (tests/test_gpu_quantize_decoded.py)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import backends, get_format, quantize_primitive as qp
from jax_blockscale.quantize import dequantize, nvfp4_tensor_scale, quantize_jnp
from jax_blockscale.recipes import INPUT_NAME, WEIGHT_NAME, Recipe, get_recipe, quantized_dense, recipe_matmul

from _quant_inputs import special_array

F = get_format
RNG = np.random.default_rng(5)
X = jnp.asarray(RNG.standard_normal((2, 40, 256)) * 2.0 ** RNG.integers(-4, 5, (2, 40, 1)), jnp.bfloat16)
W_KN = jnp.asarray(RNG.standard_normal((256, 96)) / 16, jnp.float32)
PAIRS = {"mxfp8+T": (F("mxfp8"), F("mxfp8")), "nvfp4+mxfp8T": (F("nvfp4"), F("mxfp8")),
         "mxfp4+T": (F("mxfp4"), F("mxfp4")), "e3m2+nvfp4T": (F("mxfp6_e3m2"), F("nvfp4")),
         "e5m2": (F("mxfp8_e5m2"), None), "e2m3T": (None, F("mxfp6_e2m3"))}


def _bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint16)


@pytest.mark.parametrize("shape", [(64, 96), (3, 33, 70), (1, 1)])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_decoded_sides_are_the_dequantized_codes(pair, shape):
    x = jnp.asarray(special_array(shape, "f32", 11))
    row, col = PAIRS[pair]
    got = jax.jit(lambda x: qp.quantize_sides(x, row, col, "floor", decoded=True))(x)
    for fmt, xs, d in ((row, x, got[0]), (col, jnp.swapaxes(x, -1, -2), got[1])):
        if fmt is None:
            assert d is None
            continue
        nvfp4 = fmt.name == "nvfp4"
        ts = nvfp4_tensor_scale(xs) if nvfp4 else None
        q = quantize_jnp(xs, fmt, axis=-1, rounding="floor", tensor_scale=ts)
        unscaled = jb.BlockScaledArray(q.values, q.scales, fmt, -1, q.length, jnp.ones((), jnp.float32) if nvfp4
                                       else None)
        assert d.values.dtype == jnp.bfloat16 and d.values.shape == xs.shape
        want = dequantize(unscaled, jnp.bfloat16)
        nan = np.isnan(np.asarray(want, np.float32))
        assert nan.any() or np.prod(shape) < 1000  # special_array has NaN / Inf blocks
        np.testing.assert_array_equal(_bits(d.values)[~nan], _bits(want)[~nan])
        assert (_bits(d.values)[nan] == 0x7FFF).all()  # one NaN whatever the conversion gave
        assert (d.tensor_scale is None) == (not nvfp4)
        if nvfp4:  # the tensor scale is the one the codes were scaled by
            np.testing.assert_array_equal(np.asarray(d.tensor_scale), np.asarray(ts))


def test_decoded_values_are_exact_in_bf16():
    """Elements times block scales need at most 5 significant bits: the bf16 values are the float32 ones."""
    x = jnp.asarray(RNG.standard_normal((64, 256)), jnp.float32)
    for fmt in (F("mxfp8"), F("mxfp8_e5m2"), F("mxfp6_e2m3"), F("mxfp4"), F("nvfp4")):
        d, _ = qp.quantize_sides(x, fmt, None, "rceil", decoded=True)
        q = quantize_jnp(x, fmt, axis=-1, rounding="rceil",
                         tensor_scale=nvfp4_tensor_scale(x) if fmt.name == "nvfp4" else None)
        want = dequantize(q, jnp.float32)
        got = d.values.astype(jnp.float32) * (1.0 if d.tensor_scale is None else d.tensor_scale)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2**-23, atol=0)


def test_vmap_folds_into_one_quantization():
    f = lambda x: qp.quantize_sides(x, F("mxfp8"), F("mxfp8"), "rceil", decoded=True)  # noqa: E731
    got = jax.vmap(f)(X)
    want = [f(x) for x in X]
    for side in (0, 1):
        np.testing.assert_array_equal(_bits(got[side].values), _bits(jnp.stack([w[side].values for w in want])))
    text = str(jax.make_jaxpr(jax.vmap(f))(X))
    assert text.count("blockscaled_quantize") == 1 and "decoded=True" in text


def test_unfused_sides_give_the_same_bits(monkeypatch):
    """Where the primitive does not apply (Explicit-axis sharding, empty x; here forced), each side is the jnp
    quantizer and `dequantize`, with the same bits and tensor scales as the primitive's."""
    x = jnp.asarray(special_array((64, 96), "bf16", 4))
    row, col = PAIRS["nvfp4+mxfp8T"]
    fused = qp.quantize_sides(x, row, col, "rceil", decoded=True)
    monkeypatch.setattr(qp, "USE_KERNEL", False)
    unfused = qp.quantize_sides(x, row, col, "rceil", decoded=True)
    for f, u in zip(fused, unfused):
        np.testing.assert_array_equal(_bits(u.values), _bits(f.values))
        assert (u.tensor_scale is None) == (f.tensor_scale is None)
        if f.tensor_scale is not None:
            np.testing.assert_array_equal(np.asarray(u.tensor_scale), np.asarray(f.tensor_scale))


def test_decoded_pair_refuses_block_fp8():
    with pytest.raises(ValueError, match="MX or nvfp4"):
        qp.decoded_pair(X[0], F("fp8_block", block=(1, 128)), None)
    with pytest.raises(ValueError, match="MX or nvfp4"):
        qp.quantize_sides(X[0], None, F("fp8_block", block=(128, 128)), "rceil", decoded=True)


# ------------------------------------------------------------------------------------------- the recipes


def _grads(recipe, w_layout="kn"):
    def f(x, w):
        y = quantized_dense(x, w if w_layout == "kn" else w.T, recipe, w_layout=w_layout)
        return jnp.sum(jnp.tanh(y.astype(jnp.float32))), y
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1), has_aux=True))(X, W_KN)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("w_layout", ["kn", "nk"])
@pytest.mark.parametrize("name", ["mxfp8", "nvfp4", "mxfp8_e5m2_grads"])
def test_decoded_training_matches_the_codes_path(name, w_layout):
    """Same quantized values; the GEMMs differ only in summation order (and nvfp4 in where its tensor scales
    multiply), so outputs and gradients agree to float32 rounding, far below the formats' errors."""
    (_, y_codes), g_codes = _grads(get_recipe(name + ":codes"), w_layout)
    (_, y_dec), g_dec = _grads(get_recipe(name + ":decoded"), w_layout)
    assert _rel(y_dec.astype(jnp.float32), y_codes.astype(jnp.float32)) < 1e-2 * 2**-7  # bf16 outputs
    for got, want in zip(g_dec, g_codes):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert _rel(got, want) < 1e-5


def test_frozen_weights_keep_codes():
    w = jb.quantize_weight(W_KN, "w4a8")
    r = Recipe("w4a8_decoded", ("mxfp8_e4m3", "mxfp4"), inference=True, gemm_inputs="decoded")
    got = jax.jit(lambda x: recipe_matmul(x, w, r))(X)
    want = jax.jit(lambda x: recipe_matmul(x, w, "w4a8"))(X)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_gemm_inputs_by_name_and_errors():
    assert get_recipe("mxfp8:codes").gemm_inputs == "codes"
    assert get_recipe("NVFP4:Decoded") == Recipe("nvfp4", ("nvfp4", "nvfp4"), ("mxfp8_e4m3", "mxfp8_e4m3"),
                                                 ("mxfp8_e4m3", "mxfp8_e4m3"), gemm_inputs="decoded")
    assert get_recipe("mxfp8").gemm_inputs == "auto"
    with pytest.raises(ValueError, match="gemm_inputs must be one of"):
        get_recipe("mxfp8:bf16")
    with pytest.raises(ValueError, match="MX or nvfp4 formats"):
        get_recipe("fp8_deepseek:decoded")
    with pytest.raises(ValueError, match="MX or nvfp4 formats"):
        Recipe("mixed", ("mxfp8", "mxfp8"), ("fp8_block", "fp8_block"), gemm_inputs="decoded")
    assert Recipe("half", (None, "mxfp8"), gemm_inputs="decoded").decodes()  # a dense side stays dense


def test_auto_decodes_on_hopper_only(monkeypatch):
    assert not get_recipe("mxfp8").decodes()  # this machine: a CPU
    monkeypatch.setattr(backends, "detect_target", lambda device=None: "sm_90")
    assert get_recipe("mxfp8").decodes() and get_recipe("nvfp4").decodes()
    assert not get_recipe("fp8_deepseek").decodes() and not get_recipe("bf16").decodes()
    assert not get_recipe("mxfp8:codes").decodes()
    assert "GEMM inputs auto, here decoded" in get_recipe("mxfp8").describe()
    monkeypatch.setattr(backends, "detect_target", lambda device=None: "sm_100")
    assert not get_recipe("mxfp8").decodes()  # native MX MMAs read codes


def test_decoded_residuals_are_named_for_remat():
    def f(x, w):
        return jnp.sum(quantized_dense(x, w, "nvfp4:decoded", w_layout="kn").astype(jnp.float32))
    policy = jb.checkpoint_policy(inputs=True)
    text = str(jax.make_jaxpr(jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1)))(X, W_KN))
    assert f"name={WEIGHT_NAME}" in text and f"name={INPUT_NAME}" in text
    want = jax.jit(jax.grad(f, argnums=(0, 1)))(X, W_KN)
    got = jax.jit(jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1)))(X, W_KN)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_saved_residuals_are_named_as_uint32_words():
    """Remat saves the quantizations as whole uint32 words (`recipes._named`): a layer scan stacks them in
    buffers it zero-fills, and XLA:GPU filled 1-byte ones at a third of the 4-byte rate. Every named value
    of 1- or 2-byte data is a uint32 word array, and the values come back unchanged."""
    for recipe in ("fp8_deepseek", "mxfp8:decoded", "nvfp4"):
        def f(x, w, recipe=recipe):
            return jnp.sum(quantized_dense(x, w, recipe, w_layout="kn").astype(jnp.float32))
        policy = jb.checkpoint_policy(inputs=True)
        text = str(jax.make_jaxpr(jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1)))(X, W_KN))
        named = re.findall(r"\w+:(\w+)\[([^\]]*)\] = name\[name=jax_blockscale", text)
        assert any(d == "u32" for d, _ in named), (recipe, named)
        for dtype, shape in named:  # 1-byte data stays uint8 only where its last axis is not whole words
            assert dtype in ("u32", "f32") or (dtype == "u8" and int(shape.split(",")[-1]) % 4), (recipe, named)
        want = jax.jit(jax.grad(f, argnums=(0, 1)))(X, W_KN)
        got = jax.jit(jax.grad(jax.checkpoint(f, policy=policy), argnums=(0, 1)))(X, W_KN)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_words_round_trip():
    from jax_blockscale.recipes import _as_words, _from_words

    for dtype, k in ((jnp.float8_e4m3fn, 12), (jnp.uint8, 8), (jnp.bfloat16, 6)):
        x = jax.random.normal(jax.random.key(0), (3, 5, k), jnp.float32).astype(dtype) if dtype != jnp.uint8 else \
            jax.random.randint(jax.random.key(0), (3, 5, k), 0, 256).astype(jnp.uint8)
        w = _as_words(x)
        assert w.dtype == jnp.uint32 and w.shape == (3, 5, k * jnp.dtype(dtype).itemsize // 4)
        back = _from_words(w, x)
        assert back.dtype == x.dtype and back.shape == x.shape
        np.testing.assert_array_equal(np.asarray(back).view(np.uint8), np.asarray(x).view(np.uint8))


# ---------------------------------------------------------------------------------- lowered for Hopper


def _hlo_and_kernels(recipe: str):
    from _jax_triton import require_jax_triton

    jt = require_jax_triton()

    def f(x, w):  # tanh: the backward needs the forward's product, so its dot stays
        return jnp.sum(jnp.tanh(quantized_dense(x, w, recipe, w_layout="kn").astype(jnp.float32)))
    x = jnp.zeros((512, 512), jnp.bfloat16)
    w = jnp.zeros((512, 768), jnp.float32)
    lowered = jax.jit(jax.grad(f, argnums=(0, 1))).trace(x, w).lower(lowering_platforms=("cuda",))
    kernels = [e for k in jt.lowered_kernels(lowered) for e in re.findall(r"\.entry\s+(\w+)", k.decode("latin-1"))]
    return lowered.as_text(), kernels


@pytest.mark.parametrize("name", ["mxfp8", "nvfp4"])
def test_decoded_step_lowers_to_quantizers_and_xla_dots(hopper, name):
    """Decoded: one quantization kernel per operand (x, W, dy), each writing bf16, and XLA's dots; nothing
    decodes codes. Codes on Hopper: Triton GEMMs that decode them (in registers at this size, behind XLA
    dequantize passes at training sizes)."""
    text, kernels = _hlo_and_kernels(name + ":decoded")
    assert kernels == ["quantize_mx_t_kernel"] * 3, kernels
    assert "jbs_dequantize" not in text
    assert len(re.findall(r"stablehlo\.dot_general", text)) == 3
    text, kernels = _hlo_and_kernels(name + ":codes")
    assert sum(k == "upcast_kernel" for k in kernels) == 3, kernels
