"""One block FP8 matmul shape for Nsight Compute, ours or cuBLAS blockwise, each launched three times:

    ncu --kernel-name regex:block_fp8 --launch-skip 2 --launch-count 1 python -m benchmarks.ncu_block_fp8 8192 8192 8192
    ncu --kernel-name regex:nvjet --launch-skip 2 --launch-count 1 python -m benchmarks.ncu_block_fp8 8192 8192 8192 --cublas

profiles the third launch (the first two warm up). Ours is `jb.matmul` as dispatched (printed); cuBLAS is
torch's blockwise `scaled_mm` (1x128 x 128x128) on the same bytes, the first entry point and scale layout
that `benchmarks/_torch.py` finds working. GPU only; no CUPTI of its own, so nothing competes with ncu's."""

from __future__ import annotations

import argparse

import jax
import numpy as np

import jax_blockscale as jb

from ._baselines import dense_pair, ours, quantized_pair


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="*", type=int, default=[8192, 8192, 8192], help="M N K")
    ap.add_argument("--cublas", action="store_true", help="torch's cuBLAS blockwise scaled_mm instead of ours")
    args = ap.parse_args(argv)
    if len(args.shape) != 3 or min(args.shape) < 1:
        ap.error(f"shape: three positive sizes M N K, got {args.shape}")
    m, n, k = args.shape
    a, b = quantized_pair(*dense_pair(jax.random.PRNGKey(0), m, n, k), "fp8_block", "fp8_block")
    if not args.cublas:
        f = jax.jit(ours)
        for _ in range(3):
            jax.block_until_ready(f(a, b))
        print(f"{m} x {n} x {k}: ours, {jb.explain(a, b).kernel}")
        return
    import torch

    from . import _cublas_layout as cl
    from ._torch import _attempts, _Set

    s = _Set(torch, a, b)
    labels = [v.label for v in cl.scale_b_variants(np.asarray(b.scales), n, k)]
    for tag, fn in _attempts(torch, labels):
        try:
            fn(s)
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001 - the next entry point or layout
            continue
        for _ in range(2):
            fn(s)
        torch.cuda.synchronize()
        print(f"{m} x {n} x {k}: cuBLAS blockwise, {tag}")
        return
    raise SystemExit("no torch blockwise scaled_mm entry point worked")


if __name__ == "__main__":
    main()
