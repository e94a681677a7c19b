"""The block-scaled matmul, its straight-through gradient and the training recipes on a mesh with Explicit
axes (`jax.make_mesh(..., axis_types=(AxisType.Explicit,) * 2)`: sharding in types), on 8 host CPU devices.

There jax types every array with its sharding and rejects what it cannot type: a dot whose contraction is
sharded on both sides (the backward GEMMs), a reshape that splits a sharded dim into blocks (quantization)
and a custom_vjp cotangent whose sharding differs from its primal operand's (`jax_blockscale._explicit_sharding`
states those shardings). Each case checks the numbers against the unsharded run, the sharding in the
result's type (each gradient's must be its operand's), and the compiled HLO: no all-gather / all-to-all /
collective-permute. The GEMM is opaque, as in tests/test_sharding.py, so a missing rule would show as a
gather, and the per-device GEMM is traced under the mesh, as jax 0.11 does (a sharding op left in it would
not compile: `partitioning._untyped_trace`).

Exactness as in tests/test_sharding.py: integer data are exact in MX formats and bf16, nvfp4 and fp8_block
scales round (rtol 1e-5). Gradients are taken against a fixed integer cotangent (`jax.vjp`), which every
recipe's gradient format holds exactly, so the backward GEMMs are exact except fp8_deepseek's.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sharding_helpers import GATHERS, check, opaque_cpu_gemm, partition_callback_under_mesh, put, run
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/conftest.py sets XLA_FLAGS before jax starts", allow_module_level=True)

# 256 tokens: one 128-row fp8 tile per "data" device where fp8_deepseek's wgrad quantizes x^T along them;
# N/4 and K/4 are whole 128-element blocks and tiles.
M, N, K = 256, 512, 512
FORMATS = [("mxfp8", "mxfp8"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block"),
           ("bf16", "mxfp4")]
RECIPES = ["mxfp8", "nvfp4", "fp8_deepseek", "w4a8", "bf16"]
RNG = np.random.default_rng(1)

# name: (x / a spec, w / b spec, the output's sharding, the collective the forward needs or None)
CASES = {
    "data_parallel": (P("data", None), P(None, None), P("data", None), None),
    "column_parallel": (P(None, None), P("model", None), P(None, "model"), None),
    "row_parallel": (P(None, "model"), P(None, "model"), P(None, None), "all-reduce"),
    "2d_data_x_column": (P("data", None), P("model", None), P("data", "model"), None),
}


def _mesh():
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)


def _ints(*shape):
    return jnp.asarray(RNG.integers(-4, 5, shape).astype(np.float32))



def _spec(x):
    return jax.typeof(x).sharding.spec


@pytest.fixture(scope="module", autouse=True)
def opaque_gemm_traced_as_in_jax_0_11():
    with opaque_cpu_gemm(), partition_callback_under_mesh(_mesh()):
        yield


@pytest.fixture(scope="module")
def data():
    """x (M, K), w (N, K), a cotangent for y (M, N), and the unsharded forward of each format pair."""
    x, w, ct = _ints(M, K), _ints(N, K), _ints(M, N)
    forward = {}
    for fa, fb in FORMATS:
        a, b = jb.quantize_operand(x, fa, side="a"), jb.quantize_operand(w, fb, side="b")
        forward[fa, fb] = (a, b, jax.jit(_mm)(a, b))
    return x, w, ct, forward


def _mm(a, b):
    return jb.matmul(a, b, out_dtype=jnp.float32)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fa,fb", FORMATS)
def test_forward_types_and_partitions(data, fa, fb, case):
    a_spec, b_spec, out_spec, needed = CASES[case]
    mesh = _mesh()
    a, b, ref = data[3][fa, fb]
    args = (put(mesh, a, a_spec), put(mesh, b, b_spec))
    assert _spec(jax.eval_shape(_mm, *args)) == out_spec
    out, found = run(_mm, args)
    assert out.sharding.spec == out_spec
    assert found == ({needed} if needed else set()), f"{case}: {found}"
    check(out, ref, exact=not {fa, fb} & {"nvfp4", "fp8_block"})


def _vjp(fn):
    """(y, dx, dw) of `fn(x, w)` against the cotangent `ct` (typed like y), as one function."""
    def both(x, w, ct):
        y, pullback = jax.vjp(fn, x, w)
        return (y, *pullback(ct))
    return both


def test_grad_against_a_prequantized_column_parallel_weight(data):
    """A frozen (pre-quantized) weight: dx only, sharded like x; the weight's cotangent is zero."""
    x, w, ct, _ = data
    qw = jb.quantize(w, "mxfp4")
    fn = jax.grad(lambda x, qw: jnp.sum(_mm(x, qw) * ct))
    mesh = _mesh()
    with jax.set_mesh(mesh):
        dx, found = run(fn, (put(mesh, x, P("data", None)), put(mesh, qw, P("model", None))))
    assert not found & set(GATHERS), found
    assert dx.sharding.spec == P("data", None)
    check(dx, jax.jit(fn)(x, qw), exact=True)


# jb.matmul quantizing inside (straight-through float32 backward) and every recipe's custom_vjp.
GRAD_FNS = {"matmul_mxfp8": lambda x, w: jb.matmul(x, w, a_format="mxfp8", b_format="mxfp8", out_dtype=jnp.float32),
            **{f"recipe_{r}": (lambda r: lambda x, w: jb.recipe_matmul(x, w, r, out_dtype=jnp.float32))(r)
               for r in RECIPES}}
# Outputs and gradients that are exact (small integers, power-of-two scales); the rest round in float32.
INEXACT_OUT = {"recipe_nvfp4", "recipe_fp8_deepseek"}
INEXACT_GRAD = {"recipe_fp8_deepseek"}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(GRAD_FNS))
def test_grads(data, name, case):
    """Forward and both gradients on an Explicit mesh. The straight-through backward's float32 einsums
    contract over a sharded N (column parallel) or M (data parallel) on both sides; the recipes' dgrad and
    wgrad quantize the gradient and the transposed operands along N and M, sharded as they lie. Each
    gradient lands on its operand's sharding and the weight is never gathered."""
    x_spec, w_spec, out_spec, _ = CASES[case]
    x, w, ct, _ = data
    fn = _vjp(GRAD_FNS[name])
    ref = jax.jit(fn)(x, w, ct)
    mesh = _mesh()
    with jax.set_mesh(mesh):
        (y, dx, dw), found = run(fn, (put(mesh, x, x_spec), put(mesh, w, w_spec), put(mesh, ct, out_spec)))
    assert not found & set(GATHERS), found
    assert (y.sharding.spec, dx.sharding.spec, dw.sharding.spec) == (out_spec, x_spec, w_spec)
    check(y, ref[0], exact=name not in INEXACT_OUT)
    for got, want in zip((dx, dw), ref[1:]):
        check(got, want, exact=name not in INEXACT_GRAD)
