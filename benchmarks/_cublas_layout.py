"""Scale tensors for cuBLASLt blockwise FP8 (torch `scaled_mm`, BlockWise1x128 x BlockWise128x128), numpy only.

What torch (>= 2.10, aten/src/ATen/native/cuda/ScaledBlas.cpp) checks, for out (M, N) = a (M, K) @ b (K, N)
with `a` row-major and `b` column-major (`w.t()` of a row-major (N, K) weight), and L = ceil(K / 128):

- scale_a, BlockWise1x128 on a: shape (M, L), strides (1, M): "outer-dim-major", i.e. the (L, M)
  transpose stored contiguously. cuBLAS also wants that leading dimension M 16-byte aligned (a multiple
  of 4 floats), so M is zero-padded to a multiple of 4 (M = 1 decode included); the pad rows get scale 1.
- scale_b, BlockWise128x128 on b: torch checks `scale_b.t()` against b.t() = (N, K) as shape
  (ceil(N / 128), L) with strides (round_up(L, 4), 1). So the storage is our (ceil(N/128), L) weight
  scales with each row padded to round_up(L, 4) floats, and scale_b is the (L, ceil(N/128)) view of it
  with strides (1, round_up(L, 4)). ceil, not floor: N = 2112 has 17 row blocks, the last one half full.
  Releases before the padded stride was introduced checked strides (L, 1) on an unpadded (N/128, L), and
  torch's own tests pass the padded *shape* (round_up(L, 4), N/128); when L % 4 == 0 all three coincide,
  otherwise `scale_b_variants` gives each one to try (the caller keeps the first that runs and checks).

The swapped problem, out^T (N, M) = w (N, K) @ x^T (K, M), is the other pair torch accepts
(BlockWise128x128 on mat1, BlockWise1x128 on mat2): a different cuBLAS configuration, tried when the
direct one runs but fails the check (`swapped_scales`). It reuses both storages: the weight scales as
(ceil(N/128), L) with strides (round_up(L, 4), 1), the activation scales as (L, M_pad) row-major.

Everything here is plain numpy (shapes, strides in elements, and the storage arrays), so the layouts are
tested on a CPU without torch; `_torch.py` turns storage + (shape, strides) into `Tensor.as_strided`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

BLOCK = 128


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    return ceil_div(a, b) * b


@dataclasses.dataclass(frozen=True)
class StridedScales:
    """A float32 storage array and the (shape, strides in elements) view torch must see of it."""

    storage: np.ndarray  # 2D, C-contiguous float32
    shape: tuple[int, int]
    strides: tuple[int, int]
    label: str = ""

    def view(self) -> np.ndarray:
        """The logical scale tensor (numpy view with the same element strides), for checks."""
        item = self.storage.itemsize
        return np.lib.stride_tricks.as_strided(self.storage, self.shape, tuple(s * item for s in self.strides),
                                               writeable=False)


def padded_m(m: int) -> int:
    """Rows of `a` handed to cuBLAS: M rounded up to a multiple of 4 (16-byte aligned scale columns)."""
    if m < 1:
        raise ValueError(f"M must be >= 1, got {m}")
    return round_up(m, 4)


def scale_a_1x128(sa: np.ndarray, m_pad: int) -> StridedScales:
    """Activation scales (M, L), one per row and 128 columns, as BlockWise1x128 wants them: (M_pad, L)
    with strides (1, M_pad). Pad rows (M..M_pad) get scale 1 (their values are zero)."""
    sa = np.asarray(sa, np.float32)
    if sa.ndim != 2 or m_pad < sa.shape[0] or m_pad % 4:
        raise ValueError(f"scale_a must be (M, L) with M <= M_pad, M_pad % 4 == 0; got {sa.shape}, M_pad {m_pad}")
    m, kb = sa.shape
    full = np.ones((m_pad, kb), np.float32)
    full[:m] = sa
    return StridedScales(np.ascontiguousarray(full.T), (m_pad, kb), (1, m_pad), "1x128 outer-dim-major")


def scale_b_variants(sb: np.ndarray, n: int, k: int) -> list[StridedScales]:
    """Weight scales (ceil(N/128), L) as BlockWise128x128 layouts for b = w.t(), the current one first
    (module docstring); duplicates dropped, so with L % 4 == 0 there is one."""
    sb = np.asarray(sb, np.float32)
    nb, kb = ceil_div(n, BLOCK), ceil_div(k, BLOCK)
    if sb.shape != (nb, kb):
        raise ValueError(f"128x128 weight scales for N={n}, K={k} must be (ceil(N/128), ceil(K/128)) = "
                         f"{(nb, kb)}, got {sb.shape}")
    kb4 = round_up(kb, 4)
    padded = np.ones((nb, kb4), np.float32)
    padded[:, :kb] = sb
    out = [StridedScales(padded, (kb, nb), (1, kb4), "128x128 K-major, padded stride")]
    if kb4 != kb:
        out.append(StridedScales(np.ascontiguousarray(sb), (kb, nb), (1, kb), "128x128 K-major, unpadded"))
        out.append(StridedScales(padded, (kb4, nb), (1, kb4), "128x128 K-major, padded shape"))
    return out


# ---- torch's acceptance checks, restated (ScaledBlas.cpp), so the layouts can be tested without torch ----


def _size_stride_ok(shape: tuple, strides: tuple, dim: int, size: int, stride: int) -> bool:
    # torch relaxes the stride check for a dimension of size 1 (its stride is meaningless)
    return shape[dim] == size and (size <= 1 or strides[dim] == stride)


def accepts_1x128(t_shape: tuple[int, int], shape: tuple[int, int], strides: tuple[int, int]) -> bool:
    """is_blockwise_1x128_scaling(t, scale) for a float32 2D scale."""
    return (len(shape) == 2 and _size_stride_ok(shape, strides, 0, t_shape[0], 1)
            and _size_stride_ok(shape, strides, 1, ceil_div(t_shape[1], BLOCK), t_shape[0]))


def accepts_128x128(t_shape: tuple[int, int], shape: tuple[int, int], strides: tuple[int, int]) -> bool:
    """is_blockwise_128x128_scaling(t, scale), the padded-stride version (torch >= 2.10)."""
    kb = ceil_div(t_shape[1], BLOCK)
    return (len(shape) == 2 and _size_stride_ok(shape, strides, 0, ceil_div(t_shape[0], BLOCK), round_up(kb, 4))
            and _size_stride_ok(shape, strides, 1, kb, 1))


def accepted_by_torch(m_pad: int, n: int, k: int, a: StridedScales, b: StridedScales) -> bool:
    """Would `get_joint_scaling` pick (BlockWise1x128, BlockWise128x128) for a (M_pad, K), b = w.t() (K, N)?
    torch checks a with scale_a, and b.t() (N, K) with scale_b.t(); (128x128, 1x128) is tried first and
    must not match."""
    bt_shape, bt_strides = (b.shape[1], b.shape[0]), (b.strides[1], b.strides[0])
    wanted = accepts_1x128((m_pad, k), a.shape, a.strides) and accepts_128x128((n, k), bt_shape, bt_strides)
    swapped = accepts_128x128((m_pad, k), a.shape, a.strides) and accepts_1x128((n, k), bt_shape, bt_strides)
    return wanted and not swapped


def swapped_scales(a: StridedScales, b: StridedScales) -> tuple[StridedScales, StridedScales]:
    """(scale for mat1 = w (N, K), scale for mat2 = x^T (K, M_pad)) of the swapped problem, on the storages
    of `a` (from `scale_a_1x128`) and `b` (the padded-stride layout from `scale_b_variants`)."""
    kb, nb = b.shape
    m_pad = a.shape[0]
    if b.strides != (1, round_up(kb, 4)) or a.strides != (1, m_pad):
        raise ValueError("swapped_scales wants the padded-stride weight layout and the 1x128 activation layout")
    return (StridedScales(b.storage, (nb, kb), (b.strides[1], 1), "128x128 on w"),
            StridedScales(a.storage, (kb, m_pad), (m_pad, 1), "1x128 on x^T"))


def accepted_by_torch_swapped(m_pad: int, n: int, k: int, sw: StridedScales, sxt: StridedScales) -> bool:
    """Would torch pick (BlockWise128x128, BlockWise1x128) for mat1 = w (N, K), mat2 = x^T (K, M_pad)?
    It checks mat1 with sw, and mat2.t() = x (M_pad, K) with sxt.t()."""
    t_shape, t_strides = (sxt.shape[1], sxt.shape[0]), (sxt.strides[1], sxt.strides[0])
    return accepts_128x128((n, k), sw.shape, sw.strides) and accepts_1x128((m_pad, k), t_shape, t_strides)
