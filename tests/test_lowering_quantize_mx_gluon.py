"""The Gluon MX / nvfp4 quantization kernel, dispatched and compiled on a CPU machine.

`quantize_primitive.fused_kernel` picks `_triton/quantize_mx_gluon.py` on sm_90+ for MX / nvfp4 pairs with a
transposed side and for nvfp4 alone (`preferred`); MX rows alone, fp8 blocks and other targets keep the
other kernels. The compiled kernel is checked for what its design promises: no shared memory (every block
in one thread), vector stores of codes on both sides, the hardware fp8 conversion for 8-bit elements and
the e2m1 pair encoder for 4-bit ones, no spills at the measured settings, for sm_90 and sm_100. The bits
are tested on the GPU (tests/test_gpu_quantize_mx_gluon.py): Gluon kernels do not run in Triton's
interpreter.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from jax_blockscale import get_format, quantize_primitive as qp
from jax_blockscale._triton import quantize_mx_gluon as qm
from jax_blockscale._triton.compile import compile_kernel
from jax_blockscale._triton.quantize_kernels import Side

from _jax_triton import require_jax_triton

jt = require_jax_triton()

F = get_format
MX8, MX4, NV4 = F("mxfp8"), F("mxfp4"), F("nvfp4")


@pytest.mark.parametrize("row,col,cc,want", [
    (MX8, MX8, 90, "gluon"), (NV4, MX8, 90, "gluon"), (NV4, NV4, 90, "gluon"), (MX4, MX4, 100, "gluon"),
    (NV4, None, 90, "gluon"), (None, MX8, 90, "gluon"), (F("mxfp6_e2m3"), F("mxfp8_e5m2"), 90, "gluon"),
    (MX8, None, 90, "triton"),                                   # MX rows alone: the Triton kernel is as fast
    (MX8, MX8, 89, "triton"), (MX8, MX8, None, "triton"),        # before sm_90; gfx950
    (MX8, F("fp8_block", block=(128, 128)), 90, "triton"),       # a fp8 block side
])
def test_dispatch(row, col, cc, want):
    assert qp.fused_kernel((256, 512), jnp.bfloat16, (row, "rceil"), (col, "rceil"), cc) == want


def test_why_not_names_the_reason():
    assert "sm_90" in qm.why_not((256, 256), jnp.bfloat16, Side(MX8), Side(MX8), 80)
    assert "dtype" in qm.why_not((256, 256), jnp.int8, Side(MX8), Side(MX8), 90)
    assert "64-bit" in qm.why_not((65536, 65536), jnp.bfloat16, Side(MX8), Side(MX8), 90)
    # x fits int32 offsets, its codes padded to whole blocks do not: 2 columns become 32 per row, 2 rows 32.
    assert qm.why_not((2**27, 2), jnp.bfloat16, Side(None), Side(MX8), 90) is None
    assert "64-bit" in qm.why_not((2**27, 2), jnp.bfloat16, Side(MX8), Side(None), 90)
    assert "64-bit" in qm.why_not((2, 2**27), jnp.bfloat16, Side(None), Side(MX8), 90)
    assert qm.why_not((2, 2**27), jnp.bfloat16, Side(NV4), Side(None), 90) is None
    assert "neither MX nor nvfp4" in qm.why_not((256, 256), jnp.bfloat16, Side(MX8), Side(F("fp8_block")), 90)
    assert "no side" in qm.why_not((256, 256), jnp.bfloat16, Side(None), Side(None), 90)


def test_launch_rejects_unknown_or_inconsistent_settings():
    x = jnp.zeros((1, 128, 128), jnp.bfloat16)
    ts = jnp.ones((2,))
    with pytest.raises(ValueError, match="unknown launch settings"):
        qm.launch(x, ts, Side(MX8), Side(MX8), [], 90, warps=8)
    with pytest.raises(ValueError, match="whole passes"):
        qm.launch(x, ts, Side(MX8), Side(MX8), [], 90, tile=(64, 128))   # 4 lanes x 32-row blocks: 128 rows
    with pytest.raises(ValueError, match="whole blocks"):
        qm.launch(x, ts, Side(MX8), Side(None), [], 90, row_thread_columns=16)  # half an MX block
    with pytest.raises(ValueError, match="powers of two"):
        qm.launch(x, ts, Side(MX8), Side(MX8), [], 90, num_warps=3)
    with pytest.raises(ValueError, match="inline PTX"):
        qm.launch(x, ts, Side(MX8), Side(MX8), [], 90, cvt="int")


def test_every_pair_has_valid_default_settings():
    kinds = [None, MX8, F("mxfp8_e5m2"), F("mxfp6_e3m2"), MX4, NV4]
    for row in kinds:
        for col in kinds:
            if row is None and col is None:
                continue
            for decoded in (False, True):
                qm.check_config(Side(row), Side(col), qm.default_config(Side(row), Side(col), decoded), decoded)


def _compiled(row, col, target="sm_90", r=8192, c=8192, x_type="*bf16", decoded=False):
    rs, cs = Side(row), Side(col)
    cfg = qm.default_config(rs, cs, decoded)
    out = "*bf16" if decoded else "*u8"
    signature = dict(x_ptr=x_type, ts_ptr="*fp32", rv_ptr=out, rs_ptr="*u8", cv_ptr=out, cs_ptr="*u8")
    return compile_kernel(qm.quantize_mx_t_kernel, target=target, signature=signature,
                          constexprs=qm.kernel_constexprs(r, c, rs, cs, cfg, decoded), num_warps=cfg["num_warps"],
                          num_stages=1)


PAIRS = {"mxfp8+T": (MX8, MX8), "nvfp4+mxfp8T": (NV4, MX8), "nvfp4+T": (NV4, NV4), "mxfp4+T": (MX4, MX4),
         "nvfp4": (NV4, None)}


@pytest.mark.parametrize("target", ["sm_90", "sm_100"])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_compiled_kernel_has_no_shared_memory_and_vector_stores(target, pair):
    row, col = PAIRS[pair]
    ptx = (ck := _compiled(row, col, target)).asm["ptx"]
    assert ck.metadata.shared == 0
    assert "st.shared" not in ptx and "ld.shared" not in ptx
    # Codes leave in 8- or 16-byte stores: a thread's row blocks, its column blocks along x^T's rows.
    wide = len(re.findall(r"st\.global(?:\.\w+)*\.v[24]\.b32", ptx))
    narrow = len(re.findall(r"st\.global(?:\.\w+)*\.b8", ptx))  # the per-block scales
    assert wide >= 2 and narrow <= wide, (wide, narrow)
    fp4 = [f for f in (row, col) if f is not None and f.element.bits == 4]
    nvfp4 = any(f is not None and f.name == "nvfp4" for f in (row, col))
    # The hardware e4m3 conversion: 8-bit MX elements, and nvfp4's block scale on its short path.
    eight = any(f.element.bits == 8 for f in (row, col) if f is not None)
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == (nvfp4 or eight)
    assert ("min.f32" in ptx and "0f40C00000" in ptx) == bool(fp4)  # the e2m1 pair encoder
    # nvfp4 sides: both paths are in the kernel, the short one (rcp.rn) and the general one (div.rn).
    assert ("rcp.rn.f32" in ptx) == nvfp4 and ("div.rn.f32" in ptx) == nvfp4


@pytest.mark.parametrize("decoded", [False, True])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_measured_settings_do_not_spill(pair, decoded):
    from benchmarks import _sass

    cubin = _compiled(*PAIRS[pair], decoded=decoded).asm["cubin"]
    assert not re.findall(r"\b(?:STL|LDL)\b", _sass.disassemble(cubin, "cuobjdump"))


@pytest.mark.parametrize("row,col,decoded,lanes_along_blocks", [
    (MX8, MX8, True, True), (MX8, None, True, True), (None, MX8, True, True), (NV4, MX8, True, True),
    (MX8, MX8, False, False), (MX4, MX4, True, False), (NV4, None, True, False), (NV4, NV4, True, False)])
def test_decoded_one_byte_mx_sides_put_lanes_along_a_block(row, col, decoded, lanes_along_blocks):
    """Decoded one-byte MX sides hold 8 elements per lane, a block's 4 lanes side by side, so a store fills
    whole sectors, and the block amax is a butterfly across lanes (Nsight Compute, mxfp8 + transposed 8192^2
    rows: 200.9 -> 176.9 us; kernel time with the columns too: 170.0 -> 155.7 us); codes, and nvfp4 / mxfp4
    sides (slower that way for rows), keep whole blocks per thread."""
    ptx = _compiled(row, col, decoded=decoded).asm["ptx"]
    assert ("shfl.sync.bfly" in ptx) == lanes_along_blocks


@pytest.mark.parametrize("target", ["sm_90", "sm_100"])
@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_decoded_kernel_stores_bf16_vectors_and_no_codes(target, pair):
    """DECODED (the recipes' bf16 GEMM inputs on Hopper): each side's values leave in 16-byte stores of bf16
    (a thread's whole row blocks; its column blocks along x^T's rows), no scale bytes are stored, and the
    elements still go through the encoders (the values are the codes', decoded)."""
    row, col = PAIRS[pair]
    ck = _compiled(row, col, target, decoded=True)
    ptx = ck.asm["ptx"]
    assert ck.metadata.shared == 0
    sides = sum(f is not None for f in (row, col))
    assert len(re.findall(r"st\.global(?:\.\w+)*\.v4\.b32", ptx)) >= 2 * sides
    assert not re.findall(r"st\.global(?:\.\w+)*\.(?:b8|u8)", ptx)
    assert "cvt.rn.bf16x2.f32" in ptx or "cvt.rn.bf16.f32" in ptx
    nvfp4 = any(f is not None and f.name == "nvfp4" for f in (row, col))
    eight = any(f.element.bits == 8 for f in (row, col) if f is not None)
    assert ("cvt.rn.satfinite.e4m3x2.f32" in ptx) == (nvfp4 or eight)  # 8-bit elements, nvfp4's short path


def test_quantize_with_transpose_lowers_to_the_gluon_kernel(hopper):
    x = jnp.zeros((2, 256, 384), jnp.bfloat16)
    lowered = jax.jit(lambda x: jb.quantize_with_transpose(x, "nvfp4", "mxfp8")).trace(x).lower(
        lowering_platforms=("cuda",))
    entries = [re.findall(r"\.entry\s+(\w+)", k.decode("latin-1")) for k in jt.lowered_kernels(lowered)]
    assert entries == [["quantize_mx_t_kernel"]]  # one kernel writes both sides


def test_quantizer_says_which_kernel():
    assert "quantize_mx_gluon" in jb.quantizer("mxfp8", target="sm_90")      # with the transposed side
    assert "quantize_mx_gluon" in jb.quantizer("nvfp4", target="sm_100")
    assert "short path for tensor scales in [2^-88, 2^116] or 0" in jb.quantizer("nvfp4", target="sm_90")
    assert "short path" not in jb.quantizer("mxfp8", target="sm_90")
    assert "quantize_mx_gluon" not in jb.quantizer("mxfp8", target="gfx950")
    assert "quantize_mx_gluon" not in jb.quantizer("fp8_block", target="sm_90", block=(1, 128))
