"""Blackwell decode (at most 64 activation rows x one weight) on the block-scaled MMA, operands swapped.

Quantized activations against a quantized weight (MX x MX, nvfp4 x nvfp4) need no decode on sm_100: the
codes go to `tcgen05.mma ... block_scale` as they are (kind::mxf8f6f4 / mxf4 / mxf4nvf4), which is what
`dot_scaled_nvidia.py` does for large M. At decode sizes its 128-row tiles would be mostly padding on the
activation side and leave the weight, the bytes that matter, on the N side, so the product is computed
transposed (issue #12's "weight on the MMA's M side"):

    out.T (N, rows) = w (N, K) @ x (rows, K).T

with `dot_scaled_nvidia.launch` on the swapped problem: the weight's 128-row tiles are the MMA's M side
(one tcgen05 instruction's M), the activations one 128-row tile on its N side (rows past `rows` read the
last row again and are never stored), split-K while fewer than half the SMs would have a program, and the
(N, rows) product stored transposed by the kernel, which is the (rows, N) wanted. Beside the kernel, the
weight's scales go into the 5D tcgen05 layout in jnp on every call (as on the large-M path) and XLA sums the
split-K partials: two to three kernels per matmul, where `decode.py` (kind::f16, the codes decoded in
registers) runs one. Which of the two is faster on a B200 is not known: this project has no Blackwell GPU,
so dispatch keeps `decode.py` and this path is opt-in (`TileConfig(kernel="decode_sm100")`, best with
`default_config`'s fields). One kernel per matmul would need the split-K sum in the kernel and the weight's
scales stored in the 5D layout when it is quantized. The kernel source is `dot_scaled_nvidia.scaled_gemm_kernel`,
which runs on Hopper for MX pairs (Triton emulates `dot_scaled` there: bf16 upcast + wgmma; not nvfp4), where
tests/test_gpu_decode_sm100.py checks this module's numbers.

bf16 activations keep `decode.py`: a dense operand makes Triton's `dot_scaled` a kind::f16 MMA with the
weight decoded in the kernel, which `decode.py` already is.
"""

from __future__ import annotations

import jax

from . import dot_scaled_nvidia
from .problem import DECODE_MAX_ROWS, MX_KINDS, NVFP4, GemmProblem, TileConfig

SUPPORTED: frozenset[tuple[str, str]] = frozenset(
    {(a, b) for a in MX_KINDS for b in MX_KINDS} | {(NVFP4, NVFP4)}
)


def swapped(p: GemmProblem) -> GemmProblem:
    """The transposed product's problem: the weight's N rows as M, the activations' rows (batch folded) as N."""
    return GemmProblem(batch=1, b_batched=False, m=p.n, n=p.batch * p.m, k=p.k, a_kind=p.b_kind, b_kind=p.a_kind,
                       out_dtype=p.out_dtype)


def check_problem(p: GemmProblem) -> None:
    if (p.a_kind, p.b_kind) not in SUPPORTED:
        raise ValueError(f"decode_sm100 takes quantized activations x a quantized weight (MX x MX, nvfp4 x "
                         f"nvfp4), got {p.a_kind} x {p.b_kind}")
    if p.b_batched:
        raise ValueError("decode_sm100 takes one (unbatched) weight")
    if p.batch * p.m > DECODE_MAX_ROWS:  # also when named with TileConfig(kernel=...), which skips max_rows
        raise ValueError(f"decode_sm100 takes at most {DECODE_MAX_ROWS} activation rows, got {p.batch * p.m}")


def default_config(p: GemmProblem, target: str = "sm_100") -> TileConfig:
    """`dot_scaled_nvidia.default_config` of the swapped problem: 128 x 128 tiles, split-K for small grids."""
    del target
    return dot_scaled_nvidia.default_config(swapped(p))


def launch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array, b_values: jax.Array, b_scales: jax.Array,
           alpha: jax.Array, *, config: TileConfig, compute_capability: int) -> jax.Array:
    """The (p.batch, p.m, p.n) product of the contract's operands (problem.py), as p.out_dtype: a (B, M, ...)
    activations, b (N, ...) the weight."""
    check_problem(p)
    rows = p.batch * p.m
    x_values = a_values.reshape(rows, a_values.shape[-1])
    x_scales = a_scales.reshape(rows, a_scales.shape[-1])
    # The swapped product is (N, rows); the kernel stores it transposed, which is the (rows, N) wanted.
    out = dot_scaled_nvidia.launch(swapped(p), b_values, b_scales, x_values, x_scales, alpha, config=config,
                                   compute_capability=compute_capability, transpose_out=True)  # (1, rows, N)
    return out.reshape(p.batch, p.m, p.n)
