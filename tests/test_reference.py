"""Tests of the oracle `jax_blockscale.reference.matmul` against float64 numpy products.

The dequantized operands are rebuilt here from the raw codes with ml_dtypes (element codes viewed as the
ml_dtypes float types, e8m0 scales as float8_e8m0fnu), not with the package's dequantize. The oracle
accumulates in float32 (HIGHEST precision), so results are compared with a bound on float32 accumulation
error: |got - want| <= 2e-5 * (|A| @ |B|.T) elementwise (K <= 256 here; K * 2**-24 < 1.6e-5).
"""

import functools

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_blockscale as jb
from jax_blockscale import reference

_ELEM_DTYPE = {
    "mxfp8_e4m3": ml_dtypes.float8_e4m3fn,
    "mxfp8_e5m2": ml_dtypes.float8_e5m2,
    "mxfp6_e2m3": ml_dtypes.float6_e2m3fn,
    "mxfp6_e3m2": ml_dtypes.float6_e3m2fn,
    "mxfp4": ml_dtypes.float4_e2m1fn,
    "nvfp4": ml_dtypes.float4_e2m1fn,
    "fp8_block": ml_dtypes.float8_e4m3fn,
}


def np_dequant(q) -> np.ndarray:
    """float64 numpy dequantization of a BlockScaledArray from its codes."""
    fmt = q.fmt
    v = np.moveaxis(np.asarray(q.values), q.axis, -1)
    if v.dtype == np.uint8:
        if fmt.elements_per_byte == 2:
            v = np.stack([v & 0xF, v >> 4], axis=-1).reshape(*v.shape[:-1], v.shape[-1] * 2)
        v = v.view(_ELEM_DTYPE[fmt.name])
    vals = v.astype(np.float64)
    s = np.moveaxis(np.asarray(q.scales), q.axis, -1)
    if fmt.name == "nvfp4":
        s = s.astype(np.float64) * np.float64(np.asarray(q.tensor_scale))
    elif fmt.name == "fp8_block":
        s = s.astype(np.float64)
        if fmt.tile[0] > 1:
            s = np.repeat(s, fmt.tile[0], axis=-2)[..., : vals.shape[-2], :]
    else:
        s = s.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)
    s = np.repeat(s, fmt.block, axis=-1)
    assert s.shape == vals.shape
    return np.moveaxis((vals * s)[..., : q.length], -1, q.axis)


def _prep(x, spec):
    kind, arg = spec
    if kind == "dense":
        return x.astype(arg)
    return jb.quantize(x, kind, block=arg)


@functools.partial(jax.jit, static_argnames=("sa", "sb", "out_dtype"))
def _quantize_and_matmul(xa, xb, sa, sb, out_dtype=jnp.float32):
    a, b = _prep(xa, sa), _prep(xb, sb)
    return a, b, reference.matmul(a, b, out_dtype=out_dtype)


@functools.partial(jax.jit, static_argnames=("sa", "sb"))
def _quantize_dequantize_matmul(xa, xb, sa, sb):
    a, b = _prep(xa, sa), _prep(xb, sb)
    deq = lambda q: jb.dequantize(q) if isinstance(q, jb.BlockScaledArray) else q  # noqa: E731
    return a, b, deq(a), deq(b), reference.matmul(a, b)


def _as_np(x):
    if isinstance(x, jb.BlockScaledArray):
        return np_dequant(x)
    return np.asarray(x).astype(np.float64)


def _check(got, a, b):
    A, B = _as_np(a), _as_np(b)
    want = np.einsum("...mk,...nk->...mn", A, B)
    bound = 2e-5 * np.einsum("...mk,...nk->...mn", np.abs(A), np.abs(B)) + 1e-30
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape
    err = np.abs(got - want)
    assert np.all(err <= bound), f"max excess {np.max(err - bound)}"
    assert np.any(want != 0)
    return want


def _data(shape, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp(rng.uniform(-2, 2, size=shape))
    return (x * 2.0 ** rng.integers(-6, 6, size=shape[:-1] + (1,))).astype(np.float32)


MX = lambda name: (name, None)  # noqa: E731
DENSE = lambda dt: ("dense", dt)  # noqa: E731

# (a spec, b spec, (M, N, K)): every format, mixed pairs, dense operands, and odd sizes 1, 7, 33, 129.
PAIRS = [
    (MX("mxfp8"), MX("mxfp8"), (7, 33, 129)),
    (MX("mxfp8_e5m2"), MX("mxfp8_e5m2"), (33, 7, 40)),
    (MX("mxfp6_e2m3"), MX("mxfp6_e3m2"), (1, 129, 33)),
    (MX("mxfp4"), MX("mxfp4"), (129, 1, 7)),
    (MX("nvfp4"), MX("nvfp4"), (7, 7, 129)),
    (MX("mxfp8"), MX("mxfp4"), (33, 33, 64)),
    (DENSE(jnp.bfloat16), MX("mxfp4"), (7, 33, 70)),
    (("fp8_block", (1, 128)), ("fp8_block", (128, 128)), (33, 129, 200)),
    (DENSE(jnp.float32), MX("nvfp4"), (1, 7, 33)),
    (MX("mxfp4"), DENSE(jnp.float16), (33, 1, 129)),
    (MX("nvfp4"), MX("mxfp8_e5m2"), (7, 129, 1)),
    (("fp8_block", (1, 128)), MX("mxfp6_e2m3"), (129, 7, 33)),
    (DENSE(jnp.float32), DENSE(jnp.bfloat16), (7, 1, 7)),
]


def _pair_id(p):
    fa, fb, mnk = p
    def name(s):
        if s[0] == "dense":
            return jnp.dtype(s[1]).name
        return s[0] + (str(s[1]) if s[0] == "fp8_block" else "")

    return f"{name(fa)}-x-{name(fb)}-{mnk}"


@pytest.mark.parametrize("sa, sb, mnk", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_matmul_matches_float64_product(sa, sb, mnk):
    m, n, k = mnk
    xa, xb = _data((m, k), seed=m * 1000 + k), _data((n, k), seed=n * 1000 + k + 1)
    a, b, da, db, out = _quantize_dequantize_matmul(xa, xb, sa, sb)
    assert out.shape == (m, n) and out.dtype == jnp.float32
    for q, d, x in ((a, da, xa), (b, db, xb)):
        if isinstance(q, jb.BlockScaledArray):
            assert q.shape == x.shape and q.axis == -1
            # The numpy decoding agrees with the package's dequantize (up to nvfp4's float32 scale product).
            np.testing.assert_allclose(np.asarray(d), np_dequant(q), rtol=2**-23, atol=0)
    _check(out, a, b)


def test_batched_operands_and_broadcasting():
    xa = _data((2, 3, 7, 40), seed=1)
    xb = _data((33, 40), seed=2)
    xb3 = _data((3, 33, 40), seed=3)
    sa, sb = MX("mxfp4"), MX("mxfp8")
    a, b, out = _quantize_and_matmul(xa, xb, sa, sb)
    assert out.shape == (2, 3, 7, 33)
    want = _check(out, a, b)
    # The batch entries are independent products.
    np.testing.assert_allclose(want[1, 2], np_dequant(a)[1, 2] @ np_dequant(b).T, rtol=1e-12)
    # b with its own batch dims broadcasts against a's.
    a, b3, out3 = _quantize_and_matmul(xa, xb3, sa, MX("nvfp4"))
    assert out3.shape == (2, 3, 7, 33)
    _check(out3, a, b3)


def test_out_dtype():
    xa, xb = _data((7, 64), seed=4), _data((33, 64), seed=5)
    sa, sb = MX("mxfp8"), MX("mxfp4")
    _, _, out32 = _quantize_and_matmul(xa, xb, sa, sb)
    _, _, out16 = _quantize_and_matmul(xa, xb, sa, sb, out_dtype=jnp.bfloat16)
    assert out16.dtype == jnp.bfloat16 and out16.shape == (7, 33)
    np.testing.assert_array_equal(
        np.asarray(out16).astype(np.float32), np.asarray(out32.astype(jnp.bfloat16)).astype(np.float32)
    )


def test_eager_jit_vmap_agree():
    # The package's CPU tests share (64, 64) operands, so eager dequantize is cheap here.
    xa, xb = _data((64, 64), seed=6), _data((64, 64), seed=7)
    xa[3, 10] = np.nan  # a NaN block of a: row 3 of the product is NaN, nothing else
    a, b, _ = _quantize_and_matmul(xa, xb, MX("mxfp4"), MX("mxfp8"))
    eager = np.asarray(reference.matmul(a, b))  # the one eager call
    assert np.all(np.isnan(eager[3])) and np.all(np.isfinite(np.delete(eager, 3, axis=0)))
    _check(np.delete(eager, 3, axis=0), np.delete(np_dequant(a), 3, axis=0), b)
    jitted = np.asarray(jax.jit(reference.matmul)(a, b))
    np.testing.assert_array_equal(jitted, eager)
    # vmap over a stack of quantized a's (quantized under vmap) against one b, and over dense b's.
    xs = np.stack([xa, xa * 2, -xa])

    @jax.jit
    def run(xs, b, xbs):
        qa = jax.vmap(lambda v: jb.quantize(v, "mxfp4"))(xs)
        return (
            jax.vmap(reference.matmul, in_axes=(0, None))(qa, b),
            jax.vmap(reference.matmul, in_axes=(None, 0))(a, xbs),
            jax.vmap(lambda v: reference.matmul(jb.quantize(v, "nvfp4"), b))(xs),
        )

    xbs = np.stack([xb, xb[::-1]])
    va, vb, vn = run(xs, b, xbs)
    assert va.shape == (3, 64, 64) and vb.shape == (2, 64, 64)
    np.testing.assert_array_equal(np.asarray(va)[0], eager)
    for i in range(3):
        np.testing.assert_array_equal(np.isnan(np.asarray(va)[i]), np.isnan(eager))
    np.testing.assert_array_equal(np.asarray(va)[1], eager * 2)  # power-of-two scaling is exact in MX
    mm = jax.jit(reference.matmul)
    np.testing.assert_array_equal(np.asarray(vb)[0], np.asarray(mm(a, xb)))
    np.testing.assert_array_equal(np.asarray(vb)[1], np.asarray(mm(a, xb[::-1])))
    # nvfp4 under vmap: each slice has its own tensor scale.
    quant_nv = jax.jit(lambda v: jb.quantize(v, "nvfp4"))
    for i in range(3):
        np.testing.assert_array_equal(np.asarray(vn)[i], np.asarray(mm(quant_nv(xs[i]), b)))


def test_errors():
    x = np.ones((32, 32), np.float32)
    qa = jax.eval_shape(lambda v: jb.quantize(v, "mxfp8"), x)  # shapes only: nothing is computed
    q_rows = jax.eval_shape(lambda v: jb.quantize(v, "mxfp8", axis=0), x)
    q_k64 = jax.eval_shape(lambda v: jb.quantize(v, "mxfp4"), np.ones((8, 64), np.float32))

    def mm(a, b):
        return jax.eval_shape(reference.matmul, a, b)

    with pytest.raises(ValueError, match="contraction sizes differ"):
        mm(qa, q_k64)
    with pytest.raises(ValueError, match="contraction sizes differ"):
        mm(x, np.ones((4, 33), np.float32))
    with pytest.raises(ValueError, match=r"a is quantized along axis -2.*axis=-1"):
        mm(q_rows, qa)
    with pytest.raises(ValueError, match=r"b is quantized along axis -2.*axis=-1"):
        mm(qa, q_rows)
    with pytest.raises(TypeError, match=r"a must be a BlockScaledArray or a float32/bfloat16/float16 .*int32"):
        mm(np.ones((4, 32), np.int32), qa)
    with pytest.raises(TypeError, match=r"b must be a BlockScaledArray.*got uint8"):
        mm(qa, np.ones((4, 32), np.uint8))
    with pytest.raises(ValueError, match=r"\(\.\.\., M, K\)"):
        mm(np.ones(32, np.float32), qa)
    with pytest.raises(ValueError, match="do not broadcast"):
        mm(np.ones((2, 4, 32), np.float32), np.ones((3, 4, 32), np.float32))
    assert reference.operand_shape(qa) == (32, 32)
    assert reference.check_operands(qa, q_rows) == ((32, 32), (32, 32))
