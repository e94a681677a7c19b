"""CPU tests of the decode kernel (`_triton/decode.py`): dispatch, cross-compiled instructions, one launch.

No GPU needed. Instruction spellings are Triton 3.6's (see tests/test_lowering_hopper.py). The inline-PTX
fp4 decode is checked by executing its instruction string on every byte (tests/_ptx_emulator.py), with one
scale and with a distinct scale per element of a pack.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("triton")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends  # noqa: E402
from jax_blockscale._triton import decode  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem  # noqa: E402
from _dispatch import enable_entry, sm90_decode_kernel  # noqa: E402
from _ptx_emulator import run_ptx  # noqa: E402


@pytest.fixture(autouse=True)
def _decode_dispatched_on_sm90(monkeypatch):
    """These tests check the decode kernel where dispatch sends it; on sm_90 that entry is opt-in."""
    enable_entry(monkeypatch, "sm_90", "decode")


WGMMA_BF16 = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n\d+k16\.f32\.bf16\.bf16")
MMA_SYNC_BF16 = re.compile(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32")
TCGEN05_F16 = re.compile(r"tcgen05\.mma\.cta_group::1\.kind::f16")
MFMA_BF16 = re.compile(r"v_mfma_f32_\d+x\d+x\d+_bf16")

_VALUES = {"e2m1": "*u8", "nvfp4": "*u8", "e2m3": "*u8", "e3m2": "*u8", "e4m3": "*fp8e4nv", "e5m2": "*fp8e5",
           "block_fp8": "*fp8e4nv", "bf16": "*bf16"}
_SCALES = {"nvfp4": "*fp8e4nv", "block_fp8": "*fp32"}


def _signature(w_kind: str, x_kind: str) -> dict[str, str]:
    x_scales = _VALUES[x_kind] if x_kind == "bf16" else _SCALES.get(x_kind, "*u8")
    return {"w_ptr": _VALUES[w_kind], "w_scale_ptr": _SCALES.get(w_kind, "*u8"), "x_ptr": _VALUES[x_kind],
            "x_scale_ptr": x_scales, "a_ts_ptr": "*fp32", "b_ts_ptr": "*fp32", "out_ptr": "*bf16",
            "ws_ptr": "*fp32", "count_ptr": "*i32"}


def _compile(w_kind, x_kind, target, *, rows=7, n=1000, k=2048, ttgir=False, **changes):
    p = GemmProblem(1, False, rows, n, k, x_kind, w_kind, "bf16")
    cfg = decode.default_config(p, target)
    if cfg.gemv:  # few rows default to the GEMV (tested below); these tests take decode_kernel's FMA variant
        cfg = cfg.replace(gemv=False, fma=True, block_n=32, block_k=decode._block_k(w_kind), num_stages=4,
                          split_k=1, asm_decode=target.startswith("sm_"))
    cfg = cfg.replace(**changes)
    decode.check_config(p, cfg)
    kernel, consts = decode.kernel_constexprs(p, cfg, asm=cfg.asm_decode and target.startswith("sm_"), wide=False)
    assert kernel is decode.decode_kernel
    compiled = compile_kernel(kernel, target=target, signature=_signature(w_kind, x_kind),
                              constexprs=consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return compiled if ttgir else assembly(compiled)


# ---------------------------------------------------------------------------------------------------------
# dispatch


def test_dispatch_picks_decode_only_for_few_rows():
    for target in ("sm_90", "sm_100", "gfx950"):
        assert backends.choose(target, "bf16", "e2m1", rows=1).kernel == "decode"
        # sm_90: the Gluon kernel (decode_wgmma) takes bf16 x mxfp4 at 2-64 rows
        want = "decode_wgmma" if target == "sm_90" else "decode"
        assert backends.choose(target, "bf16", "e2m1", rows=64).kernel == want
        assert backends.choose(target, "bf16", "e2m1", rows=65).kernel not in ("decode", "decode_wgmma")
        assert backends.choose(target, "bf16", "e2m1").kernel != "decode"  # batched weight / unknown rows
    assert backends.choose("sm_90", "e4m3", "e2m1", rows=1).kernel == "decode"
    assert backends.choose("sm_90", "e4m3", "e2m1", rows=16).kernel == "decode_wgmma"  # the Gluon kernel's rows
    for w in ("e2m1", "nvfp4", "e2m3", "e3m2", "e4m3", "e5m2", "block_fp8"):  # every weight format
        assert backends.choose("sm_90", "bf16", w, rows=1).kernel == "decode"
    # block FP8 weights with block FP8 activations: the fp8 decode kernel (decode_fp8) comes first on sm_90
    assert backends.choose("sm_90", "block_fp8", "block_fp8", rows=16).kernel == "decode_fp8"
    assert backends.choose("sm_100", "block_fp8", "block_fp8", rows=16).kernel == "decode"
    assert backends.choose("sm_90", "nvfp4", "nvfp4", rows=64).kernel == "decode"
    assert backends.choose("sm_90", "fp16", "e2m1", rows=16).kernel != "decode"
    assert backends.choose("cpu", "bf16", "e2m1", rows=1).path == "reference"


def test_explain_shows_the_decode_path():
    assert jb.explain("bf16", "mxfp4", target="sm_90", rows=1).kernel == "decode"
    assert jb.explain("bf16", "mxfp4", target="sm_90").kernel == "upcast"  # hopper_mx is opt-in
    w = jax.eval_shape(lambda: jb.quantize_operand(jnp.zeros((256, 512)), "nvfp4", side="b"))
    x = jax.ShapeDtypeStruct((2, 8, 512), jnp.bfloat16)  # 16 rows of an unbatched weight
    assert jb.explain(x, w, target="sm_90").kernel == "decode_wgmma"  # bf16 x fp4 at 2-16 rows on Hopper
    assert jb.explain(x, w, target="sm_100").kernel == "decode"
    assert "decode" in jb.explain_all("sm_90")


# ---------------------------------------------------------------------------------------------------------
# the PTX fp4 decode, executed


_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def _decode_packs(packed: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The PTX fp4 decode, emulated (tests/_ptx_emulator.py), on (n, 4) packed bytes and their (n, 4)
    scales: (low-nibble elements, high-nibble elements), each (n, 4) float32."""
    s16 = scales.astype(ml_dtypes.bfloat16)
    regs = [packed.view(np.uint32)[:, 0], s16[:, :2].copy().view(np.uint32)[:, 0],
            s16[:, 2:].copy().view(np.uint32)[:, 0]]
    out = run_ptx(decode._fp4_pair_ptx(), 4, regs)
    lo = np.stack(out[:2], 1).view(ml_dtypes.bfloat16).astype(np.float32)
    hi = np.stack(out[2:], 1).view(ml_dtypes.bfloat16).astype(np.float32)
    return lo, hi


def _assert_decoded(packed, scales):
    lo, hi = _decode_packs(packed, scales)
    for got, nibbles in ((lo, packed & 15), (hi, packed >> 4)):
        want = (_E2M1[nibbles] * scales).astype(ml_dtypes.bfloat16).astype(np.float32)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("scale", [1.0, 2.0**-127, 2.0**-10, 2.0**100, 0.375])
def test_ptx_fp4_decode_matches_the_e2m1_table(scale):
    # e2m1 codes: sign, 2 exponent bits (bias 1), 1 mantissa bit; code 1 is the subnormal 0.5. Every byte
    # in every position of a pack, one scale (the bf16 subnormal 2**-127 is e8m0's code 0).
    rng = np.random.default_rng(0)
    packed = np.concatenate([np.arange(256, dtype=np.uint8)[np.arange(1024) % 256].reshape(256, 4),
                             np.roll(np.arange(256, dtype=np.uint8), 1).reshape(64, 4),
                             rng.integers(0, 256, (512, 4), dtype=np.uint8)])
    _assert_decoded(packed, np.full(packed.shape, scale, np.float32))


def test_ptx_fp4_f32_decode_matches_the_e2m1_table_for_every_word():
    """The GEMV's decode through e4m3 and fp16 (decode._fp4_f32_ptx): every byte value in every byte position
    of the packed word, bit-exact 2**-6 times the e2m1 table (signed zeros included)."""
    codes = np.arange(256, dtype=np.uint8)
    packed = np.stack([codes, np.roll(codes, 1), np.roll(codes, 7), np.roll(codes, 100)], axis=1)
    packed = np.concatenate([packed, np.roll(packed, 1, axis=1), np.roll(packed, 2, axis=1)])
    out = run_ptx(decode._fp4_f32_ptx(), 8, [packed.copy().view(np.uint32)[:, 0]])
    got = np.stack(out, 1).view(np.float32)
    want = np.concatenate([_E2M1[packed & 15], _E2M1[packed >> 4]], axis=1) / np.float32(decode._FP4_F32_UNSCALE.value)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_ptx_fp4_decode_gives_each_element_of_a_pack_its_own_scale():
    """Which 4 elements a pack holds is the layout's choice: on sm_90 Triton packs the FMA variant's nvfp4
    tile across 4 scale groups. Distinct e4m3 scales per element (subnormals included) must each reach
    their own element; the first PTX gave elements 2 and 3 the scales of 0 and 1 (wrong on an H100)."""
    rng = np.random.default_rng(1)
    packed = np.concatenate([np.arange(256, dtype=np.uint8).reshape(64, 4),
                             rng.integers(0, 256, (960, 4), dtype=np.uint8)])
    scales = rng.integers(1, 0x7F, packed.shape, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    _assert_decoded(packed, scales.astype(np.float32))


def test_ptx_fp4_folded_decode_is_one_multiply_by_the_folded_scale():
    """decode_wgmma's nvfp4 decode (decode._fp4_pair_ptx(folded=True)): the e2m1 bias 2**126 folded into the
    operand, one bf16 multiply per pair. With every positive finite e4m3 scale times 2**(126 - 8), each
    element is bit-exact 2**-8 times code x scale (decode_wgmma multiplies its fp32 sums by 2**8)."""
    from jax_blockscale._triton import decode_wgmma

    ptx = decode._fp4_pair_ptx(folded=True)
    assert ptx.count("fma.rn.bf16x2") == 4  # one per pair of elements (the unfolded decode: 8)
    rng = np.random.default_rng(2)
    packed = np.concatenate([np.arange(256, dtype=np.uint8)[np.arange(508) % 256].reshape(127, 4),
                             rng.integers(0, 256, (127, 4), dtype=np.uint8)])
    codes = (np.arange(packed.size) % 0x7F).astype(np.uint8).reshape(packed.shape)  # 0 .. 0x7E: all finite
    scale = codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    shift = decode_wgmma.NVFP4_FOLD_LOG2.value
    folded = (scale * np.float32(2.0 ** (126 - shift))).astype(ml_dtypes.bfloat16)
    regs = [packed.copy().view(np.uint32)[:, 0], folded[:, :2].copy().view(np.uint32)[:, 0],
            folded[:, 2:].copy().view(np.uint32)[:, 0]]
    out = run_ptx(ptx, 4, regs)
    lo = np.stack(out[:2], 1).view(ml_dtypes.bfloat16).astype(np.float32)
    hi = np.stack(out[2:], 1).view(ml_dtypes.bfloat16).astype(np.float32)
    for got, nibbles in ((lo, packed & 15), (hi, packed >> 4)):
        want = _E2M1[nibbles] * scale * np.float32(2.0 ** -shift)  # exact in float32 and in bf16
        assert np.array_equal(want.astype(ml_dtypes.bfloat16).astype(np.float32), want)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


# ---------------------------------------------------------------------------------------------------------
# cross-compilation


@pytest.mark.parametrize("w_kind", decode.WEIGHT_KINDS)
def test_sm90_mma_variant_uses_bf16_wgmma(w_kind):
    x_kind = "bf16" if w_kind in ("e2m1", "nvfp4") else w_kind if w_kind != "e2m3" else "e4m3"
    asm = _compile(w_kind, x_kind, "sm_90", rows=16)
    # 64 weight rows on 4 warps: wgmma. The tuned configs (decode._SM90_TUNED, measured faster) take Triton's
    # mma.sync path instead (fp4: 32 rows; fp8: 64 rows on 2 warps, no whole warp group): either way a bf16
    # tensor-core MMA, not FMAs.
    tuned = w_kind in ("e2m1", "nvfp4", "e4m3", "e5m2")
    assert WGMMA_BF16.search(asm) or (tuned and MMA_SYNC_BF16.search(asm))
    assert "cp.async" in asm  # the weight tiles are pipelined
    assert ".ftz" not in asm  # subnormal codes and 2**-127 scales decode through subnormals
    if w_kind == "e2m1":  # (nvfp4's tuned MMA config decodes in fp32: asm_decode=False measured faster)
        assert "fma.rn.bf16x2" in asm and "prmt.b32" in asm  # the inline-PTX decode


@pytest.mark.parametrize("w_kind,x_kind", [("e2m1", "bf16"), ("block_fp8", "block_fp8"), ("e4m3", "bf16")])
def test_sm90_fma_variant_has_no_mma(w_kind, x_kind):
    asm = _compile(w_kind, x_kind, "sm_90", rows=1, fma=True, block_m=1)
    assert not WGMMA_BF16.search(asm) and "mma.sync" not in asm
    assert "fma.rn.f32" in asm


_FP32_ATOMIC = re.compile(r"(?<![a-z])(red|atom)\.global(\.\w+)*\.add(\.noftz)?(\.v\d)?\.f32")


def test_split_k_reduced_in_the_kernel():
    asm = _compile("e2m1", "bf16", "sm_90", rows=16, n=512, split_k=4)
    assert "atom.global.gpu.acq_rel.add" in asm  # the per-tile counter
    assert not _FP32_ATOMIC.search(asm)  # the default reduction is ordered: no fp32 atomics
    asm = _compile("e2m1", "bf16", "sm_90", rows=16, n=512, split_k=4, atomic_split_k=True)
    assert _FP32_ATOMIC.search(asm)


@pytest.mark.parametrize("w_kind,x_kind", [("e2m1", "bf16"), ("nvfp4", "nvfp4"), ("block_fp8", "block_fp8")])
def test_sm100_uses_tcgen05(w_kind, x_kind):
    asm = _compile(w_kind, x_kind, "sm_100", rows=16)
    assert TCGEN05_F16.search(asm)


@pytest.mark.parametrize("w_kind,x_kind", [("e2m1", "bf16"), ("nvfp4", "bf16"), ("e3m2", "e3m2"),
                                           ("block_fp8", "block_fp8")])
def test_gfx950_uses_bf16_mfma(w_kind, x_kind):
    asm = _compile(w_kind, x_kind, "gfx950", rows=16, num_stages=2)
    assert MFMA_BF16.search(asm)
    assert ".amdhsa_float_denorm_mode_32 3" in asm


# ---------------------------------------------------------------------------------------------------------
# the streaming GEMV variant (config.gemv)


def _compile_gemv(w_kind, x_kind, target, *, rows=1, n=7168, k=4096, **changes):
    p = GemmProblem(1, False, rows, n, k, x_kind, w_kind, "bf16")
    cfg = decode.gemv_config(p, asm=target.startswith("sm_")).replace(**changes)
    decode.check_config(p, cfg)
    consts = dict(M=rows, N=n, K=k, W_KIND=w_kind, X_KIND=x_kind, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                  BLOCK_K=cfg.block_k, SPLIT_K=cfg.split_k, ATOMIC=cfg.atomic_split_k, WIDE=False,
                  PREFETCH=cfg.prefetch, NUM_STAGES=cfg.num_stages, ASM=cfg.asm_decode,
                  F16=cfg.asm_decode and cfg.f16_decode)
    compiled = compile_kernel(decode.gemv_kernel, target=target, signature=_signature(w_kind, x_kind),
                              constexprs=consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return assembly(compiled)


_VECTOR_16B = re.compile(r"ld\.global(\.\w+)*\.v4\.b32|cp\.async\.cg\.shared\.global(\.\w+)* \[[^]]+\], \[[^]]+\], 16")


def test_gemv_default_for_few_rows_sized_for_many_programs_per_sm():
    p = GemmProblem(1, False, 1, 7168, 4096, "bf16", "e2m1", "bf16")
    cfg = decode.default_config(p, "sm_90")
    assert cfg.gemv and cfg.block_m == 1
    assert cfg == decode._tuned(p, 1, "sm_90")  # the measured config: 8 whole rows (2 KB each) on 8 warps
    cfg = decode.default_config(p, "sm_100")  # elsewhere the heuristic
    assert cfg.gemv and cfg.block_k // 2 == 256  # 256 bytes of each weight row per K tile
    assert decode.triton.cdiv(p.n, cfg.block_n) * cfg.split_k >= 4 * 132
    assert not decode.default_config(p.__class__(1, False, 16, 7168, 4096, "bf16", "e2m1", "bf16"), "sm_90").gemv
    for kind in ("e2m1", "nvfp4"):
        def tile(n, k):
            c = decode.default_config(GemmProblem(1, False, 1, n, k, "bf16", kind, "bf16"), "sm_90")
            assert c.gemv and c.f16_decode and c.split_k == 1
            return c.block_n, c.block_k, c.num_warps, c.num_stages
        # the fp4 tiles by K (gemv_tiles.FP4_GEMV_TILES), each 64 weight bytes per thread
        assert tile(7168, 4096) == (8, 4096, 8, 2)
        assert tile(8192, 8192) == tile(28672, 8192) == (16, 1024, 4, 3)
        assert tile(7168, 7168) == (8, 1024, 2, 3)
        # where 16-row tiles would leave SMs idle (2048 / 16 = 128 programs), the table's 8 x 2048 codes
        assert tile(2048, 8192)[:3] == (8, 2048, 4)
        # K = 3072 (3 x 1024): the table's tile bytes as 16 rows x 1024 codes, not the heuristic
        assert tile(7168, 3072)[:2] == (16, 1024)
    # a K that 512 codes do not divide takes 256-code tiles
    assert decode.default_config(GemmProblem(1, False, 1, 7168, 768, "bf16", "e2m1", "bf16")).block_k == 256


@pytest.mark.parametrize("x_kind,w_kind", [("bf16", "e4m3"), ("e4m3", "e4m3"), ("bf16", "e5m2")])
def test_sm90_8bit_gemv_tiles(x_kind, w_kind):
    def tile(rows, n, k):
        c = decode.default_config(GemmProblem(1, False, rows, n, k, x_kind, w_kind, "bf16"), "sm_90")
        assert c.gemv and c.block_m == max(1, 1 << (rows - 1).bit_length())
        return c.block_n, c.block_k, c.num_warps, c.num_stages, c.split_k
    # one row (gemv_tiles.FP8_GEMV_TILES): whole 4096-code rows where 4096 divides K, then 2048, then 16 x 1024
    assert tile(1, 7168, 4096) == tile(1, 8192, 8192) == tile(1, 28672, 8192) == (8, 4096, 8, 2, 1)
    assert tile(1, 7168, 2048) == tile(1, 4096, 14336) == (8, 2048, 8, 2, 1)
    assert tile(1, 7168, 7168) == (16, 1024, 4, 3, 1)
    # 2-4 rows: 16 x 1024 codes wherever 1024 divides K
    assert tile(3, 7168, 4096) == tile(4, 7168, 7168) == (16, 1024, 4, 3, 1)
    # N short of a program per SM without a K split (1024 / 8 = 128 programs): the table's split tile
    assert tile(1, 1024, 4096) == tile(4, 2048, 4096) == (32, 256, 4, 1, 4)
    # K that 1024 does not divide
    assert tile(1, 7168, 1536) == (32, 256, 4, 1, 4)


@pytest.mark.parametrize("w_kind,x_kind,rows", [("e2m1", "bf16", 1), ("nvfp4", "bf16", 1), ("e4m3", "bf16", 1),
                                                ("block_fp8", "block_fp8", 1), ("e2m1", "e4m3", 4),
                                                ("e3m2", "bf16", 2)])
def test_sm90_gemv_streams_16_byte_vectors_without_mma(w_kind, x_kind, rows):
    asm = _compile_gemv(w_kind, x_kind, "sm_90", rows=rows)
    assert _VECTOR_16B.search(asm)  # whole 16-byte vectors of each weight row
    assert "cp.async" in asm  # tl.range's pipelining keeps further tiles in flight
    assert not WGMMA_BF16.search(asm) and "mma.sync" not in asm
    assert "fma.rn.f32" in asm and ".ftz" not in asm
    if w_kind in ("e2m1", "nvfp4"):
        assert "fma.rn.bf16x2" in asm and "prmt.b32" in asm  # the unscaled inline-PTX fp4 decode
    # the sums over a scale group stay inside a thread: a few shuffles for the final row sums only
    assert len(re.findall(r"shfl\.sync", asm)) <= 16 * rows


@pytest.mark.parametrize("w_kind,rows", [("e2m1", 1), ("nvfp4", 4)])
def test_sm90_gemv_f16_decode_converts_through_e4m3(w_kind, rows):
    asm = _compile_gemv(w_kind, "bf16", "sm_90", rows=rows, f16_decode=True)
    assert "cvt.rn.f16x2.e4m3x2" in asm and "cvt.f32.f16" in asm  # nibbles -> e4m3 bytes -> fp16 -> fp32
    assert "fma.rn.bf16x2" not in asm and ".ftz" not in asm
    assert _VECTOR_16B.search(asm) and "cp.async" in asm


def test_gemv_split_k_reductions():
    asm = _compile_gemv("e2m1", "bf16", "sm_90", split_k=4)
    assert "atom.global.gpu.acq_rel.add" in asm and not _FP32_ATOMIC.search(asm)
    asm = _compile_gemv("e2m1", "bf16", "sm_90", split_k=4, atomic_split_k=True)
    assert _FP32_ATOMIC.search(asm)


@pytest.mark.parametrize("target", ["sm_100", "gfx950"])
@pytest.mark.parametrize("w_kind,x_kind", [("e2m1", "bf16"), ("nvfp4", "nvfp4"), ("block_fp8", "block_fp8")])
def test_gemv_compiles_for_blackwell_and_gfx950(target, w_kind, x_kind):
    asm = _compile_gemv(w_kind, x_kind, target, rows=2)
    if target == "gfx950":
        assert "v_mfma" not in asm and re.search(r"(global|buffer)_load_dwordx4", asm)
        assert ".amdhsa_float_denorm_mode_32 3" in asm
    else:
        assert "tcgen05.mma" not in asm and "fma.rn.f32" in asm


# ---------------------------------------------------------------------------------------------------------
# the whole matmul lowered for cuda: one custom call and nothing around it


def _lowered(x, w, **kw):
    from jax_blockscale._triton import jt

    try:
        jt.jax_triton()
    except ImportError as e:
        pytest.skip(str(e))
    return jax.jit(lambda x, w: jb.matmul(x, w, target="sm_90", **kw)).trace(x, w).lower(
        lowering_platforms=("cuda",))


_OPS = re.compile(r"stablehlo\.(\w+)")
# Free in XLA: reshapes are bitcasts, constants and their broadcasts are folded.
_FREE = {"reshape", "constant", "custom_call", "return"}


@pytest.mark.parametrize("fa,fb,m", [("bf16", "mxfp4", 1), ("bf16", "nvfp4", 16), ("mxfp8", "mxfp4", 64),
                                     ("fp8_block", "fp8_block", 33), ("bf16", "mxfp6_e2m3", 7),
                                     ("bf16", "mxfp8", 3), ("bf16", "fp8_block", 2), ("nvfp4", "nvfp4", 4)])
def test_matmul_lowers_to_one_kernel(fa, fb, m):
    n, k = 7168, 4096
    w = jax.eval_shape(lambda: jb.quantize_operand(jnp.zeros((n, k)), fb, side="b"))
    x = (jax.ShapeDtypeStruct((m, k), jnp.bfloat16) if fa == "bf16"
         else jax.eval_shape(lambda: jb.quantize_operand(jnp.zeros((m, k)), fa, side="a")))
    lowered = _lowered(x, w)
    text = lowered.as_text()
    from jax_blockscale._triton import jt

    kernels = jt.lowered_kernels(lowered)
    dispatched = sm90_decode_kernel(fa, fb, m)
    name = (f"{dispatched}_kernel".encode() if dispatched != "decode"  # the Gluon kernels
            else b"gemv_kernel" if m <= 4 else b"decode_kernel")
    assert len(kernels) == 1 and name in kernels[0]
    assert text.count("stablehlo.custom_call") == 1
    ops = set(_OPS.findall(re.sub(r"backend_config = \"[^\"]*\"", "", text)))
    # broadcast_in_dim of a constant is folded; any other op would be an XLA kernel around ours
    assert ops - _FREE <= {"broadcast_in_dim"}, ops
    for line in text.splitlines():
        if "broadcast_in_dim" in line:
            assert "stablehlo.constant" in text and re.search(r"broadcast_in_dim %c", line), line
