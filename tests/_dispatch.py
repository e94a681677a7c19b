"""Test helpers: turn a dispatch entry's opt-in (backends.KernelEntry.opt_in) off or on for one test or module."""

import dataclasses

from jax_blockscale import backends


def set_opt_in(monkeypatch, target: str, module: str, opt_in) -> None:
    """Give every entry of `module` on `target` this `opt_in` (None: automatic dispatch may choose it)."""
    entries = tuple(dataclasses.replace(e, opt_in=opt_in) if e.module == module else e
                    for e in backends.KERNEL_TABLE[target])
    monkeypatch.setitem(backends.KERNEL_TABLE, target, entries)


def enable_entry(monkeypatch, target: str, module: str) -> None:
    """Let automatic dispatch on `target` choose `module`'s entries (as if they were not opt-in)."""
    set_opt_in(monkeypatch, target, module, None)


# The activation rows at which sm_90 dispatch sends fp4 weights to the Gluon decode kernel, per (activations,
# weights) format (backends.KERNEL_TABLE: measured faster there), written out so that tests check the table, not
# read it, as (first, last) row ranges: bf16 or 8-bit MX activations x mxfp4 at 2-64 rows, mxfp4 x mxfp4 and
# nvfp4 x nvfp4 at 2-32 (and at 33-64 from K = 7168, above these tests' shapes), bf16 activations x nvfp4 at 2-64
# and x 8-bit MX weights at 3-64.
DECODE_WGMMA_ROWS = {**{(fa, "mxfp4"): ((2, 64),) for fa in ("bf16", "mxfp8", "mxfp8_e5m2")},
                     ("mxfp4", "mxfp4"): ((2, 32),), ("bf16", "nvfp4"): ((2, 64),),
                     ("nvfp4", "nvfp4"): ((2, 32),),
                     **{("bf16", fb): ((3, 64),) for fb in ("mxfp8", "mxfp8_e5m2")}}


def sm90_decode_kernel(fa: str, fb: str, rows: int) -> str:
    """The decode kernel sm_90 dispatch picks for activations `fa` x weights `fb` at `rows` rows (<= 64,
    the opt-in decode entry enabled): decode_fp8 for block FP8 x block FP8 and for 8-bit MX on both sides from
    2 rows (one row keeps decode.py's GEMV), decode_wgmma where DECODE_WGMMA_ROWS says, else decode."""
    if (fa, fb) == ("fp8_block", "fp8_block") or ({fa, fb} <= {"mxfp8", "mxfp8_e5m2"} and rows >= 2):
        return "decode_fp8"
    ranges = DECODE_WGMMA_ROWS.get((fa, fb), ())
    return "decode_wgmma" if any(lo <= rows <= hi for lo, hi in ranges) else "decode"
