"""16-bit activations x DeepSeek block FP8 weights (bf16 / fp16 x e4m3 codes with fp32 scales per 128 x 128 tile).

A serving model that keeps DeepSeek's FP8 checkpoint and leaves its activations unquantized multiplies bf16 rows by
block FP8 weights. The kernel is `block_fp8.block_fp8_kernel` with `X_DENSE`: per 128-wide K step the weight's
codes are widened to the activations' type in registers (exact), one 16-bit MMA (Hopper wgmma, Blackwell tcgen05
kind::f16, gfx950 MFMA) sums the exact products in fp32, and the step is promoted with the weight tile's scale.
Before it, these pairs ran the jnp reference, which widens the weight to fp32 in memory for an fp32 GEMM.

This module is its launcher and its own entry in the dispatch table (`backends.KERNEL_TABLE`), so that the
device tables' block FP8 rules (tuned for fp8 operands, some on TMA or persistent kernels) do not apply to it.
The weight is the MMA's M side (`swap_ab`) wherever it is unbatched: widened, it feeds wgmma's A operand from
registers, where as B it would go back through shared memory. From `WIDEN_FIRST_ROWS` activation rows on sm_90 the
codes are widened once by XLA before the kernel instead (`TileConfig.widen_first`: exact, the scales kept apart),
so that the main loop has no conversion; below that the extra pass costs more than it saves.
"""

from __future__ import annotations

import jax

from . import block_fp8
from .problem import BLOCK_FP8, GemmProblem, TileConfig

SUPPORTED: frozenset[tuple[str, str]] = frozenset({("bf16", BLOCK_FP8), ("fp16", BLOCK_FP8)})


def check_config(p: GemmProblem, config: TileConfig) -> None:
    block_fp8.check_config(p, config)
    if config.tma or config.persistent:
        raise ValueError("16-bit activations x block_fp8 run the pointer kernel: tma and persistent must be off")
    if config.swap_ab and p.b_batched:
        raise ValueError("swap_ab needs an unbatched weight")


# From this many activation rows sm_90 widens the codes by XLA before the kernel (TileConfig.widen_first): H200,
# 2026-12-02, kernel time (benchmarks/results/decode_block_fp8_h200_2026-12-02_session41.md, run 4), against the
# widening in registers: 4096 rows 1.10-1.25x (7168 x 4096: 498 against 594 us), 1024 rows 0.98-1.04x, 256 rows
# 0.60-0.67x (the extra pass reads 1 and writes 2 bytes per weight element, which few rows do not repay).
WIDEN_FIRST_ROWS = 2048


def default_config(p: GemmProblem, target: str = "sm_90") -> TileConfig:
    """The weight as the M side (swap_ab) when unbatched: at most 64 activation rows as block_fp8's swapped decode
    tiles (64 weight rows, the rows padded to >= 16, split-K to about two programs per SM), else 128 x 128 tiles on
    8 warps, 3 stages (48 KB each: 16 of weight codes, 32 of activations; with the codes widened first on sm_90 from
    `WIDEN_FIRST_ROWS` rows, 64 KB)."""
    rows = p.m if p.b_batched else p.batch * p.m
    if not p.b_batched and rows <= 64:
        return block_fp8.swapped_decode_config(p.n, rows, p.k)
    base = TileConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=3,
                      swap_ab=not p.b_batched, widen_first=target == "sm_90" and rows >= WIDEN_FIRST_ROWS)
    if base.swap_ab:
        return block_fp8.with_swapped_split_k(base, p.n, rows, p.k)
    return block_fp8.with_split_k(p, base)


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int) -> jax.Array:
    """out (p.batch, p.m, p.n) = a (dense) @ decode(b).T; `a_scales` is ignored (dense activations have none)."""
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"dense_x_block_fp8 takes bf16 / fp16 activations x block_fp8, got {p.a_kind} x {p.b_kind}")
    check_config(p, config)
    if config.widen_first and compute_capability != 90:
        # Measured on Hopper only; its 16-bit stages (64 KB each at 128 x 128) are sized for Hopper's 227 KB of shared
        # memory, where gfx950's LDS holds 160 KB.
        raise ValueError(f"TileConfig.widen_first is a Hopper (sm_90) option, got compute capability "
                         f"{compute_capability}")
    # The activations' values again as their (never read) scale pointer: the primitive's placeholder scales are
    # then dead code, and no XLA kernel builds them.
    return block_fp8.run_gemm(block_fp8.block_fp8_kernel, p, a_values, a_values, b_values, b_scales, alpha,
                              config=config, compute_capability=compute_capability,
                              name="dense_x_block_fp8_swapped" if config.swap_ab else "dense_x_block_fp8",
                              widen_b=a_values.dtype if config.widen_first else None,
                              X_DENSE=True, **block_fp8.kernel_constexprs(config.swap_ab))
