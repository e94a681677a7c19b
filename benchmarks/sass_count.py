"""SASS instructions per weight element in the decode kernels' steady-state K loop (CPU only, no GPU).

    python -m benchmarks.sass_count                          # e2m1, nvfp4, e4m3 at M=1 and 4, tuned sm_90 configs
    python -m benchmarks.sass_count --rows 16                # the swapped MMA (decode_kernel) at its tuned configs
    python -m benchmarks.sass_count --kind e2m1 --rows 1 --dump /tmp/loop.sass
    python -m benchmarks.sass_count --set f16_decode=True    # a TileConfig field changed for every case

Cross-compiles dispatch's kernel for the case (`decode.gemv_kernel` or `decode.decode_kernel`) for sm_90 (Triton's bundled ptxas), disassembles the cubin with the
bundled nvdisasm, and takes the largest loop (a label and the backward branch to it): the K loop. Each
thread handles BLOCK_N * BLOCK_K / (32 * num_warps) weight elements per iteration, so the loop's
instruction count over that is the issue cost per weight element and thread. On an H100 (132 SMs x 4
schedulers, one warp instruction per scheduler and clock at ~1.755 GHz) that bounds the time from below:
instructions x N x K / (132 * 4 * 32 * 1.755e9) -- the "issue us" column, for N=7168, K=4096. Compare it
with the HBM time of the weight bytes (~3.2 TB/s read ceiling): where issue us exceeds it, the kernel is
instruction-bound. "int pipe us" is the same for the integer pipes: 32-bit logic/shift/add ("alu pipe":
LOP3, SHF, PRMT, LEA, IADD3, ...) and IMAD each run at half the issue rate on sm_90, so 2 x the larger of
the two per-element counts bounds the time too. "smem us": the loop's shared-memory bytes (LDS/STS/LDSM,
cp.async's writes, wgmma's shared operands) at 128 bytes per SM and clock. "grid us": the issue time of the
busiest SM's warps at one instruction per scheduler and clock, where the grid leaves schedulers idle
(224 programs of 2 warps = 4 warps per SM: one per scheduler, nothing to hide any latency with).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re

from ._sass import CLOCK_HZ, LANES, SCHEDULERS, SM_COUNT, SMEM_BYTES_PER_CLOCK, access_bytes, disassemble

# Opcode (first dotted part) -> class; anything else is "other".
CLASSES = {
    "FFMA": "fp32 fma", "FMUL": "fp32 mul/add", "FADD": "fp32 mul/add",
    "HFMA2": "f16x2/bf16x2", "HMUL2": "f16x2/bf16x2", "HADD2": "f16x2/bf16x2",
    "F2F": "convert", "F2FP": "convert", "I2F": "convert", "F2I": "convert",
    "LOP3": "bit ops", "SHF": "bit ops", "PRMT": "bit ops", "LEA": "int alu", "BFE": "bit ops", "BMSK": "bit ops",
    "IMAD": "imad", "IADD3": "int alu", "VIADD": "int alu", "IABS": "int alu", "ISETP": "int alu", "SEL": "int alu",
    "MOV": "move", "IMNMX": "int alu",
    "LDG": "global load", "LDGSTS": "global load", "LDS": "shared load", "LDSM": "shared load", "STS": "shared store",
    "LDGDEPBAR": "sync", "DEPBAR": "sync", "BAR": "sync",
    "HMMA": "mma", "HGMMA": "mma", "WARPGROUP": "sync",
    "FSEL": "fp32 mul/add", "PLOP3": "int alu",
}


def smem_bytes(line: str) -> float:
    """Shared-memory bytes moved by one warp's instruction: LDS/STS/LDSM, cp.async's shared-memory write
    (LDGSTS), and the smem operands of a wgmma (HGMMA.64xNxK: B, N x K bf16, and A, 64 x K, where it
    reads a descriptor for it too), counted a quarter per warp since the 4 warps of a warpgroup each
    issue it once for one MMA."""
    m = _LINE.match(line)
    if m is None or "@!PT" in line:
        return 0.0
    op = m.group(2)
    parts = op.split(".")
    base = parts[0]
    if base in ("LDS", "STS", "LDGSTS"):
        return 32.0 * access_bytes(op)
    if base == "LDSM":  # .16.M88.N / .MT88.N: N 8x8 matrices of 16-bit elements
        n = int(parts[-1]) if parts[-1].isdigit() else 1
        return 128.0 * n
    if base == "HGMMA":
        shape = re.search(r"HGMMA\.(\d+)x(\d+)x(\d+)", line)  # _LINE's opcode stops at the 'x'
        elem = 1 if re.search(r"\.E[45]M[23]", line) else 2
        mm, nn, kk = (int(g) for g in shape.groups())
        descs = line.count("gdesc")
        return ((nn * kk) + (mm * kk if descs >= 2 else 0)) * elem / 4.0
    return 0.0

_LINE = re.compile(r"^\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"BRA\s+`?\(?(\.L_x_\d+)")


def _signature(w_kind: str, x_kind: str) -> dict[str, str]:
    values = {"e2m1": "*u8", "nvfp4": "*u8", "e2m3": "*u8", "e3m2": "*u8", "e4m3": "*fp8e4nv", "e5m2": "*fp8e5",
              "block_fp8": "*fp8e4nv", "bf16": "*bf16"}
    scales = {"nvfp4": "*fp8e4nv", "block_fp8": "*fp32"}
    x_scales = values[x_kind] if x_kind == "bf16" else scales.get(x_kind, "*u8")
    return {"w_ptr": values[w_kind], "w_scale_ptr": scales.get(w_kind, "*u8"), "x_ptr": values[x_kind],
            "x_scale_ptr": x_scales, "a_ts_ptr": "*fp32", "b_ts_ptr": "*fp32", "out_ptr": "*bf16",
            "ws_ptr": "*fp32", "count_ptr": "*i32"}


def case_config(w_kind: str, x_kind: str = "bf16", rows: int = 1, n: int = 7168, k: int = 4096, **changes):
    """(GemmProblem, TileConfig): dispatch's sm_90 config for the case with `changes` applied, checked."""
    from jax_blockscale._triton import decode
    from jax_blockscale._triton.problem import GemmProblem

    p = GemmProblem(1, False, rows, n, k, x_kind, w_kind, "bf16")
    cfg = decode.default_config(p, "sm_90").replace(**changes)
    decode.check_config(p, cfg)
    return p, cfg


def compile_case(w_kind: str, x_kind: str = "bf16", rows: int = 1, n: int = 7168, k: int = 4096, **changes):
    """(compiled kernel, TileConfig) for sm_90: dispatch's config with `changes` applied -- the GEMV
    (`gemv_kernel`) or the MMA / FMA variant (`decode_kernel`), whichever the config names."""
    from jax_blockscale._triton import decode
    from jax_blockscale._triton.compile import compile_kernel

    p, cfg = case_config(w_kind, x_kind, rows, n, k, **changes)
    kernel, consts = decode.kernel_constexprs(p, cfg, asm=cfg.asm_decode, wide=False)
    compiled = compile_kernel(kernel, target="sm_90", signature=_signature(w_kind, x_kind),
                              constexprs=consts, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return compiled, cfg


def largest_loop(lines: list[str]) -> list[str]:
    """The instructions between a label and the last backward branch to it, for the longest such span."""
    labels, best = {}, []
    for i, line in enumerate(lines):
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = i
        b = _BRANCH.search(line)
        if b and b.group(1) in labels and labels[b.group(1)] < i:
            body = [x for x in lines[labels[b.group(1)]:i + 1] if _LINE.match(x)]
            if len(body) > len(best):
                best = body
    return best


def classify(body: list[str]) -> collections.Counter:
    counts = collections.Counter()
    for line in body:
        counts["smem bytes"] += smem_bytes(line)
        op = _LINE.match(line).group(2)
        base = op.split(".")[0]
        if base in ("@!PT", "NOP"):
            continue
        if "@!PT" in line:  # never-executed padding (Triton's `@!PT LDS RZ, [RZ]`)
            continue
        cls = CLASSES.get(base, "other")
        counts[cls] += 1
        counts["total"] += 1
        if cls in ("bit ops", "int alu"):
            counts["alu pipe"] += 1
    return counts


def count(w_kind: str, x_kind: str = "bf16", rows: int = 1, n: int = 7168, k: int = 4096, **changes) -> dict:
    _, cfg = case_config(w_kind, x_kind, rows, n, k, **changes)
    # One K tile per program (the fp4 GEMV's whole 4096-code rows) has no loop to find. Its body is what an
    # iteration of the same config runs over a longer K, so that is compiled (4 K tiles: a steady-state loop).
    k_compiled = 4 * k * cfg.split_k if k // cfg.block_k <= cfg.split_k else k
    fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
    compiled, _ = compile_case(w_kind, x_kind, rows, n, k_compiled, **fields)
    body = largest_loop(disassemble(compiled.asm["cubin"]).splitlines())
    per_thread = cfg.block_n * cfg.block_k / (32 * cfg.num_warps)
    counts = classify(body)
    per_elem = {c: v / per_thread for c, v in counts.items() if c != "smem bytes"}
    scale = n * k / (SM_COUNT * SCHEDULERS * LANES * CLOCK_HZ) * 1e6
    issue_us = per_elem["total"] * scale
    # 32-bit integer / logic ops run 16 lanes per clock and scheduler on sm_90 (CUDA guide's throughput
    # table, cc 9.0: 64 results per SM and clock vs 128 for fp32 FMA), IMAD on another such pipe: each warp
    # instruction holds its pipe two clocks.
    pipe_us = 2 * max(per_elem.get("alu pipe", 0), per_elem.get("imad", 0)) * scale
    # Shared memory: the loop's bytes (all warps) per weight element, at 128 bytes per SM and clock.
    smem_per_elem = counts["smem bytes"] * cfg.num_warps / (cfg.block_n * cfg.block_k)
    smem_us = smem_per_elem * n * k / (SM_COUNT * SMEM_BYTES_PER_CLOCK * CLOCK_HZ) * 1e6
    # The grid: the busiest SM runs ceil(programs / SMs) programs; when those have fewer warps than the
    # SM's 4 schedulers, the idle schedulers' share of the issue bound is lost (one warp per scheduler
    # also leaves every dependent instruction's latency exposed: a real kernel needs several).
    programs = -(-n // cfg.block_n) * cfg.split_k
    warps_per_sm = -(-programs // SM_COUNT) * cfg.num_warps
    per_warp_instr = counts["total"] * (k // cfg.block_k) / cfg.split_k
    grid_us = -(-warps_per_sm // SCHEDULERS) * per_warp_instr / CLOCK_HZ * 1e6
    return dict(kind=w_kind, rows=rows, config=cfg, elems_per_thread=per_thread, loop=counts, per_elem=per_elem,
                issue_us=issue_us, pipe_us=pipe_us, smem_per_elem=smem_per_elem, smem_us=smem_us,
                warps_per_sm=warps_per_sm, grid_us=grid_us, bound_us=max(issue_us, pipe_us, smem_us, grid_us),
                body=body)


def _value(text: str):
    return {"True": True, "False": False}.get(text, int(text) if text.lstrip("-").isdigit() else text)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", action="append", help="weight kind(s): e2m1 nvfp4 e4m3 ... (default: those three)")
    ap.add_argument("--rows", type=int, action="append", help="activation rows (default 1 and 4)")
    ap.add_argument("--set", action="append", default=[], help="TileConfig field=value applied to every case")
    ap.add_argument("--dump", help="write the loop body of the (last) case here")
    args = ap.parse_args(argv)
    changes = dict(s.split("=", 1) for s in args.set)
    changes = {key: _value(v) for key, v in changes.items()}
    classes = ["total", "alu pipe", "fp32 fma", "fp32 mul/add", "f16x2/bf16x2", "convert", "bit ops", "int alu", "imad",
               "move", "mma", "shared load", "shared store", "global load", "sync", "other"]
    print("| kind | M | config | elems/thread/iter | " + " | ".join(classes)
          + " | smem B/elem | issue us | int pipe us | smem us | warps/SM | grid us |")
    print("|---" * (len(classes) + 10) + "|")
    for kind in args.kind or ["e2m1", "nvfp4", "e4m3"]:
        for rows in args.rows or [1, 4]:
            r = count(kind, rows=rows, **changes)
            c = r["config"]
            variant = "gemv" if c.gemv else "fma" if c.fma else "mma"
            desc = (f"{variant} n{c.block_n} k{c.block_k} s{c.split_k} w{c.num_warps} st{c.num_stages}"
                    f"{' pf' if c.prefetch and c.gemv else ''}{' asm' if c.asm_decode else ''}"
                    f"{' f16' if c.f16_decode and c.gemv else ''}")
            cells = " | ".join(f"{r['per_elem'].get(cl, 0):.2f}" for cl in classes)
            print(f"| {kind} | {rows} | {desc} | {r['elems_per_thread']:.0f} | {cells} | {r['smem_per_elem']:.2f} | "
                  f"{r['issue_us']:.1f} | {r['pipe_us']:.1f} | {r['smem_us']:.1f} | {r['warps_per_sm']} | "
                  f"{r['grid_us']:.1f} |", flush=True)
            if args.dump:
                with open(args.dump, "w") as f:
                    f.write("\n".join(r["body"]) + "\n")


if __name__ == "__main__":
    main()
