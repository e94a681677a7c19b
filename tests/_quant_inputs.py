"""Quantization inputs that reach every branch of the quantizers, for the kernel-vs-jnp bit tests.

Rows mix: wide-range normal values, all-zero blocks, exact powers of two and the largest normals of every
element type times powers of two (binade edges of the block amax), amax mantissas at and one ulp around
the rceil threshold (1.5, 1.75, 1.875 = max_normal mantissas), exact ties between element grid points,
saturation (one huge element in a block of small ones), NaN and +-Inf, and (optionally) float32
subnormals, which XLA:CPU flushes but GPUs keep.
"""

from __future__ import annotations

import functools

import ml_dtypes
import numpy as np


def special_input(rng: np.random.Generator, shape: tuple[int, ...], dtype, *, subnormals: bool,
                  nonfinite: bool = True) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-40, 40, shape[:-1] + (1,)))
    flat = x.reshape(-1, shape[-1])
    n = flat.shape[0]
    kinds = rng.integers(0, 8, n)
    for i in range(n):
        row = flat[i]
        k = kinds[i]
        if k == 0:
            row[rng.integers(0, row.size, row.size // 4)] = 0.0
            row[: min(64, row.size)] = 0.0  # whole zero blocks
        elif k == 1:  # powers of two and max normals (448, 57344, 7.5, 28, 6) times powers of two
            edges = np.array([1.0, 448.0, 57344.0, 7.5, 28.0, 6.0, 1.5, 1.75, 1.875])
            row[:] = rng.choice(edges, row.size) * np.exp2(rng.integers(-30, 30, row.size))
            row *= rng.choice([-1.0, 1.0], row.size)
        elif k == 2:  # amax mantissa one float32 ulp either side of the rceil thresholds
            base = rng.choice([1.5, 1.75, 1.875], row.size)
            ulp = rng.choice([-1, 0, 1, 2], row.size)
            bits = base.astype(np.float32).view(np.uint32).astype(np.int64) + ulp
            row[:] = bits.astype(np.uint32).view(np.float32) * np.exp2(
                rng.integers(-20, 20, row.size)).astype(np.float32)
        elif k == 3:  # ties: (m + 1/2) * 2**e, halfway between grid points of small element types
            row[:] = (rng.integers(0, 16, row.size) + 0.5) * np.exp2(rng.integers(-8, 4, row.size))
            row *= rng.choice([-1.0, 1.0], row.size)
        elif k == 4:  # saturation / underflow inside a block: one huge element per 16
            row[::16] *= 2.0**20
        elif k == 5 and nonfinite:
            row[rng.integers(0, row.size)] = rng.choice([np.nan, np.inf, -np.inf])
        elif k == 6 and subnormals:
            row[: row.size // 2] = rng.standard_normal(row.size // 2) * 2.0**-135
    x = flat.reshape(shape).astype(np.float32)
    if dtype != np.float32:
        x = x.astype(dtype)
    if not subnormals:  # XLA:CPU flushes float32 subnormals: keep them out of CPU comparisons
        f = x.astype(np.float32)
        x = np.where((np.abs(f) < 2.0**-126) & (f != 0), np.zeros_like(x), x)
    return np.ascontiguousarray(x)


DTYPES = {"bf16": ml_dtypes.bfloat16, "f16": np.float16, "f32": np.float32}


@functools.lru_cache(maxsize=None)
def special_array(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """`special_input` with float32 subnormals as `dtype` ("bf16", "f16", "f32"), cached: the GPU kernels'
    bit tests. f16 is clipped to its finite range, so the jnp quantizer sees the same f16 values as float32
    would have been finite."""
    x = special_input(np.random.default_rng(seed), shape, np.float32, subnormals=True)
    if dtype == "f16":
        x = np.clip(x, -60000, 60000)
    return np.ascontiguousarray(x.astype(DTYPES[dtype]))


def code_bits(a) -> np.ndarray:
    """An output's bits to compare: float32 scales as uint32, codes and e8m0 / e4m3 scales as uint8."""
    a = np.asarray(a)
    return a.view(np.uint32 if a.dtype.itemsize == 4 else np.uint8)


def assert_same_outputs(got, want, what: str) -> None:
    """The quantization primitive's four outputs (row values, row scales, column values, column scales) agree
    bit for bit; an absent side's (1,) placeholders, which no kernel writes (the primitive drops them), are
    only checked for shape."""
    for name, g, w in zip(("row values", "row scales", "column values", "column scales"), got, want):
        assert g.shape == w.shape, (what, name, g.shape, w.shape)
        if g.shape == (1,):
            continue
        diff = np.argwhere(code_bits(g) != code_bits(w))
        assert diff.size == 0, f"{what}: {len(diff)} {name} differ, first at {diff[:3].tolist()}"
