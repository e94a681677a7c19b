"""benchmarks/_kernel_time.py on a CPU: aggregation, classification, XSpace parsing and the trace plumbing.

The XSpace tests build a GPU plane the way XLA's CUPTI collector writes one (a "/device:GPU:0" plane with
"Stream #<id>(...)" lines, plus a derived "XLA Ops" line repeating the same time) through
`jax.profiler.ProfileData.from_text_proto`, so the parser is exercised on the real ProfileData objects.
"""

import math
import pathlib
import sys

import jax
import jax.numpy as jnp
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import _kernel_time as kt  # noqa: E402
from benchmarks._kernel_time import DEQUANT, GEMM, MEMCPY, MEMSET, OTHER, QUANT, DeviceEvent  # noqa: E402


def test_aggregate_per_operation_sums_and_kernel_list():
    # 2 calls x 4 operations: per operation 8 events of gemm (10 us) + 1 of a fusion (2.5 us)
    events = ([DeviceEvent("nvjet_hsh_256x128", 10_000.0)] * 8 + [DeviceEvent("loop_convert_fusion", 2_500.0)] * 8
              + [DeviceEvent("MemcpyD2D", 4_000.0, MEMCPY), DeviceEvent("Memset", 4_000.0, MEMSET)])
    p = kt.aggregate(events, calls=2, ops_per_call=4)
    assert p.kernel_s == pytest.approx(12.5e-6)
    assert p.memcpy_s == pytest.approx(1e-6)
    assert p.launches == pytest.approx(2.0)
    assert [k.name for k in p.kernels] == ["nvjet_hsh_256x128", "loop_convert_fusion"]
    assert p.kernels[0].seconds == pytest.approx(10e-6) and p.kernels[0].launches == pytest.approx(1.0)
    assert p.ok and p.calls == 2 and p.ops_per_call == 4
    b = kt.breakdown(p)
    assert b[GEMM] == pytest.approx(10e-6) and b[OTHER] == pytest.approx(2.5e-6) and b[QUANT] == 0.0
    assert sum(b.values()) == pytest.approx(p.kernel_s)
    assert "nvjet_hsh_256x128 10us x1" in p.summary() and "," not in p.summary()


def test_aggregate_without_kernels_is_nan_not_zero():
    p = kt.aggregate([DeviceEvent("MemcpyH2D", 1000.0, MEMCPY)], calls=1)
    assert math.isnan(p.kernel_s) and not p.ok and p.memcpy_s == pytest.approx(1e-6)
    assert all(math.isnan(v) for v in kt.breakdown(p).values())
    with pytest.raises(ValueError):
        kt.aggregate([], calls=0)
    with pytest.raises(ValueError):
        kt.aggregate([DeviceEvent("x", 1.0, "texture")], calls=1)


@pytest.mark.parametrize("name, category", [
    ("block_fp8_kernel", GEMM), ("upcast_kernel", GEMM), ("tma_gemm_kernel", GEMM), ("scaled_gemm_kernel", GEMM),
    ("block_fp8_gluon_kernel", GEMM), ("persistent_block_fp8_kernel", GEMM), ("gemv_kernel", GEMM),
    ("block_fp8_gemm_swapped", GEMM), ("decode_gemv_kernel", GEMM), ("upcast_gemm_tma", GEMM),
    ("nvjet_hsh_192x192_64x4_2x1_v_bz_coopB_TNT", GEMM), ("sm90_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", GEMM),
    ("cutlass3x_sm90_tensorop_gemm", GEMM), ("gemm_fusion_dot_3", GEMM), ("void cublasLt::splitKreduce_kernel", GEMM),
    ("quantize_mxfp8_kernel", QUANT), ("jbs_quantize_rows", QUANT), ("_quantize_fp8_block", QUANT),
    ("quantize_fp8_1x128_t_kernel", QUANT), ("quantize_kernel", QUANT),
    ("loop_multiply_fusion", OTHER), ("input_reduce_fusion_2", OTHER), ("dequantize_fusion", OTHER),
    ("wrapped_convert", OTHER), ("MemcpyD2D", OTHER),
])
def test_classify(name, category):
    assert kt.classify(name) == category


# Two fusions as `compiled.as_text()` prints them (operand shapes and backend configs cut), one in
# jax_blockscale's dequantize scope, one not, and a kernel-named custom call.
HLO = """
ENTRY %main.1 (p.1: u8[64,256]) -> bf16[64,256] {
  %loop_convert_fusion.22 = bf16[1,8192,512,32]{3,2,1,0} fusion(%a.0, %b.1), kind=kLoop, calls=%fused_convert.22, \
metadata={op_name="jit(step)/jvp(TinyLM)/blocks/Dense_2/jbs_dequantize/mul" source_file="x.py" source_line=3}
  ROOT %loop-add-fusion.3 = bf16[8,1024,4096]{2,1,0} fusion(%c.2), kind=kLoop, calls=%fused_add.3, \
metadata={op_name="jit(step)/jvp(TinyLM)/blocks/add"}
  %custom-call.7 = u8[64,256]{1,0} custom-call(%p.1), custom_call_target="__gpu$xla.gpu.triton"
}
""".replace("\\\n", "")


def test_fusion_op_names_and_reclassify_dequantize_passes():
    names = kt.fusion_op_names(HLO)
    assert names == {"loop_convert_fusion_22": "jit(step)/jvp(TinyLM)/blocks/Dense_2/jbs_dequantize/mul",
                     "loop_add_fusion_3": "jit(step)/jvp(TinyLM)/blocks/add"}
    events = [DeviceEvent("loop_convert_fusion_22", 3_000.0), DeviceEvent("loop_add_fusion_3", 2_000.0),
              DeviceEvent("tma_gemm_kernel", 10_000.0), DeviceEvent("quantize_mx_t_kernel", 1_000.0)]
    p = kt.reclassify(kt.aggregate(events, calls=1), names)
    assert {k.name: k.category for k in p.kernels} == {
        "loop_convert_fusion_22": DEQUANT, "loop_add_fusion_3": OTHER, "tma_gemm_kernel": GEMM,
        "quantize_mx_t_kernel": QUANT}
    b = kt.breakdown(p)
    assert b[DEQUANT] == pytest.approx(3e-6) and b[OTHER] == pytest.approx(2e-6)
    assert sum(b.values()) == pytest.approx(p.kernel_s)
    # without the program's names nothing moves: the fusion is "other", as its name says nothing
    assert kt.breakdown(kt.aggregate(events, calls=1))[DEQUANT] == 0.0


GPU_XSPACE = '''
planes {
  id: 1
  name: "/device:GPU:0"
  lines { id: 1 name: "Stream #13(Kernel,MemcpyD2D)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 5000000 }
    events { metadata_id: 1 offset_ps: 9000000 duration_ps: 5000000 }
    events { metadata_id: 2 offset_ps: 6000000 duration_ps: 1000000 stats { metadata_id: 7 str_value: "b:4" } }
  }
  lines { id: 2 name: "Stream #14(Kernel)" timestamp_ns: 1000
    events { metadata_id: 4 offset_ps: 0 duration_ps: 2000000 }
  }
  lines { id: 3 name: "XLA Ops" timestamp_ns: 1000 events { metadata_id: 3 offset_ps: 0 duration_ps: 12000000 } }
  lines { id: 4 name: "XLA Modules" timestamp_ns: 1000 events { metadata_id: 5 offset_ps: 0 duration_ps: 9 } }
  event_metadata { key: 1 value { id: 1 name: "block_fp8_kernel" } }
  event_metadata { key: 2 value { id: 2 name: "copy_d2d" } }
  event_metadata { key: 3 value { id: 3 name: "custom-call.1" } }
  event_metadata { key: 4 value { id: 4 name: "loop_convert_fusion" } }
  event_metadata { key: 5 value { id: 5 name: "jit_run_all" } }
  stat_metadata { key: 7 value { id: 7 name: "memcpy_details" } }
}
planes {
  id: 2
  name: "/host:CPU"
  lines { id: 1 name: "python" events { metadata_id: 1 duration_ps: 99000000 } }
  event_metadata { key: 1 value { id: 1 name: "Stream #1 lookalike" } }
}
'''


def test_events_from_xspace_stream_lines_only():
    from jax.profiler import ProfileData
    events, planes = kt.events_from_planes(ProfileData.from_text_proto(GPU_XSPACE).planes)
    assert planes == 1
    assert sorted((e.name, e.duration_ns, e.kind) for e in events) == [
        ("block_fp8_kernel", 5000.0, "kernel"), ("block_fp8_kernel", 5000.0, "kernel"),
        ("copy_d2d", 1000.0, MEMCPY), ("loop_convert_fusion", 2000.0, "kernel")]
    p = kt.aggregate(events, calls=2)
    assert p.kernel_s == pytest.approx(6e-6) and p.memcpy_s == pytest.approx(0.5e-6)
    assert kt.breakdown(p)[GEMM] == pytest.approx(5e-6)


def test_events_without_stream_names_skip_summary_lines():
    """A GPU plane whose kernel lines are not named "Stream #" (another collector): every line except the
    summaries counts."""
    from jax.profiler import ProfileData
    text = GPU_XSPACE.replace('"Stream #13(Kernel,MemcpyD2D)"', '"compute"').replace('"Stream #14(Kernel)"',
                                                                                    '"compute2"')
    events, _ = kt.events_from_planes(ProfileData.from_text_proto(text).planes)
    assert sorted(e.name for e in events) == ["block_fp8_kernel", "block_fp8_kernel", "copy_d2d",
                                              "loop_convert_fusion"]
    assert not kt.is_gpu_plane("/host:CPU") and kt.is_gpu_plane("/device:GPU:7")


def test_profile_and_kernel_times_run_on_cpu():
    """The trace plumbing runs where there is no GPU: empty profile with a reason, wall clock measured."""
    f = jax.jit(lambda x: x * 2)
    sets = [(jnp.full((64, 64), i, jnp.float32),) for i in range(3)]
    calls = []
    p = kt.profile(lambda: calls.append(1) or f(*sets[0]), calls=4, ops_per_call=2)
    assert len(calls) == 4 and p.calls == 4 and p.ops_per_call == 2
    if jax.default_backend() != "gpu":
        assert not p.ok and math.isnan(p.kernel_s) and p.note
    t = kt.kernel_times(f, sets, warmup=1, samples=3, backend="jax")
    assert t.wall_s > 0 and t.wall_min_s <= t.wall_s
    with pytest.raises(ValueError):
        kt.kernel_times(f, [])
    with pytest.raises(ValueError):
        kt.profile(lambda: None, calls=1, backend="nsys")


def test_trace_calls_bounds():
    assert kt.trace_calls(1e-3) == 20
    assert kt.trace_calls(1.0) == 2 and kt.trace_calls(1e-9) == 50 and kt.trace_calls(math.nan) == 2
