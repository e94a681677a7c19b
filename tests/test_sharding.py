"""The block-scaled matmul under jit with sharded operands, on 8 host CPU devices (tests/conftest.py).

Every case compiles `jax.jit(matmul)` over a 2 x 4 ("data", "model") mesh and checks (1) the numbers equal
the unsharded run and (2) the compiled HLO: no all-gather / all-to-all / collective-permute of any operand,
and the all-reduce or reduce-scatter that a sharded K needs.

The GEMM is opaque here, as on a GPU: the CPU lowering of the primitive normally emits the jnp reference,
plain HLO that XLA would partition by itself, so for these tests (`opaque_gemm`) the dequantized operands
pass through a LAPACK custom call that XLA cannot split, like the Triton kernel's custom call. Without the
partitioning rules every sharded case below then all-gathers its operands onto each device.

Exactness: the test data are small integers, which MX formats and bf16 represent exactly (power-of-two
scales), so every product and partial sum is an exact float32 integer and any summation order, per-shard
dot blocking or cross-device psum included, gives the same bits: those cases must be equal. nvfp4 and
fp8_block scales are not powers of two, so their float32 sums round, and the order (which depends on the
local shapes and on the K split) may move the last bits: rtol 1e-5 there.

Meshes with Explicit axes (sharding in types), gradients and recipes there: tests/test_sharding_explicit.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sharding_helpers import GATHERS, check, opaque_cpu_gemm
from _sharding_helpers import put as _put
from _sharding_helpers import run as _run
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb
from jax_blockscale.partitioning import BlockSplitWarning

if jax.device_count() < 8:
    pytest.skip("needs 8 devices: tests/conftest.py sets XLA_FLAGS before jax starts", allow_module_level=True)

M, N, K = 32, 512, 512  # N/4 and K/4 are whole 128-row / 128-column fp8_block tiles
FORMATS = [("mxfp8", "mxfp8"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block"),
           ("bf16", "mxfp4")]
RNG = np.random.default_rng(0)


def _mesh():
    return jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)


def _x(*shape):
    return jnp.asarray(RNG.integers(-4, 5, shape).astype(np.float32))


def _normal(*shape):
    return jnp.asarray(RNG.standard_normal(shape).astype(np.float32))


def _exact(fa, fb):
    return not {fa, fb} & {"nvfp4", "fp8_block"}



def _q(x, fmt, side):
    return jb.quantize_operand(x, fmt, side=side)


@pytest.fixture(scope="module", autouse=True)
def opaque_gemm():
    with opaque_cpu_gemm():
        yield


@pytest.fixture(scope="module")
def operands():
    """Unsharded operands and results per format pair, computed once (the slow part on 2 cores)."""
    x, w = _x(M, K), _x(N, K)
    x_normal, w_normal = _normal(M, K), _normal(N, K)
    out = {}
    for fa, fb in FORMATS:
        a, b = _q(x, fa, "a"), _q(w, fb, "b")
        out[fa, fb] = (a, b, jax.jit(_mm(jnp.float32))(a, b))
    a, b = _q(x_normal, "mxfp8", "a"), _q(w_normal, "mxfp8", "b")
    out["normal", jnp.bfloat16] = (a, b, jax.jit(_mm(jnp.bfloat16))(a, b))
    return out


def _mm(out_dtype):
    return lambda a, b: jb.matmul(a, b, out_dtype=out_dtype)


# name: (a spec, b spec, out spec, the collective the case needs or None)
CASES = {
    "data_parallel": (P("data", None), P(), P("data", None), None),
    "column_parallel": (P(), P("model", None), P(None, "model"), None),
    "row_parallel_psum": (P(None, "model"), P(None, "model"), P(), "all-reduce"),
    "row_parallel_reduce_scatter": (P(None, "model"), P(None, "model"), P(None, "model"), "reduce-scatter"),
    "2d_data_x_column": (P("data", None), P("model", None), P("data", "model"), None),
    "2d_data_x_row": (P("data", "model"), P(None, "model"), P("data", None), "all-reduce"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fa,fb", FORMATS)
def test_partitions_without_gathering(operands, fa, fb, case):
    a_spec, b_spec, out_spec, needed = CASES[case]
    mesh = _mesh()
    a, b, ref = operands[fa, fb]
    out, found = _run(_mm(jnp.float32), (_put(mesh, a, a_spec), _put(mesh, b, b_spec)),
                      NamedSharding(mesh, out_spec))
    assert not found & set(GATHERS), f"{case}: operands gathered: {found}"
    if needed:
        assert needed in found, f"{case}: expected a {needed}, got {found}"
    else:
        assert not found, f"{case}: no communication expected, got {found}"
    assert out.sharding.spec == out_spec
    check(out, ref, _exact(fa, fb))


@pytest.mark.parametrize("case", ["row_parallel_psum", "row_parallel_reduce_scatter"])
def test_row_parallel_bf16_output_rounds_once(operands, case):
    """Partial products are summed in float32 and rounded to bf16 once: at most one bf16 ulp apart."""
    a_spec, b_spec, out_spec, _ = CASES[case]
    mesh = _mesh()
    a, b, ref = operands["normal", jnp.bfloat16]
    out, _ = _run(_mm(jnp.bfloat16), (_put(mesh, a, a_spec), _put(mesh, b, b_spec)), NamedSharding(mesh, out_spec))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("fa,fb", [("nvfp4", "nvfp4"), ("fp8_block", "fp8_block")])
def test_batch_dims_sharded(fa, fb):
    """Batched activations with the batch on "data", against a shared weight (N on "model") and against
    per-batch weights (batch on "data")."""
    mesh = _mesh()
    a = _q(_x(4, 8, 256), fa, "a")
    shared = _q(_x(512, 256), fb, "b")  # 4 tiles of 128 rows: one per "model" device
    stacked = jax.vmap(lambda t: _q(t, fb, "b"))(_x(4, 256, 256))
    for b, b_spec, out_spec in ((shared, P("model", None), P("data", None, "model")),
                                (stacked, P("data", None, None), P("data", None, None))):
        ref = jax.jit(_mm(jnp.float32))(a, b)
        out, found = _run(_mm(jnp.float32), (_put(mesh, a, P("data", None, None)), _put(mesh, b, b_spec)),
                          NamedSharding(mesh, out_spec))
        assert not found, found
        check(out, ref, _exact(fa, fb))


def test_vmap_inside_jit_stays_partitioned():
    """vmap over the batch of quantized activations: still one partitioned call, no gathers."""
    mesh = _mesh()
    qa = jax.vmap(lambda t: jb.quantize(t, "mxfp8"))(_x(4, 8, 256))
    qb = jb.quantize(_x(128, 256), "mxfp8")
    fn = jax.vmap(_mm(jnp.float32), in_axes=(0, None))
    ref = jax.jit(fn)(qa, qb)
    out, found = _run(fn, (_put(mesh, qa, P("data", None, None)), _put(mesh, qb, P("model", None))),
                      NamedSharding(mesh, P("data", None, "model")))
    assert not found, found
    np.testing.assert_array_equal(out, ref)


def test_grad_data_x_model_parallel():
    """Quantize inside + straight-through grad with x on "data" and W column-parallel on "model": the
    weight is never gathered; the weight gradient is the data-parallel all-reduce."""
    mesh = _mesh()
    x, w = _x(64, 256), _x(128, 256)

    def loss(x, w):
        return jnp.sum(jb.matmul(x, w, a_format="mxfp8", b_format="mxfp8", out_dtype=jnp.float32) ** 2)

    grad = jax.grad(loss, (0, 1))
    ref = jax.jit(grad)(x, w)
    out, found = _run(grad, (_put(mesh, x, P("data", None)), _put(mesh, w, P("model", None))))
    assert not found & set(GATHERS), found
    for g, r in zip(out, ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * float(jnp.abs(r).max()))


def test_gspmd_partitioner_agrees():
    """The GSPMD callbacks (jax_use_shardy_partitioner=False) partition the same way."""
    a, b = _q(_x(M, K), "mxfp8", "a"), _q(_x(N, K), "mxfp4", "b")
    ref = jax.jit(_mm(jnp.float32))(a, b)
    previous = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        mesh = _mesh()
        for case in ("2d_data_x_column", "row_parallel_psum", "2d_data_x_row"):
            a_spec, b_spec, out_spec, needed = CASES[case]
            out, found = _run(_mm(jnp.float32), (_put(mesh, a, a_spec), _put(mesh, b, b_spec)),
                              NamedSharding(mesh, out_spec))
            assert not found & set(GATHERS) and (needed is None or needed in found), (case, found)
            np.testing.assert_array_equal(out, ref)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def test_shard_map_runs_the_local_matmul():
    mesh = _mesh()
    a, b = _q(_x(M, K), "nvfp4", "a"), _q(_x(N, K), "nvfp4", "b")
    specs = (jax.tree_util.tree_map(lambda t: P("data") if t.ndim else P(), a),
             jax.tree_util.tree_map(lambda t: P("model") if t.ndim else P(), b))
    fn = jax.shard_map(_mm(jnp.float32), mesh=mesh, in_specs=specs, out_specs=P("data", "model"))
    check(jax.jit(fn)(a, b), jax.jit(_mm(jnp.float32))(a, b), exact=False)


# ------------------------------------------------------------------------------------- bad shardings
# A sharding that would split a quantization block (or a 128-row fp8 weight tile) across devices is never
# computed in pieces: that dim is gathered instead, with a BlockSplitWarning naming a sharding that works.
# (Such shardings also arise inside training steps, e.g. fp8_deepseek's wgrad quantizes along the tokens,
# so a hard error would break valid programs.)


def _k_split(k, mesh):
    a, b = _q(_x(M, k), "mxfp8", "a"), _q(_x(64, k), "mxfp8", "b")
    # K / 4 elements per device: jit accepts the values' sharding; the scales stay replicated.
    args = (_put(mesh, a, P(None, "model"), P()), _put(mesh, b, P(None, "model"), P()))
    return (a, b), args


def test_k_split_inside_a_block_is_gathered_with_a_warning():
    (a, b), args = _k_split(96, _mesh())  # 3 blocks of 32 over 4 devices: 24 elements each
    with pytest.warns(BlockSplitWarning, match=r"3 quantization blocks of 32.*replicate K"):
        out, found = _run(_mm(jnp.float32), args)
    assert "all-gather" in found
    np.testing.assert_array_equal(out, jax.jit(_mm(jnp.float32))(a, b))


def test_k_split_warning_suggests_an_axis_that_fits():
    (a, b), args = _k_split(64, _mesh())  # 2 blocks: "data" (2 devices) fits, "model" (4) does not
    with pytest.warns(BlockSplitWarning, match=r"shard K over 'data' or replicate it"):
        out, _ = _run(_mm(jnp.float32), args)
    np.testing.assert_array_equal(out, jax.jit(_mm(jnp.float32))(a, b))


def test_fp8_weight_tiles_split_across_devices_are_gathered():
    mesh = _mesh()
    a, b = _q(_x(M, 256), "fp8_block", "a"), _q(_x(384, 256), "fp8_block", "b")  # 3 tile rows, 4 devices
    with pytest.warns(BlockSplitWarning, match=r"N is sharded.*3 fp8_block tiles of rows"):
        out, _ = _run(_mm(jnp.float32), (_put(mesh, a, P()), _put(mesh, b, P("model", None), P())))
    check(out, jax.jit(_mm(jnp.float32))(a, b), exact=False)
