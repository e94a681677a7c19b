"""CPU checks of the static SASS tools whose counts the README cites (benchmarks/sass_count.py for the decode
kernels, benchmarks/sass_quant.py for the quantization kernel): each cross-compiles for sm_90, disassembles
with the tools Triton ships, and classifies every instruction it counts."""

import pytest

from benchmarks import _sass, sass_count, sass_quant


def test_access_bytes_reads_the_width_suffix():
    assert [_sass.access_bytes(op) for op in ("LDS.U8", "STS.U16", "LDS", "LDS.64", "STS.128", "LDG.E.128")] == \
        [1, 2, 4, 8, 16, 16]


def test_sass_count_finds_the_gemv_k_loop_and_classifies_all_of_it():
    r = sass_count.count("e2m1", rows=1)
    assert r["config"].gemv and r["body"]  # the tuned fp4 GEMV and its K loop
    loop = r["loop"]
    classes = {k: v for k, v in loop.items() if k not in ("total", "alu pipe", "smem bytes")}
    assert sum(classes.values()) == loop["total"] > 0
    assert loop["alu pipe"] == classes.get("bit ops", 0) + classes.get("int alu", 0)
    assert classes.get("fp32 fma", 0) > 0 and classes.get("global load", 0) > 0  # FMAs and the weight stream
    assert r["bound_us"] == max(r["issue_us"], r["pipe_us"], r["smem_us"], r["grid_us"]) > 0
    # the decode through e4m3 bytes: 7 integer ops per 8 codes and 4 hardware conversions (F2FP); the fp16
    # bit placement before it took 2.2 integer-pipe ops per element
    assert r["per_elem"]["alu pipe"] < 1.5 and r["per_elem"]["convert"] >= 0.5
    assert any("F2FP.F16.E4M3" in line for line in r["body"])


@pytest.mark.parametrize("label", ["mxfp8", "fp8_1x128+T"])
def test_sass_quant_launches_the_primitives_plan_and_bounds_each_pipe(label):
    plan = sass_quant.case_plan(label)
    assert plan.constexprs["CVT"] == "hw"  # what the primitive passes on sm_90
    r = sass_quant.analyse(label, plan, _sass.disassemble(sass_quant.compile_case(label, plan), tool="cuobjdump"))
    assert sum(r["counts"].values()) > 0 and r["time_us"]["dram"] > 0
    assert r["bound"] == max(r["time_us"], key=r["time_us"].get)
    if label.endswith("+T"):  # the transposed codes go through shared memory
        assert r["counts"]["lds/sts"] > 0 and r["time_us"]["smem"] > 0
