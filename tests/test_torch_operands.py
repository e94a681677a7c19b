"""benchmarks/_torch.py's operand plumbing, on a CPU, against a numpy stand-in for torch.

The stand-in implements only what `_Set` and `_attempts` call (DLPack in, clone, transpose, as_strided) and a
`_scaled_mm` that accepts exactly the layouts torch's ScaledBlas.cpp accepts (restated in
`_cublas_layout`) and then computes the blockwise product as cuBLAS defines it. Every attempt that the
stand-in accepts must reproduce `jb.reference.matmul` on the same quantized operands: the direct problem and
the swapped one, M = 1 (padded to 4), N with a half-full last 128-row block, K with 5 blocks (padded stride).
"""

import pathlib
import sys
import types

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax_blockscale as jb  # noqa: E402
from benchmarks import _cublas_layout as cl  # noqa: E402
from benchmarks import _torch  # noqa: E402


class FakeTensor:
    def __init__(self, arr):
        self.arr = arr

    shape = property(lambda self: self.arr.shape)

    def stride(self):
        return tuple(s // self.arr.itemsize for s in self.arr.strides)

    def cuda(self):
        return self

    def clone(self):
        return FakeTensor(self.arr.copy())

    def contiguous(self):
        return FakeTensor(np.ascontiguousarray(self.arr))

    def t(self):
        return FakeTensor(self.arr.T)

    def view(self, dtype):
        assert dtype == "e4m3"
        return FakeTensor(self.arr.view(ml_dtypes.float8_e4m3fn))

    def as_strided(self, shape, strides):
        assert self.arr.flags["C_CONTIGUOUS"], "as_strided is only used on fresh storage"
        return FakeTensor(np.lib.stride_tricks.as_strided(self.arr, shape, [s * self.arr.itemsize for s in strides]))

    def __getitem__(self, idx):
        return FakeTensor(self.arr[idx])


def _expand(scales, rows_per_scale, k):
    return np.repeat(np.repeat(scales, rows_per_scale, axis=0), 128, axis=1)[:, :k]


def _side(t, s, t_shape, s_shape, s_strides):
    """t (R, K) e4m3 times its scales, if (t, s) is a 1x128 or 128x128 layout torch accepts, else None."""
    r, k = t_shape
    if cl.accepts_1x128(t_shape, s_shape, s_strides):
        return t.astype(np.float32) * _expand(s, 1, k)
    if cl.accepts_128x128(t_shape, s_shape, s_strides):
        return t.astype(np.float32) * _expand(s, 128, k)[:r]
    return None


def _scaled_mm(a, b, sa, sb, out_dtype=None):
    """torch._scaled_mm for blockwise scales: a (M, K) @ b (K, N); b and scale_b are checked transposed."""
    bt, sbt = b.arr.T, sb.arr.T
    lhs = _side(a.arr, sa.arr, a.shape, sa.shape, sa.stride())
    rhs = _side(bt, sbt, bt.shape, sbt.shape, (sb.stride()[1], sb.stride()[0]))
    if lhs is None or rhs is None:
        raise RuntimeError("Invalid scaling configuration")
    return FakeTensor((lhs @ rhs.T).astype(np.float32))


def fake_torch():
    t = types.SimpleNamespace(float8_e4m3fn="e4m3", bfloat16="bf16")
    t.from_dlpack = lambda x: FakeTensor(np.asarray(x))
    t.from_numpy = FakeTensor
    t.cuda = types.SimpleNamespace(synchronize=lambda: None)
    t._scaled_mm = _scaled_mm
    t.nn = types.SimpleNamespace(functional=types.SimpleNamespace())  # no F.scaled_mm: the v1 entry point
    return t


@pytest.mark.parametrize("m, n, k", [(1, 256, 384), (16, 320, 640), (6, 2112, 512)])
def test_every_accepted_attempt_matches_the_reference(m, n, k):
    kx, kw = jax.random.split(jax.random.key(m * n + k))
    qa = jb.quantize_operand(jax.random.normal(kx, (m, k), jnp.bfloat16), "fp8_block", side="a")
    qb = jb.quantize_operand(jax.random.normal(kw, (n, k), jnp.bfloat16), "fp8_block", side="b")
    ref = np.asarray(jb.reference.matmul(qa, qb), np.float32)
    torch = fake_torch()
    s = _torch._Set(torch, qa, qb)
    assert s.a.shape == (cl.padded_m(m), k) and s.b.shape == (k, n) and s.b.stride() == (1, k)
    labels = [v.label for v in cl.scale_b_variants(np.asarray(qb.scales), n, k)]
    ran = []
    for tag, attempt in _torch._attempts(torch, labels):
        try:
            y = attempt(s)
        except RuntimeError:
            continue
        y = y.arr[:m]
        rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        assert rel < 1e-5, (tag, rel)
        ran.append(tag)
    assert ran[0] == ("torch._scaled_mm" if len(labels) == 1 else f"torch._scaled_mm [{labels[0]}]")
    assert "torch._scaled_mm swapped (w @ x^T)^T" in ran
    if cl.ceil_div(k, 128) % 4:  # the older layouts are rejected by the current checks
        assert len(ran) == 2
