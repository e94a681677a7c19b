"""GPU tests of the fp8 decode kernel (`_triton/decode_fp8.py`) against the jnp reference.

Skipped without a GPU (and off Hopper: the kernel is wgmma's). Block FP8 activations x block FP8 weights at
the rows dispatch sends it (1-64), with its knobs forced (padded rows, ring depth, split-K count and
reduction), on ragged N (not a multiple of the 64-row tile nor of the 128-row scale block), K of one block,
batched activations and every output dtype. The fp8 wgmma accumulates each 128-wide block with truncation
(block_fp8.py), so results match the reference to ~1e-4 relative, as the other block FP8 kernels do; the
default split-K reduction is checked to be bitwise deterministic. 8-bit MX on both sides (e4m3 / e5m2, every
pairing) runs one wgmma per 32-wide group, promoted with its e8m0 scales: as dispatched, with knobs forced,
and with NaN scales (0xFF), which must poison exactly the outputs the reference's do. CPU coverage (dispatch,
instructions): tests/test_lowering_decode_fp8.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale._triton import decode_fp8
from jax_blockscale._triton.problem import GemmProblem, TileConfig
from _matmul_checks import KINDS, rel_err, run_matmul

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]

TOL = 2e-3  # as tests/test_gpu_matmul.py allows every block FP8 kernel


@pytest.fixture(autouse=True)
def _hopper():
    if backends.detect_target() != "sm_90":
        pytest.skip("the fp8 decode kernel runs on sm_90 only")


def _operands(m, n, k, seed=0, batch=(), formats=("fp8_block", "fp8_block")):
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.standard_normal(batch + (m, k)).astype(np.float32))
    # Rows of different magnitudes, so that MX weight scales differ from row to row and group to group.
    w = rng.standard_normal((n, k)) * np.exp2(rng.integers(-6, 7, size=(n, 1))) / np.sqrt(k)
    w = jnp.asarray(w.astype(np.float32))
    return jb.quantize_operand(a, formats[0], side="a"), jb.quantize_operand(w, formats[1], side="b")


def _config(m, n, k, formats=("fp8_block", "fp8_block"), **changes) -> TileConfig:
    p = GemmProblem(1, False, m, n, k + (-k % 256), KINDS[formats[0]], KINDS[formats[1]], "bf16")
    return decode_fp8.default_config(p).replace(**changes)


# one row with K a multiple of 1024 and N >= 2112 takes decode.py's GEMV (tests/test_gpu_decode.py)
@pytest.mark.parametrize("m,n,k", [(1, 7168, 1536), (1, 1024, 4096), (2, 7168, 4096), (16, 7168, 2048), (17, 2112, 7168),
                                   (64, 4096, 1024), (5, 200, 384), (33, 96, 128)])
def test_as_dispatched(m, n, k):
    a, b = _operands(m, n, k)
    assert jb.explain(a, b).kernel == "decode_fp8"
    err = rel_err(run_matmul(a, b), jb.reference.matmul(a, b, out_dtype=jnp.float32))
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
    err = rel_err(run_matmul(a, b, cfg), jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < TOL, (changes, err)


def test_eight_row_tiles():
    # wgmma's n8, which MX takes by default up to 8 rows; block FP8 reaches it only by config
    m, n, k = 5, 448, 2048
    a, b = _operands(m, n, k, seed=8)
    err = rel_err(run_matmul(a, b, _config(m, n, k, block_m=8)), jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < TOL, err


@pytest.mark.parametrize("out_dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_output_dtypes_and_batched_activations(out_dtype):
    a, b = _operands(6, 320, 1024, seed=2, batch=(2, 3))  # 2 x 3 x 6 = 36 rows fold into the kernel's N side
    assert jb.explain(a, b).kernel == "decode_fp8"
    out = run_matmul(a, b, out_dtype=out_dtype)
    assert out.shape == (2, 3, 6, 320) and out.dtype == out_dtype
    err = rel_err(out, jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < max(TOL, 1e-2 if out_dtype != jnp.float32 else 0), err


def test_deterministic_by_default():
    a, b = _operands(16, 7168, 4096, seed=3)
    cfg = _config(16, 7168, 4096, block_k=256, split_k=4)
    assert not cfg.atomic_split_k
    first = np.asarray(run_matmul(a, b, cfg))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(run_matmul(a, b, cfg)), first)


def test_matches_the_swapped_block_fp8_kernel():
    # The same products, summed per 128-wide block by the same fp8 wgmma, promoted in the same order within a
    # split: the two kernels agree far below the reference tolerance.
    a, b = _operands(16, 1024, 2048, seed=4)
    ours = run_matmul(a, b, _config(16, 1024, 2048, split_k=1))
    old = run_matmul(a, b, TileConfig(block_m=64, block_n=16, block_k=128, group_m=1, num_stages=4, swap_ab=True,
                                kernel="block_fp8"))
    assert rel_err(ours, old) < 1e-5


# 8-bit MX: one k32 wgmma per group, so only its products' accumulation inside a group (32 terms) is the
# wgmma's, which truncates (~14 significant bits); the reference sums exactly decoded fp32 values. Measured
# 4.0e-5 to 4.7e-5 relative on an H100 over these tests, the sanitize cases and the benchmark's shapes.
MX_TOL = 2e-4
MX_PAIRS = [("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8"), ("mxfp8", "mxfp8_e5m2"), ("mxfp8_e5m2", "mxfp8_e5m2")]


@pytest.mark.parametrize("formats", MX_PAIRS)
@pytest.mark.parametrize("m,n,k", [(2, 7168, 4096), (16, 2112, 2048), (37, 200, 384), (64, 96, 4096),
                                   (5, 300, 7168)])  # 224 scale groups: not a power of two
def test_mx_as_dispatched(formats, m, n, k):
    a, b = _operands(m, n, k, seed=5, formats=formats)
    assert jb.explain(a, b).kernel == "decode_fp8"
    err = rel_err(run_matmul(a, b), jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < MX_TOL, (formats, m, n, k, err)


@pytest.mark.parametrize("changes", [
    dict(block_k=128, split_k=4), dict(block_k=256, split_k=2, atomic_split_k=True), dict(num_sms=3),
    dict(block_m=64, block_k=128, num_stages=4), dict(block_k=512, num_stages=3, num_sms=5), dict(block_m=8),
    dict(block_m=32, block_k=256, num_stages=3, split_k=2, num_sms=4),
])
def test_mx_knobs(changes):
    m, n, k, formats = 7, 320, 2048, ("mxfp8", "mxfp8")
    a, b = _operands(m, n, k, seed=6, formats=formats)
    err = rel_err(run_matmul(a, b, _config(m, n, k, formats, **changes)), jb.reference.matmul(a, b, out_dtype=jnp.float32))
    assert err < MX_TOL, (changes, err)


def test_mx_nan_scales_poison_what_the_reference_poisons():
    # e8m0 0xFF is NaN: a weight group's poisons its output column, an activation group's its output row.
    m, n, k = 7, 200, 1024
    a, b = _operands(m, n, k, seed=7, formats=("mxfp8", "mxfp8"))
    b = dataclasses.replace(b, scales=b.scales.at[130, 9].set(0xFF))
    a = dataclasses.replace(a, scales=a.scales.at[4, 30].set(0xFF))
    assert jb.explain(a, b).kernel == "decode_fp8"
    out = np.asarray(run_matmul(a, b))
    ref = np.asarray(jb.reference.matmul(a, b, out_dtype=jnp.float32))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert np.isnan(ref).sum() == m + n - 1
    ok = ~np.isnan(ref)
    assert rel_err(out[ok], ref[ok]) < MX_TOL
