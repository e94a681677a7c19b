"""GPU tests of 16-bit activations x block FP8 weights (`_triton/dense_x_block_fp8.py`) against the jnp reference.

Skipped without an NVIDIA GPU. Operands and tolerance as tests/test_gpu_hopper_kernels.py (the products are exact
and summed in fp32: the bf16 MMA floor, or the output's rounding): odd shapes that leave partial tiles and a partial
128-row scale tile, one row to large M, both operand orders, split-K, batched weights, fp16 activations, every output
type; and `jb.matmul` as dispatched, against the reference, at decode and large sizes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jax_blockscale._triton.problem import GemmProblem, TileConfig

from test_gpu_hopper_kernels import assert_close, capability, check  # noqa: F401

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def dense_x(capability):
    from jax_blockscale._triton import dense_x_block_fp8

    return dense_x_block_fp8


def problem(batch, b_batched, m, n, k, x="bf16", out="bf16") -> GemmProblem:
    return GemmProblem(batch, b_batched, m, n, k, x, "block_fp8", out)


@pytest.mark.parametrize("m,n,k", [(1, 333, 256), (7, 200, 384), (64, 520, 768), (65, 520, 768), (300, 1100, 1024),
                                   (1000, 4100, 512)])
def test_odd_shapes(dense_x, capability, m, n, k):
    check(dense_x, problem(2, False, m, n, k), capability)


@pytest.mark.parametrize("m", [1, 129])
def test_batched_weights(dense_x, capability, m):
    check(dense_x, problem(3, True, m, 200, 384), capability)


@pytest.mark.parametrize("x,out", [("fp16", "bf16"), ("bf16", "fp16"), ("bf16", "fp32"), ("fp16", "fp32")])
def test_activation_and_output_types(dense_x, capability, x, out):
    check(dense_x, problem(1, False, 200, 300, 512, x, out), capability)


@pytest.mark.parametrize("x", ["bf16", "fp16"])
def test_widened_first_at_large_m(dense_x, capability, x):
    p = problem(1, False, 2100, 600, 1024, x)
    assert dense_x.default_config(p).widen_first
    check(dense_x, p, capability)


@pytest.mark.parametrize("config", [
    TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3, swap_ab=False),
    TileConfig(block_m=64, block_n=64, block_k=128, group_m=4, num_warps=4, num_stages=4, swap_ab=True, split_k=3),
    TileConfig(block_m=256, block_n=64, block_k=128, group_m=8, num_warps=8, num_stages=2, swap_ab=True),
    TileConfig(block_m=64, block_n=16, block_k=64, group_m=1, num_warps=4, num_stages=4, swap_ab=True, split_k=2),
    # the codes widened by XLA before the kernel (the default from 2048 rows on sm_90), both operand orders
    TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3, swap_ab=True,
               widen_first=True),
    TileConfig(block_m=64, block_n=128, block_k=128, group_m=4, num_warps=4, num_stages=3, swap_ab=False, split_k=2,
               widen_first=True),
])
def test_configs(dense_x, capability, config):
    check(dense_x, problem(1, False, 37, 700, 1024), capability, config)


@pytest.mark.parametrize("rows", [1, 4, 16, 64, 256, 2048])
def test_matmul_as_dispatched(capability, rows):
    import jax_blockscale as jb

    kx, kw = jax.random.split(jax.random.key(rows))
    x = jax.random.normal(kx, (rows, 2048), jnp.float32).astype(jnp.bfloat16)
    w = jb.quantize_operand(jax.random.normal(kw, (1536, 2048), jnp.float32) / 45.0, "fp8_block", side="b")
    assert jb.explain(x, w).path != "reference"
    out = jax.jit(lambda x, w: jb.matmul(x, w, out_dtype=jnp.float32))(x, w)
    assert_close(out, jb.reference.matmul(x, w, out_dtype=jnp.float32), 5e-5)
