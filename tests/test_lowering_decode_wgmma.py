"""The Gluon decode kernel (`_triton/decode_wgmma.py`), dispatched and compiled on a CPU machine.

Checked: which problems dispatch sends it (sm_90, bf16 x mxfp4 / nvfp4 at 2-64 activation rows), its
configuration rules, and what the compiled kernel promises: the weight streams through a ring of 16-byte
cp.async copies and comes back as 16-byte ld.shared loads already in wgmma's A-operand registers (no
ldmatrix: the K relabelling moves no data), wgmma m64n16k16 with A from registers and B (the activations)
from shared memory, the split-K counter's acq_rel atomic. Results are tested on the GPU
(tests/test_gpu_decode_wgmma.py).
"""

import os
import re
import subprocess

import jax
import jax.numpy as jnp
import pytest

import jax_blockscale as jb
from jax_blockscale import backends
from jax_blockscale._triton import decode_wgmma as dw
from jax_blockscale._triton.compile import compile_kernel
from jax_blockscale._triton.problem import GemmProblem

from _jax_triton import require_jax_triton

jt = require_jax_triton()

WGMMA_REG_A = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n16k16\.f32\.bf16\.bf16\s+\{[^}]*\},\s*\{[^}]*\},\s*%rd")


def _problem(m=16, n=7168, k=4096, kind="e2m1"):
    return GemmProblem(1, False, m, n, k, "bf16", kind, "bf16")


@pytest.mark.parametrize("target,fb,rows,want", [
    ("sm_90", "mxfp4", 16, "decode_wgmma"), ("sm_90", "nvfp4", 2, "decode_wgmma"),
    ("sm_90", "mxfp4", 1, "decode"),          # one row: the CUDA-core GEMV measured faster
    ("sm_90", "mxfp4", 17, "decode_wgmma"),   # mxfp4 up to 32 rows (padded to wgmma n32) ...
    ("sm_90", "nvfp4", 17, "decode_wgmma"),   # ... and bf16 x nvfp4 since its 2 streamed splits
    ("sm_90", "nvfp4", 32, "decode_wgmma"),
    ("sm_90", "mxfp4", 33, "decode_wgmma"),   # 33-64 rows (padded to n64, the activations streamed): both fp4
    ("sm_90", "nvfp4", 64, "decode_wgmma"),
    ("sm_90", "mxfp4", 65, "upcast"),
    ("sm_90", "mxfp8", 1, "decode"),          # 8-bit weights: 1-2 rows keep the GEMV ...
    ("sm_90", "mxfp8", 2, "decode"),
    ("sm_90", "mxfp8", 3, "decode_wgmma"),    # ... bf16 activations take 3-64 rows
    ("sm_90", "mxfp8", 16, "decode_wgmma"),
    ("sm_90", "mxfp8", 64, "decode_wgmma"),
    ("sm_90", "mxfp8", 65, "upcast"),
    ("sm_100", "mxfp4", 16, "decode"),        # wgmma is Hopper's
])
def test_dispatch(target, fb, rows, want):
    kind = {"mxfp4": "e2m1", "nvfp4": "nvfp4", "mxfp8": "e4m3"}[fb]
    assert backends.choose(target, "bf16", kind, rows=rows, n=7168, k=4096).kernel == want


@pytest.mark.parametrize("fa,fb,rows,want", [
    ("e4m3", "e2m1", 2, "decode_wgmma"), ("e4m3", "e2m1", 17, "decode_wgmma"), ("e5m2", "e2m1", 32, "decode_wgmma"),
    ("e4m3", "e2m1", 33, "decode_wgmma"), ("e5m2", "e2m1", 64, "decode_wgmma"), ("e4m3", "e2m1", 65, "upcast"),
    ("e2m1", "e2m1", 32, "decode_wgmma"), ("e2m1", "e2m1", 33, "upcast"),  # fp4 activations: their decode
    ("e2m1", "e2m1", 8, "decode_wgmma"), ("e4m3", "e2m1", 1, "decode"),
    ("e4m3", "e2m1", 16, "decode_wgmma"), ("nvfp4", "nvfp4", 16, "decode_wgmma"),
    ("nvfp4", "nvfp4", 32, "decode_wgmma"), ("nvfp4", "nvfp4", 33, "upcast"),  # its activations' decode: slower
    ("e4m3", "e4m3", 16, "decode_fp8"), ("e2m1", "e5m2", 8, "decode"),   # quantized x 8-bit: opt-in here
    ("bf16", "e5m2", 8, "decode_wgmma"), ("bf16", "e5m2", 33, "decode_wgmma"),  # bf16 x 8-bit: 3-64 rows
    ("e4m3", "e4m3", 1, "decode"),    # (8-bit MX on both sides takes decode_fp8 from 2 rows)
])
def test_dispatch_quantized_activations(fa, fb, rows, want):
    assert backends.choose("sm_90", fa, fb, rows=rows, n=7168, k=4096).kernel == want
    # every pair the kernel takes is reachable by naming it
    assert backends.choose("sm_90", fa, fb, rows=rows, kernel="decode_wgmma").kernel == "decode_wgmma"


@pytest.mark.parametrize("rows,k,want", [(33, 7168, "decode_wgmma"), (64, 8192, "decode_wgmma"), (64, 4096, "upcast"),
                                         (64, None, "upcast"), (65, 8192, "upcast"), (32, 4096, "decode_wgmma")])
def test_dispatch_nvfp4_activations_at_64_rows_from_k_7168(rows, k, want):
    # nvfp4 x nvfp4 at 33-64 rows measured faster than the upcast path only from K = 7168 (backends.py)
    assert backends.choose("sm_90", "nvfp4", "nvfp4", rows=rows, n=7168, k=k).kernel == want


def test_the_table_lists_what_the_kernel_takes():
    pairs = set()
    for e in backends.KERNEL_TABLE["sm_90"]:
        if e.module == "decode_wgmma":
            pairs |= e.pairs
    assert pairs == dw.SUPPORTED


def test_a_callers_own_config_skips_it():
    # A TileConfig that names no kernel is meant for the decode / upcast entries' fields.
    assert backends.choose("sm_90", "bf16", "e2m1", rows=16, n=7168, k=4096, configured=True).kernel == "decode"


@pytest.mark.parametrize("rows,n,k,split,streamed", [
    (16, 7168, 4096, 2, True), (2, 7168, 7168, 2, True), (16, 7168, 2048, 2, True), (9, 28672, 8192, 2, True),
    (16, 8192, 8192, 2, True), (16, 1000, 1024, 2, False), (16, 64, 256, 1, False), (16, 64, 512, 1, False),
    (16, 100, 768, 1, True),
    (17, 7168, 4096, 2, True), (32, 7168, 4096, 2, True), (32, 7168, 2048, 2, False), (32, 7168, 8192, 2, True),
    (32, 7168, 1024, 2, False), (32, 7168, 512, 1, False), (32, 7168, 1280, 1, True),
])
def test_default_config_2_splits_of_256_codes_at_2_32_rows(rows, n, k, split, streamed):
    p = _problem(m=rows, n=n, k=k)
    cfg = dw.default_config(p)
    block_m = 16 if rows <= 16 else 32
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.kernel) == (block_m, 64, 256, 4, "decode_wgmma")
    assert cfg.split_k == split and cfg.num_stages == 2 and not cfg.atomic_split_k
    assert k // (cfg.block_k * cfg.split_k) >= min(2, k // cfg.block_k)  # two chunks per split where K has them
    # staged whole up to 2 chunks (16 KiB) at 16 rows and 4 (64 KiB) at 32, streamed past it
    assert dw.streams_activations(p, cfg) == streamed
    dw.check_config(p, cfg)
    with pytest.raises(ValueError, match="pads the activation rows"):
        dw.check_config(_problem(m=block_m + 1, n=n, k=k), cfg)


@pytest.mark.parametrize("rows,n,k,split", [(33, 7168, 4096, 2), (64, 7168, 4096, 2), (64, 7168, 2048, 1),
                                            (64, 7168, 7168, 2), (64, 28672, 8192, 2), (48, 1000, 1024, 1)])
def test_default_config_streams_the_activations_at_64_rows(rows, n, k, split):
    p = _problem(m=rows, n=n, k=k)
    cfg = dw.default_config(p)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.num_warps, cfg.num_stages) == (64, 64, 128, 4, 2)
    assert cfg.split_k == split and not cfg.atomic_split_k
    assert dw.streams_activations(p, cfg)  # 64 rows x K / split x 2 bytes: over STAGED_BYTES[64]
    dw.check_config(p, cfg)
    # a split too large to stage is streamed, not refused
    assert dw.streams_activations(p, cfg.replace(split_k=1))
    dw.check_config(p, cfg.replace(split_k=1))


@pytest.mark.parametrize("kind", ["e4m3", "e5m2"])
@pytest.mark.parametrize("rows,n,k,stages,split", [
    (4, 7168, 2048, 3, 1), (16, 7168, 4096, 3, 1), (3, 1000, 1024, 3, 1),  # K <= 4096, <= 132 tiles: 3 stages
    (16, 7168, 7168, 2, 2), (4, 8192, 8192, 2, 2),    # larger K: fp4's 2 stages and 2 splits
    (16, 28672, 4096, 2, 2),                          # 448 tiles: likewise
    (17, 7168, 4096, 2, 2),                           # 32 padded rows: likewise
])
def test_default_config_8bit_weights(kind, rows, n, k, stages, split):
    p = _problem(m=rows, n=n, k=k, kind=kind)
    cfg = dw.default_config(p)
    assert (cfg.block_k, cfg.num_stages, cfg.split_k) == (256, stages, split)
    dw.check_config(p, cfg)


@pytest.mark.parametrize("changes,match", [
    (dict(block_m=8), "pads the activation rows"), (dict(block_n=128), "weight rows per warp"),
    (dict(block_k=1024), "block_k"), (dict(split_k=3), "multiple of block_k"), (dict(num_stages=1), "num_stages"),
    (dict(num_stages=9), "num_stages"),
])
def test_check_config_says_why(changes, match):
    p = _problem(k=8192)
    with pytest.raises(ValueError, match=match):
        dw.check_config(p, dw.default_config(p).replace(**changes))
    with pytest.raises(ValueError, match="pads the activation rows"):
        dw.check_config(_problem(m=17), dw.default_config(_problem()))


_PTR = {"bf16": "*bf16", "e4m3": "*fp8e4nv", "e5m2": "*fp8e5", "e2m1": "*u8", "nvfp4": "*u8"}


def _compile(w_kind, x_kind="bf16", chunk=256, warps=4, split=8, atomic=False, k=4096, stages=3, rows=16,
             stream=False, cubin=False):
    sig = dict(w_ptr=_PTR[w_kind], s_ptr="*fp8e4nv" if w_kind == "nvfp4" else "*u8", x_ptr=_PTR[x_kind],
               xs_ptr={"bf16": "*bf16", "nvfp4": "*fp8e4nv"}.get(x_kind, "*u8"), a_ts_ptr="*fp32", b_ts_ptr="*fp32",
               out_ptr="*bf16", ws_ptr="*fp32", count_ptr="*i32")
    return compile_kernel(dw.decode_wgmma_kernel, target="sm_90", signature=sig, num_warps=warps, num_stages=1,
                          constexprs=dict(M=rows, N=7168, K=k, BM=rows, W_KIND=w_kind, X_KIND=x_kind, CHUNK=chunk,
                                          SPLIT_K=split, STAGES=stages, ATOMIC=atomic, WIDE=False,
                                          STREAM_X=stream)).asm["cubin" if cubin else "ptx"]


@pytest.mark.parametrize("w_kind,x_kind,chunk,warps", [
    ("e2m1", "bf16", 256, 4), ("nvfp4", "bf16", 256, 4), ("e2m1", "bf16", 128, 8), ("e4m3", "bf16", 256, 4),
    ("e5m2", "bf16", 128, 4), ("e4m3", "e4m3", 256, 4), ("e2m1", "e4m3", 256, 4), ("e2m1", "e2m1", 128, 4),
    ("nvfp4", "nvfp4", 256, 4),
])
def test_weight_streams_through_a_cp_async_ring_into_wgmma_registers(w_kind, x_kind, chunk, warps):
    ptx = _compile(w_kind, x_kind, chunk, warps)
    # 16-byte cp.async copies of the weight rows (the scales' copies are 4 bytes), a ring slot per step.
    assert re.search(r"cp\.async\.cg\.shared\.global(\.L2::\d+B)? \[[^]]+\], \[[^]]+\], 0x10", ptx)
    assert "cp.async.wait_group" in ptx
    # Read back in the A operand's own layout (16-byte ld.shared), not through ldmatrix or a layout shuffle.
    assert "ldmatrix" not in ptx and "ld.shared.v4.b32" in ptx
    wgmmas = WGMMA_REG_A.findall(ptx)
    assert len(wgmmas) == chunk // 16, len(wgmmas)  # one per k16 step of the chunk (the loop is not unrolled)
    assert "atom.global.gpu.acq_rel" in ptx or "atom.acq_rel.gpu.global" in ptx


@pytest.mark.parametrize("w_kind,x_kind,rows,chunk", [("e2m1", "bf16", 64, 128), ("nvfp4", "bf16", 64, 128),
                                                     ("e2m1", "e4m3", 64, 128), ("e2m1", "bf16", 32, 256),
                                                     ("nvfp4", "nvfp4", 32, 256)])
def test_streamed_activations_keep_one_wgmma_in_flight(w_kind, x_kind, rows, chunk, tmp_path):
    # The activations through a 2-chunk ring (the defaults at 32 and 64 rows): m64n{rows}k16 wgmmas from
    # registers, left in flight (wait for one outstanding) across the next chunk's stores; ptxas neither
    # serializes them nor spills.
    from triton.backends.nvidia.compiler import get_ptxas

    ptx = _compile(w_kind, x_kind, chunk=chunk, split=2, stages=2, rows=rows, stream=True)
    wgmma = rf"wgmma\.mma_async\.sync\.aligned\.m64n{rows}k16\.f32\.bf16\.bf16\s+\{{[^}}]*\}},\s*\{{[^}}]*\}},\s*%rd"
    assert len(re.findall(wgmma, ptx)) == chunk // 16
    assert {int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)} == {0, 1}
    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    report = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", os.devnull],
                            capture_output=True, text=True, check=True).stderr
    assert "C7514" not in report and "C7515" not in report  # no wgmma serialized
    assert "0 bytes spill stores, 0 bytes spill loads" in report


@pytest.mark.parametrize("w_kind,multiplies", [("e2m1", 2), ("nvfp4", 1)])
def test_fp4_pairs_reach_wgmma_without_repacking(w_kind, multiplies):
    # The PTX decode yields bf16 pairs of the low (or high) nibbles of two adjacent bytes; `_slots(NIBBLES)`
    # relabels K so that such a pair is one A-fragment register: the K loop (one 256-code chunk, 128 codes
    # per thread) has one PRMT per 8 codes (the decode's byte permute), not 5 (one re-pairing per 2 codes),
    # and 1 (nvfp4: the bias folded into the scale) or 2 (mxfp4) bf16x2 multiplies per pair.
    from benchmarks._sass import disassemble
    from benchmarks.sass_count import _LINE, largest_loop

    cubin = _compile(w_kind, split=8, stages=2, cubin=True)
    ops = [_LINE.match(x).group(2).split(".")[0] for x in largest_loop(disassemble(cubin).splitlines())]
    assert ops.count("HGMMA") == 256 // 16
    assert ops.count("PRMT") <= 128 // 8 + 4, ops.count("PRMT")  # + the scales' pairs
    assert multiplies * 64 <= ops.count("HMUL2") <= multiplies * 64 + 8, ops.count("HMUL2")


@pytest.mark.parametrize("w_kind,cvt", [("e4m3", "cvt.rn.f16x2.e4m3x2"), ("e5m2", "cvt.rn.f16x2.e5m2x2")])
def test_8bit_weights_decode_by_hardware_conversion(w_kind, cvt):
    # 4 codes: two cvt to f16x2, widened and packed to bf16x2, one bf16x2 multiply by the scale per pair;
    # 256-code chunks: 64 rows x 256 codes over 128 threads = 128 codes per thread and step.
    ptx = _compile(w_kind)
    assert ptx.count(cvt) == 128 // 2 and ptx.count("fma.rn.bf16x2") == 128 // 2


def test_atomic_split_k_adds_fp32_atomics():
    ptx = _compile("e2m1", atomic=True)
    assert "atom.global.gpu.relaxed.add.f32" in ptx or "red.global.gpu.relaxed.add.f32" in ptx


def test_matmul_lowers_to_it(hopper):
    x = jnp.zeros((2, 5, 1000), jnp.bfloat16)
    w = jb.quantize_operand(jnp.zeros((777, 1000), jnp.float32), "nvfp4", side="b")
    lowered = jax.jit(lambda x, w: jb.matmul(x, w)).trace(x, w).lower(lowering_platforms=("cuda",))
    (ptx,) = [k.decode("latin-1") for k in jt.lowered_kernels(lowered)]
    assert "decode_wgmma_kernel" in ptx
    assert WGMMA_REG_A.search(ptx)
    assert jb.explain(x, w, target="sm_90").kernel == "decode_wgmma"


def test_launch_refuses_other_targets():
    p = _problem()
    with pytest.raises(ValueError, match="sm_90"):
        dw.launch(p, jnp.zeros((1, 16, 4096), jnp.bfloat16), jnp.zeros((1,), jnp.uint8),
                  jnp.zeros((7168, 2048), jnp.uint8), jnp.zeros((7168, 128), jnp.uint8), jnp.ones((1,)),
                  config=dw.default_config(p), compute_capability=100)
