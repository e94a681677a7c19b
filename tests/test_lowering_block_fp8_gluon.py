"""CPU tests of the Gluon Hopper block FP8 kernel (block_fp8_gluon.py), cross-compiled for sm_90.

What they prove without a GPU: the kernel builds its TMA descriptors in the kernel (global scratch), loads
with TMA and multiplies with fp8 e4m3 wgmma of 128 columns; it is warp-specialized (12 warps: two 4-warp
consumers and a loader, registers moved by setmaxnreg to 224 per consumer thread and 56 in the loader);
each consumer waits for its own wgmma only (`wgmma.wait_group 0`) and ptxas keeps every wgmma asynchronous
(no C7514/C7515 serialization notice) with no spills and no copy of a wgmma register; the launcher's checks refuse what the kernel cannot
take; the dispatch table picks it for large problems on sm_90 only, and `jb.matmul` lowers to one launch
of min(NUM_SMS, tiles) programs. GPU results: test_gpu_block_fp8_persistent.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

pytest.importorskip("triton")
pytest.importorskip("triton.experimental.gluon")

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import backends  # noqa: E402
from jax_blockscale._triton import block_fp8_gluon as bg, block_fp8_persistent as bp  # noqa: E402
from jax_blockscale._triton.compile import assembly, compile_kernel  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from test_lowering_hopper_tma import TMA_LOAD, WGMMA_FP8  # noqa: E402

SIG = {"a_ptr": "*fp8e4nv", "a_scale_ptr": "*fp32", "b_ptr": "*fp8e4nv", "b_scale_ptr": "*fp32",
       "alpha_ptr": "*fp32", "out_ptr": "*bf16"}
BIG = GemmProblem(1, False, 8192, 8192, 8192, "block_fp8", "block_fp8", "bf16")


def _compile(m=8192, n=8192, k=8192, block_n=256, stages=3, tma_store=True):
    config = bg.default_config(BIG).replace(block_n=block_n, num_stages=stages)
    constexprs = dict(M=m, N=n, K=k, BLOCK_M=128, BLOCK_N=block_n, GROUP_M=8, NUM_SMS=132, STAGES=stages,
                      TMA_STORE=tma_store, EPI_BUFS=bg.epilogue_buffers(config, jnp.bfloat16))
    return compile_kernel(bg.block_fp8_gluon_kernel, target="sm_90", signature=SIG, constexprs=constexprs,
                          num_warps=4, num_stages=stages, maxnreg=bg.MAX_REGISTERS)


def _ptxas(ptx: str, tmp_path) -> str:
    """ptxas -v's report for the PTX (the same ptxas Triton ships and uses)."""
    from triton.backends.nvidia.compiler import get_ptxas

    path = tmp_path / "k.ptx"
    path.write_text(ptx)
    out = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", os.devnull],
                         capture_output=True, text=True, check=True)
    return out.stderr


@pytest.mark.parametrize("block_n,stages", [(256, 3), (256, 4), (128, 4)])
def test_warp_specialized_fp8_wgmma_stays_asynchronous(block_n, stages, tmp_path):
    compiled = _compile(block_n=block_n, stages=stages)
    ptx = assembly(compiled)
    assert TMA_LOAD in ptx and {int(n) for n in WGMMA_FP8.findall(ptx)} == {128}
    assert compiled.metadata.global_scratch_size > 0  # the descriptors are built in the kernel
    assert compiled.metadata.num_warps == 12  # two consumers and the loader's (padded) warp group
    assert compiled.metadata.shared <= bg.SMEM_BYTES
    assert {int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)} == {0}
    assert {int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)} >= {224}
    assert {int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)} >= {56}
    report = _ptxas(ptx, tmp_path)
    assert "C7514" not in report and "C7515" not in report  # no wgmma serialized
    assert "0 bytes spill stores, 0 bytes spill loads" in report
    # The promotion completes before the next wgmma reuses the partial's registers (`_settled`): no wgmma
    # register is copied in a K loop (the unpinned 128 x 256 loop copied them 384 times, 64 per subtile and
    # K block). The first K step of a tile, peeled to overlap the previous tile's stores, hands the partial
    # to the loop once per consumer: at most 64 copies each, outside the K loops.
    wgmma_regs = {r.strip() for m in re.finditer(r"wgmma\.mma_async\S*\s+\{([^}]*)\}", ptx)
                  for r in m.group(1).split(",")}
    k_loops = {h: body for h, body in _k_loop_blocks(ptx).items() if "wgmma.mma_async" in body}
    assert wgmma_regs and len(k_loops) == 2  # one per consumer (the loader's loop has no wgmma)
    assert not [m for body in k_loops.values() for m in re.finditer(r"mov\.b32\s+%r\d+, (%r\d+);", body)
                if m.group(1) in wgmma_regs]
    assert len([m for m in re.finditer(r"mov\.b32\s+%r\d+, (%r\d+);", ptx) if m.group(1) in wgmma_regs]) <= 128


def _k_loop_blocks(ptx: str) -> dict[str, str]:
    """The PTX of each innermost loop (the consumers' and the loader's K loops), keyed by its header label: LLVM's
    comments name a block "This Inner Loop Header" or "in Loop: Header=<that header>". A block runs to the
    next `$L__BB` label, and LLVM leaves fall-through blocks unlabelled, so a loop's text can include code
    just after it: a check that finds nothing there is stricter than needed, never looser."""
    blocks, label, comment = {}, None, ""
    headers, members = set(), {}
    for line in ptx.splitlines():
        if m := re.match(r"^(\$L__BB\d+_\d+):(.*)", line.strip()):
            label, comment = m.group(1), m.group(2)
            blocks[label] = ""
            if h := re.search(r"in Loop: Header=(BB\d+_\d+)", comment):
                members[label] = "$L__" + h.group(1)
            continue
        if label is None:
            continue
        if line.strip().startswith("//") and not blocks[label].strip():
            if "This Inner Loop Header" in line:
                headers.add(label)
            continue
        blocks[label] += line + "\n"
    loops = {h: blocks[h] for h in headers}
    for block, header in members.items():
        if header in loops:
            loops[header] += blocks[block]
    return loops


@pytest.mark.parametrize("n", [8192, 2112])  # 2112: the light tiles' loop too
def test_stages_are_released_by_named_barriers(n):
    """A consumer releases a stage with bar.arrive on named barrier EMPTY_BARRIER0 + s (all its 128 threads),
    the loader waits for the 2 x 128 + 32 threads with bar.sync, and the consumers' K loops keep one mbarrier
    arrive (the turn) and at most two of the warp group's own bar.sync per K step (an mbarrier release had
    two more). The named IDs lie above every ID Triton uses itself and below 16."""
    ptx = assembly(_compile(n=n, k=4096))
    # each loop's text up to its back edge (`_k_loop_blocks` may run on past it)
    k_loops = [body[:body.index(f"bra \t{header};")] for header, body in _k_loop_blocks(ptx).items()
               if "wgmma.mma_async" in body]
    assert k_loops
    for body in k_loops:
        assert len(re.findall(r"\bbar\.arrive\s+%r\d+, %r\d+;", body)) >= 1
        assert len(re.findall(r"mbarrier\.arrive", body)) == 1
        wgmma = len(re.findall(r"wgmma\.commit_group", body))
        assert len(re.findall(r"\bbar\.sync\s+\d+, 128;", body)) <= wgmma
    threads = {m.group(1) for m in re.finditer(r"mov\.b32\s+(%r\d+), 288;", ptx)}
    assert threads and any(re.search(rf"\bbar\.sync\s+%r\d+, {re.escape(r)};", ptx) for r in threads)
    triton_ids = {int(i) for i in re.findall(r"\b(?:bar|barrier)\.sync\s+(\d+)", ptx)}
    assert max(triton_ids) < bg.EMPTY_BARRIER0.value and bg.EMPTY_BARRIER0.value + bg.MAX_STAGES - 1 <= 15


def test_float32_output_does_not_spill(tmp_path):
    """The previous tile's outputs stay in registers through the next tile's first K step: as fp32 (64 + 64
    per consumer thread, one output buffer) they still fit beside the partial without spilling."""
    config = bg.default_config(BIG)
    compiled = compile_kernel(bg.block_fp8_gluon_kernel, target="sm_90", signature={**SIG, "out_ptr": "*fp32"},
                              constexprs=dict(M=8192, N=8192, K=2048, BLOCK_M=128, BLOCK_N=256, GROUP_M=8,
                                              NUM_SMS=132, STAGES=3, TMA_STORE=True,
                                              EPI_BUFS=bg.epilogue_buffers(config, jnp.float32)),
                              num_warps=4, num_stages=3, maxnreg=bg.MAX_REGISTERS)
    report = _ptxas(assembly(compiled), tmp_path)
    assert "C7514" not in report and "C7515" not in report
    assert "0 bytes spill stores, 0 bytes spill loads" in report


def test_pointer_store_when_rows_are_not_16_byte_aligned():
    ptx = assembly(_compile(n=1100, tma_store=False))
    assert "cp.async.bulk.tensor.2d.global.shared" not in ptx and "st.global" in ptx


def test_epilogue_buffers_fit_shared_memory():
    config = bg.default_config(BIG)
    assert bg.epilogue_buffers(config, jnp.bfloat16) == 2  # 3 stages: a buffer per 128-column subtile
    assert bg.epilogue_buffers(config.replace(num_stages=4), jnp.bfloat16) == 1  # 4 stages: one, reused
    assert bg.epilogue_buffers(config.replace(block_n=128, num_stages=4), jnp.float32) == 1
    assert _compile(stages=4).metadata.shared <= bg.SMEM_BYTES


@pytest.mark.parametrize("stages,buffers", [(3, 2), (4, 1)])
def test_epilogue_waits_only_for_the_buffer_it_reuses(stages, buffers):
    """Before writing an output buffer a consumer waits for that buffer's previous TMA store, and no newer
    one: with a buffer per subtile the second subtile's store does not wait for the first's (`wait_group.read
    1`); with one buffer reused, it must (`0`). Each consumer ends with a wait for all (0)."""
    assert bg.epilogue_buffers(bg.default_config(BIG).replace(num_stages=stages), jnp.bfloat16) == buffers
    ptx = assembly(_compile(stages=stages))
    last_wait, before_store = None, []
    for line in ptx.splitlines():
        if wait := re.search(r"cp\.async\.bulk\.wait_group\.read\s+(\d+)", line):
            last_wait = wait.group(1)
        elif "cp.async.bulk.tensor.2d.global.shared" in line:
            before_store.append(last_wait)
    # Two subtiles in each of two consumers, stored in the next tile's first K step and after the last tile.
    assert before_store == [str(buffers - 1)] * 8


@pytest.mark.parametrize("problem,changes,message", [
    (BIG, dict(block_n=64), "128 x 256 x 128 tiles"),
    (BIG, dict(block_m=64), "128 x 256 x 128 tiles"),
    (BIG, dict(num_warps=8), "4-warp consumers"),
    (BIG, dict(num_stages=1), "num_stages"),
    (BIG, dict(num_stages=5), "shared memory"),
    (BIG, dict(block_n=128, num_stages=9), "at most 8 stages"),
    (BIG, dict(max_registers=128), "register split"),
    (BIG, dict(num_sms=0), "num_sms"),
    (GemmProblem(2, True, 256, 256, 256, "block_fp8", "block_fp8", "bf16"), {}, "unbatched weight"),
    (GemmProblem(1, False, 256, 256, 200, "block_fp8", "block_fp8", "bf16"), {}, "multiple of 128"),
])
def test_check_config_refuses(problem, changes, message):
    with pytest.raises(ValueError, match=message):
        bg.check_config(problem, bg.default_config(problem).replace(**changes))


def _p(m, n, k):
    return GemmProblem(1, False, m, n, k, "block_fp8", "block_fp8", "bf16")


@pytest.mark.parametrize("m,n,k,tiles", [
    # issue #13's shapes and the suite's with M, N, K >= 2048: wide tiles fill their waves as well
    (8192, 8192, 8192, "WIDE"), (4096, 7168, 2048, "WIDE"), (4096, 24576, 1536, "WIDE"),
    (4096, 7168, 16384, "WIDE"), (2048, 4096, 7168, "WIDE"), (4096, 4096, 7168, "WIDE"),
    (4096, 8192, 8192, "WIDE"), (4096, 28672, 8192, "WIDE"),
    # N = 2112 = 8 x 256 + 64: the light last column (64 columns multiplied) runs after the full tiles
    (2048, 2112, 7168, "WIDE"), (4096, 2112, 7168, "WIDE"),
    # 192 wide tiles are two waves for 1.45 waves of work; 384 narrow ones three of 0.56
    (3072, 2048, 4096, "NARROW"),
])
def test_default_config_picks_the_tile_width_whose_busiest_program_is_done_first(m, n, k, tiles):
    config = bg.default_config(_p(m, n, k))
    assert config == getattr(bg, f"{tiles}_TILES")
    bg.check_config(_p(m, n, k), config)


@pytest.mark.parametrize("n,block_n,light", [
    (2112, 256, 64), (2112, 128, 64), (520, 256, 64), (1100, 256, 128), (336, 256, 128), (64, 256, 64),
    (200, 256, 0),    # 200 of 256 columns: the second subtile is live, nothing to skip
    (200, 128, 0), (8192, 256, 0), (2304, 256, 0), (1000, 128, 0),
])
def test_light_columns(n, block_n, light):
    assert bg.light_columns(n, block_n) == light


def test_busiest_program_counts_light_tiles_last():
    """4096 x 2112: 256 full wide tiles and 32 light ones over 132 programs. Programs 0-23 run two full tiles
    and a light one, programs 124-131 one of each: the busiest is 2 + LIGHT_TILE_TIME[64], where the same
    288 tiles counted as full ones took three (the kernel before light tiles); narrow tiles: 512 full and
    32 light, four full narrow tiles and a light one."""
    p = _p(4096, 2112, 7168)
    assert bg.busiest_program_time(p, bg.WIDE_TILES) == pytest.approx(2 + bg.LIGHT_TILE_TIME[64])
    assert bg.busiest_program_time(p, bg.NARROW_TILES) == pytest.approx(4 * 0.56 + bg.LIGHT_TILE_TIME[64])
    assert bg.busiest_program_time(_p(8192, 8192, 8192), bg.WIDE_TILES) == 16  # 4096 tiles, 31.03 waves
    assert bg.busiest_program_time(_p(200, 64, 256), bg.WIDE_TILES) == bg.LIGHT_TILE_TIME[64]  # light only


@pytest.mark.parametrize("m,n,k,block_n,light,blocks", [
    (4096, 2112, 7168, 256, 64, 2), (300, 520, 768, 128, 64, 1), (200, 64, 1024, 256, 64, 2),
    (1000, 1100, 384, 256, 128, 1),
])
def test_light_tiles_run_their_own_k_loop(m, n, k, block_n, light, blocks, tmp_path):
    """A light last column compiles to its own K loop per consumer, whose wgmma is m64 x LIGHT_N (n64 beside
    the full tiles' n128 where LIGHT_N is 64), `blocks` K blocks per stage (4 k32 wgmma each): two where
    a 256-row weight buffer holds them (`_light_buffer`). Every wgmma stays asynchronous, nothing spills."""
    assert bg.light_columns(n, block_n) == light
    stages = 3 if block_n == 256 else 4
    compiled = _compile(m=m, n=n, k=k, block_n=block_n, stages=stages, tma_store=n % 8 == 0)
    ptx = assembly(compiled)
    widths = {int(w) for w in WGMMA_FP8.findall(ptx)}
    assert light in widths and widths <= {128, light}
    k_loops = [body for body in _k_loop_blocks(ptx).values() if "wgmma.mma_async" in body]
    if light == 64:
        light_loops = [body for body in k_loops if "m64n128k32" not in body]
        assert [len(re.findall(r"m64n64k32", body)) for body in light_loops] == [4 * blocks] * 2  # per consumer
    report = _ptxas(ptx, tmp_path)
    assert "C7514" not in report and "C7515" not in report
    assert "0 bytes spill stores, 0 bytes spill loads" in report


@pytest.mark.parametrize("tokens,d", [(16384, 2048), (8192, 4096)])  # train_step.py's d2048 and d4096
def test_default_config_keeps_wide_tiles_for_the_training_projections(tokens, d):
    """Every GEMM of a TinyLM block's projections (qkv 3d, out d, MLP 4d): forward (tokens, N, K), dgrad
    (tokens, K, N) and wgrad in either operand order (N, K, tokens), (K, N, tokens)."""
    for n, k in ((3 * d, d), (d, d), (4 * d, d), (d, 4 * d)):
        for m, n_, k_ in ((tokens, n, k), (tokens, k, n), (n, k, tokens), (k, n, tokens)):
            assert bg.default_config(_p(m, n_, k_)) == bg.WIDE_TILES, (m, n_, k_)


def test_dispatch_picks_it_for_large_problems_on_hopper():
    rows, n, k = backends.GLUON_BLOCK_FP8_MIN
    big = dict(rows=rows, n=n, k=k)
    assert backends.choose("sm_90", "block_fp8", "block_fp8", **big).kernel == "block_fp8_gluon"
    for field in big:  # one dimension under its threshold, or unknown (batched weight): not this kernel
        assert backends.choose("sm_90", "block_fp8", "block_fp8", **dict(big, **{field: big[field] - 1})).kernel \
            != "block_fp8_gluon"
        assert backends.choose("sm_90", "block_fp8", "block_fp8", **dict(big, **{field: None})).kernel \
            != "block_fp8_gluon"
    assert bg.default_config(BIG).kernel == "block_fp8_gluon"
    # A caller's config naming no kernel is for the Triton kernels below it in the table.
    assert backends.choose("sm_90", "block_fp8", "block_fp8", configured=True, **big).kernel \
        == "block_fp8_persistent"
    for target in ("sm_100", "gfx950"):  # Hopper's wgmma only
        with pytest.raises(ValueError, match="no entry"):
            backends.choose(target, "block_fp8", "block_fp8", kernel="block_fp8_gluon", **big)


def test_matmul_lowers_to_one_launch():
    from _jax_triton import lowered_for_cuda
    from jax_blockscale._triton import jt

    rng = np.random.default_rng(0)
    a = jb.quantize_operand(jnp.asarray(rng.standard_normal((2048, 2048)), jnp.float32), "fp8_block", side="a")
    b = jb.quantize_operand(jnp.asarray(rng.standard_normal((2048, 2048)), jnp.float32), "fp8_block", side="b")
    lowered = lowered_for_cuda(lambda a, b: jb.matmul(a, b, target="sm_90"), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    text = kernel.decode("latin-1")
    assert ".entry block_fp8_gluon_kernel" in text and ".maxnreg 168" in text
    # 16 x 8 = 128 tiles of 128 x 256: 128 programs, one output plus the descriptors' scratch; no transpose.
    hlo = lowered.as_text()
    assert re.search(r"stablehlo.custom_call @triton_kernel_call.*-> \(tensor<2048x2048xbf16>, "
                     r"tensor<\d+xui8>, tensor<128xui8>\)", hlo)
    assert "stablehlo.transpose" not in hlo


def test_configs_naming_other_kernels_run_there():
    """Dispatch picks this kernel for a large problem, but a config= naming no kernel (the Triton kernels'
    fields, as the variants benchmark passes) runs the kernel it describes, not a refusal."""
    from _jax_triton import lowered_for_cuda
    from jax_blockscale._triton import block_fp8, jt

    rng = np.random.default_rng(1)
    a = jb.quantize_operand(jnp.asarray(rng.standard_normal((2048, 2048)), jnp.float32), "fp8_block", side="a")
    b = jb.quantize_operand(jnp.asarray(rng.standard_normal((2048, 2048)), jnp.float32), "fp8_block", side="b")
    p = GemmProblem(1, False, 2048, 2048, 2048, "block_fp8", "block_fp8", "bf16")
    for config, entry in [(bp.default_config(p), "persistent_block_fp8_kernel"),
                          (block_fp8.default_config(p, "sm_90"), "block_fp8_kernel")]:
        lowered = lowered_for_cuda(lambda a, b, config=config: jb.matmul(a, b, target="sm_90", config=config),
                                   a, b)
        (kernel,) = jt.lowered_kernels(lowered)
        assert f".entry {entry}" in kernel.decode("latin-1")


def test_scratch_call_caps_registers():
    from jax_blockscale._triton import launch

    constexprs = dict(M=8192, N=8192, K=8192, BATCHES=1, B_BATCHED=False, BLOCK_M=128, BLOCK_N=128, GROUP_M=8,
                      NUM_SMS=132, NUM_STAGES=2, WARP_SPECIALIZE=False, FLATTEN=False, TMA_STORE=True,
                      PREFETCH_SCALES=True, A_SCALES_T=False)
    sig = tuple(SIG.items())
    capped = launch._compile(bp.persistent_block_fp8_kernel, sig, tuple(sorted(constexprs.items())), 8, 2, "sm_90",
                             128)
    assert ".maxnreg 128" in assembly(capped)
    with pytest.raises(ValueError, match="max_registers"):
        bp.check_config(BIG, TileConfig(persistent=True, num_warps=8, max_registers=300))


def test_transposed_output_is_written_by_the_epilogue():
    """TRANS_OUT: the same stores as the plain epilogue, through stmatrix .trans into a (128, 64) buffer and
    a TMA store at (col, row) of the (N, M) output; the pointer store takes (N, M) addresses."""
    plain, trans = (assembly(_compile_trans(t)) for t in (False, True))
    # 8 per (64, 128) subtile, 2 subtiles per consumer, 2 consumers; each subtile's store appears twice (in
    # the next tile's first K step and after the last tile).
    assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", trans)) == 64
    assert "stmatrix.sync.aligned.m8n8.x4.shared.b16" not in trans
    assert len(re.findall(r"stmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", plain)) == 64
    assert trans.count("cp.async.bulk.tensor.2d.global.shared::cta") == plain.count(
        "cp.async.bulk.tensor.2d.global.shared::cta")
    pointer = assembly(_compile_trans(True, tma_store=False))
    assert "stmatrix" not in pointer and "st.global" in pointer


def _compile_trans(trans: bool, tma_store: bool = True):
    return compile_kernel(bg.block_fp8_gluon_kernel, target="sm_90", signature=SIG,
                          constexprs=dict(M=4096, N=2048, K=1024, BLOCK_M=128, BLOCK_N=256, GROUP_M=8, NUM_SMS=132,
                                          STAGES=3, TMA_STORE=tma_store, EPI_BUFS=1, TRANS_OUT=trans),
                          num_warps=4, num_stages=3, maxnreg=bg.MAX_REGISTERS)


@pytest.mark.parametrize("m, kernel_transposes", [(4096, True), (1024, False)])
def test_matmul_transpose_out_lowers_without_a_transpose(m, kernel_transposes):
    """jb.matmul(transpose_out=True): one launch writing (N, M) where the Gluon kernel runs (no transpose in
    the program); below its dispatch threshold the Triton kernel's (M, N) product is transposed by XLA."""
    from _jax_triton import lowered_for_cuda
    from jax_blockscale._triton import jt

    rng = np.random.default_rng(2)
    a = jb.quantize_operand(jnp.asarray(rng.standard_normal((m, 2048)), jnp.float32), "fp8_block", side="a")
    b = jb.quantize_operand(jnp.asarray(rng.standard_normal((2048 + 128, 2048)), jnp.float32), "fp8_block",
                            side="b")
    lowered = lowered_for_cuda(lambda a, b: jb.matmul(a, b, target="sm_90", transpose_out=True), a, b)
    (kernel,) = jt.lowered_kernels(lowered)
    text, hlo = kernel.decode("latin-1"), lowered.as_text()
    assert (".entry block_fp8_gluon_kernel" in text) == kernel_transposes
    assert ("stablehlo.transpose" not in hlo) == kernel_transposes
    assert f"-> (tensor<2176x{m}xbf16>" in hlo.split("func.func public @main")[1].split("\n")[0]
