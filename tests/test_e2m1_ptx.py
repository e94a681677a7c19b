"""The Gluon quantization kernel's e2m1 pair encoder (`quantize_kernels._e2m1_pairs_ptx`: one float add rounds
to e2m1's grid, two codes per byte, four bytes at a time) against the integer encoder `elements.encode`, on
the CPU through tests/_ptx_emulator.py.

Inputs: float32 bit patterns within a few ulps of every e2m1 value and of every midpoint between
neighbours (ties both ways), of the binade edges 1, 2, 4, 8, values beyond 6 up to float32's max, +-Inf,
NaNs with several payloads, float32 subnormals and zeros, both signs, random bit patterns; the sign source
is either the value itself or an independent pattern (the quotient path's), as in the kernels.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("triton")

import _ptx_emulator  # noqa: E402
from jax_blockscale import elements  # noqa: E402
from jax_blockscale._triton.quantize_kernels import _e2m1_pairs_ptx  # noqa: E402
from jax_blockscale.formats import E2M1  # noqa: E402


def _inputs() -> np.ndarray:
    values = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    mids = (values[:-1] + values[1:]) / 2
    edges = np.array([0.25, 1, 2, 4, 8, 6.5, 7, 12, 1e3, 3.4e38, 2.0**-126, 2.0**-140])
    centres = np.concatenate([values, mids, edges]).astype(np.float32).view(np.uint32)
    near = (centres.astype(np.int64)[:, None] + np.arange(-4, 5)[None, :]).ravel()
    near = near[(near >= 0) & (near < 0x7F800000)].astype(np.uint32)
    specials = np.array([0, 1, 2, 0x3FFFFF, 0x400000, 0x7FFFFF, 0x800000, 0x7F7FFFFF,
                         0x7F800000, 0x7F800001, 0x7FA00000, 0x7FC00000, 0x7FFFFFFF], np.uint32)
    rng = np.random.default_rng(0)
    rand = rng.integers(0, 1 << 31, 1 << 17, dtype=np.uint32)
    small = (rng.uniform(0, 8, 1 << 16)).astype(np.float32).view(np.uint32)  # the kernel's usual range
    magnitudes = np.concatenate([near, specials, rand, small])
    bits = np.concatenate([magnitudes, magnitudes | np.uint32(0x80000000)])
    return np.concatenate([bits, np.zeros(-len(bits) % 8, np.uint32)])


def _reference(bits: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    merged = (bits & np.uint32(0x7FFFFFFF)) | (sign_bits & np.uint32(0x80000000))
    with jax.default_device(jax.devices("cpu")[0]):
        codes = jax.jit(lambda b: elements.encode(jax.lax.bitcast_convert_type(b, jnp.float32), E2M1))(merged)
        return np.asarray(codes).astype(np.uint8)


def _emulated(bits: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    """Pairs (element 2j low, 2j + 1 high) through the asm block, 4 pairs per run -> one code per element."""
    lo, hi = bits[0::2].reshape(-1, 4), bits[1::2].reshape(-1, 4)
    slo, shi = sign_bits[0::2].reshape(-1, 4), sign_bits[1::2].reshape(-1, 4)
    (word,) = _ptx_emulator.run_ptx(_e2m1_pairs_ptx(), 1, [*lo.T, *hi.T, *slo.T, *shi.T])
    packed = np.ascontiguousarray(word).view(np.uint8).reshape(-1)
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(-1)


@pytest.mark.parametrize("signs", ["own", "independent"])
def test_e2m1_pairs_ptx_equals_encode(signs):
    bits = _inputs()
    rng = np.random.default_rng(1)
    bits = np.concatenate([bits, rng.permutation(bits)])  # each value as a low and as a high element
    sign_bits = bits if signs == "own" else rng.integers(0, 1 << 32, bits.size, dtype=np.uint32)
    got, want = _emulated(bits, sign_bits), _reference(bits, sign_bits)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(bits[i]), hex(sign_bits[i]), int(got[i]), int(want[i])) for i in bad[:5]]
