"""GPU tests of the Gluon decode kernel (`_triton/decode_wgmma.py`) against the jnp reference.

Skipped without a GPU (and off Hopper: the kernel is wgmma's). bf16 activations x mxfp4 / nvfp4 weights at
the rows dispatch sends them (2-64), and with its knobs forced (chunk, warps,
split-K count and reduction, 32 padded rows; at 64 rows, where the activations stream, the same knobs and
whole-split staging); 8-bit (mxfp8) weights and quantized activations (MX, nvfp4) with the kernel's config
forced, and MX activations x mxfp4 (8-bit 2-64 rows, fp4 2-32) and nvfp4 x nvfp4 (2-32) at the rows dispatch
sends them; on ragged N, odd K (padded to 256), batched activations and nvfp4 tensor scales. Products are
exact in bf16, so float32 outputs differ from the reference only by the fp32 summation order (1e-5). The
default split-K reduction is checked to be bitwise deterministic (16 and 64 rows). CPU coverage (dispatch,
instructions): tests/test_lowering_decode_wgmma.py; Gluon kernels do not run in Triton's interpreter.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale._triton import decode_wgmma
from jax_blockscale._triton.problem import GemmProblem
from _matmul_checks import KINDS, rel_err, run_matmul

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU"),
]



@pytest.fixture(autouse=True)
def _hopper():
    if backends.detect_target() != "sm_90":
        pytest.skip("the wgmma decode kernel runs on sm_90 only")


def _operands(fb, m, n, k, seed=0, batch=(), fa="bf16"):
    rng = np.random.default_rng(seed)
    a = jnp.asarray(rng.standard_normal(batch + (m, k)).astype(np.float32)).astype(jnp.bfloat16)
    w = jnp.asarray((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32))
    if fa != "bf16":
        a = jb.quantize_operand(a, fa, side="a")
    return a, jb.quantize_operand(w, fb, side="b")


def _config(fb, m, n, k, fa="bf16", **changes):
    p = GemmProblem(1, False, m, n, k + (-k % 256), KINDS[fa], KINDS[fb], "bf16")
    return decode_wgmma.default_config(p).replace(**changes)


def _check(a, b, config=None, out_dtype=jnp.float32):
    out = run_matmul(a, b, config, out_dtype)
    ref = jb.reference.matmul(a, b, out_dtype=jnp.float32)
    assert out.shape == ref.shape and out.dtype == out_dtype
    tol = 1e-5 if out_dtype == jnp.float32 else 2 * float(jnp.finfo(out_dtype).eps) + 1e-5
    err = rel_err(out, ref)
    assert err < tol, (err, config)
    return out


@pytest.mark.parametrize("fb,m", [("mxfp4", 2), ("mxfp4", 5), ("mxfp4", 16), ("mxfp4", 17), ("mxfp4", 32),
                                  ("mxfp4", 33), ("mxfp4", 64), ("nvfp4", 2), ("nvfp4", 5), ("nvfp4", 16),
                                  ("nvfp4", 17), ("nvfp4", 32), ("nvfp4", 40), ("nvfp4", 64),
                                  ("mxfp8", 3), ("mxfp8", 4), ("mxfp8", 16), ("mxfp8", 17), ("mxfp8", 64),
                                  ("mxfp8_e5m2", 5), ("mxfp8_e5m2", 33)])
@pytest.mark.parametrize("n,k", [(7168, 4096), (1000, 1000), (64, 7168)])
def test_as_dispatched(fb, m, n, k):
    a, b = _operands(fb, m, n, k)
    assert jb.explain(a, b).kernel == "decode_wgmma"  # bf16 x fp4 (2-64 rows) or 8-bit MX weights (3-64)
    _check(a, b)
    _check(a, b, out_dtype=jnp.bfloat16)


@pytest.mark.parametrize("fb", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("changes", [
    dict(block_k=128), dict(num_warps=8, block_n=128), dict(split_k=1), dict(split_k=2),
    dict(atomic_split_k=True), dict(block_k=128, split_k=4, atomic_split_k=True), dict(block_m=32),
    dict(num_stages=3), dict(num_stages=4, block_k=128),
])
def test_every_knob(fb, changes):
    m, n, k = 7, 1000, 2048
    a, b = _operands(fb, m, n, k, seed=1)
    _check(a, b, config=_config(fb, m, n, k, **changes))


@pytest.mark.parametrize("fb", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("changes,streamed", [
    (dict(), True), (dict(split_k=2), True), (dict(block_k=256, num_stages=3), True),
    (dict(num_warps=8, block_n=128), True), (dict(atomic_split_k=True, split_k=2), True),
    (dict(split_k=4), False), (dict(split_k=16, atomic_split_k=True), False),  # 512 / 128 K per split: staged whole
])
def test_every_knob_at_64_rows(fb, changes, streamed):
    m, n, k = 57, 1000, 2048
    a, b = _operands(fb, m, n, k, seed=8)
    cfg = _config(fb, m, n, k, **changes)
    p = GemmProblem(1, False, m, n, k, "bf16", KINDS[fb], "bf16")
    assert cfg.block_m == 64 and decode_wgmma.streams_activations(p, cfg) == streamed
    _check(a, b, config=cfg)


# 8-bit weights and quantized activations (decoded once per program into the staged bf16 tile), forced with
# the kernel's own config: which of them dispatch sends here is the table's (measured) choice.
QUANTIZED_PAIRS = [("bf16", "mxfp8"), ("bf16", "mxfp8_e5m2"), ("mxfp8", "mxfp8"), ("mxfp8", "mxfp4"),
                   ("mxfp8_e5m2", "mxfp8"), ("mxfp4", "mxfp4"), ("mxfp4", "mxfp8"), ("nvfp4", "nvfp4")]


@pytest.mark.parametrize("fa,fb", QUANTIZED_PAIRS)
@pytest.mark.parametrize("m,n,k", [(2, 7168, 4096), (16, 1000, 1000), (32, 64, 2048), (64, 1000, 2048)])
def test_quantized_activations_and_8bit_weights(fa, fb, m, n, k):
    a, b = _operands(fb, m, n, k, seed=5, fa=fa)
    _check(a, b, config=_config(fb, m, n, k, fa=fa))  # rows padded to 16, 32 or 64 (streamed)


@pytest.mark.parametrize("fa,fb,m", [("mxfp8", "mxfp4", 2), ("mxfp8", "mxfp4", 8), ("mxfp8", "mxfp4", 16),
                                     ("mxfp8", "mxfp4", 17), ("mxfp8_e5m2", "mxfp4", 9), ("mxfp4", "mxfp4", 16),
                                     ("mxfp4", "mxfp4", 32), ("mxfp8", "mxfp4", 64), ("mxfp8_e5m2", "mxfp4", 33),
                                     ("nvfp4", "nvfp4", 3), ("nvfp4", "nvfp4", 16),
                                     ("nvfp4", "nvfp4", 24), ("nvfp4", "nvfp4", 32)])
def test_quantized_activations_as_dispatched(fa, fb, m):
    a, b = _operands(fb, m, 7168, 4096, seed=7, fa=fa)
    assert jb.explain(a, b).kernel == "decode_wgmma"
    _check(a, b)
    _check(a, b, out_dtype=jnp.bfloat16)


@pytest.mark.parametrize("fa,fb", [("bf16", "mxfp8"), ("mxfp8", "mxfp8"), ("nvfp4", "nvfp4")])
@pytest.mark.parametrize("changes", [dict(block_k=128), dict(num_warps=8, block_n=128), dict(split_k=1),
                                     dict(atomic_split_k=True), dict(num_stages=3)])
def test_quantized_pairs_every_knob(fa, fb, changes):
    m, n, k = 7, 1000, 2048
    a, b = _operands(fb, m, n, k, seed=6, fa=fa)
    _check(a, b, config=_config(fb, m, n, k, fa=fa, **changes))


@pytest.mark.parametrize("m,k,want", [(48, 7168, "decode_wgmma"), (48, 4096, "upcast")])
def test_nvfp4_activations_at_64_rows_as_dispatched(m, k, want):
    a, b = _operands("nvfp4", m, 1000, k, seed=10, fa="nvfp4")
    assert jb.explain(a, b).kernel == want  # from K = 7168 only (backends.py)
    _check(a, b)


def test_batched_activations_and_nvfp4_tensor_scales():
    a, b = _operands("nvfp4", 3, 777, 512, seed=2, batch=(2,))
    b = dataclasses.replace(b, tensor_scale=b.tensor_scale * 0.375)
    assert jb.explain(a, b).kernel == "decode_wgmma"
    _check(a, b)


@pytest.mark.parametrize("m", [16, 64])
def test_deterministic_by_default(m):
    a, b = _operands("mxfp4", m, 7168, 4096, seed=3)
    cfg = _config("mxfp4", m, 7168, 4096)
    assert cfg.split_k > 1 and not cfg.atomic_split_k
    first = np.asarray(run_matmul(a, b, cfg))
    for _ in range(3):
        np.testing.assert_array_equal(np.asarray(run_matmul(a, b, cfg)), first)


def _special_rows(rng, rows, k, nan_at):
    """(rows, k) normal samples with row 0 zero, row 1 tiny (1e-30), row 2 huge (1e30), a NaN in row 3."""
    v = rng.standard_normal((rows, k)).astype(np.float32)
    v[0] = 0.0
    v[1] *= 1e-30
    v[2] *= 1e30
    v[3, nan_at] = np.nan
    return v


def test_special_values_match_the_reference():
    """Zero, tiny and huge weights, NaN scales: the kernel's bf16 decode is exact, so its output matches
    the reference's finite entries and its NaN / Inf pattern."""
    m, n, k = 4, 256, 512
    rng = np.random.default_rng(4)
    w = _special_rows(rng, n, k, nan_at=5)
    a = jnp.asarray(rng.standard_normal((m, k)).astype(np.float32)).astype(jnp.bfloat16)
    for fb in ("mxfp4", "nvfp4", "mxfp8"):
        b = jb.quantize_operand(jnp.asarray(w), fb, side="b")
        out = np.asarray(run_matmul(a, b, _config(fb, m, n, k)))
        ref = np.asarray(jb.reference.matmul(a, b, out_dtype=jnp.float32))
        np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(out[fin], ref[fin], rtol=1e-5, atol=1e-6 * np.abs(ref[fin]).max())


@pytest.mark.parametrize("fa,fb", [("mxfp8", "mxfp4"), ("mxfp8_e5m2", "mxfp4"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4")])
@pytest.mark.parametrize("m", [6, 40])  # staged (16 padded rows) and streamed (64)
def test_special_activations_match_the_reference(fa, fb, m):
    """Quantized activations decoded by the weight's instructions (bf16 multiplies by the scale): zero, tiny and
    huge rows and a NaN match the reference's finite entries and its NaN / Inf pattern."""
    n, k = 256, 1024
    rng = np.random.default_rng(9)
    a = jb.quantize_operand(jnp.asarray(_special_rows(rng, m, k, nan_at=7)), fa, side="a")
    b = jb.quantize_operand(jnp.asarray((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)), fb, side="b")
    out = np.asarray(run_matmul(a, b, _config(fb, m, n, k, fa=fa)))
    ref = np.asarray(jb.reference.matmul(a, b, out_dtype=jnp.float32))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    fin = np.isfinite(ref)
    for row in range(m):  # per row: the tiny row's scale is ~1e-30 of the others'
        f = fin[row]
        np.testing.assert_allclose(out[row, f], ref[row, f], rtol=1e-5, atol=1e-6 * np.abs(ref[row, f]).max(initial=0))


@pytest.mark.parametrize("m", [5, 40])  # 16 padded rows (2 streamed splits) and 64
def test_nvfp4_every_scale_code_and_code_pair(m):
    """nvfp4 weights decode with the e2m1 bias folded into the e4m3 scale (one bf16 multiply per pair, the
    values 2**-8 times the true ones, the fp32 sums 2**8 times): every positive finite e4m3 scale code, from
    the subnormal 2**-9 to 448, against every byte of codes (both nibbles), matches the reference."""
    n, k = 256, 4096
    rng = np.random.default_rng(11)
    a, b = _operands("nvfp4", m, n, k, seed=11)
    codes = jnp.asarray(rng.permutation(np.arange(n * k // 2) % 256).astype(np.uint8).reshape(n, k // 2))
    raw = jnp.asarray((np.arange(n * k // 16) % 0x7F).astype(np.uint8).reshape(n, k // 16))
    b = dataclasses.replace(b, values=codes, scales=jax.lax.bitcast_convert_type(raw, jnp.float8_e4m3fn))
    assert b.scales.dtype == jnp.float8_e4m3fn
    _check(a, b)
