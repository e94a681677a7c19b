"""Session-31 experiment (not adopted): jax_blockscale/_triton/decode_wgmma_tma.py against decode_wgmma's default at
16 rows, bf16 x mxfp4 / nvfp4. Runs only at the commit that added it; results:
benchmarks/results/decode_wgmma_structure_h100_2026-11-24_session31.md (run 8).

    python -m benchmarks.decode_wgmma_tma 7168x4096,8192x8192,7168x2048,28672x8192,7168x7168
"""
import functools, statistics, sys
import numpy as np
import jax, jax.numpy as jnp
import jax_blockscale as jb
from benchmarks import decode as bd
from jax_blockscale._triton import decode_wgmma as dw, decode_wgmma_tma as dt
from jax_blockscale._triton.problem import GemmProblem


def main(shapes, rows=16, rounds=2):
    torch = bd._torch()
    orig = dw.launch
    print(f"device: {jax.devices()[0].device_kind}; us per matmul (CUPTI), median of {rounds} rounds")
    print("| N | K | rows | weights | config | us | rounds | wall us | % same-size read | vs XLA bf16 | rel err | max diff vs default |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        bf16_ws = bd._weights("bf16", n, k, 0)
        for fb in ("mxfp4", "nvfp4"):
            ws, nb, read_us = bd._weights_and_read(torch, fb, n, k)
            m = rows
            x = bd._activation("bf16", m, k)
            xla_args = [(bd._activation("bf16", m, k), w) for w in bf16_ws]
            p = GemmProblem(1, False, m, n, k, "bf16", bd._KIND[fb], "bf16")
            cfg = dw.default_config(p)
            cands = [("default", None)] + [(f"tma-persistent P{pp} st{st} sc{sc}", (pp, st, sc))
                                           for pp, st, sc in ((264, 2, 4), (264, 3, 2), (264, 4, 2), (132, 4, 4), (132, 6, 2))
                                           if k % (256 * sc) == 0]
            ref = np.asarray(jb.reference.matmul(x, ws[0], out_dtype=jnp.float32), np.float64)
            fns, base = [], None
            for label, kn in cands:
                dw.launch = orig if kn is None else functools.partial(dt.launch, programs=kn[0], stages=kn[1], sc=kn[2])
                try:
                    out = np.asarray(jax.jit(lambda x, w: jb.matmul(x, w, config=cfg, out_dtype=jnp.float32))(x, ws[0]), np.float64)
                    fn = jax.jit(lambda x, w: jb.matmul(x, w, config=cfg))
                    jax.block_until_ready(fn(x, ws[0]))
                except Exception as e:  # noqa: BLE001
                    print(f"| {n} | {k} | {m} | {fb} | {label} | {type(e).__name__}: {str(e)[:200]} |", flush=True)
                    continue
                finally:
                    dw.launch = orig
                err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                diff = "" if base is None else f"{np.abs(out - base).max() / np.abs(base).max():.1e}"
                base = out if base is None else base
                fns.append((label, fn, err, diff))
            xla, us = [], {f[0]: [] for f in fns}
            for _ in range(rounds):
                xla.append(bd.kernel_us(bd._XLA_BF16, xla_args, torch))
                for label, fn, _, _ in fns:
                    us[label].append(bd.kernel_us(fn, [(x, w) for w in ws], torch))
            xu = statistics.median(xla)
            print(f"| {n} | {k} | {m} | bf16 | XLA bf16 | {xu:.2f} | | | | 1.00x | | |", flush=True)
            for label, fn, err, diff in fns:
                t = statistics.median(us[label])
                wall = bd.wall_us(fn, [(x, w) for w in ws])
                bad = "" if err < 1e-5 else " WRONG"
                print(f"| {n} | {k} | {m} | {fb} | {label}{bad} | {t:.2f} | {' / '.join(f'{v:.2f}' for v in us[label])} | {wall:.2f} | "
                      f"{100 * read_us / t:.0f}% | {xu / t:.2f}x | {err:.1e} | {diff} |", flush=True)
            del ws


if __name__ == "__main__":
    main([tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")], int(sys.argv[2]) if len(sys.argv) > 2 else 16)
