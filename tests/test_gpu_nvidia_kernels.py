"""GPU numerics of the Blackwell dot_scaled kernel: `launch` vs the dequantize-then-matmul oracle.

Runs where jax sees a CUDA GPU of compute capability >= 10 (B200/B300). With
JAX_BLOCKSCALE_EMULATED_DOT_SCALED=1 it also runs on sm_90 (H100/H200), where Triton 3.6 emulates
dot_scaled by upcasting the MX operands to bf16: that checks this kernel's addressing, scale unpacking,
masks, batching and split-K, though not tcgen05 itself; nvfp4 has no emulation and is skipped there.
Elsewhere every test is skipped.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_blockscale
from jax_blockscale import reference

pytestmark = pytest.mark.gpu

_EMULATED_ENV = "JAX_BLOCKSCALE_EMULATED_DOT_SCALED"
_FORMAT_OF_KIND = {"e4m3": "mxfp8_e4m3", "e5m2": "mxfp8_e5m2", "e2m3": "mxfp6_e2m3", "e3m2": "mxfp6_e3m2",
                   "e2m1": "mxfp4", "nvfp4": "nvfp4"}
_DENSE_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16}
_OUT_DTYPES = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}


def _compute_capability() -> int | None:
    try:
        gpus = jax.devices("gpu")
    except RuntimeError:
        return None
    cc = getattr(gpus[0], "compute_capability", None) if gpus else None
    if cc is None:
        return None
    major, minor = str(cc).split(".")
    return int(major) * 10 + int(minor)


CC = _compute_capability()
EMULATED = CC is not None and 90 <= CC < 100 and os.environ.get(_EMULATED_ENV) == "1"
if CC is None or (CC < 100 and not EMULATED):
    pytest.skip(f"needs a CUDA GPU with compute capability >= 10 (or sm_90 with {_EMULATED_ENV}=1); "
                f"found {CC}", allow_module_level=True)
pytest.importorskip("triton")

from jax_blockscale._triton import dot_scaled_nvidia as nv  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402


def _operand(key, kind: str, shape: tuple[int, ...]):
    """(values, scales, tensor_scale, oracle operand) of one side, in the contract's layouts."""
    x = jax.random.normal(key, shape, jnp.float32)
    if kind in _DENSE_DTYPES:
        dense = x.astype(_DENSE_DTYPES[kind])
        return dense, jnp.zeros(shape[:-1] + (1,), jnp.uint8), None, dense
    q = jax_blockscale.quantize(x, _FORMAT_OF_KIND[kind])
    return q.values, q.scales, q.tensor_scale, q


def _check(a_kind: str, b_kind: str, *, batch: int = 2, m: int = 129, n: int = 200, k: int = 1056,
           b_batched: bool = False, out_dtype: str = "fp32", config: TileConfig | None = None,
           transpose_out: bool = False) -> None:
    if EMULATED and "nvfp4" in (a_kind, b_kind):
        pytest.skip("Triton 3.6 has no sm_90 emulation of nvfp4 dot_scaled")
    p = GemmProblem(batch, b_batched, m, n, k, a_kind, b_kind, out_dtype)
    config = config or nv.default_config(p)
    ka, kb = jax.random.split(jax.random.PRNGKey(zlib.crc32(f"{a_kind}{b_kind}{m}{n}".encode())))
    a_values, a_scales, a_ts, a_ref = _operand(ka, a_kind, (batch, m, k))
    b_values, b_scales, b_ts, b_ref = _operand(kb, b_kind, ((batch,) if b_batched else ()) + (n, k))
    alpha = jnp.ones((1,), jnp.float32)
    for ts in (a_ts, b_ts):
        alpha = alpha if ts is None else alpha * ts

    run = jax.jit(lambda *xs: nv.launch(p, *xs, config=config, compute_capability=CC, transpose_out=transpose_out))
    out = run(a_values, a_scales, b_values, b_scales, alpha)
    assert out.shape == ((1, n, m) if transpose_out else (batch, m, n)) and out.dtype == _OUT_DTYPES[out_dtype]

    want = np.asarray(reference.matmul(a_ref, b_ref, jnp.float32))
    if transpose_out:
        want = np.swapaxes(want, -1, -2)
    got = np.asarray(out.astype(jnp.float32))
    # Products of dequantized operands are exact in fp32; only the summation order differs (plus the
    # final rounding for 16-bit outputs). Errors are measured against the row's magnitude.
    rtol = 1e-5 if out_dtype == "fp32" else 1e-2
    scale = np.abs(want).max() + 1e-30
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale)


@pytest.mark.parametrize("a_kind,b_kind", sorted(nv.SUPPORTED))
def test_every_supported_pair(a_kind, b_kind):
    _check(a_kind, b_kind)


@pytest.mark.parametrize("a_kind,b_kind", [("e4m3", "e4m3"), ("e4m3", "e2m1"), ("e2m1", "e2m1"),
                                           ("nvfp4", "nvfp4"), ("bf16", "e2m1")])
@pytest.mark.parametrize("shape", [
    dict(batch=1, m=1, n=384, k=4096),                    # decode: default split-K > 1
    dict(batch=3, m=129, n=130, k=512, b_batched=True),   # batched B: grid axis 1
    dict(batch=2, m=64, n=256, k=1024, out_dtype="bf16"),
    dict(batch=1, m=300, n=513, k=2048, out_dtype="fp16"),
], ids=["decode", "batched", "bf16_out", "fp16_out"])
def test_shapes(a_kind, b_kind, shape):
    _check(a_kind, b_kind, **shape)


@pytest.mark.parametrize("config", [
    TileConfig(block_m=128, block_n=256, block_k=128, num_warps=8, num_stages=3, split_k=3),
    TileConfig(block_m=256, block_n=128, block_k=256, num_warps=8, num_stages=2, group_m=1),
], ids=["bn256_split3", "bm256_bk256"])
def test_other_tiles(config):
    _check("e4m3", "e2m1", batch=2, m=300, n=260, k=1056, config=config)


@pytest.mark.parametrize("a_kind,b_kind", [("e4m3", "e4m3"), ("e4m3", "e2m1"), ("nvfp4", "nvfp4")])
@pytest.mark.parametrize("m,n,k,out_dtype", [(129, 200, 1056, "bf16"), (16, 7168, 4096, "fp32")],
                         ids=["ragged", "decode_split_k"])
def test_transposed_output(a_kind, b_kind, m, n, k, out_dtype):
    """transpose_out (OUT_T): the (N, M) product stored by the kernel, ragged and with split-K partials."""
    _check(a_kind, b_kind, batch=1, m=m, n=n, k=k, out_dtype=out_dtype, transpose_out=True)


def test_default_split_k_is_used_for_decode():
    p = GemmProblem(1, False, 1, 384, 4096, "e4m3", "e4m3", "bf16")
    assert nv.default_config(p).split_k > 1
