"""The quantization kernel's float32 quotient (quantize_kernels._quotient_parts / _quotient), in NumPy with an
exact fma, against the float64 path it replaced and against exact rational arithmetic.

The kernel's interpreter tests (test_quantize_kernel.py) run it on realistic blocks; here the per-block
divisor d is chosen directly, over the whole float32 range (tiny d whose residuals would underflow
unscaled, d near 2**127, zero / Inf / NaN d), with quotients near float32 midpoints and near the ties of
the e4m3 and e2m1 grids, so that every branch of the proof sketch in quantize_kernels is exercised.
"""

from fractions import Fraction

import numpy as np
import pytest

from _exact_fma import fma32

F32 = np.float32
E4M3 = dict(mbits=3, min_exp=-6, max_bits=0x43E00000, nbits=8)
E2M1 = dict(mbits=1, min_exp=0, max_bits=0x40C00000, nbits=4)


def encode(v: np.ndarray, sign_src: np.ndarray, sign_mask: np.ndarray, mbits, min_exp, max_bits, nbits):
    """quantize_kernels._encode with the sign taken from `sign_src` masked by `sign_mask` (0 or 1<<31)."""
    bits = v.view(np.uint32).astype(np.int64)
    sign = ((sign_src.view(np.uint32).astype(np.int64) & sign_mask) >> 31)
    m = np.minimum(bits & 0x7FFFFFFF, max_bits)
    drop = 23 - mbits
    rounded = (m + ((1 << (drop - 1)) - 1) + ((m >> drop) & 1)) >> drop
    normal = rounded - ((127 + min_exp - 1) << mbits)
    magic_bits = (min_exp - mbits + 23 + 127) << 23
    magic = np.array(magic_bits, np.uint32).view(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        sub = (m.astype(np.uint32).view(F32) + magic).view(np.uint32).astype(np.int64) - magic_bits
    mag = np.where(m < ((min_exp + 127) << 23), sub, normal)
    return (mag | (sign << (nbits - 1))).astype(np.uint8)


def old_path(x, d, zero_on_inf):
    """The float64 path: RN32(x * (1 / d)) in float64, zero where 1 / d is infinite (nvfp4)."""
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        recip = 1.0 / d.astype(np.float64)
        scaled = (x.astype(np.float64) * recip).astype(F32)
    if zero_on_inf:
        scaled = np.where(np.isinf(recip), F32(0), scaled)
    return scaled


def sign_addend(d, zero_on_inf, generated_nan_sign=None):
    """quantize_kernels._sign_addend in NumPy: z per block, the code's sign being x_s + z's.
    generated_nan_sign: the sign bit of a float64 0 * Inf (None: this machine's, as the kernel computes it)."""
    if generated_nan_sign is None:
        with np.errstate(invalid="ignore"):
            generated = (np.float64(0.0) * np.float64(np.inf)).astype(F32)
        generated_nan_sign = int(np.array(generated).view(np.uint32)) >> 31
    zero_fill = 0x7FC00000 if zero_on_inf else (0x80000001 if generated_nan_sign else 0)
    bits = np.where(np.isnan(d), 0x7FC00000, np.where(d == 0, zero_fill, 0x80000000))
    return bits.astype(np.uint32).view(F32)


def parts(d, zero_on_inf, generated_nan_sign=None):
    """quantize_kernels._quotient_parts in NumPy: (c, d_s, y_s, z) per block."""
    bits = d.view(np.uint32).astype(np.int64)
    normal = (np.abs(d) >= F32(2.0**-126)) & np.isfinite(d)
    e = ((bits >> 23) & 0xFF) - 127
    c = (np.maximum(-e, -126) + 127).astype(np.uint32) << 23
    c = np.where(normal, c.view(F32), F32(1))
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        d_s = np.where(normal, d * c, F32(0))
        y_s = (F32(1) / np.where(normal, d_s, d)).astype(F32)  # IEEE float32 division (div_rn)
    if zero_on_inf:
        y_s = np.where(d == 0, F32(0), y_s)
    return c, d_s, y_s, sign_addend(d, zero_on_inf, generated_nan_sign)


def new_path(x, d, zero_on_inf, generated_nan_sign=None, canonical_nan=False):
    """The kernel's float32 quotient: (q, sign source). canonical_nan: every float32 NaN result is
    0x7FFFFFFF, as on NVIDIA GPUs (NumPy on x86 propagates operands' NaNs and generates 0xFFC00000)."""
    c, d_s, y_s, z = parts(d, zero_on_inf, generated_nan_sign)

    def canon(v):
        return np.where(np.isnan(v), np.array(0x7FFFFFFF, np.uint32).view(F32), v) if canonical_nan else v

    with np.errstate(over="ignore", invalid="ignore"):
        x_s = canon(x * c)
        q0 = canon(x_s * y_s)
        sign_src = canon(x_s + z)
    r = canon(fma32(-q0, d_s, x_s))
    q = canon(fma32(r, y_s, q0))
    return q, sign_src


def _random_f32(rng, n, lo_exp, hi_exp, mant_bits=23):
    mant = rng.integers(0, 1 << mant_bits, n).astype(np.int64) << (23 - mant_bits)
    exp = rng.integers(lo_exp, hi_exp + 1, n) + 127
    sign = rng.integers(0, 2, n).astype(np.int64) << 31
    return ((sign | (exp.astype(np.int64) << 23) | mant).astype(np.uint32)).view(F32)


def _cases(rng, n):
    """(x, d) pairs: d over the whole float32 range and specials; x around x / d in the codes' range,
    at float32 midpoints of x / d, and at e4m3 / e2m1 ties times d."""
    d = np.concatenate([
        _random_f32(rng, n, -126, 127),  # every exponent
        _random_f32(rng, n, -126, -90),  # tiny: the unscaled residual would underflow
        _random_f32(rng, n // 4, 120, 127),  # huge (nvfp4 with a large tensor scale)
        _random_f32(rng, n // 4, -5, 5, mant_bits=3),  # e4m3-like scales times a power of two
    ])
    d = np.abs(d)
    specials = np.array([0.0, np.inf, np.nan, 2.0**-126, 2.0**127, 1.0, np.float32(2.0) - 2.0**-22], F32)
    d = np.concatenate([d, np.repeat(specials, 64)])
    m = d.size
    kind = rng.integers(0, 5, m)
    t = np.exp2(rng.uniform(-14, 11, m))  # target quotient magnitude
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        x = (t * d.astype(np.float64)).astype(F32)
        # x / d near a float32 midpoint: x = RN32(mid * d) and its neighbours
        q = t.astype(F32)
        mid = q.astype(np.float64) + (np.nextafter(q, F32(np.inf)).astype(np.float64) - q) / 2
        xm = (mid * d.astype(np.float64)).astype(F32)
        xm = np.where(kind == 1, np.nextafter(xm, F32(np.inf)), np.where(kind == 2, np.nextafter(xm, F32(0)), xm))
        # x / d at a tie of the element grids: (k + 1/2) * quantum, e4m3 quanta 2**-9 .. 2**5, e2m1 0.5 / 1 / 2
        quanta = np.exp2(rng.integers(-9, 6, m).astype(np.float64))
        tie = (rng.integers(0, 8, m) + 0.5) * quanta
        xt = (tie * d.astype(np.float64)).astype(F32)
        xt = np.where(rng.integers(0, 3, m) == 0, np.nextafter(xt, F32(np.inf)), xt)
    x = np.where(kind == 0, x, np.where(kind <= 2, xm, xt)).astype(F32)
    x = np.where(kind == 4, _random_f32(rng, m, -149 + 23, 127), x)  # unrelated magnitudes
    subnormal = rng.integers(1, 1 << 23, m).astype(np.uint32).view(F32)
    x = np.where(rng.integers(0, 50, m) == 0, subnormal, x).astype(F32)
    sign = rng.integers(0, 2, m).astype(bool)
    x = np.where(sign, -x, x)
    x[: 16] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 2.0**-149, -(2.0**-149), 3e38, -3e38, 1e-45,
               448.0, 6.0, -6.0, 0.25]
    # NaN inputs are the positive quiet NaN: which NaN operand a product returns is up to the CPU loop
    # (NumPy's vectorized and scalar loops differ); on a GPU every NaN result is the canonical one.
    x = np.where(np.isnan(x), F32(np.nan), x)
    # A block holding a NaN or Inf has a NaN divisor (its scale is NaN) in both formats.
    d = np.where(np.isfinite(x), d, F32(np.nan))
    return x.astype(F32), d.astype(F32)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("zero_on_inf", [False, True], ids=["fp8", "nvfp4"])
def test_codes_equal_the_float64_path(seed, zero_on_inf):
    rng = np.random.default_rng(seed)
    x, d = _cases(rng, 250_000)
    want = old_path(x, d, zero_on_inf)
    q, sign_src = new_path(x, d, zero_on_inf)
    ones = np.full(d.shape, 1 << 31, np.int64)
    for elem in (E4M3, E2M1):
        w = encode(want, want, ones, **elem)
        g = encode(q, sign_src, ones, **elem)
        bad = np.flatnonzero(w != g)
        assert bad.size == 0, [(float(x[i]), float(d[i]), float(want[i]), float(q[i])) for i in bad[:5]]


def test_zero_divisor_signs_follow_the_float64_nan_under_gpu_nan_rules():
    """A zero fp8 scale (amax below 448 * 2**-126) saturates every code; a zero element's code is the
    float64 path's 0 * Inf NaN, whose sign (set on x86 and NVIDIA GPUs) the float32 product's canonical NaN
    (0x7FFFFFFF on NVIDIA) does not carry. Under those GPU rules, the sign addend gives the float64 path's
    codes, and q0's sign (the earlier rule) does not: the H100 mismatch this reproduces."""
    x = np.array([0.0, -0.0, 2.0**-149, -(2.0**-149), 1e-40, -1e-40, 3e-39, -3e-39], F32)
    d = np.zeros_like(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = (x.astype(np.float64) * (1.0 / d.astype(np.float64))).astype(F32)
    want_sign = want.view(np.uint32) >> 31
    assert list(want_sign[:2]) == [1, 1]  # zero elements: the generated NaN's sign (x86 here)
    ones = np.full(d.shape, 1 << 31, np.int64)
    w = encode(want, want, ones, **E4M3)
    q, sign_src = new_path(x, d, False, generated_nan_sign=1, canonical_nan=True)
    np.testing.assert_array_equal(encode(q, sign_src, ones, **E4M3), w)
    c, _, y_s, _ = parts(d, False, 1)
    with np.errstate(invalid="ignore"):
        q0 = x * c * y_s
    q0 = np.where(np.isnan(q0), np.array(0x7FFFFFFF, np.uint32).view(F32), q0)
    assert (encode(q, q0, ones, **E4M3) != w).sum() == 2  # the q0 rule: both zero elements lose the sign


@pytest.mark.parametrize("seed", range(2))
def test_quotient_is_correctly_rounded_where_codes_depend_on_it(seed):
    """Where |x / d| >= 2**-11 and the block is normal, q == RN32(x / d) exactly (checked with Fractions on
    a sample; the float64 route RN32(RN64(x / d)) equals it by quantize.py's lemma, checked on all)."""
    rng = np.random.default_rng(100 + seed)
    x, d = _cases(rng, 250_000)
    ok = np.isfinite(x) & np.isfinite(d) & (d != 0)
    x, d = x[ok], d[ok]
    with np.errstate(over="ignore", under="ignore"):
        t64 = x.astype(np.float64) / d.astype(np.float64)
        want = t64.astype(F32)
    q, _ = new_path(x, d, False)
    rel = (np.abs(t64) >= 2.0**-11) & (np.abs(t64) < 2.0**100)  # above, x * c may overflow: codes saturate
    assert rel.sum() > 400_000
    assert np.array_equal(q[rel].view(np.uint32), want[rel].view(np.uint32))
    for i in rng.choice(np.flatnonzero(rel), 3000, replace=False):
        exact = Fraction(float(x[i])) / Fraction(float(d[i]))
        lo = F32(float(exact))  # float(Fraction) rounds correctly to float64; then to the float32 neighbours
        cands = [lo, np.nextafter(lo, F32(np.inf)), np.nextafter(lo, F32(-np.inf))]
        best = min(cands, key=lambda c: (abs(Fraction(float(c)) - exact), int(np.array(c).view(np.uint32)) & 1))
        assert q[i] == best, (float(x[i]), float(d[i]))


def test_exact_fma_single_rounding():
    rng = np.random.default_rng(7)
    a, b = _random_f32(rng, 20000, -20, 20), _random_f32(rng, 20000, -20, 20)
    c = (-(a.astype(np.float64) * b)).astype(F32)  # catastrophic cancellation: only the low part survives
    c = np.where(rng.integers(0, 2, c.size) == 0, c, _random_f32(rng, c.size, -60, 20))
    got = fma32(a, b, c)
    for i in range(0, a.size, 7):
        exact = Fraction(float(a[i])) * Fraction(float(b[i])) + Fraction(float(c[i]))
        f = F32(float(exact))
        cands = [f, np.nextafter(f, F32(np.inf)), np.nextafter(f, F32(-np.inf))]
        best = min(cands, key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.uint32)) & 1))
        assert got[i] == best
