"""An experiment: how the one-row fp4 GEMV's time (decode.gemv_kernel) moves with its arithmetic.

    python -m benchmarks.gemv_controls --sass                 # CPU: SASS per weight element of each variant
    python -m benchmarks.gemv_controls --variant nohi         # GPU: time one variant (one per process)

The question (issue #12, M = 1): the GEMV reads a 7168 x 4096 mxfp4 weight in ~8.8 us where a plain
stream of the same bytes with the GEMV's tile takes 6.5 (session 27). Its K loop issues 4.40 SASS
instructions per weight element. A tensor-core GEMV (mma.sync, B fragments in registers) would issue
about 1.5-2.5. Before building it: how fast is the GEMV's own structure with less arithmetic? Each variant
replaces `decode.gemv_tile` (the per-tile arithmetic) before the kernel first compiles, so every variant
keeps the GEMV's grid, tiles and loads. All but `base` give wrong results on purpose (controls).

- base: the GEMV as dispatched.
- nohi: the high nibbles' FMAs dropped (and their activations' conversion): the decode stays.
- nox: no activations: the decoded codes summed (FADD for FFMA), no x loads or conversions.
- nodecode: the codes' bytes placed into fp32 exponents (2 integer ops per byte) instead of the decode;
  FMAs and activations stay.
- none: the codes summed as integers: loads only.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.6")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

VARIANTS = ("base", "nohi", "nox", "nodecode", "none")
VARIANT = tl.constexpr("base")  # the replacement tile's variant, set by `_tile_fn` before it compiles


def _tile_fn(variant: str):
    """A replacement for decode.gemv_tile (M = 1, fp4 weights, bf16 activations, the f16 decode)."""
    from jax_blockscale._triton import decode as d

    @triton.jit
    def gemv_tile(acc, codes, raw_s, x_ptr, x_scale_ptr, k0, M: tl.constexpr, K: tl.constexpr,
                  W_KIND: tl.constexpr, X_KIND: tl.constexpr, BLOCK_K: tl.constexpr, ASM: tl.constexpr,
                  F16: tl.constexpr):
        G: tl.constexpr = codes.shape[1]
        BPG: tl.constexpr = codes.shape[2]
        if VARIANT == "none":
            part = tl.sum(codes.to(tl.int32), axis=2).to(tl.float32)
        elif VARIANT == "nodecode":
            w_lo = (codes.to(tl.int32) << 23).to(tl.float32, bitcast=True)
            x = d.gemv_x_row(x_ptr, x_scale_ptr, 0, k0, K, X_KIND, BLOCK_K)
            x_lo, x_hi = tl.split(tl.reshape(x, (G, BPG, 2)))
            part = tl.sum(w_lo * x_lo[None, :, :], axis=2) + tl.sum(w_lo * x_hi[None, :, :], axis=2)
        else:
            w_lo, w_hi = tl.inline_asm_elementwise(d._FP4_F32_PTX, "=r,=r,=r,=r,=r,=r,=r,=r,r", [codes],
                                                   dtype=(tl.float32, tl.float32), is_pure=True, pack=4)
            if VARIANT == "nox":
                part = tl.sum(w_lo + w_hi, axis=2)
            else:
                x = d.gemv_x_row(x_ptr, x_scale_ptr, 0, k0, K, X_KIND, BLOCK_K)
                x_lo, x_hi = tl.split(tl.reshape(x, (G, BPG, 2)))
                part = tl.sum(w_lo * x_lo[None, :, :], axis=2)
                if VARIANT == "base":
                    part += tl.sum(w_hi * x_hi[None, :, :], axis=2)
            part = part * d._FP4_F32_UNSCALE
        s = d.scales_to_f32(raw_s, W_KIND)
        return acc + part * s

    gemv_tile.fn.__globals__["VARIANT"] = tl.constexpr(variant)
    return gemv_tile


def install(variant: str) -> None:
    """Replaces decode.gemv_tile (before anything compiles; `base` keeps the library's own)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if variant == "base":
        return
    from jax_blockscale._triton import decode

    decode.gemv_tile = _tile_fn(variant)


def sass(variant: str) -> dict:
    from . import sass_count

    install(variant)
    return sass_count.count("e2m1", rows=1)


def time_variant(variant: str, shapes) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_blockscale as jb

    from . import decode as bd

    install(variant)
    torch = bd._torch()
    for n, k in shapes:
        ws, read, dense = bd.experiment_weights(torch, "mxfp4", n, k)
        x = jax.random.normal(jax.random.key(7), (1, k), jnp.float32).astype(jnp.bfloat16)
        kernel = jb.explain(x, ws[0], rows=1).kernel
        fn = jax.jit(lambda x, w: jb.matmul(x, w, out_dtype=jnp.float32))
        out = np.asarray(fn(x, ws[0]), np.float64)
        ref = np.asarray(jb.reference.matmul(x, ws[0], out_dtype=jnp.float32), np.float64)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        us = bd.kernel_us(jax.jit(lambda x, w: jb.matmul(x, w)), [(x, w) for w in ws], torch)
        print(f"| {variant} | {n}x{k} | {kernel} | {us:.2f} | {read:.2f} | {read / us:.0%} | {err:.1e} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="base", choices=VARIANTS)
    ap.add_argument("--sass", action="store_true", help="CPU: SASS per weight element of every variant")
    ap.add_argument("--shapes", default="7168x4096,8192x8192")
    a = ap.parse_args(argv)
    if a.sass:
        r = sass(a.variant)
        pe = r["per_elem"]
        print(f"| {a.variant} | {pe['total']:.2f} | " + ", ".join(f"{c} {v:.2f}" for c, v in sorted(pe.items())
                                                            if c != "total" and v >= 0.05) + " |")
        return
    time_variant(a.variant, [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")])


if __name__ == "__main__":
    main()
