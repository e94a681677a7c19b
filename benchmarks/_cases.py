"""The suite's shapes: (M, N, K) cases, which formats each runs, and the --shapes / --formats filters.

Groups: square (8192^3), deepseek (DeepSeek-V3 (N, K) pairs x M in {1, 16, 64, 128, 512, 4096}), llama
((M, 8192, 8192) and (M, 28672, 8192), M in {16, 4096}), decode_fp8 (block FP8 decode targets: M in
{1, 16, 64}, N = 7168, K in {2048, 4096, 7168}), decode_fp4 (fp4-weight decode targets: M in {1, 16, 64},
N = 7168, K = 4096), smoke (tiny, for a CPU). A shape in several groups is one case.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

from ._timing import TimingConfig

# suite format name -> (a side, b side) for jb.quantize_operand; "bf16" stays dense (weight-only w4a16)
FORMATS = {"fp8_block": ("fp8_block", "fp8_block"), "mxfp8": ("mxfp8", "mxfp8"), "mxfp4": ("mxfp4", "mxfp4"),
           "nvfp4": ("nvfp4", "nvfp4"), "mxfp8xmxfp4": ("mxfp8", "mxfp4"), "bf16xmxfp4": ("bf16", "mxfp4"),
           "bf16xnvfp4": ("bf16", "nvfp4")}
DEEPSEEK_NK = ((7168, 2048), (2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168))


@dataclasses.dataclass
class Case:
    """One shape a (M, K) x b (N, K), the formats it runs, and the groups that list it."""

    m: int
    n: int
    k: int
    formats: tuple[str, ...]
    groups: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclasses.dataclass(frozen=True)
class Mode:
    """What a run covers: full sweep, --quick or --smoke."""

    cases: tuple[Case, ...]
    quant_shape: tuple[int, int]
    ceiling_mnk: int  # M = N = K of the matmul ceilings
    copy_shape: tuple[int, int]  # bf16 elements of the copy ceiling (1 GiB on a GPU)
    timing: TimingConfig


def _merge(shapes: list[tuple[int, int, int, tuple[str, ...], str]]) -> tuple[Case, ...]:
    """Cases from (m, n, k, formats, group); a shape listed twice gets the union of formats and groups."""
    out: dict[tuple, Case] = {}
    for m, n, k, fmts, group in shapes:
        c = out.setdefault((m, n, k), Case(m, n, k, (), ()))
        c.formats = tuple(f for f in FORMATS if f in set(c.formats) | set(fmts))
        c.groups = c.groups + (group,) if group not in c.groups else c.groups
    return tuple(out.values())


FP4_WEIGHT_FORMATS = ("mxfp4", "nvfp4", "mxfp8xmxfp4", "bf16xmxfp4", "bf16xnvfp4")


def _decode(fmts_fp8: tuple, fmts_fp4: tuple) -> list:
    return ([(m, 7168, k, fmts_fp8, "decode_fp8") for m in (1, 16, 64) for k in (2048, 4096, 7168)]
            + [(m, 7168, 4096, fmts_fp4, "decode_fp4") for m in (1, 16, 64)])


def full_cases() -> tuple[Case, ...]:
    every = tuple(FORMATS)
    return _merge([(8192, 8192, 8192, every, "square")]
                  + [(m, n, k, every, "deepseek") for n, k in DEEPSEEK_NK for m in (1, 16, 64, 128, 512, 4096)]
                  + [(m, n, 8192, every, "llama") for n in (8192, 28672) for m in (16, 4096)]
                  + _decode(every, every))


def quick_cases() -> tuple[Case, ...]:
    return _merge([(8192, 8192, 8192, tuple(FORMATS), "square")] + _decode(("fp8_block",), FP4_WEIGHT_FORMATS))


def smoke_cases() -> tuple[Case, ...]:
    return _merge([(256, 256, 512, tuple(FORMATS), "smoke"), (16, 256, 512, tuple(FORMATS), "smoke_decode")])


def select(cases: tuple[Case, ...], shapes: Optional[str], formats: Optional[set[str]]) -> list[Case]:
    """--shapes: group names, case names or new MxNxK shapes; --formats: a subset of FORMATS."""
    out = list(cases)
    if shapes:
        tokens = [t.strip() for t in shapes.split(",") if t.strip()]
        out = [c for c in cases if any(t in c.groups or t == c.name for t in tokens)]
        known = {c.name for c in cases}
        for t in tokens:
            if re.fullmatch(r"\d+x\d+x\d+", t) and t not in known:
                m, n, k = map(int, t.split("x"))
                out.append(Case(m, n, k, tuple(FORMATS), ("custom",)))
    if formats:
        for c in out:
            c.formats = tuple(f for f in c.formats if f in formats)
    return [c for c in out if c.formats]
