"""Which kernel runs where: target detection and the one dispatch table.

Targets are `"sm_100"` (Blackwell B200/GB200; sm_103 is treated as sm_100), `"sm_90"` (Hopper H100/H200),
`"gfx950"` (AMD MI355) and `"cpu"`. The jnp reference (`jax_blockscale.reference`) is itself a backend:
it serves the CPU and any GPU without a kernel, and `explain` says so.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Optional

import jax

from ._triton import gemv_tiles
from ._triton.problem import BLOCK_FP8, DECODE_MAX_ROWS, DENSE_KINDS, MX_KINDS, NVFP4

__all__ = ["Choice", "detect_target", "choose", "TARGETS", "KERNEL_TABLE"]

TARGETS = ("sm_100", "sm_90", "gfx950", "cpu")

_MX_PAIRS = frozenset((a, b) for a in MX_KINDS for b in MX_KINDS)
_DENSE_X_MX = frozenset((d, m) for d in DENSE_KINDS for m in MX_KINDS + (NVFP4,))
_MX_X_DENSE = frozenset((m, d) for d in DENSE_KINDS for m in MX_KINDS + (NVFP4,))


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    module: str  # under jax_blockscale._triton
    pairs: frozenset  # (a_kind, b_kind)
    path: str  # "native" | "upcast"
    why: str
    # Only for at most this many activation rows (batch * M) against an unbatched weight (decode kernels);
    # None: any problem.
    max_rows: Optional[int] = None
    # Only for problems of at least (activation rows, N, K), all known (an unbatched weight); None: any.
    min_size: Optional[tuple[int, int, int]] = None
    # Only for a batched weight or at least this many activation rows (large-M kernels whose tiles would
    # be mostly padding at decode sizes); None: any problem.
    min_rows: Optional[int] = None
    # Only when the activation rows (padded to a power of two, at least 8) times K's 32-wide groups (rounded up
    # to a power of two) are at most this, K known: the 8-bit MX fp8 decode kernel stages the activations'
    # decoded scales (fp32, 4 bytes each) in shared memory beside its ring; None: any problem.
    max_staged_scales: Optional[int] = None
    # Only where this holds of (activation rows, N, K), all known: entries that apply where their kernel's
    # measured tiles do (the kernel module's own rule, read from a module without Triton); None: any problem.
    applies: Optional[Callable[[int, int, int], bool]] = None
    # Set: automatic dispatch skips the entry (reachable with TileConfig(kernel=...)), and this says why.
    opt_in: Optional[str] = None
    # Its launcher reads only configs that name it (TileConfig(kernel=module)): a caller's config that does
    # not is meant for the entries below (e.g. the Triton block FP8 kernels' fields), so dispatch skips it.
    named_configs_only: bool = False


# One table: per target, kernels in order of preference; the first whose pairs hold the operand kinds runs.
# The upcast kernel multiplies in bf16, so fp16 activations (10 mantissa bits) would be rounded to bf16's 7:
# those pairs take the reference rather than lose precision silently.
_UPCAST_PAIRS = frozenset(
    pair for pair in _MX_PAIRS | _DENSE_X_MX | _MX_X_DENSE | {(NVFP4, NVFP4)} if "fp16" not in pair
)
_BLOCK_FP8_PAIR = frozenset({(BLOCK_FP8, BLOCK_FP8)})


def _one_row_block_fp8_tile(rows: int, n: int, k: int) -> bool:
    """Whether decode.py has a measured one-row GEMV tile for block FP8 weights of this N and K."""
    return bool(gemv_tiles.tile_fields(gemv_tiles.BLOCK_FP8_GEMV_TILES, rows, n, k))

# The decode kernel (_triton/decode.py): every weight kind with bf16 activations or the quantized kinds
# that pair with it. Kept here (not imported from the kernel module) so dispatch needs no triton.
# Every weight format again since the two bugs an H100 run found (2026-11-22, tests/test_gpu_decode.py,
# relative errors 0.23-1.4) are fixed: bf16 x block_fp8 read the bf16 activations as fp32 scales, and
# the PTX fp4 decode gave elements 2, 3 of a pack the scales of elements 0, 1, wrong once Triton packs
# across nvfp4 scale groups (the FMA variant's layout on sm_90). tests/test_decode_interpret.py runs the
# kernel in Triton's interpreter (the PTX emulated, packed across groups) for every format and variant.
_WEIGHT_KINDS = MX_KINDS + (NVFP4, BLOCK_FP8)
_DECODE_PAIRS = frozenset(
    {("bf16", w) for w in _WEIGHT_KINDS} | _MX_PAIRS | {(NVFP4, NVFP4), (BLOCK_FP8, BLOCK_FP8)}
)
_DECODE_SM90 = frozenset(pair for pair in _DECODE_PAIRS if pair[1] in ("e2m1", NVFP4, "e4m3", "e5m2"))
# The Gluon decode kernel on Hopper (_triton/decode_wgmma.py): fp4 weights with bf16 activations, or with quantized
# activations of their scale family (MX activations x mxfp4, nvfp4 x nvfp4), decoded once per program.
_DECODE_WGMMA_PAIRS = frozenset({("bf16", "e2m1"), ("bf16", NVFP4)})
_DECODE_WGMMA_QUANTIZED_X = frozenset({(x, "e2m1") for x in ("e4m3", "e5m2", "e2m1")} | {(NVFP4, NVFP4)})
# Quantized activations it takes at 33-64 rows too (padded to 64): 8-bit MX x mxfp4.
_DECODE_WGMMA_MX8_X = frozenset({("e4m3", "e2m1"), ("e5m2", "e2m1")})
# bf16 activations x 8-bit MX weights (mxfp8 e4m3 / e5m2) at 3-64 rows.
_DECODE_WGMMA_BF16_8BIT = frozenset({("bf16", w) for w in ("e4m3", "e5m2")})
# What else it takes (decode_wgmma.SUPPORTED): quantized activations x 8-bit weights (opt-in below).
_DECODE_WGMMA_8BIT = frozenset({(x, w) for x in ("e4m3", "e5m2", "e2m1") for w in ("e4m3", "e5m2")})
# bf16 x fp4: H100, 2026-11-23, CUPTI kernel time, the 5 issue shapes (benchmarks/results/decode_wgmma_h100_2026-
# 11-23_session12.md): against decode.py at 2 / 4 / 8 / 16 rows 0.94-1.34x / 1.43-1.75x / 1.05-1.58x / 0.94-1.37x
# (three cases below 1.0: mxfp4 at 2 rows of 7168 x 4096, nvfp4 at 16 rows of 7168 x 2048 and 8192 x 8192);
# at one row the GEMV is faster (9.4 vs 13.2 us at 7168 x 4096), so it keeps one row.
# Block FP8 weights at 1-64 rows on Hopper (_triton/decode_fp8.py): the codes go to an fp8 wgmma as they are.
_DECODE_FP8_WHY = ("decode (one weight): Gluon, persistent programs stream the weight by TMA through a ring of "
                   "256-512-byte K slots into an fp8 wgmma (the codes as they are, weight rows as its M side), "
                   "promoted per 128-K block, one kernel; 1.00-1.13x cuBLAS blockwise at 1-32 rows, 0.95-1.03x at 64, "
                   "1.01-1.37x the swapped block_fp8 kernel below on an H100 (2026-11-23, kernel time, the five "
                   "issue-#12 shapes; 0.98x at 7168 x 2048, 32 rows)")
# 8-bit MX on both sides (e4m3 / e5m2 codes, e8m0 scales per 32) take the same kernel, promoted per 32.
_MX8_PAIRS = frozenset((x, w) for x in ("e4m3", "e5m2") for w in ("e4m3", "e5m2"))
# 128 KiB of decoded activation scales: with its default ring it fits a Hopper block at every row count
# (64 rows up to K = 16384, 16 rows up to 65536; tests/test_lowering_decode_fp8.py checks the defaults).
MX8_STAGED_SCALES = 32768
_DECODE_FP8_MX_WHY = ("decode (one weight): the fp8 decode kernel above, one k32 wgmma per 32-wide MX group promoted "
                      "in fp32 with the weight row's and activation row's e8m0 scales, one kernel; against decode.py / "
                      "upcast, which ran here before: 1.56-1.70x at 4 rows, 0.89-1.27x at 8, 0.98-1.26x at 16, "
                      "1.27-1.43x at 32, 1.12-1.33x at 64 on an H100 (2026-11-23, kernel time, the five issue-#12 "
                      "shapes); one row keeps decode.py's GEMV (this kernel 0.72-1.01x of it)")
_DECODE_WGMMA_WHY = ("decode (one weight): Gluon, the weight loaded in wgmma's A-operand register layout (K "
                     "relabelled in both operands) and decoded there, bf16 wgmma, split-K reduced in the same "
                     "kernel; ")
_DECODE_WGMMA_MEASURED = ("1.4-1.75x decode.py's kernels at 4 rows, 0.94-1.58x at 2-16 rows, 1.2-2.0x XLA's bf16 "
                          "dot on an H100 (2026-11-23); at 17-64 rows (padded to 32 or 64, 2 K splits, the "
                          "activations streamed) 1.11-1.80x the upcast path below; at 2-16 rows with 2 streamed "
                          "splits too, 1.52-2.72x XLA's bf16 dot at 16 rows (2026-11-24)")
_DECODE_WHY = ("decode (<= 64 rows, one weight): the weight streamed in 128-byte rows and decoded in "
               "registers, split-K reduced in the same kernel (one launch)")
# 16-bit activations x block FP8 weights (_triton/dense_x_block_fp8.py): before it, the jnp reference.
_DENSE_X_BLOCK_FP8 = frozenset({("bf16", BLOCK_FP8), ("fp16", BLOCK_FP8)})
_DENSE_X_BLOCK_FP8_WHY = ("the block FP8 kernel on 16-bit activations: the weight's e4m3 codes widened in registers "
                          "(exact; on sm_90 from 2048 rows by XLA before the kernel), a 16-bit MMA per 128-K step, "
                          "promoted in fp32 with the weight tile's scale; the weight as the MMA's M side")
# Measured on an H200 (2026-12-02, kernel time; benchmarks/results/bf16_block_fp8_h200_2026-12-02_session40.md, and
# session 41's decode_block_fp8_h200_2026-12-02_session41.md after the widening stopped using the conversion pipe and
# from 2048 rows moved before the kernel): at 16 / 64 rows 1.37-1.51x / 1.08-1.20x XLA's bf16 dot (session 40:
# 0.97-1.18x / 0.86-1.00x) and 5-7x the jnp reference that ran before; decode.py's swapped MMA 0.78-0.81x its speed
# there; at 256-1024 rows 0.50-0.57x XLA's bf16 dot, at 4096 rows 0.61-0.68x (session 40: 0.40-0.45x). One row takes
# decode.py's GEMV (below).
_DENSE_X_BLOCK_FP8_MEASURED = (" (H200: 1.08-1.51x XLA's bf16 dot at 16-64 rows, 0.50-0.57x at 256-1024, 0.61-0.68x at "
                               "4096, 0.93-1.07x at 2 rows before the widening change; 5-7x the jnp reference that ran "
                               "before)")

# The persistent block FP8 kernel (_triton/block_fp8_persistent.py) from these sizes (activation rows, N,
# K): below them a problem has about as few 128 x 128 tiles as the H100 has SMs, so a persistent loop has
# nothing to overlap, and the one-program-per-tile kernel's tuned small-M paths (TMA 64-row tiles, swapped
# decode) apply. Measured only above them (benchmarks/block_fp8_variants.py: M, N, K >= 2048).
PERSISTENT_BLOCK_FP8_MIN = (1024, 1024, 1024)
# The Gluon block FP8 kernel (_triton/block_fp8_gluon.py) from these sizes: measured faster than the
# persistent kernel from 2048 rows and columns (benchmarks/results/block_fp8_variants_h100_2026-11-23.md);
# at 2000 x 1804 x 1152 (240 small tiles) it was slower (33 vs 30 us: its warp-specialized start costs more).
GLUON_BLOCK_FP8_MIN = (2048, 2048, 1024)

# One table: per target, kernels in order of preference; the first whose pairs hold the operand kinds runs.
# fp6 operands reach the MMA widened to fp8 (exact) because Triton 3.6's dot_scaled rejects e2m3/e3m2.
KERNEL_TABLE: dict[str, tuple[KernelEntry, ...]] = {
    "sm_100": (
        KernelEntry("decode_sm100", _MX_PAIRS | {(NVFP4, NVFP4)}, "native",
                    "decode (<= 64 rows, one weight), quantized activations: tcgen05.mma block_scale with the "
                    "operands swapped (the weight's 128-row tiles as the MMA's M side, the activations one padded "
                    "tile on its N side), the codes multiplied as they are, split-K for small grids, the swapped "
                    "product stored transposed by the kernel; the weight's scales packed in jnp",
                    max_rows=DECODE_MAX_ROWS,
                    opt_in="not measured against decode.py below, which decodes the codes in registers for a "
                           "kind::f16 MMA: there is no Blackwell GPU here, and as built this path runs two to three "
                           "kernels per matmul (XLA packs the weight's scales and sums the split-K partials) where "
                           "decode.py runs one"),
        KernelEntry("decode", _DECODE_PAIRS, "upcast", _DECODE_WHY + "; bf16 tcgen05.mma kind::f16",
                    max_rows=DECODE_MAX_ROWS),
        KernelEntry("dot_scaled_nvidia", _MX_PAIRS | {(NVFP4, NVFP4)}, "native",
                    "tl.dot_scaled lowers to tcgen05.mma block_scale (mxf8f6f4 / mxf4 / mxf4nvf4)"),
        KernelEntry("dot_scaled_nvidia", _DENSE_X_MX - {(d, NVFP4) for d in DENSE_KINDS}, "upcast",
                    "Triton decodes the MX operand in the kernel and runs a 16-bit tcgen05.mma (kind::f16)"),
        KernelEntry("block_fp8", _BLOCK_FP8_PAIR, "native",
                    "fp8 tcgen05.mma with fp32 promotion per 128-K block"),
        KernelEntry("dense_x_block_fp8", _DENSE_X_BLOCK_FP8, "upcast", _DENSE_X_BLOCK_FP8_WHY + " (tcgen05 kind::f16)"),
        KernelEntry("upcast", _UPCAST_PAIRS, "upcast",
                    "decoded to bf16 in registers before a bf16 MMA"),
    ),
    "sm_90": (
        # Where it measured faster than the swapped kernels below (H100, 2026-11-22, N=7168, K=4096, tuned
        # configs in decode._SM90_TUNED): fp4 and mxfp8 weights up to 16 rows (M=1: mxfp4 11.3 us vs
        # upcast 24.4, nvfp4 11.4 vs 20.1, mxfp8 13.0 vs 27.2; M=16: 20.5 vs 28.0, 16.1 vs 21.2, 20.4 vs
        # 26.7; the day's last run, with the fp16-route GEMV decode and the 64-row mxfp8 tile: M=1 9.4 / 10.2
        # / 13.0, M=16 20.1 / 16.1 / 16.7). At M=64 (mxfp4 34.8 vs 30.2, mxfp8 43.8 vs 29.6) the older kernels
        # stay; block FP8 (decode.py 13.5 / 21.1 / 38.2 vs block_fp8's 13.9 / 14.0 / 16.5) takes decode_fp8
        # (session 18, benchmarks/results/decode_fp8_h100_2026-11-23_session18.md); fp6 weights are not measured
        # yet.
        # bf16 x fp4 at 17-64 rows, against the upcast path that ran there, H100, 2026-11-24, the 5 issue shapes
        # (benchmarks/results/decode_wgmma_rows64_h100_2026-11-24_session29.md), with the activations streamed and
        # 2 K splits (decode_wgmma.default_config): at 32 rows bf16 x mxfp4 1.55-1.80x, bf16 x nvfp4 1.11-1.34x (the
        # staged 4-8 splits had run 0.85-1.07x for nvfp4); at 33 / 64 rows bf16 x mxfp4 1.35-1.73x / 1.30-1.42x
        # (1.23-1.61x / 1.23-1.45x XLA's bf16 dot), bf16 x nvfp4 1.13-1.40x / 1.12-1.19x. At 16 rows, 2 streamed
        # splits and the fp4 pairs fed to wgmma without re-pairing: 1.07-1.49x session 29's kernel, 1.52-2.72x XLA's
        # bf16 dot (benchmarks/results/decode_wgmma_rows16_h100_2026-11-24_session30.md, run 6).
        KernelEntry("decode_wgmma", _DECODE_WGMMA_PAIRS, "upcast", _DECODE_WGMMA_WHY + _DECODE_WGMMA_MEASURED,
                    max_rows=64, min_rows=2, named_configs_only=True),
        # H100, 2026-11-23, kernel time, against decode.py's kernels (benchmarks/results/decode_wgmma_pairs_h100_
        # 2026-11-23_session15.md): at 16 rows 1.45-2.08x (mxfp8 x mxfp4 11.77 / 16.06 / 23.95 us against 17.11 /
        # 30.31 / 49.88 at 7168 x 2048 / 4096 / 7168; mxfp4 x mxfp4 2.0-2.9x; nvfp4 x nvfp4 1.23-1.54x), at 8 rows
        # 1.40-1.90x, at 2 rows 0.88-1.35x (K = 2048 below 1.0). At 32 rows, against the upcast path that ran
        # there: session 15's 3-chunk ring 0.84-1.10x for MX activations x mxfp4; with session 16's 2-chunk ring
        # and splits of >= 2 chunks (decode_wgmma.default_config; benchmarks/results/decode_wgmma_tuning_h100_
        # 2026-11-23_session16.md, runs 3-4, the 5 issue shapes) mxfp8 x mxfp4 0.97-1.30x (geomean 1.10x; slower only at
        # 7168 x 2048, 13.78 vs 13.32 us) and nvfp4 x nvfp4 0.94-1.26x (geomean 1.10x; slower only at
        # 28672 x 8192, 170.6 vs 159.9 us), so both take 2-32 rows. 17 rows pad to the same 32 and were not timed.
        KernelEntry("decode_wgmma", _DECODE_WGMMA_QUANTIZED_X, "upcast",
                    _DECODE_WGMMA_WHY + "the quantized activations decoded to bf16 once per program; at 16 rows "
                    "mxfp8 x mxfp4 1.42-1.91x XLA's bf16 dot (decode.py 0.84-1.14x); at 32 rows, with 2 streamed "
                    "splits, 1.22-1.40x the upcast path (nvfp4 x nvfp4 1.30-1.44x) on an H100 (2026-11-24)",
                    max_rows=32, min_rows=2, named_configs_only=True),
        # Quantized activations at 33-64 rows, H100, 2026-11-24, kernel time, the 5 issue shapes, against the upcast
        # path that ran here before (same results file), the activations streamed, 2 K splits (1 at K = 2048):
        # mxfp8 x mxfp4 1.18-1.77x at 33 rows, 1.01-1.40x at 64 (e5m2 activations take the same decode, not timed).
        # fp4 activations, decoded again by every program (as much decode work per program as the weight's), then
        # by fp32 instructions: mxfp4 x mxfp4 0.82-1.14x / 0.67-1.06x,
        # nvfp4 x nvfp4 0.92-1.20x / 0.81-1.31x. Decoded by the weight's instructions since (same session,
        # second run), at 64 rows mxfp4 x mxfp4 0.84-1.20x and nvfp4 x nvfp4 0.87-1.58x the upcast path (mxfp8 x
        # mxfp4 0.94-1.03x its earlier time; at 16 rows 0.98-1.04x; nvfp4 x nvfp4 at 32 rows 1.06-1.39x):
        # nvfp4 x nvfp4 takes K >= 7168 below (1.00-1.58x there, 0.87-0.97x at K = 2048 / 4096), mxfp4 x mxfp4
        # keeps upcast (0.96x at 8192^2).
        KernelEntry("decode_wgmma", _DECODE_WGMMA_MX8_X, "upcast",
                    _DECODE_WGMMA_WHY + "8-bit MX activations decoded once per program, padded to 64 rows and "
                    "streamed through a 2-chunk ring beside the weight's, 2 K splits; 1.01-1.77x the upcast path "
                    "below at 33 and 64 rows (H100, 2026-11-24)",
                    max_rows=64, min_rows=33, named_configs_only=True),
        KernelEntry("decode_wgmma", frozenset({(NVFP4, NVFP4)}), "upcast",
                    _DECODE_WGMMA_WHY + "activations padded to 64 rows and streamed, decoded by the weight's "
                    "instructions; from K = 7168 1.00-1.58x the upcast path at 64 rows (H100, 2026-11-24: 48.48 vs "
                    "51.11 us at 7168^2, 182.38 vs 287.47 at 28672 x 8192, 59.94 vs 59.99 at 8192^2)",
                    max_rows=64, min_rows=33, min_size=(33, 1, 7168), named_configs_only=True),
        # bf16 x mxfp8 weights (e4m3, e5m2), H100, 2026-11-25, kernel time, the 5 issue shapes (benchmarks/results/
        # mxfp8_weights_dispatch_h100_2026-11-25_session35.md, run 3): against decode.py at 4 rows (its GEMV, re-tiled
        # the same day) 1.09-1.19x, at 16 rows (its swapped MMA) 1.02-1.10x, against the upcast path at 32 / 64 rows
        # 1.28-1.60x / 1.15-1.26x. Before the GEMV's 8-bit tiles (runs 1-2) the GEMV ran 0.89-0.94x XLA's bf16 dot at
        # 4 rows (1.50-1.87x slower than this kernel). 1-2 rows keep the GEMV: 1.04-1.07x faster than this kernel at
        # 2 rows (its FMAs grow with the rows; 3 rows, not timed, lie between). Session 15's opt-in (16 rows, 13.55
        # vs 10.44 us at 7168 x 2048) predates the 2-split default: 10.29 vs 10.49 now.
        KernelEntry("decode_wgmma", _DECODE_WGMMA_BF16_8BIT, "upcast", _DECODE_WGMMA_WHY + "8-bit weights by hardware "
                    "conversion; 1.53-1.80x XLA's bf16 dot at 4-16 rows, 1.12-1.74x at 32-64, 1.02-1.60x the kernels "
                    "that ran here before (the GEMV re-tiled) on an H100 (2026-11-25)",
                    max_rows=64, min_rows=3, named_configs_only=True),
        KernelEntry("decode_wgmma", _DECODE_WGMMA_8BIT, "upcast", _DECODE_WGMMA_WHY + "8-bit weights by hardware "
                    "conversion", max_rows=32, named_configs_only=True,
                    opt_in="against decode_fp8 (below) for mxfp8 x mxfp8 on an H100 (2026-11-25, kernel time, 2-64 "
                           "rows, the 5 issue shapes, before and after its 3-stage ring at K <= 4096) 0.90-1.21x: "
                           "faster at 7168 x 7168 and 8192 x 8192, level or slower at K <= 4096 and at 8-16 rows of "
                           "28672 x 8192, so the fp8 wgmma kernel keeps them"),
        # Block FP8 weights at one row, with bf16 or block FP8 activations: the GEMV (per-128-K scales on each group's
        # fp32 sum), whole rows per program (gemv_tiles.BLOCK_FP8_GEMV_TILES). H200, 2026-12-02, kernel time: bf16 rows
        # 9.49 / 6.29 / 24.00 us at 7168 x 4096 / 7168 x 2048 / 8192 x 8192 against dense_x_block_fp8's 19.60 / 12.48 /
        # 38.87 and XLA's bf16 dot's 19.83 / 16.47 / 37.12 (session 40); block FP8 rows 10.27 / 6.81 / 18.56 / 14.95 /
        # 57.95 us at those and 7168 x 7168 / 28672 x 8192 against decode_fp8's 10.86 / 7.18 / 20.03 / 16.48 / 59.91
        # (1.03-1.10x) and cuBLAS blockwise's 14.20 / 8.90 / 27.61 / 20.04 / 69.91 (session 41,
        # benchmarks/results/decode_block_fp8_h200_2026-12-02_session41.md). At 2 rows it is 0.61-0.92x decode_fp8.
        # Block FP8 rows take it only where those tiles apply (gemv_tiles.tile_fields: K of 2048 / 4096 or a multiple
        # of 1024, N at least a program per SM), as decode.default_config picks them; elsewhere decode_fp8, measured
        # against the GEMV's heuristic tiles on no shape.
        KernelEntry("decode", frozenset({("bf16", BLOCK_FP8)}), "upcast", _DECODE_WHY + "; the CUDA-core GEMV, "
                    "2.09x / 2.62x / 1.55x XLA's bf16 dot at 7168 x 4096 / 7168 x 2048 / 8192 x 8192 on an H200",
                    max_rows=1),
        KernelEntry("decode", _BLOCK_FP8_PAIR, "upcast", _DECODE_WHY + "; the CUDA-core GEMV on whole weight rows, "
                    "1.03-1.10x decode_fp8 and 1.21-1.49x cuBLAS blockwise on the five issue shapes on an H200",
                    max_rows=1, applies=_one_row_block_fp8_tile),
        KernelEntry("decode_fp8", _BLOCK_FP8_PAIR, "native", _DECODE_FP8_WHY, max_rows=64, named_configs_only=True),
        KernelEntry("decode_fp8", _MX8_PAIRS, "native", _DECODE_FP8_MX_WHY, max_rows=64, min_rows=2,
                    max_staged_scales=MX8_STAGED_SCALES, named_configs_only=True),
        KernelEntry("decode", _DECODE_SM90, "upcast", _DECODE_WHY + "; CUDA-core GEMV or bf16 MMA",
                    max_rows=16),
        KernelEntry("decode", _DECODE_PAIRS, "upcast", _DECODE_WHY + "; bf16 wgmma or CUDA-core FMAs",
                    max_rows=DECODE_MAX_ROWS,
                    opt_in="slower than the kernels below on an H100 for these pairs (2026-11-22): block FP8 "
                           "weights (13.5 / 21.1 / 38.2 us at M = 1 / 16 / 64 vs block_fp8's 13.9 / 14.0 / "
                           "16.5), fp4 and mxfp8 weights above 16 rows; fp6 weights unmeasured; with bf16 "
                           "activations x block FP8 weights 0.63-0.79x dense_x_block_fp8 at 4 rows (session 40), "
                           "0.78-0.81x at 16-64 (session 41; H200, 2026-12-02; its one-row GEMV has an entry above, "
                           "for block FP8 activations too)"),
        KernelEntry("block_fp8_gluon", _BLOCK_FP8_PAIR, "native",
                    "persistent, warp-specialized Gluon kernel: a TMA loader warp and two consumer warp groups "
                    "taking turns, so one promotes (fp32, per 128-K block) while the other's fp8 wgmma runs; "
                    "128 x 256 tiles (128 x 128 where fewer waves), a tile's stores overlapped with the next "
                    "tile's first wgmma, stages released by named barrier (0.961x cuBLAS blockwise geomean, "
                    "worst 0.930x, over the suite's seven M, N, K >= 2048 shapes on an H200, 2026-12-02, kernel "
                    "time, interleaved rounds; 0.70-0.75x for block_fp8_persistent below in single-pass runs, "
                    "H100)",
                    min_size=GLUON_BLOCK_FP8_MIN, named_configs_only=True),
        KernelEntry("block_fp8_persistent", _BLOCK_FP8_PAIR, "native",
                    "persistent (one program per SM over grouped 128 x 128 tiles): TMA loads, fp8 e4m3 wgmma, "
                    "fp32 promotion per 128-K block with the next step's scales prefetched (0.71x cuBLAS "
                    "blockwise on an H100, 2026-11-22, against 0.66x for block_fp8 below)",
                    min_size=PERSISTENT_BLOCK_FP8_MIN),
        KernelEntry("block_fp8", _BLOCK_FP8_PAIR, "native",
                    "fp8 e4m3 wgmma with fp32 promotion per 128-K block"),
        KernelEntry("dense_x_block_fp8", _DENSE_X_BLOCK_FP8, "upcast", _DENSE_X_BLOCK_FP8_WHY + " (bf16 wgmma, the "
                    "widened weight its register A operand)" + _DENSE_X_BLOCK_FP8_MEASURED),
        KernelEntry("mx_gluon", frozenset(("bf16", w) for w in ("e2m1", NVFP4, "e4m3", "e5m2")), "upcast",
                    "Hopper has no block-scaled MMA: warp-specialized Gluon kernel, the weight decoded in "
                    "registers into wgmma's A operand (product transposed) while the other consumer's wgmma "
                    "runs, bf16 activations by TMA; one kernel", min_rows=DECODE_MAX_ROWS + 1,
                    opt_in="0.78-0.90x the upcast path below on an H100 (2026-11-24, kernel time, bf16 x "
                           "mxfp4 / nvfp4 at 8192^3 and the Llama M = 4096 shapes; 0.70-0.76x XLA's bf16 dot): "
                           "the in-register decode, repeated per activation tile, sets each K step's pace",
                    named_configs_only=True),
        KernelEntry("hopper_mx", _UPCAST_PAIRS, "upcast",
                    "Hopper has no block-scaled MMA: packed tiles by TMA, decoded to bf16 in registers before "
                    "a bf16 wgmma, one kernel (no XLA dequantize pass)", min_rows=DECODE_MAX_ROWS + 1,
                    opt_in="half the speed of the upcast path below on an H100 (2026-11-22, kernel time, "
                           "4096 x 8192 x 8192 and 4096 x 28672 x 8192: 0.39-0.47x XLA bf16 against upcast's "
                           "0.70-0.93x): decoding both operands in the wgmma loop costs more than XLA's "
                           "separate pass"),
        # XLA dequantizes large operands to bf16 first, then the bf16 TMA GEMM (measured 1.02-1.06x of XLA
        # dequantize + dot, 2026-11-22).
        KernelEntry("upcast", _UPCAST_PAIRS, "upcast",
                    "Hopper has no block-scaled MMA: decoded to bf16 (in XLA for large operands) before a bf16 "
                    "wgmma"),
    ),
    "gfx950": (
        KernelEntry("decode", _DECODE_PAIRS, "upcast", _DECODE_WHY + "; bf16 MFMA or FMAs",
                    max_rows=DECODE_MAX_ROWS),
        KernelEntry("dot_scaled_cdna4", _MX_PAIRS, "native",
                    "tl.dot_scaled lowers to v_mfma_scale_f32_*_f8f6f4 with pre-shuffled scales"),
        KernelEntry("block_fp8", _BLOCK_FP8_PAIR, "native",
                    "fp8 MFMA with fp32 promotion per 128-K block"),
        KernelEntry("dense_x_block_fp8", _DENSE_X_BLOCK_FP8, "upcast", _DENSE_X_BLOCK_FP8_WHY + " (16-bit MFMA)"),
        KernelEntry("upcast", _UPCAST_PAIRS, "upcast",
                    "no native path: v_mfma_scale takes fp8 / fp6 / fp4 operands only (not bf16 activations), "
                    "and Triton 3.6's nvfp4 dot_scaled fails to compile for gfx950; decoded to bf16 before a "
                    "bf16 MFMA"),
    ),
}


@dataclasses.dataclass(frozen=True)
class Choice:
    """What runs for one operand pair on one target."""

    target: str
    path: str  # "native" | "upcast" | "reference"
    kernel: Optional[str]
    why: str

    def load(self):
        """The kernel module (needs triton)."""
        return importlib.import_module(f"jax_blockscale._triton.{self.kernel}")


def _normalize_target(target: str) -> str:
    t = target.lower()
    if t in ("sm_100a", "sm_103", "sm_103a", "sm_100"):
        return "sm_100"
    if t in ("sm_90a", "sm_90"):
        return "sm_90"
    return t


def detect_target(device: jax.Device | None = None) -> str:
    """The target name of `device` (default: the first JAX device)."""
    device = device or jax.devices()[0]
    if device.platform == "cpu":
        return "cpu"
    cc = getattr(device, "compute_capability", None)
    if device.platform in ("gpu", "cuda") and cc is not None and "." in str(cc):
        major, minor = str(cc).split(".")[:2]
        return _normalize_target(f"sm_{major}{minor}")
    kind = str(getattr(device, "device_kind", "")).lower()
    if "gfx" in str(cc or "") or "gfx" in kind:
        arch = str(cc or kind)
        return arch[arch.index("gfx"):].split(":")[0].split()[0]
    if "mi355" in kind or "mi350" in kind:
        return "gfx950"
    return f"{device.platform}:{kind or 'unknown'}"


def _size_allows(entry: KernelEntry, rows: Optional[int], n: Optional[int], k: Optional[int]) -> bool:
    if entry.opt_in is not None:
        return False
    if entry.max_rows is not None and (rows is None or rows > entry.max_rows):
        return False
    if entry.min_rows is not None and rows is not None and rows < entry.min_rows:
        return False
    if entry.max_staged_scales is not None:
        if rows is None or k is None:
            return False
        padded = max(8, 1 << (rows - 1).bit_length())
        if padded * (1 << (max(1, -(-k // 32)) - 1).bit_length()) > entry.max_staged_scales:
            return False
    if entry.applies is not None and (None in (rows, n, k) or not entry.applies(rows, n, k)):
        return False
    if entry.min_size is not None:
        if None in (rows, n, k) or any(v < lo for v, lo in zip((rows, n, k), entry.min_size)):
            return False
    return True


def choose(target: str, a_kind: str, b_kind: str, rows: Optional[int] = None, n: Optional[int] = None,
           k: Optional[int] = None, kernel: Optional[str] = None, configured: bool = False) -> Choice:
    """The dispatch decision for one target and operand pair; never raises for a known pair unless
    `kernel` is given.

    `rows`: activation rows (batch * M) when the weight is unbatched, else None; entries with `max_rows`
    (decode kernels) apply only when it is given and within their limit, entries with `min_rows` (large-M
    kernels) when it is None or reaches it. Entries with `min_size` (the persistent kernel) apply only when
    `rows`, `n` (the weight's rows) and `k` are given and reach it. `kernel`: take this module's entry (for
    comparisons, `TileConfig.kernel`); a ValueError if the target has none for the pair. `configured`: the
    caller passes its own TileConfig (naming no kernel), so entries with `named_configs_only` are skipped."""
    target = _normalize_target(target)
    if kernel is not None:
        for entry in KERNEL_TABLE.get(target, ()):
            if entry.module == kernel and (a_kind, b_kind) in entry.pairs:
                return Choice(target, entry.path, entry.module, entry.why + f" (forced: kernel={kernel!r})")
        raise ValueError(f"kernel={kernel!r} has no entry for {a_kind} x {b_kind} on {target}")
    if target == "cpu":
        return Choice(target, "reference", None, "CPU: the jnp reference (dequantize + fp32 dot) runs")
    for entry in KERNEL_TABLE.get(target, ()):
        if not _size_allows(entry, rows, n, k) or (configured and entry.named_configs_only):
            continue
        if (a_kind, b_kind) in entry.pairs:
            return Choice(target, entry.path, entry.module, entry.why)
    if target not in KERNEL_TABLE:
        why = f"no Triton kernel targets {target}; the jnp reference runs (correct, not fast)"
    else:
        why = f"no kernel for {a_kind} x {b_kind} on {target}; the jnp reference runs"
    return Choice(target, "reference", None, why)
