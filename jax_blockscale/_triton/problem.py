"""The contract between the matmul primitive and the kernel launchers.

A launcher is `launch(p: GemmProblem, a_values, a_scales, b_values, b_scales, alpha, *, config,
compute_capability) -> jax.Array` (shape `(p.batch, p.m, p.n)`, dtype `p.out_dtype`), built from
`jax_triton.triton_call`. It receives canonical, contiguous operands (below) and does any target-specific
scale rearrangement itself in jnp, so that XLA can fuse or hoist it.

Operands (`B = p.batch`; `b_*` has no leading B dim unless `p.b_batched`):
  a_values  (B, M, K / epb)   fp8 kinds: float8_e4m3fn / float8_e5m2; fp6: uint8, one code per byte;
                              fp4: uint8, two codes per byte, low nibble = even element; dense: bf16/fp16.
  a_scales  (B, M, K / 32) uint8 e8m0 for MX kinds, (B, M, K / 16) float8_e4m3fn for nvfp4,
            (B, M, K / 128) float32 for block_fp8 (1 x 128 groups); a (B, M, 1) dummy for dense.
  b_values  ([B,] N, K / epb) as a_values.
  b_scales  ([B,] N, K / 32) / ([B,] N, K / 16) as above; block_fp8 weights: ([B,] ceil(N / 128), K / 128)
            float32 (128 x 128 tiles); a ([B,] N, 1) dummy for dense.
  alpha     (1,) float32: the product of nvfp4 tensor scales (1.0 otherwise); multiplies the accumulator.
K is already padded by the caller to a multiple of every block involved (and of 128 for block_fp8); the
padding holds zero values. M and N are arbitrary.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Optional

import ml_dtypes
import numpy as np

if TYPE_CHECKING:
    import jax

# Element kinds. MX kinds carry e8m0 scales per 32 elements along K.
MX_KINDS = ("e4m3", "e5m2", "e2m3", "e3m2", "e2m1")
NVFP4 = "nvfp4"
BLOCK_FP8 = "block_fp8"
DENSE_KINDS = ("bf16", "fp16")
ALL_KINDS = MX_KINDS + (NVFP4, BLOCK_FP8) + DENSE_KINDS

# The name scope of the XLA dequantize passes before an upcast GEMM (upcast.py). Their fused kernels carry only
# names like "loop_convert_fusion"; the scope reaches their HLO metadata, where profiles find it
# (benchmarks/_kernel_time.reclassify).
DEQUANTIZE_SCOPE = "jbs_dequantize"

# Hopper (H100 / H200): the SMs that persistent kernels size their grids by, and the shared memory one block
# may use (227 KiB), which bounds the Gluon kernels' rings.
HOPPER_SMS = 132
HOPPER_SMEM_BYTES = 232448

# Names of the dense dtypes as operand kinds and output dtypes (jnp dtype -> name).
DTYPE_NAMES = {np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype(np.float16): "fp16", np.dtype(np.float32): "fp32"}
ELEMENTS_PER_BYTE = {"e2m1": 2, NVFP4: 2}
SCALE_BLOCK = {**{k: 32 for k in MX_KINDS}, NVFP4: 16, BLOCK_FP8: 128}
# DeepSeek-V3's block FP8 quantization block along K (and along N for weights).
SCALE_GROUP = SCALE_BLOCK[BLOCK_FP8]
# Decode kernels (one unbatched weight): at most this many activation rows (batch * M); dispatch's `max_rows`
# and the decode launchers' own checks.
DECODE_MAX_ROWS = 64
# Output dtypes by name (DTYPE_NAMES inverted).
OUT_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
# TMA: global strides must be multiples of 16 bytes.
TMA_ALIGN = 16


@dataclasses.dataclass(frozen=True)
class GemmProblem:
    """Static description of one block-scaled GEMM: out[b] = a[b] @ b[b or 0].T."""

    batch: int
    b_batched: bool
    m: int
    n: int
    k: int  # padded K, in elements
    a_kind: str
    b_kind: str
    out_dtype: str  # "bf16" | "fp16" | "fp32"

    def __post_init__(self):
        for kind in (self.a_kind, self.b_kind):
            if kind not in ALL_KINDS:
                raise ValueError(f"unknown operand kind {kind!r}")
        if self.out_dtype not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"unknown out_dtype {self.out_dtype!r}")

    def elements_per_byte(self, side: str) -> int:
        return ELEMENTS_PER_BYTE.get(self.a_kind if side == "a" else self.b_kind, 1)

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """Launch configuration of one kernel: tile sizes (in elements) and Triton's warp/stage counts."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8  # grouped (swizzled) launch order for L2 reuse
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1
    # Hopper variants (ignored elsewhere): TMA loads (hopper_tma.py) and swapped operands for decode (the
    # weight as the MMA's M side, block_fp8.run_gemm).
    tma: bool = False
    swap_ab: bool = False
    # Persistent Hopper block FP8 kernel (block_fp8_persistent.py; ignored elsewhere): one program per SM
    # over grouped tiles; Triton's warp specialization (producer + two consumer warp groups) or the tile and
    # K loops flattened into one pipelined loop; scales prefetched a K step ahead in registers; activation
    # scales transposed by XLA to (K/128, M) before the kernel instead of read with a stride.
    persistent: bool = False
    warp_specialize: bool = False
    flatten: bool = False
    prefetch_scales: bool = False
    a_scales_t: bool = False
    num_sms: int = HOPPER_SMS
    # Registers per thread capped (PTX .maxnreg; 0: the compiler's choice), e.g. 128 so that two 8-warp
    # programs share an SM and one's promotion overlaps the other's wgmma.
    max_registers: int = 0
    # Decode kernel variants (decode.py; ignored elsewhere): CUDA-core FMAs instead of the swapped MMA,
    # fp32 atomics for split-K (not bitwise deterministic) instead of the ordered workspace reduction, and
    # the inline-PTX fp4 decode on NVIDIA targets.
    fma: bool = False
    atomic_split_k: bool = False
    asm_decode: bool = True
    # The decode module's streaming GEMV (decode.gemv_kernel): CUDA-core FMAs over small weight tiles, many
    # programs per SM, group scales applied after each group's dot product; `prefetch` double-buffers the
    # raw weight tiles in registers. block_m, block_n, block_k, split_k, num_warps, num_stages apply.
    gemv: bool = False
    prefetch: bool = True
    # The GEMV's PTX fp4 decode to fp32 through e4m3 and fp16 (decode._fp4_f32_ptx: 7 bit ops per 8
    # elements, then the hardware's e4m3x2 -> f16x2 and f16 -> f32 conversions) instead of bf16 pairs
    # widened by integer ops (sm_89+: the sm_90 tuned configs turn it on).
    f16_decode: bool = False
    # Hopper MX GEMM variants (hopper_mx.py; ignored elsewhere): fp8 wgmma with one promotion per MX block
    # (mxfp8 x mxfp8 only) instead of decoding to bf16.
    fp8_mma: bool = False
    # 16-bit activations x block FP8 weights (dense_x_block_fp8.py; ignored elsewhere): the weight's e4m3 codes
    # widened to the activations' type by XLA once before the kernel (exact; the scales kept apart), so that the
    # main loop multiplies 16-bit tiles from shared memory with no conversion, for twice the weight's bytes.
    widen_first: bool = False
    # Forces the dispatch table's entry of this kernel module (e.g. "upcast" for the XLA-predecode path on
    # sm_90) instead of the first that holds the pair, for comparisons; the fields above apply to it as given.
    kernel: Optional[str] = None

    def replace(self, **changes) -> "TileConfig":
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------------------------------------
# Operand checks and shapes every launcher shares (the contract above; here so that no kernel module has to
# import another one for them).


def operand_dtypes(kind: str) -> tuple[np.dtype, Optional[np.dtype]]:
    """(values dtype, scales dtype) of an operand kind, as the module docstring lays them out; None: a dummy
    of any dtype (dense kinds)."""
    if kind in DENSE_KINDS:
        return OUT_DTYPES[kind], None
    fp8 = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2, BLOCK_FP8: ml_dtypes.float8_e4m3fn}
    scales = {NVFP4: ml_dtypes.float8_e4m3fn, BLOCK_FP8: np.float32}
    return np.dtype(fp8.get(kind, np.uint8)), np.dtype(scales.get(kind, np.uint8))


def check_operands(p: GemmProblem, a_values, a_scales, b_values, b_scales) -> None:
    """Wrong dtypes would be reinterpreted by the kernel rather than converted: refuse them here."""
    for side, kind, values, scales in (("a", p.a_kind, a_values, a_scales), ("b", p.b_kind, b_values, b_scales)):
        want_values, want_scales = operand_dtypes(kind)
        if values.dtype != want_values or (want_scales is not None and scales.dtype != want_scales):
            raise TypeError(
                f"{side} ({kind}) needs values of {want_values} and scales of {want_scales or 'any dtype'}, "
                f"got {values.dtype} and {scales.dtype}"
            )


def fold_batch(p: GemmProblem, a_values: jax.Array, a_scales: jax.Array) -> tuple[int, int, jax.Array, jax.Array]:
    """(grid batches, rows per batch, a_values, a_scales). With an unbatched b, batch folds into M: one 2D
    GEMM of B*M rows fills the machine better than B small ones."""
    if p.b_batched:
        return p.batch, p.m, a_values, a_scales
    rows = p.batch * p.m
    return 1, rows, a_values.reshape(1, rows, a_values.shape[-1]), a_scales.reshape(1, rows, a_scales.shape[-1])


def out_rows_tma_aligned(p: GemmProblem, transposed: bool = False) -> bool:
    """Whether the (M, N) output's rows are 16-byte aligned, as a TMA store needs (else a masked store);
    transposed: the rows of an (N, M) output (one product, M rows)."""
    width = p.batch * p.m if transposed else p.n
    return (width * OUT_DTYPES[p.out_dtype].itemsize) % TMA_ALIGN == 0
