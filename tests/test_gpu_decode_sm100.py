"""GPU numerics of the Blackwell decode path (_triton/decode_sm100.py): `launch` against the
dequantize-then-matmul oracle, at 1-64 activation rows.

Runs where jax sees a CUDA GPU of compute capability >= 10, or on sm_90 (H100 / H200) with
JAX_BLOCKSCALE_EMULATED_DOT_SCALED=1, where Triton 3.6 emulates `dot_scaled` (bf16 upcast + wgmma): that
checks the swapped operands, the activations' one padded tile, the split-K sum and the transposed product,
though not tcgen05 itself; nvfp4 has no emulation and is skipped there (as in test_gpu_nvidia_kernels.py).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_blockscale as jb
from jax_blockscale import reference

from test_gpu_nvidia_kernels import CC, EMULATED, _FORMAT_OF_KIND  # noqa: E402 - skips this module as it does

pytestmark = pytest.mark.gpu

from jax_blockscale._triton import decode_sm100  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402


def _check(x_kind: str, w_kind: str, *, batch: int, m: int, n: int, k: int, out_dtype: str = "fp32",
           config: TileConfig | None = None) -> None:
    if EMULATED and "nvfp4" in (x_kind, w_kind):
        pytest.skip("Triton 3.6 has no sm_90 emulation of nvfp4 dot_scaled")
    p = GemmProblem(batch, False, m, n, k, x_kind, w_kind, out_dtype)
    config = config or decode_sm100.default_config(p)
    kx, kw = jax.random.split(jax.random.PRNGKey(zlib.crc32(f"{x_kind}{w_kind}{m}{n}{k}".encode())))
    x = jb.quantize(jax.random.normal(kx, (batch, m, k), jnp.float32), _FORMAT_OF_KIND[x_kind])
    w = jb.quantize(jax.random.normal(kw, (n, k), jnp.float32), _FORMAT_OF_KIND[w_kind])
    alpha = jnp.ones((1,), jnp.float32)
    for ts in (x.tensor_scale, w.tensor_scale):
        alpha = alpha if ts is None else alpha * ts
    run = jax.jit(lambda *xs: decode_sm100.launch(p, *xs, config=config, compute_capability=CC))
    out = run(x.values, x.scales, w.values, w.scales, alpha)
    assert out.shape == (batch, m, n)
    want = np.asarray(reference.matmul(x, w, jnp.float32))
    got = np.asarray(out.astype(jnp.float32))
    rtol = 1e-5 if out_dtype == "fp32" else 1e-2
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * (np.abs(want).max() + 1e-30))


@pytest.mark.parametrize("x_kind,w_kind", sorted(decode_sm100.SUPPORTED))
def test_every_pair_at_16_rows(x_kind, w_kind):
    _check(x_kind, w_kind, batch=2, m=8, n=1000, k=1024)


@pytest.mark.parametrize("x_kind,w_kind", [("e4m3", "e2m1"), ("e4m3", "e4m3"), ("e2m1", "e2m1"), ("nvfp4", "nvfp4")])
@pytest.mark.parametrize("batch,m,n,k,out_dtype", [
    (1, 1, 7168, 4096, "bf16"),   # one row, the default split-K (2 splits of 56 weight tiles)
    (1, 64, 520, 2048, "fp32"),   # 64 rows: the activations' one 128-row tile half used
    (3, 7, 384, 7168, "bf16"),    # a folded batch of 21 rows, K = 7168
])
def test_shapes(x_kind, w_kind, batch, m, n, k, out_dtype):
    _check(x_kind, w_kind, batch=batch, m=m, n=n, k=k, out_dtype=out_dtype)


def test_named_through_matmul_on_blackwell():
    """On an sm_100 GPU jb.matmul of mxfp8 x mxfp4 at 16 rows with the kernel named runs this path."""
    if CC < 100:
        pytest.skip("the dispatch entry is sm_100's")
    x = jb.quantize_operand(jax.random.normal(jax.random.key(0), (16, 1024)), "mxfp8", side="a")
    w = jb.quantize_operand(jax.random.normal(jax.random.key(1), (768, 1024)), "mxfp4", side="b")
    config = decode_sm100.default_config(GemmProblem(1, False, 16, 768, 1024, "e4m3", "e2m1", "bf16"))
    got = jax.jit(lambda x, w: jb.matmul(x, w, config=config.replace(kernel="decode_sm100")))(x, w)
    want = np.asarray(reference.matmul(x, w, jnp.float32))
    np.testing.assert_allclose(np.asarray(got.astype(jnp.float32)), want, rtol=1e-2, atol=1e-2 * np.abs(want).max())
