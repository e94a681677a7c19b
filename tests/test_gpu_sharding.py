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
from _sharding_helpers import GATHERS, put, run
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


def _check(out, ref, exact):
    out, ref = np.asarray(out), np.asarray(ref)
    if exact:
        np.testing.assert_array_equal(out, ref)
    else:
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * float(np.abs(ref).max()))


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
    _check(out, ref, exact=not {fa, fb} & {"nvfp4", "fp8_block"})


# Gradients on Explicit-axis meshes are tested on 8 CPU devices (tests/test_sharding_explicit.py). On
# 2 x H200 (2026-11-21) the column-parallel mxfp8 matmul gradient failed and the fp8_deepseek recipe's
# aborted inside XLA; until that is diagnosed (issue #6) they are not part of the GPU suite, where an abort
# would end the whole run.
