"""One kernel, two assemblers: the Gluon block FP8 kernel's PTX assembled by Triton's bundled ptxas (launched
through Triton's own runtime on torch tensors) and by jaxlib (`_triton/launch.py` hands jaxlib the PTX, which
assembles it with XLA's assembler: libnvptxcompiler or the installed ptxas). Same PTX, same operands, same
launch grid; CUPTI kernel time per launch in interleaved rounds, and the two outputs compared bit for bit.

    python -m benchmarks.assembler_ab                       # 8192^3, 3 rounds
    python -m benchmarks.assembler_ab --shape 4096x7168x16384 --rounds 5

Why: the CPU tests check Triton's ptxas report (no spills, no wgmma serialization), while the code that runs
under `jb.matmul` comes from the other assembler. A difference in time here is a difference in the machine
code. Needs an sm_90 GPU, torch with CUDA, and Triton 3.6.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before jax: torch shares the GPU

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
from typing import Optional  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from jax_blockscale._triton import block_fp8_gluon as bg  # noqa: E402
from jax_blockscale._triton.problem import GemmProblem  # noqa: E402

from . import _kernel_time as kt  # noqa: E402


def _operands(m: int, n: int, k: int):
    """(a_values (1, m, k) e4m3, a_scales (1, m, k/128), b_values (n, k) e4m3, b_scales (n/128, k/128), alpha)
    as JAX arrays: finite codes, scales in [0.5, 1.5)."""
    ka, kb, ks, kt_ = jax.random.split(jax.random.key(0), 4)
    a = jax.random.normal(ka, (1, m, k), jnp.float32).astype(jnp.float8_e4m3fn)
    b = jax.random.normal(kb, (n, k), jnp.float32).astype(jnp.float8_e4m3fn)
    a_s = jax.random.uniform(ks, (1, m, k // 128), jnp.float32, 0.5, 1.5)
    b_s = jax.random.uniform(kt_, (-(-n // 128), k // 128), jnp.float32, 0.5, 1.5)
    return a, a_s, b, b_s, jnp.ones((1,), jnp.float32)


def _to_torch(torch, x: jax.Array):
    """The same bytes as a CUDA torch tensor (fp8 through uint8: DLPack has no fp8)."""
    host = np.asarray(x)
    if x.dtype == jnp.float8_e4m3fn:
        return torch.from_numpy(host.view(np.uint8).copy()).cuda().view(torch.float8_e4m3fn)
    return torch.from_numpy(host.copy()).cuda()


def main(argv: Optional[list[str]] = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="8192x8192x8192", help="MxNxK (K a multiple of 128)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=10, help="launches per profiled round")
    args = ap.parse_args(argv)
    m, n, k = (int(v) for v in args.shape.split("x"))

    import torch
    import triton

    p = GemmProblem(1, False, m, n, k, "block_fp8", "block_fp8", "bf16")
    cfg = bg.default_config(p)
    ops = _operands(m, n, k)
    constexprs = bg.kernel_constexprs(p, cfg)  # exactly what bg.launch passes
    programs = constexprs["NUM_SMS"]

    # jaxlib's path: what jb.matmul launches.
    jax_fn = jax.jit(functools.partial(bg.launch, p, config=cfg, compute_capability=90))
    jax_out = jax.block_until_ready(jax_fn(*ops))

    # Triton's path: the same kernel and constexprs, Triton's cubin, global scratch from torch.
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    a_t, as_t, b_t, bs_t, alpha_t = (_to_torch(torch, x) for x in ops)
    a_t, as_t = a_t.reshape(m, k), as_t.reshape(m, k // 128)
    out_t = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    launch_args = (a_t, as_t, b_t, bs_t, alpha_t, out_t)

    def triton_launch():
        bg.block_fp8_gluon_kernel[(programs,)](*launch_args, **constexprs, num_warps=4, maxnreg=bg.MAX_REGISTERS)
        return out_t

    triton_launch()
    torch.cuda.synchronize()
    same = np.array_equal(out_t.view(torch.int16).cpu().numpy(),
                          np.asarray(jax_out).reshape(m, n).view(np.int16))
    print(f"assembler_ab: {torch.cuda.get_device_name()}, {m}x{n}x{k}, {cfg.block_m}x{cfg.block_n} tiles, "
          f"{programs} programs; outputs bitwise equal: {same}", flush=True)

    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    times: dict[str, list[float]] = {"triton ptxas": [], "jaxlib": []}
    for _ in range(args.rounds):
        tri = kt.profile(triton_launch, calls=args.calls, block=sync, backend="jax")
        if not tri.ok:  # the jax trace did not show Triton's own launches: CUPTI through torch's profiler
            tri = kt.profile(triton_launch, calls=args.calls, block=sync, backend="torch")
        jx = kt.profile(lambda: jax_fn(*ops), calls=args.calls, backend="jax")
        times["triton ptxas"].append(tri.kernel_s * 1e6)
        times["jaxlib"].append(jx.kernel_s * 1e6)
        print(f"  round: triton ptxas {times['triton ptxas'][-1]:.1f} us ({tri.note or tri.source}), "
              f"jaxlib {times['jaxlib'][-1]:.1f} us ({jx.note or jx.source})", flush=True)
    ratios = [j / t for t, j in zip(times["triton ptxas"], times["jaxlib"])]
    flops = 2.0 * m * n * k
    for label, us in times.items():
        med = statistics.median(us)
        print(f"  {label:<13} median {med:.1f} us, {flops / med / 1e6:.0f} TF/s")
    print(f"  jaxlib time / triton-ptxas time: median {statistics.median(ratios):.3f} "
          f"(rounds {' '.join(f'{r:.3f}' for r in ratios)})")
    return {"same": same, "times": times}


if __name__ == "__main__":
    main()
