"""The decode GEMV's measured sm_90 tiles by (rows, K), and the rule that picks one (`tile_fields`).

Plain data, no Triton: `decode.default_config` picks its tile here, and dispatch (`backends.KERNEL_TABLE`, which must
import without Triton) asks the same rule where an entry applies only where a measured tile does.
"""

from __future__ import annotations

from .problem import HOPPER_SMS

# The fp4 GEMV's tile by K where decode._SM90_TUNED's (8 rows x 2048 codes, 4 warps) measured slower with the
# e4m3-route decode (H100, 2026-11-24, mxfp4 / nvfp4, CUPTI kernel time,
# benchmarks/results/decode_gemv_e4m3_h100_2026-11-24_session27.md): (block_n, block_k, num_warps, num_stages). Each
# keeps 64 weight bytes per thread and tile, and applies only where N leaves at least two programs per SM. K = 4096:
# whole rows on 8 warps (7168 x 4096 mxfp4 9.05 -> 8.75 us, nvfp4 9.55 -> 8.87, 4096 x 4096 6.38 -> 5.76); K = 8192 (a
# multiple of 2048 above 4096): 16 rows x 1024 codes (8192 x 8192 17.97 -> 15.52; 28672 x 8192 47.62 -> 47.25); other
# multiples of 1024 above 4096, or where N is short of two programs per SM for 16 rows: 8 rows x 1024 codes on 2 warps
# (7168 x 7168 14.40 -> 13.43; 4096 x 14336 15.12 -> 14.62). The first entry whose condition and program count hold
# applies.
FP4_GEMV_TILES = (
    (lambda rows, k: k == 4096, (8, 4096, 8, 2)),
    (lambda rows, k: k > 4096 and k % 2048 == 0, (16, 1024, 4, 3)),
    (lambda rows, k: k > 4096 and k % 1024 == 0, (8, 1024, 2, 3)),
)


# The 8-bit (mxfp8 e4m3 / e5m2) GEMV's tile (H100, 2026-11-25, CUPTI kernel time, bf16 and mxfp8 activations,
# benchmarks/results/mxfp8_weights_dispatch_h100_2026-11-25_session35.md): (block_n, block_k, num_warps,
# num_stages), no K split, where N leaves a program per SM. One row: whole 4096-code rows (or half rows at K = 8192)
# on 8 warps where 4096 divides K, 2048-code rows where 2048 does, else 16 rows x 1024 codes: 7168 x 4096 13.85 ->
# 12.35 us, 7168 x 2048 8.70 -> 7.10, 7168 x 7168 21.58 -> 20.48, 8192 x 8192 27.06 -> 25.33, 28672 x 8192
# 87.80 -> 79.92 (89-97% of a same-size read, against the old tile's 73-88%; 1.90-2.41x XLA's bf16 dot).
# 2-4 rows: 16 rows x 1024 codes on 4 warps, 1.04-1.73x the old tile at 4 rows (same run). Dispatch sends it
# bf16 activations at 2 rows (7168 x 4096 17.75 -> 14.28 us across runs; 1.41-1.91x XLA's bf16 dot in the later
# one) and fp4 ones at 2-4; 8-bit ones take decode_fp8 and bf16 ones from 3 rows decode_wgmma.
FP8_GEMV_TILES = (
    (lambda rows, k: rows == 1 and k % 4096 == 0, (8, 4096, 8, 2)),
    (lambda rows, k: rows == 1 and k % 2048 == 0, (8, 2048, 8, 2)),
    (lambda rows, k: k % 1024 == 0, (16, 1024, 4, 3)),
)


# bf16 activations x block FP8 weights at one row (H200, 2026-12-02, CUPTI kernel time, `python -m benchmarks.decode
# --bf16-block`, benchmarks/results/bf16_block_fp8_h200_2026-12-02_session40.md): whole rows on 8 warps where K is
# 2048 or 4096 (7168 x 4096: 9.49 us against the heuristic tile's 14.47, 2.09x XLA's bf16 dot; 7168 x 2048: 6.29
# against 9.44), 16 rows x 1024 codes on 4 warps beyond (8192 x 8192: 24.00 against 33.50 and the whole-row tile's
# 37.47 over two K tiles). (block_n, block_k, num_warps, num_stages), no K split, where N leaves a program per SM.
BLOCK_FP8_GEMV_TILES = (
    (lambda rows, k: rows == 1 and k in (2048, 4096), (8, None, 8, 2)),   # block_k None: all of K
    (lambda rows, k: rows == 1 and k % 1024 == 0, (16, 1024, 4, 3)),
)


def tile_fields(table, rows: int, n: int, k: int, programs_per_sm: int = 1) -> dict:
    """TileConfig fields (block_n, block_k, num_warps, num_stages) of the first entry of a GEMV tile table
    (`FP4_GEMV_TILES`, `FP8_GEMV_TILES`, `BLOCK_FP8_GEMV_TILES`: (condition on rows and K, (block_n, block_k or
    None for all of K, warps, stages))) whose condition holds and whose rows leave N at least `programs_per_sm`
    programs per SM; {} where none does (the caller's default)."""
    for applies, (block_n, block_k, warps, stages) in table:
        if applies(rows, k) and n // block_n >= programs_per_sm * HOPPER_SMS:
            return dict(block_n=block_n, block_k=block_k or k, num_warps=warps, num_stages=stages)
    return {}
