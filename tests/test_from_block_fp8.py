"""`jb.from_block_fp8`: block FP8 codes and scales quantized elsewhere (a DeepSeek-V3 / R1 checkpoint's `weight` and
`weight_scale_inv`) as a `BlockScaledArray`, served as they are: the same codes and scales as `jb.quantize` gives
for the same tiles, DeepSeek's dequantization (codes times the tile's scale), matmuls at odd shapes on the CPU path,
a Flax layer serving it, and the checks that refuse a wrong dtype or scale grid before any compute.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale.nn import linen as jbl


def _w(n, k, seed=0):
    return jax.random.normal(jax.random.key(seed), (n, k), jnp.float32) / np.sqrt(k)


def _deepseek_dequant(values, scales, rows=128, cols=128):
    """DeepSeek's weight_dequant: each code times its tile's weight_scale_inv, in numpy."""
    v = np.asarray(values.astype(jnp.float32))
    s = np.repeat(np.repeat(np.asarray(scales), rows, axis=-2), cols, axis=-1)
    return v * s[..., : v.shape[-2], : v.shape[-1]]


@pytest.mark.parametrize("n,k", [(256, 512), (300, 200), (2112, 384)])
def test_same_codes_and_scales_as_quantize(n, k):
    q = jb.quantize(_w(n, k), "fp8_block", block=(128, 128))
    # a checkpoint stores the codes unpadded: (N, K)
    r = jb.from_block_fp8(q.values[:, :k], q.scales)
    assert (r.fmt, r.axis, r.length, r.shape) == (q.fmt, q.axis, q.length, (n, k))
    np.testing.assert_array_equal(np.asarray(r.values).view(np.uint8), np.asarray(q.values).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(r.scales), np.asarray(q.scales))
    np.testing.assert_array_equal(np.asarray(jb.dequantize(r)), _deepseek_dequant(q.values[:, :k], q.scales))


def test_activation_groups_and_stacked_layers():
    x = jax.random.normal(jax.random.key(1), (3, 5, 300), jnp.float32)
    q = jb.quantize(x, "fp8_block", block=(1, 128))
    r = jb.from_block_fp8(q.values[..., :300], q.scales, tile=(1, 128))
    np.testing.assert_array_equal(np.asarray(jb.dequantize(r)), np.asarray(jb.dequantize(q)))
    stack = jnp.stack([_w(256, 256, s) for s in range(2)])              # (layers, N, K)
    qs = jb.quantize(stack, "fp8_block", block=(128, 128))
    rs = jb.from_block_fp8(qs.values, qs.scales.astype(jnp.bfloat16))   # bf16 scales widen to float32 exactly
    assert rs.scales.shape == (2, 2, 2) and rs.scales.dtype == jnp.float32 and rs.shape == (2, 256, 256)
    np.testing.assert_array_equal(np.asarray(rs.scales), np.asarray(qs.scales.astype(jnp.bfloat16), np.float32))


@pytest.mark.parametrize("m", [1, 5, 70])
def test_serves_bf16_and_block_fp8_activations(m):
    n, k = 300, 200   # K pads to 256 and N spans a partial 128-row tile
    q = jb.quantize(_w(n, k, 2), "fp8_block", block=(128, 128))
    w = jb.from_block_fp8(q.values[:, :k], q.scales)
    x = jax.random.normal(jax.random.key(3), (m, k), jnp.float32).astype(jnp.bfloat16)
    out = jax.jit(lambda x, w: jb.matmul(x, w, out_dtype=jnp.float32))(x, w)
    want = np.asarray(x, np.float32) @ _deepseek_dequant(q.values[:, :k], q.scales).T
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    xq = jb.quantize_operand(x.astype(jnp.float32), "fp8_block", side="a")
    out_q = jax.jit(lambda x, w: jb.matmul(x, w, out_dtype=jnp.float32))(xq, w)
    np.testing.assert_allclose(np.asarray(out_q), np.asarray(jb.reference.matmul(xq, q, out_dtype=jnp.float32)),
                               rtol=1e-6, atol=1e-6)


def test_a_flax_layer_serves_a_checkpoint_kernel():
    layer = jbl.Dense(300, recipe="w8a16_fp8", use_bias=False)
    x = jnp.ones((4, 200), jnp.bfloat16)
    q = jb.quantize(_w(300, 200, 4), "fp8_block", block=(128, 128))
    served = {"params": {"kernel": jb.from_block_fp8(q.values[:, :200], q.scales)}}
    template = jbl.quantize_params(layer, layer.init(jax.random.key(0), x), x)
    assert jax.tree_util.tree_structure(template) == jax.tree_util.tree_structure(served)
    y = jax.jit(layer.apply)(served, x)
    want = np.asarray(x, np.float32) @ _deepseek_dequant(q.values[:, :200], q.scales).T
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("values,scales,tile,match", [
    (jnp.zeros((256, 256), jnp.bfloat16), jnp.ones((2, 2)), (128, 128), r"values: expected dtype float8_e4m3fn"),
    (jnp.zeros((256, 256), jnp.float8_e4m3fn), jnp.ones((2, 2), jnp.int32), (128, 128),
     "scales: expected dtype float32"),
    (jnp.zeros((256, 300), jnp.float8_e4m3fn), jnp.ones((2, 2)), (128, 128), r"scales: expected shape \(2, 3\)"),
    (jnp.zeros((300, 256), jnp.float8_e4m3fn), jnp.ones((2, 2)), (128, 128), r"scales: expected shape \(3, 2\)"),
    # a transposed grid
    (jnp.zeros((256, 512), jnp.float8_e4m3fn), jnp.ones((4, 2)), (128, 128), r"scales: expected shape \(2, 4\)"),
    (jnp.zeros((256,), jnp.float8_e4m3fn), jnp.ones((2,)), (128, 128), "of rank >= 2"),
    (jnp.zeros((5, 256), jnp.float8_e4m3fn), jnp.ones((2,)), (1, 128), r"scales: expected shape \(5, 2\)"),
])
def test_refuses_before_any_compute(values, scales, tile, match):
    with pytest.raises(ValueError, match=match):
        jb.from_block_fp8(values, scales, tile=tile)
