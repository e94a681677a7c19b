"""Static SASS analysis of the quantization kernel on a CPU: instructions per element by class, and the time
each hardware pipe would need for a bf16 8192 x 8192 input on an H100 (issue #11: what bounds each case).

    python -m benchmarks.sass_quant                          # the default cases, the kernel as it is
    python -m benchmarks.sass_quant --cases nvfp4,fp8_1x128+T --div f64,f32   # compare quotient paths
    python -m benchmarks.sass_quant --cases nvfp4 --dump /tmp/nvfp4.sass      # also write the SASS
    python -m benchmarks.sass_quant --cvt int,hw             # fp8 codes: integer encoder vs cvt.rn.satfinite

The kernel is compiled for sm_90 with the plan and constexprs the primitive launches it with
(`quantize_kernels.plan`, num_stages=1 as `quantize_primitive._launch`), the cubin disassembled with the
`cuobjdump` Triton ships. The kernel is straight-line code (no loops): every thread runs each instruction
of the main body once, except the out-of-line slow paths (float64 division's subnormal/special-case
subroutine, reached by CALL), which are counted apart and left out of the estimate.

Per class, warp-instructions executed = static count x warps per program x programs; the time is that over
the class's per-SM issue rate (lanes per clock / 32) x 132 SMs x 1.755 GHz. Rates per SM per clock
(Hopper, NVIDIA's CUDA C++ Programming Guide throughput table, compute capability 9.0): fp32 add/mul/fma 128;
fp64 64; conversions to or from 64-bit types 16; other conversions 16; MUFU 16; integer logic / shift /
add / compare / select 64; IMAD 64. "issue": every instruction takes one dispatch slot of its SM
sub-partition, 4 warp-instructions per clock per SM in all. Shared memory: 128 bytes per clock per SM
(bank-conflict free). DRAM: the bytes the kernel must move at the rate of the `x * 2` pass that issue #11
measures against (93.1 us for 2 x 128 MiB on the H100). A lower bound per pipe, not a prediction: the
largest of them is what to remove first; latency and occupancy are not modelled.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import pathlib
import re

import numpy as np

from jax_blockscale._triton import quantize_kernels as qk
from jax_blockscale._triton.compile import compile_kernel
from jax_blockscale.formats import get_format

from ._sass import CLOCK_HZ, SM_COUNT, SMEM_BYTES_PER_CLOCK, access_bytes, disassemble

SHAPE = (8192, 8192)
X2_US, X2_BYTES = 93.1, 2 * 2 * SHAPE[0] * SHAPE[1]  # the x * 2 baseline of issue #11 (bf16 in + out)

FP8_1x128 = get_format("fp8_block", block=(1, 128))
FP8_128 = get_format("fp8_block", block=(128, 128))
CASES = {  # as benchmarks/quant_variants.py
    "mxfp8": (get_format("mxfp8"), None),
    "nvfp4": (get_format("nvfp4"), None),
    "fp8_1x128": (FP8_1x128, None),
    "fp8_128x128": (FP8_128, None),
    "mxfp8+T": (get_format("mxfp8"), get_format("mxfp8")),
    "nvfp4+T": (get_format("nvfp4"), get_format("nvfp4")),
    "fp8_1x128+T": (FP8_1x128, FP8_1x128),
    "fp8_128x128+T": (FP8_128, FP8_128),
    "nvfp4+mxfp8T": (get_format("nvfp4"), get_format("mxfp8")),
}
DEFAULT_CASES = "nvfp4,fp8_1x128,fp8_1x128+T,nvfp4+T,mxfp8+T"

# Class -> lanes per clock per SM. Order matters: the first matching rule classifies an opcode.
RATES = {"cvt64": 16, "cvt": 16, "mufu": 16, "fp64": 64, "fp32": 128, "imad": 64, "int": 64,
         "ldg/stg": None, "lds/sts": None, "shfl": 32, "bar": None, "local": None, "other": None}
_RULES = [
    ("cvt64", lambda op, full: op in ("F2F", "I2F", "F2I") and ".F64" in full or op in ("F2I.F64",)),
    ("cvt", lambda op, full: op in ("F2F", "I2F", "F2I", "FRND", "F2FP", "I2FP", "F2IP")),
    ("mufu", lambda op, full: op == "MUFU"),
    ("fp64", lambda op, full: op in ("DMUL", "DFMA", "DADD", "DSETP", "DMNMX")),
    ("fp32", lambda op, full: op in ("FFMA", "FMUL", "FADD", "HFMA2", "HADD2", "HMUL2", "FMUL32I", "FFMA32I",
                                      "FADD32I")),
    ("imad", lambda op, full: op.startswith("IMAD")),
    ("ldg/stg", lambda op, full: op in ("LDG", "STG", "LD", "ST", "RED", "ATOM", "LDGSTS")),
    ("lds/sts", lambda op, full: op in ("LDS", "STS", "LDSM", "STSM")),
    ("local", lambda op, full: op in ("LDL", "STL")),
    ("shfl", lambda op, full: op == "SHFL"),
    ("bar", lambda op, full: op in ("BAR",)),
    ("int", lambda op, full: op in ("LOP3", "SHF", "IADD3", "VIADD", "ISETP", "SEL", "PRMT", "LEA", "VIMNMX", "VIMNMX3",
                                     "SGXT", "MOV", "FSEL", "FSETP", "FMNMX", "PLOP3", "IABS", "BMSK", "LOP",
                                     "IMNMX", "FCHK", "POPC", "FLO", "BREV", "ISCADD", "P2R", "R2P", "CS2R",
                                     "LEA.HI", "IADD", "SHL", "SHR", "HMNMX2", "HSETP2", "IDP", "BFE", "BFI")),
]
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)([^;]*);")


def classify(mnemonic: str) -> str:
    op = mnemonic.split(".")[0]
    for name, rule in _RULES:
        if rule(op, mnemonic):
            return name
    return "other"


def kernel_summary(compiled, per: float, top: int = 20) -> str:
    """Two lines about a compiled kernel's whole SASS (straight-line, static counts): registers, shared memory and
    instructions per unit of work (`per`: 1 / the units one thread handles, e.g. weight elements), by `classify`'s
    class; then its `top` opcodes. For the one-row GEMV experiments (benchmarks/decode_gemv_*.py --sass)."""
    from ._sass import registers

    insts, _ = parse(disassemble(compiled.asm["cubin"], "cuobjdump"))
    cnt = collections.Counter(classify(op) for _, op, _ in insts)
    ops = collections.Counter(op.split(".")[0] for _, op, _ in insts)
    return (f"regs {registers(compiled.asm['cubin'])}, smem {compiled.metadata.shared}, "
            f"{sum(cnt.values()) * per:.2f} SASS per weight element; "
            + ", ".join(f"{c} {v * per:.2f}" for c, v in cnt.most_common())
            + "\n    " + ", ".join(f"{o} {v}" for o, v in ops.most_common(top)))


def parse(text: str) -> tuple[list[tuple[int, str, str]], int]:
    """(address, mnemonic, operands) of each instruction, and the first address of out-of-line subroutines
    (the smallest CALL target), from which on code is a slow path."""
    insts = []
    for m in _LINE.finditer(text):
        insts.append((int(m.group(1), 16), m.group(3), m.group(4)))
    targets = [int(re.search(r"0x([0-9a-f]+)", ops).group(1), 16) for _, op, ops in insts
               if op.startswith("CALL") and re.search(r"0x([0-9a-f]+)", ops)]
    return insts, min(targets) if targets else 1 << 62


def case_plan(label: str, **overrides) -> qk.Plan:
    """The plan the primitive launches on sm_90 (its fp8 encoder included), with `overrides`."""
    row, col = CASES[label]
    overrides.setdefault("cvt", qk.default_cvt(90))
    return qk.plan(1, *SHAPE, qk.Side(row), qk.Side(col), **overrides)


def compile_case(label: str, plan: qk.Plan) -> bytes:
    sig = dict(x_ptr="*bf16", ts_ptr="*fp32", rv_ptr="*u8", rs_ptr="*u8", cv_ptr="*u8", cs_ptr="*u8")
    row, col = CASES[label]
    for name, fmt in (("rs_ptr", row), ("cs_ptr", col)):
        if fmt is not None and fmt.name == "fp8_block":
            sig[name] = "*fp32"
    k = compile_kernel(qk.quantize_kernel, target="sm_90", signature=sig, constexprs=plan.constexprs,
                       num_warps=plan.num_warps, num_stages=1)
    return k.asm["cubin"]


def analyse(label: str, plan: qk.Plan, text: str) -> dict:
    insts, slow_from = parse(text)
    counts, slow = collections.Counter(), collections.Counter()
    smem_bytes = 0
    by_op = collections.Counter()
    for addr, op, _ in insts:
        if op in ("NOP", "BRA", "EXIT") and addr >= slow_from:
            continue
        cls = classify(op)
        if addr >= slow_from:
            slow[cls] += 1
            continue
        counts[cls] += 1
        by_op[op] += 1
        if cls == "lds/sts":
            smem_bytes += 32 * access_bytes(op)
    threads = plan.num_warps * 32
    elements = plan.constexprs["BR"] * plan.constexprs["BC"]
    programs = int(np.prod(plan.grid))
    warp_insts = {cls: n * plan.num_warps * programs for cls, n in counts.items()}
    time_us = {}
    for cls, n in warp_insts.items():
        rate = RATES.get(cls)
        if rate:
            time_us[cls] = n / (rate / 32) / SM_COUNT / CLOCK_HZ * 1e6
    time_us["issue"] = sum(warp_insts.values()) / 4 / SM_COUNT / CLOCK_HZ * 1e6
    time_us["smem"] = smem_bytes * plan.num_warps * programs / SMEM_BYTES_PER_CLOCK / SM_COUNT / CLOCK_HZ * 1e6
    nbytes = 2 * SHAPE[0] * SHAPE[1] + sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in plan.out_shapes
                                            if s != (1,))
    time_us["dram"] = nbytes / (X2_BYTES / X2_US)
    per_element = {cls: n * threads / elements for cls, n in counts.items()}
    return dict(label=label, plan=plan, counts=counts, slow=slow, per_element=per_element, time_us=time_us,
                by_op=by_op, bound=max(time_us, key=time_us.get))


def report(results: list[dict], top: int) -> str:
    classes = [c for c in RATES if any(r["counts"].get(c) for r in results)]
    lines = ["Per input element (lane-instructions / element), main path; slow-path instructions apart.", ""]
    head = "| case | div | cvt | words | tile | warps | " + " | ".join(classes) + " | total | slow path |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        p = r["plan"]
        pe = r["per_element"]
        lines.append(f"| {r['label']} | {p.constexprs.get('DIV', '-')} | {p.constexprs.get('CVT', '-')} | "
                     f"{int(p.constexprs.get('T_WORDS', 0))} | {p.constexprs['BR']}x{p.constexprs['BC']} | "
                     f"{p.num_warps} | " + " | ".join(f"{pe.get(c, 0):.2f}" for c in classes) +
                     f" | {sum(pe.values()):.2f} | {sum(r['slow'].values())} |")
    lines += ["", "Pipe-bound time (us) for bf16 8192x8192 on an H100 (132 SMs, 1.755 GHz); dram at the x*2 rate.", ""]
    tcls = ["dram", "issue"] + [c for c in RATES if any(c in r["time_us"] for r in results)] + ["smem"]
    tcls = list(dict.fromkeys(tcls))
    head = "| case | div | cvt | words | " + " | ".join(tcls) + " | bound |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        t = r["time_us"]
        lines.append(f"| {r['label']} | {r['plan'].constexprs.get('DIV', '-')} | {r['plan'].constexprs.get('CVT', '-')} | "
                     f"{int(r['plan'].constexprs.get('T_WORDS', 0))} | " +
                     " | ".join(f"{t.get(c, 0):.1f}" for c in tcls) + f" | {r['bound']} {t[r['bound']]:.1f} |")
    if top:
        lines += ["", f"Most frequent opcodes (static count, main path, top {top}):"]
        for r in results:
            ops = ", ".join(f"{op} {n}" for op, n in r["by_op"].most_common(top))
            lines.append(f"- {r['label']} ({r['plan'].constexprs.get('DIV', '-')}, "
                         f"{r['plan'].constexprs.get('CVT', '-')}, "
                         f"words {int(r['plan'].constexprs.get('T_WORDS', 0))}): {ops}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--div", default="", help="comma-separated quotient paths (plan's div=), default: the plan's")
    ap.add_argument("--cvt", default="", help="comma-separated fp8 encoders (plan's cvt=), default: the plan's")
    ap.add_argument("--t-words", default="", help="comma-separated 0/1: column codes transposed as words (plan's "
                    "t_words=), default: the plan's")
    ap.add_argument("--top", type=int, default=12, help="list this many most frequent opcodes per case")
    ap.add_argument("--dump", default="", help="write the SASS of the (last) case to this file")
    args = ap.parse_args()
    divs = [d for d in args.div.split(",") if d] or [None]
    cvts = [c for c in args.cvt.split(",") if c] or [None]
    t_words = [bool(int(w)) for w in args.t_words.split(",") if w] or [None]
    results = []
    for label in args.cases.split(","):
        for div, cvt, words in itertools.product(divs, cvts, t_words):
            overrides = {k: v for k, v in (("div", div), ("cvt", cvt), ("t_words", words)) if v is not None}
            if words and CASES[label][1] is None:
                continue
            try:
                plan = case_plan(label, **overrides)
            except ValueError:  # e.g. t_words for fp4 column codes
                continue
            text = disassemble(compile_case(label, plan), tool="cuobjdump")
            if args.dump:
                pathlib.Path(args.dump).write_text(text)
            results.append(analyse(label, plan, text))
            print(f"compiled {label} div={div} cvt={cvt} t_words={words}", flush=True)
    print(report(results, args.top))


if __name__ == "__main__":
    main()
