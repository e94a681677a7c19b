"""benchmarks/_cublas_layout.py: the scale tensors handed to torch's cuBLAS blockwise FP8, checked on a CPU.

For every shape the suite and quick.py run (M = 1 decode, N = 2112 with a half-full last row block, K whose
block count is not a multiple of 4) the view torch sees must hold our scales at the right (row, K block),
and torch's own acceptance checks (restated from ScaledBlas.cpp) must pick BlockWise1x128 x BlockWise128x128.
"""

import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _cublas_layout as cl  # noqa: E402

SHAPES = [(1, 7168, 4096), (16, 7168, 2048), (64, 2112, 7168), (4096, 4096, 7168), (4096, 24576, 1536),
          (5, 2112, 640), (3, 256, 384)]


def _scales(rng, rows, k):
    return rng.uniform(0.5, 2.0, (rows, cl.ceil_div(k, 128))).astype(np.float32)


@pytest.mark.parametrize("m, n, k", SHAPES)
def test_layouts_hold_our_scales_and_torch_accepts_them(m, n, k):
    rng = np.random.default_rng(m + n + k)
    sa, sb = _scales(rng, m, k), _scales(rng, cl.ceil_div(n, 128), k)
    m_pad = cl.padded_m(m)
    a = cl.scale_a_1x128(sa, m_pad)
    assert m_pad % 4 == 0 and m_pad - m < 4
    assert a.shape == (m_pad, sa.shape[1]) and a.strides == (1, m_pad)
    va = a.view()
    np.testing.assert_array_equal(va[:m], sa)
    np.testing.assert_array_equal(va[m:], 1.0)
    b, *older = cl.scale_b_variants(sb, n, k)
    kb, nb = cl.ceil_div(k, 128), cl.ceil_div(n, 128)
    assert b.shape == (kb, nb) and b.strides == (1, cl.round_up(kb, 4))
    np.testing.assert_array_equal(b.view(), sb.T)  # scale_b[k block, n block]
    assert cl.accepted_by_torch(m_pad, n, k, a, b)
    assert len(older) == (0 if kb % 4 == 0 else 2)
    for v in older:  # the older layouts hold the same numbers in the first L rows
        np.testing.assert_array_equal(v.view()[:kb], sb.T)
    sw, sxt = cl.swapped_scales(a, b)  # out^T = w @ x^T on the same storages
    np.testing.assert_array_equal(sw.view(), sb)
    np.testing.assert_array_equal(sxt.view()[:, :m], sa.T)
    assert cl.accepted_by_torch_swapped(m_pad, n, k, sw, sxt)
    assert not cl.accepted_by_torch_swapped(m_pad, n, k, sxt, sw)


def test_padded_shape_is_rejected_when_k_blocks_are_not_a_multiple_of_4():
    """The layout torch's tests build (shape padded to round_up(L, 4)) fails the current check for L = 5:
    why the padded-stride view comes first."""
    m, n, k = 16, 256, 640
    rng = np.random.default_rng(0)
    a = cl.scale_a_1x128(_scales(rng, m, k), m)
    variants = {v.label: v for v in cl.scale_b_variants(_scales(rng, 2, k), n, k)}
    assert cl.accepted_by_torch(m, n, k, a, variants["128x128 K-major, padded stride"])
    assert not cl.accepted_by_torch(m, n, k, a, variants["128x128 K-major, padded shape"])
    assert not cl.accepted_by_torch(m, n, k, a, variants["128x128 K-major, unpadded"])


def test_row_major_activation_scales_are_rejected():
    """(M, L) row-major (strides (L, 1)) is not outer-dim-major: torch would not pick 1x128 for it."""
    m, k = 16, 512
    assert not cl.accepts_1x128((m, k), (m, 4), (4, 1))
    assert cl.accepts_1x128((m, k), (m, 4), (1, m))
    # M = 1: the size-1 dimension's stride is not checked, the other must equal M = 1
    assert cl.accepts_1x128((1, k), (1, 4), (4, 1)) and cl.accepts_1x128((4, k), (4, 4), (1, 4))


def test_ceil_grid_for_n_2112_and_bad_shapes_raise():
    sb = np.ones((16, 56), np.float32)  # floor(2112 / 128) row blocks: one short
    with pytest.raises(ValueError, match=r"\(17, 56\)"):
        cl.scale_b_variants(sb, 2112, 7168)
    with pytest.raises(ValueError):
        cl.scale_a_1x128(np.ones((5, 4), np.float32), 4)  # M_pad < M
    with pytest.raises(ValueError):
        cl.scale_a_1x128(np.ones((5, 4), np.float32), 6)  # not a multiple of 4
    with pytest.raises(ValueError):
        cl.padded_m(0)
