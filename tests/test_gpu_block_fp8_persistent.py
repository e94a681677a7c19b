"""GPU tests of the persistent Hopper block FP8 kernel (block_fp8_persistent.py) against the jnp reference.

Skipped without an sm_90 GPU (the kernel is Hopper-only: warp specialization and wgmma). Same operands,
tolerance and checks as tests/test_gpu_hopper_kernels.py (fp8 MMA accumulation floor 5e-4 relative), on
shapes the tiles do not divide: one row, ragged M/N/K tails, batched weights, fp16/fp32 outputs, more
tiles than programs (each program walks several tiles) and every switch of the sweep.
"""

from __future__ import annotations

import numpy as np
import pytest

from jax_blockscale._triton.problem import GemmProblem, TileConfig

from test_gpu_hopper_kernels import assert_close, capability, check, make_case, run, tolerance  # noqa: F401

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def persistent(capability):
    if capability != 90:
        pytest.skip("the persistent block FP8 kernel is for sm_90 (Hopper)")
    from jax_blockscale._triton import block_fp8_persistent

    return block_fp8_persistent


def fp8(batch, b_batched, m, n, k, out="bf16") -> GemmProblem:
    return GemmProblem(batch, b_batched, m, n, k, "block_fp8", "block_fp8", out)


@pytest.mark.parametrize("m,n,k", [(1, 333, 256), (7, 200, 384), (129, 520, 768), (1000, 1100, 1024),
                                   (300, 4100, 256)])
def test_odd_shapes(persistent, capability, m, n, k):
    # N = 333 / 1100: output rows not 16-byte aligned, the pointer store; 520 / 200 / 4100: the TMA store.
    check(persistent, fp8(2, False, m, n, k), capability)


@pytest.mark.parametrize("m", [1, 129])
def test_batched_weights(persistent, capability, m):
    check(persistent, fp8(3, True, m, 200, 384), capability)


@pytest.mark.parametrize("out", ["fp16", "fp32"])
def test_out_dtypes(persistent, capability, out):
    check(persistent, fp8(2, False, 129, 200, 512, out), capability)


def test_k_one_block(persistent, capability):
    # K = 128: the unspecialized persistent loop (the specializer cannot take a one-step K loop).
    check(persistent, fp8(1, False, 300, 256, 128), capability)


CONFIGS = [
    TileConfig(persistent=True, num_warps=8, num_stages=4),
    TileConfig(persistent=True, num_warps=8, num_stages=4, flatten=True),
    TileConfig(persistent=True, num_warps=8, num_stages=4, prefetch_scales=True),
]


@pytest.mark.parametrize("config", CONFIGS, ids=str)
def test_configs(persistent, capability, config):
    # 1300 x 1000: 11 x 8 = 88 tiles of 128 x 128 with ragged last row/column tiles; K = 1024 has 8 blocks
    # whose live data ends inside block 2 (make_case zero-pads K past 200 columns).
    check(persistent, fp8(1, False, 1300, 1000, 1024, "fp32"), capability, config)


def test_full_k_matches_old_kernel(persistent, capability):
    """Every K block live (no zero padding), a shape of the issue: the same tolerance as the old kernel,
    and both kernels within it of each other."""
    from jax_blockscale._triton import block_fp8

    p = fp8(1, False, 2048, 4096, 1536)
    operands, ref = make_case(p, k_live=p.k)
    new = run(persistent, p, operands, capability)
    old = run(block_fp8, p, operands, capability)
    assert_close(new, ref, tolerance(p))
    assert_close(new, old.astype(np.float32), tolerance(p))


def test_bitwise_deterministic(persistent, capability):
    p = fp8(1, False, 1024, 1024, 2048)
    operands, _ = make_case(p, k_live=p.k)
    first = np.asarray(run(persistent, p, operands, capability))
    second = np.asarray(run(persistent, p, operands, capability))
    assert np.array_equal(first.view(np.uint16), second.view(np.uint16))



@pytest.fixture(scope="module")
def gluon(capability):
    if capability != 90:
        pytest.skip("the Gluon block FP8 kernel is for sm_90 (Hopper wgmma)")
    from jax_blockscale._triton import block_fp8_gluon

    return block_fp8_gluon


@pytest.mark.parametrize("m,n,k,out,sms,tile", [
    (1, 333, 256, "fp32", 132, ""),          # one row; N = 333: rows not 16-byte aligned, the pointer store;
                                             # a light last column of 128 (light_columns)
    (300, 520, 768, "bf16", 132, ""),        # a light last column of 64: 8 of its 256 columns live
    (129, 200, 384, "fp16", 132, ""),        # a 256-wide tile whose second weight block does not exist
    (1000, 1100, 128, "fp32", 132, ""),      # one K block; fp32 subtiles: one epilogue buffer per consumer
    (777, 336, 1152, "fp32", 5, ""),         # more tiles than programs: the loads run ahead across tiles, from
                                             # full tiles into light ones and from light to light
    (300, 520, 768, "bf16", 7, "128x128:s4"),  # 128-wide tiles, light ones of 64 columns after them
    (650, 1040, 512, "bf16", 3, "s4"),       # 4 stages: one output buffer reused for both subtiles
    (200, 64, 384, "bf16", 132, ""),         # N = 64: light tiles only; 3 K blocks: a stage of two, one of one
    (520, 2112, 640, "bf16", 3, ""),         # DeepSeek-V3's N = 2112: light tiles of 64, several per program
])
def test_gluon_kernel(gluon, capability, m, n, k, out, sms, tile):
    p = fp8(2, False, m, n, k, out)
    config = gluon.WIDE_TILES.replace(num_sms=sms)  # tiny problems would get narrow tiles by default
    if "128x128" in tile:
        config = config.replace(block_n=128)
    if "s4" in tile:
        config = config.replace(num_stages=4)
    check(gluon, p, capability, config)


def test_gluon_default_tiles_at_n_2112(gluon, capability):
    """N = 2112 (DeepSeek-V3's q/kv down projection) at M = 2048: default_config keeps 128 x 256 tiles, whose
    last column is light (64 columns multiplied), and they give the reference's result through the
    dispatched path's launch."""
    p = fp8(1, False, 2048, 2112, 1024)
    assert gluon.default_config(p) == gluon.WIDE_TILES and gluon.light_columns(p.n, 256) == 64
    check(gluon, p, capability)


def test_gluon_default_narrow_tiles(gluon, capability):
    """3072 x 2048: 128 x 128 tiles fill the waves better (default_config), through the dispatched launch."""
    p = fp8(1, False, 3072, 2048, 512)
    assert gluon.default_config(p) == gluon.NARROW_TILES
    check(gluon, p, capability)


def test_gluon_full_k_matches_persistent_and_is_deterministic(gluon, persistent, capability):
    p = fp8(1, False, 2048, 2048, 1536)
    operands, ref = make_case(p, k_live=p.k)
    new = run(gluon, p, operands, capability)
    assert_close(new, ref, tolerance(p))
    assert_close(new, run(persistent, p, operands, capability).astype(np.float32), tolerance(p))
    again = run(gluon, p, operands, capability)
    assert np.array_equal(np.asarray(new).view(np.uint16), np.asarray(again).view(np.uint16))


@pytest.mark.parametrize("tiles", ["WIDE_TILES", "NARROW_TILES"])
@pytest.mark.parametrize("m,n,k,out", [
    (2048, 2304, 1024, "bf16"),   # the TMA store through a transposed shared buffer
    (1000, 1100, 384, "fp32"),    # ragged tiles; M * 4 bytes is 16-byte aligned: TMA, clipped at both ends
    (333, 520, 256, "bf16"),      # M = 333: (N, M) rows not 16-byte aligned, the pointer store
])
def test_gluon_transposed_output_is_the_product_transposed(gluon, capability, m, n, k, out, tiles):
    """transpose_out: the (N, M) output holds the plain product's bits, transposed; both tile widths
    default_config picks between."""
    import functools

    import jax

    p = fp8(1, False, m, n, k, out)
    config = getattr(gluon, tiles)
    operands, ref = make_case(p)
    plain = run(gluon, p, operands, capability, config)
    assert_close(plain, ref, tolerance(p))
    plain = np.asarray(plain)
    fn = jax.jit(functools.partial(gluon.launch, p, config=config, compute_capability=capability,
                                   transpose_out=True))
    got = np.asarray(fn(*operands))
    assert got.shape == (1, n, m)
    assert np.array_equal(np.ascontiguousarray(got[0].T).view(np.uint8), plain[0].view(np.uint8))
