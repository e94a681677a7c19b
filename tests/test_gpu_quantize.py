"""The fused quantization kernel on a GPU, bit for bit against the jnp quantizer.

Skipped without a GPU. Per format, >= 10**7 elements (tests/_quant_inputs.py: zeros, float32
subnormals, block maxima at each binade edge and around the rceil thresholds, ties, saturation, NaN,
+-Inf) are quantized by `jb.quantize` / `jb.quantize_with_transpose` (the kernel on one GPU) and by
`quantize_jnp` jitted on the same GPU; codes and scales must be identical. A second check compares the
kernel with the jnp quantizer on the host CPU for inputs without float32 subnormals (XLA:CPU flushes
them, GPUs keep them).
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import get_format
from jax_blockscale.quantize import nvfp4_tensor_scale, quantize_jnp

from _quant_inputs import special_input
from _exhaustive import grid

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

SHAPE = (4096, 2560)  # 10.5M elements
FORMATS = [
    ("mxfp8", None, "rceil"), ("mxfp8", None, "floor"), ("mxfp8", None, "even"), ("mxfp8", None, "ceil"),
    ("mxfp8_e5m2", None, "rceil"), ("mxfp6_e2m3", None, "rceil"), ("mxfp6_e3m2", None, "floor"),
    ("mxfp4", None, "rceil"), ("mxfp4", None, "floor"), ("mxfp4", None, "even"), ("nvfp4", None, "rceil"),
    ("fp8_block", (1, 128), "rceil"), ("fp8_block", (128, 128), "rceil"), ("fp8_block", (256, 256), "rceil"),
]


@functools.lru_cache(maxsize=None)
def _input(dtype_name: str, subnormals: bool) -> np.ndarray:
    dtype = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}[dtype_name]
    return special_input(np.random.default_rng(7), SHAPE, dtype, subnormals=subnormals)


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint8)


def _assert_same(got, want, what):
    for leaf in ("values", "scales", "tensor_scale"):
        g, w = getattr(got, leaf), getattr(want, leaf)
        if w is None:
            assert g is None
            continue
        assert g.shape == w.shape and g.dtype == w.dtype, (what, leaf, g.shape, w.shape, g.dtype, w.dtype)
        diff = np.argwhere(_bits(g) != _bits(w))
        assert diff.size == 0, f"{what}: {len(diff)} {leaf} differ, first at {diff[:3].tolist()}"


def _rounding(fmt, rounding):
    """`quantize` takes rounding= for MX formats only."""
    return dict(rounding=rounding) if fmt.name.startswith("mx") else {}


def _jnp(x, fmt, rounding):
    return jax.jit(lambda x: quantize_jnp(x, fmt, axis=-1, rounding=rounding,
                                          tensor_scale=nvfp4_tensor_scale(x)
                                          if fmt.name == "nvfp4" else None))(x)


# Default: every format from bf16, every third from f32; all with --exhaustive.
@pytest.mark.parametrize("name,block,rounding,dtype", grid(
    [(*f, d) for f in FORMATS for d in ("bf16", "f32")], lambda i, case: case[3] == "bf16" or (i // 2) % 3 == 0))
def test_kernel_equals_jnp_on_gpu_with_subnormals(name, block, rounding, dtype):
    fmt = get_format(name, block=block)
    x = jnp.asarray(_input(dtype, True))
    got = jax.jit(lambda x: jb.quantize(x, fmt, **_rounding(fmt, rounding)))(x)
    _assert_same(got, _jnp(x, fmt, rounding), f"{name} {block} {rounding} {dtype}")


# Every other format, and fp8 1x128 (the fp8_deepseek gradients' pair: the Gluon kernel on sm_90+).
@pytest.mark.parametrize("name,block,rounding", FORMATS[::2] + [("fp8_block", (1, 128), "rceil")])
def test_transposed_side_equals_jnp_on_gpu(name, block, rounding):
    fmt = get_format(name, block=block)
    x = jnp.asarray(_input("bf16", True))
    row, col = jax.jit(lambda x: jb.quantize_with_transpose(x, fmt, rounding=rounding))(x)
    _assert_same(row, _jnp(x, fmt, rounding), f"row {name}")
    _assert_same(col, _jnp(x.T, fmt, rounding), f"transposed {name}")


# nvfp4 both ways with the caller's tensor scales (no amax pass: quantize_with_transpose(tensor_scale=)), one
# of them small enough that many block scales saturate at 448, and a pair outside the kernel's short path
# (quantize_kernels.SHORT_PATH_TS).
@pytest.mark.parametrize("ts, t_ts", [(2.0**-5, None), (0.37, 2.0**-30), (2.0**-100, 2.0**120)])
def test_transposed_nvfp4_with_given_tensor_scales_equals_jnp_on_gpu(ts, t_ts):
    fmt = get_format("nvfp4")
    x = jnp.asarray(_input("bf16", True))
    row, col = jax.jit(lambda x: jb.quantize_with_transpose(x, fmt, tensor_scale=ts, t_tensor_scale=t_ts))(x)
    t_ts = ts if t_ts is None else t_ts

    def ref(x, scale):
        return jax.jit(lambda x: quantize_jnp(x, fmt, axis=-1, rounding="rceil", tensor_scale=jnp.float32(scale)))(x)

    _assert_same(row, ref(x, ts), "row")
    _assert_same(col, ref(x.T, t_ts), "transposed")


# The host-CPU jnp quantizer over 10.5M elements is the slow part: by default one case in four.
@pytest.mark.parametrize("name,block,rounding,dtype", grid(
    [(*f, d) for f in FORMATS for d in ("bf16", "f32")], lambda i, case: i % 4 == 0))
def test_kernel_equals_jnp_on_cpu_without_subnormals(name, block, rounding, dtype):
    fmt = get_format(name, block=block)
    host = _input(dtype, False)
    got = jax.jit(lambda x: jb.quantize(x, fmt, **_rounding(fmt, rounding)))(jnp.asarray(host))
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        want = _jnp(jax.device_put(host, cpu), fmt, rounding)
    _assert_same(jax.device_get(got), jax.device_get(want), f"{name} {block} {rounding} {dtype} vs CPU")


def test_recipe_step_uses_the_kernel_and_matches_the_jnp_quantizer():
    """A recipe's forward + backward with the fused quantizer equals the same step with the jnp one."""
    from jax_blockscale import quantize_primitive

    x = jnp.asarray(np.random.default_rng(3).standard_normal((512, 1024)), jnp.bfloat16)
    w = jnp.asarray(np.random.default_rng(4).standard_normal((768, 1024)) * 0.02, jnp.bfloat16)

    def loss(x, w, recipe):
        return jb.recipe_matmul(x, w, recipe).astype(jnp.float32).sum()

    for recipe in ("mxfp8", "nvfp4", "fp8_deepseek"):
        fused = jax.jit(jax.value_and_grad(functools.partial(loss, recipe=recipe), (0, 1)))(x, w)
        quantize_primitive.USE_KERNEL = False
        try:
            plain = jax.jit(jax.value_and_grad(functools.partial(loss, recipe=recipe), (0, 1)))(x, w)
        finally:
            quantize_primitive.USE_KERNEL = True
        for a, b in zip(jax.tree_util.tree_leaves(fused), jax.tree_util.tree_leaves(plain)):
            np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32), err_msg=recipe)
