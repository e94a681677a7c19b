"""The Gluon fp8 1x128 + transposed quantization kernel, dispatched and compiled on a CPU machine.

`quantize_primitive.fused_kernel` picks `_triton/quantize_fp8_gluon.py` on sm_90+ for fp8 1 x 128 with a
transposed 1 x 128 or 128 x 128 side, and the Triton kernel for every other pair and target. The compiled
kernel is checked for what its design promises: no shared memory (each side reads x in its own layout, a
column's amax stays within a warp), 16-byte stores of both sides' codes, the hardware fp8 conversion, and
a register count that lets several programs share an SM. The bits are tested on the GPU
(tests/test_gpu_quantize_fp8_gluon.py): Gluon kernels do not run in Triton's interpreter.
"""

import re

import jax
import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from jax_blockscale import get_format, quantize_primitive as qp
from jax_blockscale._triton import quantize_fp8_gluon as qg
from jax_blockscale._triton.compile import compile_kernel
from jax_blockscale._triton.quantize_kernels import Side

from _jax_triton import require_jax_triton

jt = require_jax_triton()

ROW = get_format("fp8_block", block=(1, 128))
T1 = get_format("fp8_block", block=(1, 128))
T128 = get_format("fp8_block", block=(128, 128))


@pytest.mark.parametrize("row,col,cc,want", [
    (ROW, T1, 90, "gluon"), (ROW, T128, 90, "gluon"), (ROW, T1, 100, "gluon"),
    (ROW, T1, None, "triton"),                                   # gfx950: no compute capability
    (ROW, None, 90, "triton"),                                   # no transposed side
    (T128, T128, 90, "triton"),                                  # the weights' square tiles (reuse)
    (ROW, get_format("mxfp8"), 90, "triton"),                    # mixed fp8 / MX: neither Gluon kernel
    (ROW, get_format("fp8_block", block=(256, 256)), 90, "triton"),
])
def test_dispatch(row, col, cc, want):
    assert qp.fused_kernel((256, 512), jnp.bfloat16, (row, "rceil"), (col, "rceil"), cc) == want


def test_why_not_names_the_reason():
    assert "sm_90" in qg.why_not((256, 256), jnp.bfloat16, Side(ROW), Side(T1), 80)
    assert "dtype" in qg.why_not((256, 256), jnp.int8, Side(ROW), Side(T1), 90)
    assert "64-bit" in qg.why_not((65536, 65536), jnp.bfloat16, Side(ROW), Side(T1), 90)
    with pytest.raises(ValueError, match="Gluon quantization kernel does not apply"):
        qp._launch(jnp.zeros((1, 128, 128), jnp.bfloat16), jnp.ones((2,)), row=(T128, "rceil"),
                   col=(T128, "rceil"), compute_capability=90, kernel="gluon")


@pytest.mark.parametrize("t_fmt", [T1, T128])
def test_quantize_with_transpose_lowers_to_the_gluon_kernel(hopper, t_fmt):
    x = jnp.zeros((2, 256, 384), jnp.bfloat16)
    lowered = jax.jit(lambda x: jb.quantize_with_transpose(x, ROW, t_fmt)).trace(x).lower(
        lowering_platforms=("cuda",))
    (ptx,) = [k.decode("latin-1") for k in jt.lowered_kernels(lowered)]
    assert "quantize_fp8_1x128_t_kernel" in ptx
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx


def _compiled(target, x_type="*bf16", col_tile=1, r=8192, c=8192):
    cfg = qg.CONFIGS[col_tile]
    cr, cc = cfg["column_thread_tile"]
    return compile_kernel(qg.quantize_fp8_1x128_t_kernel, target=target,
                          signature=dict(x_ptr=x_type, rv_ptr="*u8", rs_ptr="*fp32", cv_ptr="*u8", cs_ptr="*fp32"),
                          constexprs=dict(R=r, C=c, CQ=-(-c // 128) * 128, RQ=-(-r // 128) * 128,
                                          COL_TILE=col_tile, MBITS=3, CR=cr, CC=cc, RC=cfg["row_thread_columns"]),
                          num_warps=cfg["num_warps"], num_stages=1,
                          **({"maxnreg": cfg["maxnreg"]} if cfg["maxnreg"] else {}))


@pytest.mark.parametrize("target", ["sm_90", "sm_100"])
@pytest.mark.parametrize("col_tile", [1, 128])
def test_compiled_kernel_has_no_shared_memory_and_wide_stores(target, col_tile):
    ck = _compiled(target, col_tile=col_tile)
    ptx = ck.asm["ptx"]
    # One word per warp for the 128 x 128 tile's amax (a cross-warp max), no staging of x.
    assert ck.metadata.shared <= 4 * qg.CONFIGS[col_tile]["num_warps"]
    assert "st.shared" not in ptx or col_tile == 128
    # Every code store is 16 bytes: a thread's row codes (RC per row strip) and a column's CR codes.
    cfg = qg.CONFIGS[col_tile]
    threads = 32 * cfg["num_warps"]
    cr, cc = cfg["column_thread_tile"]
    want = 2 * 128 * 128 // 16 // threads  # both sides' codes in 16-byte stores, per thread
    assert len(re.findall(r"st\.global(?:\.\w+)*\.v4\.b32", ptx)) == want
    assert cr % 16 == 0 and cfg["row_thread_columns"] % 16 == 0
    assert "cvt.rn.satfinite.e4m3x2.f32" in ptx


def test_registers_allow_several_programs_per_sm_without_spills():
    """At most 80 registers x 256 threads: three programs per H100 SM (96 uncapped: two). The cap spills at
    most one value once (1 STL + 1 LDL for the 1 x 128 column side, none for 128 x 128): measured faster
    (quantize_fp8_gluon.CONFIGS); a cap that spilled in the loop (64: 161 us against 118) would fail here."""
    from benchmarks import _sass

    for col_tile in (1, 128):
        cubin = _compiled("sm_90", col_tile=col_tile).asm["cubin"]
        regs = _sass.registers(cubin)
        assert regs * 32 * qg.CONFIGS[col_tile]["num_warps"] <= 65536 // 3, (col_tile, regs)
        sass = _sass.disassemble(cubin, "cuobjdump")
        assert len(re.findall(r"\b(?:STL|LDL)\b", sass)) <= 2, col_tile


def test_launch_rejects_unknown_settings():
    with pytest.raises(ValueError, match="unknown launch settings"):
        qg.launch(jnp.zeros((1, 128, 128), jnp.bfloat16), jnp.ones((2,)), Side(ROW), Side(T1), [], 90, warps=8)


def test_launch_rejects_partial_runs():
    x = jnp.zeros((1, 128, 128), jnp.bfloat16)
    with pytest.raises(ValueError, match="whole runs of 16"):
        qg.launch(x, None, Side(ROW), Side(T1), [], 90, row_thread_columns=8)
    with pytest.raises(ValueError, match="whole runs of 16"):
        qg.launch(x, None, Side(ROW), Side(T1), [], 90, column_thread_tile=(2, 16))


@pytest.mark.parametrize("rows", [8, 16, 32, 64])
def test_column_rows_come_in_runs_of_16_per_store(rows):
    """A thread's rows of a column are runs of at most 16 (one 16-byte store of codes), the lanes' runs
    adjacent: each store fills whole sectors (H100, f32 8192^2 fp8 1x128 + transposed: 184.2 -> 163.8 us)."""
    layout = qg._column_layout(8, rows, 1, True)
    run = min(rows, 16)
    assert [b[0] for b in layout.reg_bases[:run.bit_length() - 1]] == [1 << i for i in range(run.bit_length() - 1)]
    lane_rows = [b[0] for b in layout.lane_bases if b[0]]
    assert lane_rows[0] == run and len(lane_rows) == (128 // rows).bit_length() - 1
    # every row of the block is held exactly once by (register, lane) bases
    row_bases = [b[0] for b in layout.reg_bases + layout.lane_bases if b[0]]
    assert sorted(row_bases) == [1 << i for i in range(7)]


def test_quantizer_says_which_kernel():
    assert "quantize_fp8_gluon" in jb.quantizer("fp8_block", target="sm_90", block=(1, 128))
    assert "quantize_fp8_gluon" not in jb.quantizer("fp8_block", target="gfx950", block=(1, 128))
    assert "quantize_fp8_gluon" not in jb.quantizer("mxfp8", target="sm_90")
