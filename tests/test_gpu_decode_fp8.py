"""GPU tests of the block FP8 decode kernel (`_triton/decode_fp8.py`) against the jnp reference.

Skipped without a GPU (and off Hopper: the kernel is wgmma's). Block FP8 activations x block FP8 weights at
the rows dispatch sends it (1-64), with its knobs forced (padded rows, ring depth, split-K count and
reduction), on ragged N (not a multiple of the 64-row tile nor of the 128-row scale block), K of one block,
batched activations and every output dtype. The fp8 wgmma accumulates each 128-wide block with truncation
(block_fp8.py), so results match the reference to ~1e-4 relative, as the other block FP8 kernels do; the
default split-K reduction is checked to be bitwise deterministic. CPU coverage (dispatch, instructions):
tests/test_lowering_decode_fp8.py.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale._triton import decode_fp8
from jax_blockscale._triton.problem import GemmProblem, TileConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

TOL = 2e-3  # as tests/test_gpu_matmul.py allows every block FP8 kernel


@pytest.fixture(autouse=True)
def _hopper():
    if backends.detect_target() != "sm_90":
        pytest.skip("the fp8 decode kernel runs on sm_90 only")


def _operands(m, n, k, seed=0, batch=()):
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.standard_normal(batch + (m, k)).astype(np.float32))
    w = jnp.asarray((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
    return jb.quantize_operand(a, "fp8_block", side="a"), jb.quantize_operand(w, "fp8_block", side="b")


def _config(m, n, k, **changes) -> TileConfig:
    p = GemmProblem(1, False, m, n, k + (-k % 128), "block_fp8", "block_fp8", "bf16")
    return decode_fp8.default_config(p).replace(**changes)


def _rel_err(out, ref):
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def _run(a, b, config=None, out_dtype=jnp.float32):
    return jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=out_dtype, config=config))(a, b)


@pytest.mark.parametrize("m,n,k", [(1, 7168, 4096), (16, 7168, 2048), (17, 2112, 7168), (64, 4096, 1024),
                                   (5, 200, 384), (33, 96, 128)])
def test_as_dispatched(m, n, k):
    a, b = _operands(m, n, k)
    assert jb.explain(a, b).kernel == "decode_fp8"
    err = _rel_err(_run(a, b), jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < TOL, (m, n, k, err)


@pytest.mark.parametrize("changes", [
    dict(split_k=1), dict(block_k=128, split_k=4), dict(block_k=128, split_k=8, atomic_split_k=True),
    dict(num_stages=2), dict(block_k=128, num_stages=8), dict(block_m=64),
    dict(block_m=32, block_k=256, split_k=2, atomic_split_k=True),
    # a few persistent programs, each streaming several work items through one ring
    dict(num_sms=3), dict(num_sms=5, block_k=128, split_k=4, num_stages=3), dict(block_k=256, num_stages=3),
    dict(block_k=512, num_stages=2, num_sms=7), dict(num_sms=2, block_k=256, split_k=2, atomic_split_k=True),
])
def test_every_knob(changes):
    m, n, k = 9, 448, 2048
    a, b = _operands(m, n, k, seed=1)
    cfg = _config(m, n, k, **changes)
    err = _rel_err(_run(a, b, cfg), jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < TOL, (changes, err)


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_output_dtypes_and_batched_activations(out_dtype):
    a, b = _operands(6, 320, 1024, seed=2, batch=(2, 3))  # 2 x 3 x 6 = 36 rows fold into the kernel's N side
    assert jb.explain(a, b).kernel == "decode_fp8"
    out = _run(a, b, out_dtype=out_dtype)
    assert out.shape == (2, 3, 6, 320) and out.dtype == out_dtype
    err = _rel_err(out, jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < max(TOL, 1e-2 if out_dtype != jnp.float32 else 0), err


def test_deterministic_by_default():
    a, b = _operands(16, 7168, 4096, seed=3)
    cfg = _config(16, 7168, 4096, block_k=256, split_k=4)
    assert not cfg.atomic_split_k
    first = np.asarray(_run(a, b, cfg))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(_run(a, b, cfg)), first)


def test_matches_the_swapped_block_fp8_kernel():
    # The same products, summed per 128-wide block by the same fp8 wgmma, promoted in the same order within a
    # split: the two kernels agree far below the reference tolerance.
    a, b = _operands(16, 1024, 2048, seed=4)
    ours = _run(a, b, _config(16, 1024, 2048, split_k=1))
    old = _run(a, b, TileConfig(block_m=64, block_n=16, block_k=128, group_m=1, num_stages=4, swap_ab=True,
                                kernel="block_fp8"))
    assert _rel_err(ours, old) < 1e-5
