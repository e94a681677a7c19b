"""One decode matmul (bf16 activations x a quantized weight) for Nsight Compute, launched three times:

    ncu --kernel-name regex:gemv_kernel --launch-skip 2 --launch-count 1 --section WarpStateStats \\
        python -m benchmarks.ncu_decode 1 7168 4096 --format mxfp4
    python -m benchmarks.ncu_decode 16 7168 4096 --activities     # every GPU activity of a call, CUPTI

profiles the third launch (the first two warm up). The matmul is `jb.matmul` as dispatched (the kernel is
printed). GPU only; no CUPTI of its own unless `--activities` (then not under ncu): each GPU activity of the
call (kernels, memsets, copies) with its mean duration over 20 calls, through torch.profiler."""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import jax_blockscale as jb


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="*", type=int, default=[1, 7168, 4096], help="M N K")
    ap.add_argument("--format", default="mxfp4", help="the weight's format (bf16 activations)")
    ap.add_argument("--activities", action="store_true", help="list the call's GPU activities (torch.profiler)")
    args = ap.parse_args(argv)
    if len(args.shape) != 3 or min(args.shape) < 1:
        ap.error(f"shape: three positive sizes M N K, got {args.shape}")
    m, n, k = args.shape
    kx, kw = jax.random.split(jax.random.PRNGKey(0))
    x = jax.random.normal(kx, (m, k), jnp.float32).astype(jnp.bfloat16)
    w = jb.quantize_operand(jax.random.normal(kw, (n, k), jnp.float32) / k ** 0.5, args.format, side="b")
    f = jax.jit(jb.matmul)
    for _ in range(3):
        jax.block_until_ready(f(x, w))
    print(f"{m} x {n} x {k}, bf16 x {args.format}: {jb.explain(x, w).kernel}")
    if args.activities:
        import collections

        import torch
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        calls = 20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                out = f(x, w)
            jax.block_until_ready(out)
        us = collections.defaultdict(float)
        for e in prof.events():
            if str(getattr(e, "device_type", "")).endswith("CUDA"):
                us[e.name] += getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0)
        for name, total in sorted(us.items(), key=lambda kv: -kv[1]):
            print(f"  {total / calls:8.2f} us per call  {name[:100]}")


if __name__ == "__main__":
    main()
