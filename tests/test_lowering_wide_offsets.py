"""CPU tests: past 2**31 elements the pointer GEMM kernels address memory with 64-bit arithmetic.

`block_fp8.needs_wide_offsets` switches the kernels to int64 row/batch offsets (`WIDE`). Whether that
reaches every address is a property of the PTX: a row index multiplied by the row stride in 32 bits
(`mul.lo.s32` / `mad.lo.s32`) wraps past 2**31 and reads another row, silently. The strides here are
chosen to be no power of two (K = 16512, N = 200), so the multiplications show up as `mul`/`mad` by the
stride constant and are not confused with shared-memory shifts. Each test also compiles the same kernel
without WIDE and finds the 32-bit multiplication there, so the pattern it looks for is real.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("triton")

from jax_blockscale._triton import block_fp8, upcast  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem, TileConfig  # noqa: E402

from test_lowering_hopper import cross_compile  # noqa: E402

K = 16512  # 129 blocks of 128: the row stride in elements (and in bytes for 8-bit values)
# M * K / 2 and N * K / 2 >= 2**32 (fp4 operands of 4 GiB; only compiled here): no row offset fits in 32
# bits even unsigned, so any 32-bit `row * stride` left in the PTX is a wrapping bug. (Below 2**32 LLVM may rightly
# narrow a product it proves < 2**32 to a 32-bit multiply and a zero extension.) An unbatched weight of
# >= 2**31 elements used to fail to compile (`0 * (N * K)` as an int32 constant).
M = N = (1 << 33) // K + 64


def _mul32(ptx: str, constant: int) -> list[str]:
    """32-bit integer multiplies (or multiply-adds) of a register by `constant`."""
    return re.findall(rf"\b(?:mul|mad)\.lo\.[su]32\s+%r\d+,\s*%r\d+,\s*{constant}\b[^\n]*", ptx)


def _mul64(ptx: str, constant: int) -> list[str]:
    """Multiplies by `constant` with a 64-bit result (widening from 32 bits, or 64 x 64)."""
    return re.findall(rf"\b(?:mul|mad)\.(?:wide\.[su]32|lo\.[su]64)\s+%rd\d+,\s*%r[d]?\d+,\s*{constant}\b", ptx)


CASES = [
    # block_fp8: the pointer kernel (large M), split-K partials, and the swapped decode order.
    ("block_fp8", TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3)),
    ("block_fp8", TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=3, split_k=2)),
    ("block_fp8", TileConfig(block_m=64, block_n=16, block_k=128, num_warps=4, num_stages=4, swap_ab=True)),
    ("e4m3", TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)),
    ("e2m1", TileConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3)),
]


def _compile(kind: str, config: TileConfig, wide: bool) -> str:
    # The narrow kernel cannot even be built for M * K >= 2**31 (Triton rejects the int32 constant), so it
    # gets fewer rows and the same strides.
    rows = M if wide else 1000
    p = GemmProblem(1, False, rows, rows, K, kind, kind, "bf16")
    assert block_fp8.needs_wide_offsets(p, config) == wide
    if kind == "block_fp8":
        kernel, extra = block_fp8.block_fp8_kernel, block_fp8.kernel_constexprs(config.swap_ab)
    else:
        kernel, extra = upcast.upcast_kernel, upcast.kernel_constexprs(p)
    # cross_compile derives WIDE from the problem; pass it explicitly to compare both settings.
    return cross_compile(kernel, p, config, "sm_90", **extra) if wide else \
        _compile_narrow(kernel, p, config, extra)


def _compile_narrow(kernel, p: GemmProblem, config: TileConfig, extra: dict) -> str:
    from test_lowering_hopper import gemm_constexprs, signature
    from jax_blockscale._triton.compile import assembly, compile_kernel

    constexprs = {**gemm_constexprs(p, config), **extra, "WIDE": False}
    return assembly(compile_kernel(kernel, target="sm_90", signature=signature(p), constexprs=constexprs,
                                   num_warps=config.num_warps, num_stages=config.num_stages))


@pytest.mark.parametrize("kind,config", CASES, ids=lambda x: x if isinstance(x, str) else
                         f"split{x.split_k}_bk{x.block_k}{'_swapped' if x.swap_ab else ''}")
def test_row_offsets_are_64_bit_past_2_31(kind, config):
    p = GemmProblem(1, False, M, N, K, kind, kind, "bf16")
    epb = p.elements_per_byte("a")
    narrow = _compile(kind, config, wide=False)
    wide = _compile(kind, config, wide=True)
    values_stride = K // epb
    # Without WIDE the a/b row offset is a 32-bit product: the check below would see it.
    assert _mul32(narrow, values_stride), "expected a 32-bit row * K product in the narrow kernel"
    assert _mul64(wide, values_stride), "expected a 64-bit row * K product in the wide kernel"
    # The values' row stride (both operands) must never be multiplied in 32 bits; the output's row index
    # times N must be 64-bit (32-bit multiplies by N remain: `offs % N` is computed that way). Scale
    # offsets are not checked: a scale row is at most K / 32 elements, below 2**31 whenever the values are.
    found = _mul32(wide, values_stride)
    assert not found, f"{kind} {config}: 32-bit multiply by the row stride {values_stride}: {found[:3]}"
    assert _mul64(wide, N) or _mul64(wide, N * 2) or _mul64(wide, N * 4), "output row offset not 64-bit"
