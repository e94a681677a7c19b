"""Flax integration: dot_general in linen/nnx layers and at lax.dot_general sites, the block-scaled layers,
scan/remat stacks, quantize-once serving, its orbax checkpoint round trip and the partitioning of a
served kernel on a mesh.

Tolerance: as in test_recipes.py, a GEMM of two e4m3 operands (mxfp8, fp8_deepseek) has a relative
Frobenius error of at most about sqrt(2) * 2**-4 = 0.088 against float32, used here for outputs and
gradients alike.
"""

import contextlib
import functools
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from _sharding_helpers import GATHERS, opaque_cpu_gemm, run
from flax import nnx
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb
from jax_blockscale.dot_general import dot_general
from jax_blockscale.nn import linen as jbl
from jax_blockscale.nn import nnx as jbx
from jax_blockscale.recipes import quantize_weight

TOL = float(np.hypot(2.0**-4, 2.0**-4))
RNG = np.random.default_rng(0)


def _x(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _rel(a, b) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


# (lhs shape, rhs shape, dimension_numbers): Dense, DenseGeneral with several axes / batch dims, einsum-like
LAYOUTS = [
    ((4, 8, 64), (64, 48), (((2,), (0,)), ((), ()))),  # linen.Dense / nnx.Linear
    ((4, 8, 64), (48, 64), (((2,), (1,)), ((), ()))),  # weight stored (N, K)
    ((64, 8, 4), (3, 64, 16), (((0,), (1,)), ((), ()))),  # contracting dim first, two rhs free dims
    ((4, 8, 2, 32), (2, 32, 3, 16), (((2, 3), (0, 1)), ((), ()))),  # DenseGeneral(axis=(-2, -1))
    ((5, 8, 64), (5, 64, 24), (((2,), (1,)), ((0,), (0,)))),  # DenseGeneral(batch_dims=(0,))
    ((8, 5, 64), (64, 24, 5), (((2,), (0,)), ((1,), (2,)))),  # batch dims elsewhere
]


@pytest.mark.parametrize("recipe", ["mxfp8", "fp8_deepseek"])
def test_dot_general_layouts_and_grads(recipe):
    dg = dot_general(recipe)
    outs, refs = [], []
    for ls, rs, dn in LAYOUTS:
        lhs, rhs = _x(*ls), _x(*rs)
        # the loss contracts the output with a fixed tensor: gradients see a dense upstream gradient
        r = _x(*jax.eval_shape(lambda a, b: lax.dot_general(a, b, dn), lhs, rhs).shape)

        def y_and_grads(f, a, b):
            y, vjp = jax.vjp(lambda a, b: f(a, b, dn), a, b)
            return y, vjp(r)
        outs.append(jax.jit(functools.partial(y_and_grads, dg))(lhs, rhs))
        exact = functools.partial(lax.dot_general, precision=lax.Precision.HIGHEST)
        refs.append(y_and_grads(exact, lhs, rhs))
    for (y, grads), (y0, grads0), layout in zip(outs, refs, LAYOUTS):
        assert y.shape == y0.shape, layout
        for got, want in zip((y, *grads), (y0, *grads0)):
            assert got.shape == want.shape and _rel(got, want) <= TOL, layout


def test_dot_general_bf16_recipe_fallbacks_and_errors():
    lhs, rhs = _x(4, 64), _x(64, 32)
    dn = (((1,), (0,)), ((), ()))
    np.testing.assert_array_equal(dot_general("bf16")(lhs, rhs, dn), lax.dot_general(lhs, rhs, dn))
    # no contracting dim (outer product): nothing to quantize along, lax.dot_general runs
    outer = (((), ()), ((), ()))
    np.testing.assert_array_equal(dot_general("mxfp8")(lhs, rhs, outer), lax.dot_general(lhs, rhs, outer))
    out = jax.eval_shape(lambda a, b: dot_general("mxfp8")(a, b, dn, preferred_element_type=jnp.float32),
                         lhs.astype(jnp.bfloat16), rhs)
    assert out.dtype == jnp.float32
    with pytest.raises(ValueError, match="contracting dims differ in size"):
        dot_general("mxfp8")(lhs, _x(63, 32), dn)
    with pytest.raises(TypeError, match="lhs must be dense"):
        jax.eval_shape(lambda: dot_general("mxfp8")(jb.quantize(lhs, "mxfp8"), rhs, dn))


def test_dot_general_prequantized_rhs():
    lhs, kernel = _x(4, 8, 64), _x(64, 48)  # Flax (K, N) kernel
    dn_nk = (((2,), (1,)), ((), ()))
    qw = jax.jit(quantize_weight, static_argnums=1)(kernel, "w4a8")  # (N, K) along K
    y = jax.jit(lambda a, q: dot_general("w4a8")(a, q, dn_nk))(lhs, qw)
    assert _rel(y, jnp.einsum("bmk,kn->bmn", lhs, kernel)) <= float(np.hypot(2.0**-4, 2.0**-2))
    # quantized in the Flax layout (K, N) along K: the Dense dimension numbers work as they are
    qk = jax.jit(lambda k: jb.quantize(k, "mxfp4", axis=0, rounding="rceil"))(kernel)
    y2 = jax.jit(lambda a, q: dot_general("w4a8")(a, q, (((2,), (0,)), ((), ()))))(lhs, qk)
    np.testing.assert_allclose(y2, y, rtol=1e-6)
    with pytest.raises(ValueError, match="must contract exactly its quantized axis"):
        dot_general("w4a8")(_x(4, 48), qw, (((1,), (0,)), ((), ())))


def test_flax_layers_accept_dot_general():
    x = _x(2, 8, 64)
    dg = dot_general("mxfp8")
    for model in (nn.Dense(32, dot_general=dg), nn.DenseGeneral((2, 16), axis=-1, dot_general=dg),
                  nn.DenseGeneral(16, axis=(-2, -1), dot_general=dg)):
        plain = model.clone(dot_general=None)
        v = jax.jit(model.init)(jax.random.key(0), x)
        y, y0 = jax.jit(model.apply)(v, x), jax.jit(plain.apply)(v, x)
        assert y.shape == y0.shape and _rel(y, y0) <= TOL
        g = jax.jit(jax.grad(lambda v: jnp.sum(model.apply(v, x) ** 2)))(v)
        g0 = jax.jit(jax.grad(lambda v: jnp.sum(plain.apply(v, x) ** 2)))(v)
        assert _rel(g["params"]["kernel"], g0["params"]["kernel"]) <= 2 * TOL

    lin = nnx.Linear(64, 32, dot_general=dg, rngs=nnx.Rngs(0))
    y = nnx.jit(lambda m, x: m(x))(lin, x)
    ref = x @ lin.kernel[...] + lin.bias[...]
    assert _rel(y, ref) <= TOL
    grads = nnx.jit(nnx.grad(lambda m: jnp.sum(m(x) ** 2)))(lin)
    assert grads.kernel[...].shape == (64, 32)


class Stack(nn.Module):
    """Embedding-free stack: a mxfp8 input layer, scanned+remat fp8_deepseek blocks, a w4a16 head, and a
    plain flax Dense, to exercise mixed recipes."""

    @nn.compact
    def __call__(self, x):
        x = jbl.Dense(64, recipe="mxfp8")(x)

        class Block(nn.Module):
            @nn.compact
            def __call__(self, h, _):
                return h + jnp.tanh(jbl.Dense(64, recipe="fp8_deepseek")(h)), None

        stack = nn.scan(nn.remat(Block), variable_axes={"params": 0}, split_rngs={"params": True}, length=3)
        x, _ = stack()(x, None)
        x = jbl.Dense(32, recipe="w4a16")(x)
        return nn.Dense(8)(x)


def test_linen_dense_training_scan_remat_and_serving(tmp_path):
    x = _x(4, 16, 64)
    model = Stack()
    v = jax.jit(model.init)(jax.random.key(0), x)
    assert v["params"]["ScanCheckpointBlock_0"]["Dense_0"]["kernel"].shape == (3, 64, 64)

    def loss(v):
        return jnp.mean(model.apply(v, x) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss))(v)
    assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))

    served = jax.jit(lambda v: jbl.quantize_params(model, v, x))(v)
    p = served["params"]
    assert isinstance(p["Dense_0"]["kernel"], jb.BlockScaledArray)
    assert p["Dense_0"]["kernel"].fmt.name == "mxfp8_e4m3"
    blocks = p["ScanCheckpointBlock_0"]["Dense_0"]["kernel"]
    assert blocks.shape == (3, 64, 64) and blocks.fmt.tile == (128, 128)
    assert p["Dense_1"]["kernel"].fmt.name == "mxfp4"
    assert not isinstance(p["Dense_2"]["kernel"], jb.BlockScaledArray)  # plain flax Dense untouched
    apply = jax.jit(model.apply)
    y_train, y_served = apply(v, x), apply(served, x)
    assert _rel(y_served, y_train) <= 0.1  # only the w4a16 layer changes: fprop already quantized weights

    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "served", served)
    ckpt.wait_until_finished()
    abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, served)
    restored = ckpt.restore(tmp_path / "served", abstract)
    assert jax.tree_util.tree_structure(restored) == jax.tree_util.tree_structure(served)
    for a, b in zip(jax.tree_util.tree_leaves(restored), jax.tree_util.tree_leaves(served)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a).view(np.uint8), np.asarray(b).view(np.uint8))
    np.testing.assert_array_equal(apply(restored, x), y_served)


class Block(nnx.Module):
    def __init__(self, recipe, rngs):
        self.lin = jbx.Linear(64, 64, recipe=recipe, rngs=rngs)

    def __call__(self, h):
        return h + jnp.tanh(self.lin(h))


class NnxModel(nnx.Module):
    def __init__(self, rngs):
        self.inp = jbx.Linear(64, 64, recipe="nvfp4", rngs=rngs)

        @nnx.split_rngs(splits=2)
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def make(rngs):
            return Block("mxfp8", rngs)

        self.blocks = make(rngs)

    def __call__(self, x):
        @nnx.scan(in_axes=(0, nnx.Carry), out_axes=nnx.Carry)
        @nnx.remat
        def body(block, h):
            return block(h)

        return body(self.blocks, self.inp(x))


def test_nnx_linear_train_scan_quantize_and_checkpoint(tmp_path):
    x = _x(4, 16, 64)
    model = NnxModel(nnx.Rngs(0))
    fwd = nnx.jit(lambda m, x: m(x))
    y_train = fwd(model, x)
    grads = nnx.jit(nnx.grad(lambda m, x: jnp.mean(m(x) ** 2)))(model, x)
    assert grads.blocks.lin.kernel[...].shape == (2, 64, 64)
    assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))

    jbx.quantize_model(model)
    assert model.inp.quantized and model.blocks.lin.quantized
    assert model.blocks.lin.kernel.shape == (2, 64, 64)
    y_served = fwd(model, x)
    np.testing.assert_allclose(y_served, y_train, rtol=1e-5, atol=1e-5)  # fprop quantized weights already

    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "nnx", nnx.state(model))
    ckpt.wait_until_finished()
    fresh = nnx.eval_shape(lambda: jbx.quantize_model(NnxModel(nnx.Rngs(1))))
    graphdef, abstract = nnx.split(fresh)
    restored = nnx.merge(graphdef, ckpt.restore(tmp_path / "nnx", abstract))
    np.testing.assert_array_equal(fwd(restored, x), y_served)


def test_nnx_serves_block_fp8_weights_to_bf16_activations():
    # w8a16_fp8: DeepSeek's 128 x 128 block FP8 weights, bf16 activations left as they are (the FP8 checkpoint served
    # weight-only); the served layer multiplies by exactly the quantized kernel
    layer = jbx.Linear(256, 192, recipe="w8a16_fp8", use_bias=False, rngs=nnx.Rngs(3))
    x = jax.random.normal(jax.random.key(4), (5, 256), jnp.float32).astype(jnp.bfloat16)
    w = layer.kernel[...]
    layer.quantize_weights()
    assert layer.quantized and layer.kernel.fmt.name == "fp8_block" and layer.kernel.fmt.tile == (128, 128)
    y = nnx.jit(lambda m, x: m(x))(layer, x)
    want = jnp.dot(x.astype(jnp.float32), jb.dequantize(quantize_weight(w, "w8a16_fp8"), jnp.float32).T)
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=2e-2, atol=2e-2)


def test_nnx_takes_a_weight_quantized_elsewhere():
    # a DeepSeek checkpoint's codes and scales (jb.from_block_fp8) in place of quantizing the master kernel
    layer = jbx.Linear(200, 300, recipe="w8a16_fp8", use_bias=False, rngs=nnx.Rngs(5))
    q = jb.quantize(jax.random.normal(jax.random.key(6), (300, 200), jnp.float32), "fp8_block", block=(128, 128))
    with pytest.raises(ValueError, match=r"fp8_block 128x128 of shape \(300, 200\)"):
        layer.quantize_weights(jb.from_block_fp8(q.values[:200, :200], q.scales[:2]))       # (N, K) of another N
    with pytest.raises(ValueError, match="got fp8_block 1x128"):
        layer.quantize_weights(jb.quantize(jnp.ones((300, 200)), "fp8_block", block=(1, 128)))
    assert not layer.quantized
    loaded = jb.from_block_fp8(q.values[:, :200], q.scales)
    layer.quantize_weights(loaded)
    assert layer.quantized
    x = jax.random.normal(jax.random.key(7), (3, 200), jnp.float32).astype(jnp.bfloat16)
    y = nnx.jit(lambda m, x: m(x))(layer, x)
    want = jnp.dot(x.astype(jnp.float32), jb.dequantize(loaded).T)
    np.testing.assert_allclose(np.asarray(y, np.float32), want, rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="already quantized"):
        layer.quantize_weights(loaded)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp8_deepseek"])
def test_quantize_params_keeps_a_column_parallel_kernel_column_parallel(recipe):
    """A kernel (K, N) named ("embed", "mlp") with "mlp" on the "model" axis is split on N. Its quantized
    form is stored (N, K): values and scales must be named ("mlp", "embed") to stay split on N, and nvfp4's
    scalar tensor scale unnamed (replicated). Applying the served layer then gathers no weight."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py)")
    rules = (("embed", None), ("mlp", "model"))
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    layer = jbl.Dense(512, recipe=recipe, use_bias=False,
                      kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(), ("embed", "mlp")))
    x = _x(64, 256)
    served = jbl.quantize_params(layer, jax.jit(layer.init)(jax.random.key(0), x), x)
    specs = nn.get_partition_spec(served)["params"]["kernel"]
    assert (specs.values, specs.scales) == (P("mlp", "embed"),) * 2
    assert specs.tensor_scale == (P() if recipe == "nvfp4" else None)

    placed = jax.device_put(served, nn.logical_to_mesh_sharding(nn.get_partition_spec(served), mesh, rules))
    kernel = nn.unbox(placed)["params"]["kernel"]
    assert kernel.values.sharding.spec == kernel.scales.sharding.spec == P("model", None)
    with opaque_cpu_gemm(), jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        y, found = run(layer.apply, (placed, x))
    assert not found & set(GATHERS), found
    assert y.sharding.spec == P(None, "model")
    np.testing.assert_allclose(y, jax.jit(layer.apply)(served, x), rtol=1e-6)


def test_layer_shape_errors_at_trace_time():
    with pytest.raises(ValueError, match="cannot handle .*size 0"):
        jax.eval_shape(jbl.Dense(8).init, jax.random.key(0), jnp.zeros((0, 64)))
    served = {"params": {"kernel": jax.eval_shape(lambda: quantize_weight(_x(64, 8), "w4a8")),
                         "bias": jnp.zeros(8)}}
    with pytest.raises(ValueError, match="quantized kernel is"):
        jax.eval_shape(jbl.Dense(16, recipe="w4a8", use_bias=False).apply, served, jnp.zeros((2, 64)))
    with pytest.raises(ValueError, match="expects fp8_block weights"):
        jax.eval_shape(jbl.Dense(8, recipe="fp8_deepseek").apply, served, jnp.zeros((2, 64)))


def test_flax_is_optional():
    code = ("import sys, jax_blockscale, jax_blockscale.recipes, jax_blockscale.dot_general, "
            "jax_blockscale.nn; "
            "assert 'flax' not in sys.modules, 'flax was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("recipe", ["mxfp8", "nvfp4", "fp8_deepseek"])
@pytest.mark.parametrize("in_mesh_context", [True, False])
def test_nnx_quantize_weights_keeps_a_column_parallel_kernel_column_parallel(recipe, in_mesh_context):
    """nnx twin of the linen test above: the kernel (K, N) annotated ("embed", "mlp") and placed with "mlp"
    on "model". After `quantize_model` its values and scales, stored (N, K), carry ("mlp", "embed") and lie
    split on N; nvfp4's tensor scale is replicated. Quantizing outside the mesh context uses the kernel's
    own mesh. The served layer gathers no weight and equals the unsharded one."""
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py)")
    rules = (("embed", None), ("mlp", "model"))
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    init = nnx.with_partitioning(nnx.initializers.lecun_normal(), ("embed", "mlp"))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        layer = jbx.Linear(256, 512, recipe=recipe, use_bias=False, kernel_init=init, rngs=nnx.Rngs(0))
    plain = jbx.Linear(256, 512, recipe=recipe, use_bias=False, rngs=nnx.Rngs(0))
    with contextlib.ExitStack() as stack:
        if in_mesh_context:
            stack.enter_context(jax.set_mesh(mesh))
            stack.enter_context(nnx.logical_axis_rules(rules))
        jbx.quantize_model(layer)
    jbx.quantize_model(plain)

    kernel = layer.kernel
    assert kernel.values.get_metadata()["out_sharding"] == kernel.scales.get_metadata()["out_sharding"] \
        == ("mlp", "embed")
    assert kernel.values.get_value().sharding.spec == kernel.scales.get_value().sharding.spec == P("model", None)
    if recipe == "nvfp4":
        assert kernel.tensor_scale.get_value().sharding.spec == P()
    specs = nnx.get_partition_spec(nnx.state(layer))
    assert [s.get_value() for s in jax.tree.leaves(specs, is_leaf=lambda v: isinstance(v, nnx.Variable))][:2] \
        == [P("mlp", "embed")] * 2

    x = _x(64, 256)
    with opaque_cpu_gemm(), jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
        graphdef, state = nnx.split(layer)
        y, found = run(lambda s, x: nnx.merge(graphdef, s)(x), (state, x))
    assert not found & set(GATHERS), found
    assert y.sharding.spec == P(None, "model")
    np.testing.assert_array_equal(y, nnx.jit(lambda m, x: m(x))(plain, x))
