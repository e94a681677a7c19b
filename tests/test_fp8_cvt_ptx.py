"""The quantization kernel's hardware fp8 encoder (`quantize_kernels._fp8_cvt_ptx`: cvt.rn.satfinite plus a
NaN / sign fix-up) against the integer encoder `elements.encode`, on the CPU through tests/_ptx_emulator.py.

Inputs: the float32 bit patterns within a few ulps of every e4m3 / e5m2 value and of every midpoint
between neighbours (ties both ways), values beyond the largest finite one up to float32's max, +-Inf, NaNs
with several payloads, float32 subnormals and zeros, both signs, plus random bit patterns. Each code must
equal `encode`'s with the sign taken from the sign source (the kernel's quotient path passes q0's), for
every NaN byte the hardware might write (the PTX ISA only says "a NaN") and for e5m2 Inf inputs kept as
Inf, so that the fix-up depends on neither.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("triton")

import _ptx_emulator  # noqa: E402
from jax_blockscale import elements  # noqa: E402
from jax_blockscale._triton.quantize_kernels import _fp8_cvt_ptx  # noqa: E402
from jax_blockscale.formats import E4M3, E5M2  # noqa: E402

TYPES = {"e4m3": (E4M3, ml_dtypes.float8_e4m3fn, 3, "e4m3x2"), "e5m2": (E5M2, ml_dtypes.float8_e5m2, 2, "e5m2x2")}


def _boundary_inputs(dtype) -> np.ndarray:
    """float32 bit patterns (uint32) around every value and midpoint of `dtype`, specials, random ones."""
    codes = np.arange(256, dtype=np.uint8).view(dtype).astype(np.float64)
    values = np.unique(codes[np.isfinite(codes) & (codes >= 0)])
    mids = (values[:-1] + values[1:]) / 2  # exact in float32: fp8 values have <= 4 significant bits
    top = values[-1]
    beyond = np.concatenate([top + (top - values[-2]) * np.arange(0.25, 4, 0.25), 2.0 ** np.arange(8, 128)])
    centres = np.concatenate([values, mids, beyond]).astype(np.float32).view(np.uint32)
    near = (centres.astype(np.int64)[:, None] + np.arange(-3, 4)[None, :]).ravel()
    near = near[(near >= 0) & (near < 0x7F800000)].astype(np.uint32)
    specials = np.array([0, 1, 2, 0x3FFFFF, 0x400000, 0x7FFFFF, 0x800000, 0x7F7FFFFF,  # subnormals, max
                         0x7F800000, 0x7F800001, 0x7FA00000, 0x7FC00000, 0x7FFFFFFF], np.uint32)  # Inf, NaNs
    rand = np.random.default_rng(0).integers(0, 1 << 31, 1 << 17, dtype=np.uint32)
    magnitudes = np.concatenate([near, specials, rand])
    bits = np.concatenate([magnitudes, magnitudes | np.uint32(0x80000000)])
    return np.concatenate([bits, np.zeros(-len(bits) % 4, np.uint32)])


def _emulated_codes(kind: str, bits: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    """The asm block on packs of 4 consecutive elements -> uint8 codes, element i of a pack in byte i."""
    elem, _, mbits, _ = TYPES[kind]
    values, signs = bits.reshape(-1, 4), sign_bits.reshape(-1, 4)
    (word,) = _ptx_emulator.run_ptx(_fp8_cvt_ptx(mbits), 1, [*values.T, *signs.T])
    return np.ascontiguousarray(word).view(np.uint8).reshape(-1)


def _reference(kind: str, bits: np.ndarray, sign_bits: np.ndarray) -> np.ndarray:
    """`elements.encode` of |x| with the sign source's sign bit (the kernel's `_encode_signed`)."""
    elem = TYPES[kind][0]
    merged = (bits & np.uint32(0x7FFFFFFF)) | (sign_bits & np.uint32(0x80000000))
    with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(jax.jit(lambda b: elements.encode(jax.lax.bitcast_convert_type(b, jnp.float32), elem))(
            merged))


@pytest.mark.parametrize("kind", list(TYPES))
def test_emulated_conversion_spot_values(kind):
    """The emulator's cvt itself, on hand-checked values (RNE, ties, subnormals, satfinite)."""
    xs = np.array([448.0, 464.0, 480.0, 2.0**-10, 3 * 2.0**-10, -(2.0**-9) * 1.5, 57344.0, 61440.0, np.inf, -np.inf],
                  np.float32)
    want = {"e4m3": [0x7E, 0x7E, 0x7E, 0x00, 0x02, 0x82, 0x7E, 0x7E, 0x7E, 0xFE],
            "e5m2": [0x5F, 0x5F, 0x60, 0x14, 0x1A, 0x9A, 0x7B, 0x7B, 0x7B, 0xFB]}[kind]
    got = _ptx_emulator._cvt_fp8(TYPES[kind][3], xs.view(np.uint32))
    assert [int(c) for c in got] == want
    assert int(_ptx_emulator._cvt_fp8(TYPES[kind][3], np.array([np.nan], np.float32).view(np.uint32))[0]) & 0x7F >= 0x7D


NAN_VARIANTS = [(0x7F, True), (0xFF, True), (0x7D, False), (0xFE, False)]


@pytest.mark.parametrize("kind", list(TYPES))
@pytest.mark.parametrize("nan_code,inf_saturates", NAN_VARIANTS)
@pytest.mark.parametrize("signs", ["own", "random"])
def test_hw_encoder_matches_integer_encoder(monkeypatch, kind, nan_code, inf_saturates, signs):
    if kind == "e4m3" and nan_code & 0x7F != 0x7F:
        pytest.skip("e4m3fn's only NaN magnitude is 0x7F")
    monkeypatch.setitem(_ptx_emulator.FP8_NAN_CODE, TYPES[kind][3], nan_code)
    monkeypatch.setattr(_ptx_emulator, "FP8_INF_SATURATES", inf_saturates)
    bits = _boundary_inputs(TYPES[kind][1])
    if signs == "own":
        sign_bits = bits
    else:  # the quotient path: a sign source whose sign may differ from the value's (q0 = -0, q = +0)
        sign_bits = np.random.default_rng(1).integers(0, 1 << 32, bits.shape, dtype=np.uint64).astype(np.uint32)
    got = _emulated_codes(kind, bits, sign_bits)
    want = _reference(kind, bits, sign_bits)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(int(bits[i])), hex(int(sign_bits[i])), hex(int(got[i])), hex(int(want[i])))
                           for i in bad[:8]]
