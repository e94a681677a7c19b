"""The partitioned block-scaled matmul on two GPUs: the Triton kernels under jit with sharded operands.

Skipped unless the backend is a GPU with at least two devices; runs on the first two. Each case compiles
`jax.jit(matmul)` over a 2-device mesh and checks (1) the result equals the unsharded run on one GPU and
(2) the compiled HLO gathers no operand (no all-gather / all-to-all / collective-permute) and has the
all-reduce or reduce-scatter that a sharded K needs. On a GPU the kernel is a custom call XLA cannot split,
so a missing partitioning rule shows as a gather (tests/test_sharding.py checks the same on CPU with a
stand-in opaque GEMM).

Exactness: the data are small integers; MX elements with power-of-two scales and bf16 hold them exactly and
every partial sum is an exact float32 integer, so any K split or accumulation order gives the same bits.
nvfp4 and fp8_block scales are not powers of two: the float32 sums round and their order (per-device K
range, psum) may move the last bits, hence rtol 1e-5 there. Outputs are float32 so that row parallel's
single rounding to the output dtype does not hide a wrong partial sum.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _sharding_helpers import GATHERS, check, put, run
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_blockscale as jb

pytestmark = pytest.mark.gpu

if jax.default_backend() != "gpu" or jax.device_count() < 2:
    pytest.skip("needs at least 2 GPUs", allow_module_level=True)

# Per device: K/2 = 512 is 16 MX blocks, 32 nvfp4 blocks, 4 fp8 tiles; N/2 = 256 is two 128-row weight tiles.
M, N, K = 256, 512, 1024
FORMATS = [("mxfp8", "mxfp8"), ("nvfp4", "nvfp4"), ("fp8_block", "fp8_block"), ("bf16", "mxfp4")]
RNG = np.random.default_rng(0)

# name: (a spec, b spec, out spec, the collective the case needs or None)
CASES = {
    "data_parallel": (P("d", None), P(), P("d", None), None),
    "column_parallel": (P(), P("d", None), P(None, "d"), None),
    "row_parallel_psum": (P(None, "d"), P(None, "d"), P(), "all-reduce"),
    "row_parallel_reduce_scatter": (P(None, "d"), P(None, "d"), P(None, "d"), "reduce-scatter"),
}


def _mesh(axis_type=AxisType.Auto):
    return Mesh(np.array(jax.devices()[:2]), ("d",), axis_types=(axis_type,))


def _ints(*shape):
    return jnp.asarray(RNG.integers(-4, 5, shape).astype(np.float32))



def _mm(a, b):
    return jb.matmul(a, b, out_dtype=jnp.float32)


@pytest.fixture(scope="module")
def operands():
    """Quantized operands and the unsharded result on one GPU, per format pair."""
    x, w = _ints(M, K), _ints(N, K)
    out = {}
    for fa, fb in FORMATS:
        a, b = jb.quantize_operand(x, fa, side="a"), jb.quantize_operand(w, fb, side="b")
        out[fa, fb] = (a, b, jax.jit(_mm)(a, b))
    return out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("fa,fb", FORMATS)
def test_two_gpus_match_one_without_gathering(operands, fa, fb, case):
    a_spec, b_spec, out_spec, needed = CASES[case]
    mesh = _mesh()
    a, b, ref = operands[fa, fb]
    out, found = run(_mm, (put(mesh, a, a_spec), put(mesh, b, b_spec)), NamedSharding(mesh, out_spec))
    assert not found & set(GATHERS), f"{case}: operands gathered: {found}"
    if needed:
        assert needed in found, f"{case}: expected a {needed}, got {found}"
    else:
        assert not found, f"{case}: no communication expected, got {found}"
    check(out, ref, exact=not {fa, fb} & {"nvfp4", "fp8_block"})


# Meshes with Explicit axes (sharding in types), forward and both gradients. jax 0.11 traces the
# per-device GEMM under the caller's mesh; before `partitioning._untyped_trace` the sharding ops that put
# into the partitioned program made these fail to compile ("no implementation for custom call to
# Sharding") or abort in the all-reduce (2 x H200, 2026-11-21). Mesh shape per case: 2 GPUs on the split axis.
EXPLICIT_CASES = {
    "data_parallel": ((2, 1), P("data", None), P(None, None), P("data", None)),
    "column_parallel": ((1, 2), P(None, None), P("model", None), P(None, "model")),
    "row_parallel": ((1, 2), P(None, "model"), P(None, "model"), P(None, None)),
}
GRAD_FNS = {
    "matmul_mxfp8": lambda x, w: jb.matmul(x, w, a_format="mxfp8", b_format="mxfp8", out_dtype=jnp.float32),
    **{f"recipe_{r}": (lambda r: lambda x, w: jb.recipe_matmul(x, w, r, out_dtype=jnp.float32))(r)
       for r in ("mxfp8", "nvfp4", "fp8_deepseek", "w4a8")},
}
INEXACT = {"recipe_nvfp4", "recipe_fp8_deepseek"}  # non-power-of-two scales: float32 sums round by order


@pytest.mark.parametrize("case", list(EXPLICIT_CASES))
@pytest.mark.parametrize("name", list(GRAD_FNS))
def test_explicit_mesh_forward_and_grads_match_one_gpu(name, case):
    shape, x_spec, w_spec, y_spec = EXPLICIT_CASES[case]
    x, w, ct = _ints(M, K), _ints(N, K), _ints(M, N)
    f = GRAD_FNS[name]

    def fn(x, w, ct):
        y, pullback = jax.vjp(f, x, w)
        return (y, *pullback(ct))

    ref = jax.jit(fn)(x, w, ct)
    mesh = jax.make_mesh(shape, ("data", "model"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        args = (put(mesh, x, x_spec), put(mesh, w, w_spec), put(mesh, ct, y_spec))
        out, found = run(fn, args)
    assert not found & set(GATHERS), f"{case}: {found}"
    assert tuple(o.sharding.spec for o in out) == (y_spec, x_spec, w_spec)
    for got, want in zip(out, ref):
        check(got, want, exact=name not in INEXACT)
