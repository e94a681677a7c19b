"""Every kernel family once, at odd shapes, for NVIDIA's compute-sanitizer (Hopper):

    compute-sanitizer --tool memcheck   --error-exitcode 1 python -m benchmarks.sanitize
    compute-sanitizer --tool racecheck  --error-exitcode 1 python -m benchmarks.sanitize --small
    compute-sanitizer --tool initcheck  --error-exitcode 1 python -m benchmarks.sanitize --small

Families: block FP8 (pointer, split-K, swapped decode order, TMA), the persistent block FP8 kernel
(dispatch's pick and a batched problem looping over tiles), the warp-specialized Gluon block FP8 kernel
(the same two), the upcast kernel (pointer, split-K, swapped, predecoded bf16 through the TMA kernel), the decode kernel (swapped MMA, CUDA-core FMA, split-K reduced in
the kernel, the streaming GEMV), the Gluon fp4 decode kernel (its pick and a forced atomic split-K), the Gluon
block FP8 decode kernel (its pick, forced ordered and atomic split-K over few persistent programs), the opt-in Hopper MX GEMM, the quantization kernels (row-wise and with the transposed side, MX, nvfp4, block
FP8 1x128 and 128x128, and 1x128 with 128x128 transposed tiles; the Gluon kernel for fp8 1x128 pairs) and the Blackwell `dot_scaled` kernel on sm_90 (Triton's emulation; nvfp4 has
none). Shapes are odd: M = 1 or one past a tile, N one past a tile, K not a multiple of the K tile, batch
dims. Each result is also compared with the jnp reference (a stray read that changes numbers fails
here), bits for quantization. One launch per family and variant (about 30 kernels); `--small` also cuts K
to <= 1056 and the quantized tensor to 129 x 200: racecheck instruments every shared-memory access and
runs orders of magnitude slower.
`--only block_fp8,decode` picks families, `--match gemv` the matmul cases whose label contains a string
(racecheck of the streaming GEMV alone). Exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

import jax_blockscale as jb
from jax_blockscale._triton.problem import TileConfig

FAMILIES = ("block_fp8", "block_fp8_persistent", "block_fp8_gluon", "upcast", "decode", "decode_wgmma", "decode_fp8",
            "hopper_mx", "quantize", "dot_scaled")
_RNG = np.random.default_rng(0)


def _x(*shape):
    return jnp.asarray(_RNG.standard_normal(shape), jnp.float32)


def _rel(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30))


def _matmul_cases(small: bool):
    """(family, label, a format, b format, a shape, n, config): config None = what the dispatch picks."""
    f8 = dict(block_k=128, num_warps=4, num_stages=3)
    cases = [
        ("block_fp8", "pointer", "fp8_block", "fp8_block", (300, 200), 65, TileConfig(block_m=128, block_n=64, **f8)),
        ("block_fp8", "split_k2", "fp8_block", "fp8_block", (129, 400), 65,
         TileConfig(block_m=64, block_n=64, split_k=2, **f8)),
        ("block_fp8", "swapped", "fp8_block", "fp8_block", (7, 200), 129,
         TileConfig(block_m=64, block_n=16, group_m=1, swap_ab=True, kernel="block_fp8", **f8)),
        # The fp8 decode kernel: dispatch's pick (N one past a tile, K padded to 256: two 128-wide boxes per
        # slot), and forced (K 1100 pads to 1280: ten 128-wide blocks): 32 padded rows of a batch, 5 ordered
        # splits over 3 persistent programs (each running several work items through its ring); 64 rows, 2
        # fp32-atomic splits.
        ("decode_fp8", "default", "fp8_block", "fp8_block", (7, 200), 129, None),
        ("decode_fp8", "split5_programs3_batched", "fp8_block", "fp8_block", (2, 9, 1100), 130,
         TileConfig(block_m=32, block_n=64, block_k=128, group_m=1, split_k=5, num_warps=4, num_stages=3,
                    num_sms=3, kernel="decode_fp8")),
        ("decode_fp8", "rows64_atomic_split2", "fp8_block", "fp8_block", (64, 1100), 130,
         TileConfig(block_m=64, block_n=64, block_k=128, group_m=1, split_k=2, atomic_split_k=True, num_warps=4,
                    num_stages=2, kernel="decode_fp8")),
        # 8-bit MX: ragged N and rows (the staged activation scales past M, the weight's scale words past N),
        # K 1100 (padded to 1280: a scale table of 40 groups, not a power of two), and 3 programs over split items.
        ("decode_fp8", "mx_default", "mxfp8", "mxfp8", (5, 1100), 130, None),
        ("decode_fp8", "mx_e5m2_split2_programs3", "mxfp8_e5m2", "mxfp8", (2, 13, 1024), 200,
         TileConfig(block_m=32, block_n=64, block_k=256, group_m=1, split_k=2, num_warps=4, num_stages=3,
                    num_sms=3, kernel="decode_fp8")),
        ("block_fp8", "tma", "fp8_block", "fp8_block", (129, 200), 130, None),
        ("upcast", "pointer", "nvfp4", "nvfp4", (129, 200), 65, None),
        ("upcast", "split_k3", "mxfp8", "mxfp4", (129, 400), 65,
         TileConfig(block_m=64, block_n=64, block_k=64, split_k=3, num_warps=4, num_stages=3)),
        ("upcast", "swapped", "nvfp4", "nvfp4", (33, 200), 129, None),  # (<= 16 rows take the decode kernel)
        ("upcast", "predecoded_tma", "mxfp8", "mxfp4", (1000, 224), 700, None),
        ("decode", "mma", "bf16", "mxfp4", (1, 200), 129,
         TileConfig(block_m=16, block_n=64, block_k=256, group_m=1, num_warps=4, num_stages=3, kernel="decode")),
        ("decode", "fma_split3", "mxfp8", "mxfp8", (3, 4160), 65,
         TileConfig(block_m=4, block_n=32, block_k=128, group_m=1, split_k=3, fma=True, num_warps=4, num_stages=3,
                    kernel="decode")),
        ("decode", "mma_split4_batched_a", "mxfp8", "mxfp4", (2, 9, 2048), 130,
         TileConfig(block_m=32, block_n=64, block_k=256, group_m=1, split_k=4, num_warps=4, num_stages=3,
                    kernel="decode")),
        # The streaming GEMV: dispatch's pick (fp4 weight, one row), and forced with prefetch + split-K on
        # nvfp4 and block FP8 weights (N one past a tile).
        ("decode", "gemv", "bf16", "mxfp4", (1, 4096), 129, None),
        # ... and its by-K tiles (gemv_tiles.FP4_GEMV_TILES), N one past an 8-row tile: whole 4096-code rows on
        # 8 warps, and 8 rows x 1024 codes on 2 warps (K = 7168)
        ("decode", "gemv_whole_rows", "bf16", "mxfp4", (1, 4096), 2113, None),
        ("decode", "gemv_k7168", "bf16", "nvfp4", (1, 7168), 2113, None),
        ("decode", "gemv_prefetch_split2", "nvfp4", "nvfp4", (3, 1024), 17,
         TileConfig(block_m=4, block_n=16, block_k=512, group_m=1, split_k=2, num_warps=4, num_stages=3,
                    gemv=True, prefetch=True, kernel="decode")),
        ("decode", "gemv_block_fp8", "fp8_block", "fp8_block", (2, 1024), 130,
         TileConfig(block_m=2, block_n=8, block_k=256, group_m=1, num_warps=4, num_stages=3, gemv=True,
                    prefetch=False, kernel="decode")),
        # The Gluon decode kernel: dispatch's pick (5 rows, K padded to 17 chunks: 17 one-chunk splits, N
        # one past a tile), and forced onto 128-code chunks, a 2-stage ring, fp32-atomic split-K and 16
        # batched rows.
        ("decode_wgmma", "default", "bf16", "mxfp4", (5, 4160), 129, None),
        ("decode_wgmma", "rows25_padded32", "bf16", "mxfp4", (25, 4160), 129, None),  # wgmma n32 (17-32 rows)
        ("decode_wgmma", "nvfp4_chunk128_atomic_split2", "bf16", "nvfp4", (2, 8, 1024), 130,
         TileConfig(block_m=16, block_n=64, block_k=128, group_m=1, split_k=2, num_warps=4, num_stages=2,
                    atomic_split_k=True, kernel="decode_wgmma")),
        # ... with quantized activations (dispatch's pick for mxfp8 x mxfp4: rows past M read row M - 1), and
        # mxfp8 weights (opt-in: 256-byte ring rows) forced with a ragged N.
        ("decode_wgmma", "mxfp8_x_mxfp4", "mxfp8", "mxfp4", (7, 4160), 129, None),
        ("decode_wgmma", "mxfp8_weights", "bf16", "mxfp8", (3, 2048), 131,
         TileConfig(block_m=16, block_n=64, block_k=128, group_m=1, split_k=2, num_warps=4, num_stages=3,
                    kernel="decode_wgmma")),
        # The persistent block FP8 kernel: dispatch's pick at an odd large shape, and forced onto a batched
        # problem with fewer programs than tiles (each program loops over several).
        ("block_fp8_persistent", "default", "fp8_block", "fp8_block", (1025, 1152), 1030, None),
        ("block_fp8_persistent", "batched_7_programs", "fp8_block", "fp8_block", (2, 300, 384), 260,
         TileConfig(block_m=128, block_n=128, block_k=128, num_warps=8, num_stages=4, persistent=True,
                    prefetch_scales=True, num_sms=7, kernel="block_fp8_persistent")),
        # The warp-specialized Gluon block FP8 kernel: dispatch's pick at an odd large shape (TMA store), and
        # forced onto a batched problem with fewer programs than tiles and unaligned output rows (pointer
        # store; the last 256-wide tile's second weight block past N).
        ("block_fp8_gluon", "default", "fp8_block", "fp8_block", (2049, 1152), 2056, None),
        ("block_fp8_gluon", "batched_3_programs", "fp8_block", "fp8_block", (2, 300, 384), 333,
         TileConfig(block_m=128, block_n=256, block_k=128, num_warps=4, num_stages=3, num_sms=3,
                    kernel="block_fp8_gluon")),
        # The opt-in one-kernel Hopper MX GEMM (TMA tiles decoded before a bf16 wgmma).
        ("hopper_mx", "bf16_mma", "mxfp8", "mxfp4", (129, 320), 260,
         TileConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, tma=True, kernel="hopper_mx")),
    ]
    if small:  # racecheck: K (the loop length, hence shared-memory traffic) cut to at most 1056
        cases = [c[:4] + (c[4][:-1] + (min(c[4][-1], 1056),),) + c[5:] for c in cases]
        # Dispatch picks the persistent kernel only from 1024 rows, N and K: racecheck did not finish that
        # one launch in 9 minutes on an H100; the forced batched case runs the same kernel on small tiles.
        cases = [c for c in cases if not (c[0] in ("block_fp8_persistent", "block_fp8_gluon") and c[-1] is None)]
    return cases


def run_matmuls(families, small: bool, match: str = "") -> list[str]:
    failures = []
    for fam, label, fa, fb, a_shape, n, config in _matmul_cases(small):
        if fam not in families or match not in label:
            continue
        k = a_shape[-1]
        a = _x(*a_shape)
        a = a.astype(jnp.bfloat16) if fa == "bf16" else jb.quantize_operand(a, fa, side="a")
        b = jb.quantize_operand(_x(n, k) / np.sqrt(k), fb, side="b")
        rows = int(np.prod(a_shape[:-1]))
        # A config naming its kernel forces it (opt-in entries); else what dispatch picks for these rows.
        kernel = config.kernel if config is not None and config.kernel else jb.explain(a, b, rows=rows).kernel
        out = jax.block_until_ready(jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32, config=config))(a, b))
        err = _rel(out, jb.reference.matmul(a, b))
        # fp8 wgmma accumulates with truncation: per 128-wide block for block FP8 (~1e-4), per 32-wide group for
        # 8-bit MX on decode_fp8 (~5e-5); every other kernel multiplies exactly decoded bf16 / fp32 values.
        tol = 2e-3 if fa == "fp8_block" else 2e-4 if kernel == "decode_fp8" else 1e-5
        ok = err < tol and kernel == fam
        print(f"{'ok  ' if ok else 'FAIL'} {fam:<9} {label:<22} {fa} x {fb} a{a_shape} n={n}: kernel {kernel}, "
              f"rel err {err:.2e}")
        if not ok:
            failures.append(f"{fam}/{label}")
    return failures


def _same_bits(got, ref) -> bool:
    """Two BlockScaledArrays hold the same bytes (values, scales and any tensor scale)."""
    return all(np.array_equal(np.asarray(getattr(got, f)).view(np.uint8), np.asarray(getattr(ref, f)).view(np.uint8))
               for f in ("values", "scales")) and (
        got.tensor_scale is None or np.array_equal(np.asarray(got.tensor_scale), np.asarray(ref.tensor_scale)))


def run_quantize(small: bool) -> list[str]:
    from jax_blockscale.quantize import nvfp4_tensor_scale, quantize_jnp

    failures = []
    shape = (129, 200) if small else (257, 4160)
    x = _x(*shape).astype(jnp.bfloat16)
    cases = [("mxfp8", None), ("mxfp4", None), ("nvfp4", None), ("fp8_block", (1, 128)), ("fp8_block", (128, 128))]
    for name, block in cases:
        fmt = jb.get_format(name, block=block)
        ts = (lambda v: nvfp4_tensor_scale(v)) if name == "nvfp4" else (lambda v: None)
        want = jax.jit(lambda v: quantize_jnp(v, fmt, axis=-1, rounding="rceil", tensor_scale=ts(v)))
        row, col = jax.block_until_ready(jax.jit(lambda v: jb.quantize_with_transpose(v, fmt))(x))
        single = jax.block_until_ready(jax.jit(lambda v: jb.quantize(v, fmt))(x))
        for label, got, ref in (("row", single, want(x)), ("row+transposed", row, want(x)),
                                ("transposed", col, want(x.T))):
            same = _same_bits(got, ref)
            print(f"{'ok  ' if same else 'FAIL'} quantize  {label:<22} {name} {block or ''} {shape}: bit-identical {same}")
            if not same:
                failures.append(f"quantize/{name}/{label}")
    # Mixed pairs: fp8_deepseek's activations, 1 x 128 rows with x^T in 128 x 128 tiles (the Gluon fp8 kernel on
    # sm_90+, as is fp8_block (1, 128) with its transposed side above), and the nvfp4 recipe's, nvfp4 rows with
    # mxfp8 x^T (the Gluon MX kernel, as are the MX and nvfp4 pairs above).
    for row_fmt, col_fmt, label in ((jb.get_format("fp8_block", block=(1, 128)),
                                     jb.get_format("fp8_block", block=(128, 128)), "1x128 + 128x128T"),
                                    (jb.get_format("nvfp4"), jb.get_format("mxfp8"), "nvfp4 + mxfp8T")):
        row, col = jax.block_until_ready(jax.jit(lambda v: jb.quantize_with_transpose(v, row_fmt, col_fmt))(x))
        ts = (lambda v: nvfp4_tensor_scale(v)) if row_fmt.name == "nvfp4" else (lambda v: None)
        ref_row = jax.jit(lambda v: quantize_jnp(v, row_fmt, axis=-1, rounding="rceil", tensor_scale=ts(v)))(x)
        ref_col = jax.jit(lambda v: quantize_jnp(v.T, col_fmt, axis=-1, rounding="rceil"))(x)
        for side, got, ref in (("row", row, ref_row), ("transposed", col, ref_col)):
            same = _same_bits(got, ref)
            print(f"{'ok  ' if same else 'FAIL'} quantize  {label} {side:<12} {shape}: bit-identical {same}")
            if not same:
                failures.append(f"quantize/{label}/{side}")
    return failures


def run_dot_scaled(small: bool) -> list[str]:
    """The Blackwell kernel through Triton's sm_90 emulation of dot_scaled (MX operands only)."""
    from jax_blockscale._triton import dot_scaled_nvidia as nv
    from jax_blockscale._triton.problem import GemmProblem

    failures = []
    cc = int(str(jax.devices()[0].compute_capability).replace(".", ""))
    formats = {"e4m3": "mxfp8_e4m3", "e2m1": "mxfp4"}
    for a_kind, b_kind in (("e4m3", "e2m1"), ("bf16", "e2m1")):
        m, n, k = (129, 65, 256) if small else (129, 200, 1056)
        p = GemmProblem(1, False, m, n, k, a_kind, b_kind, "fp32")
        a = _x(1, m, k)
        if a_kind == "bf16":
            a_q, a_v, a_s = a.astype(jnp.bfloat16), a.astype(jnp.bfloat16), jnp.zeros((1, m, 1), jnp.uint8)
        else:
            a_q = jb.quantize(a, formats[a_kind])
            a_v, a_s = a_q.values, a_q.scales
        b_q = jb.quantize(_x(n, k), formats[b_kind])
        out = jax.jit(lambda *xs: nv.launch(p, *xs, config=nv.default_config(p), compute_capability=cc))(
            a_v, a_s, b_q.values, b_q.scales, jnp.ones((1,), jnp.float32))
        err = _rel(out, jb.reference.matmul(a_q, b_q, jnp.float32))
        ok = err < 1e-5
        print(f"{'ok  ' if ok else 'FAIL'} dot_scaled {a_kind} x {b_kind} ({m}, {n}, {k}) emulated on sm_{cc}: "
              f"rel err {err:.2e}")
        if not ok:
            failures.append(f"dot_scaled/{a_kind}x{b_kind}")
    return failures


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="smallest shapes (for racecheck / initcheck)")
    ap.add_argument("--only", default=",".join(FAMILIES), help=f"comma-separated subset of {FAMILIES}")
    ap.add_argument("--match", default="", help="only the matmul cases whose label contains this string")
    args = ap.parse_args(argv)
    families = set(args.only.split(","))
    if jax.default_backend() != "gpu":
        print("needs a GPU (the kernels are what compute-sanitizer checks)", file=sys.stderr)
        return 2
    print(f"target {jb.detect_target()}, families {sorted(families)}")
    failures = run_matmuls(families, args.small, args.match)
    if "quantize" in families:
        failures += run_quantize(args.small)
    if "dot_scaled" in families:
        failures += run_dot_scaled(args.small)
    print(f"{len(failures)} failures" + (f": {failures}" if failures else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
