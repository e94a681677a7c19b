"""Scratch A/B: decode_wgmma activations loaded in the fragment layout (stmatrix store; group_m=3) vs default."""
import statistics, sys, time
import jax
from benchmarks import decode as bd
from benchmarks.decode import _KIND, _XLA_BF16, _activation, _checked, _weights, _weights_and_read, kernel_us, wall_us
import jax_blockscale as jb
from jax_blockscale._triton import decode_wgmma as dw
from jax_blockscale._triton.problem import GemmProblem

torch = bd._torch()
SHAPES = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1].split(",")]
ROWS = [int(r) for r in sys.argv[2].split(",")]
PAIRS = [tuple(p.split(":")) for p in sys.argv[3].split(",")]
ROUNDS = 2
print(f"device: {jax.devices()[0].device_kind}; us per matmul (CUPTI), median of {ROUNDS} rounds")
print("| N | K | x | w | M | config | us | rounds | wall | % read | vs XLA | err |")
t0 = time.time()
for n, k in SHAPES:
    bf16_ws = _weights("bf16", n, k, 0)
    for fb in dict.fromkeys(b for _, b in PAIRS):
        ws, nb, read_us = _weights_and_read(torch, fb, n, k)
        for fa, m in ((fa, m) for fa, b in PAIRS if b == fb for m in ROWS):
            xa = _activation(fa, m, k)
            xla_args = [(_activation("bf16", m, k), w) for w in bf16_ws]
            p = GemmProblem(1, False, m, n, k, _KIND[fa], _KIND[fb], "bf16")
            base = dw.default_config(p)
            cands = [(f"default c{base.block_k} st{base.num_stages} sp{base.split_k}", base)]
            if base.block_m >= 32:
                for st, sp in ((2, base.split_k), (2, base.split_k * 2), (3, base.split_k)):
                    cfg = base.replace(group_m=3, num_stages=st, split_k=sp)
                    try:
                        dw.check_config(p, cfg)
                    except ValueError:
                        continue
                    cands.append((f"frag c{cfg.block_k} st{st} sp{sp}", cfg))
            timed = []
            for label, cfg in cands:
                try:
                    err = _checked(xa, ws[0], cfg)
                except Exception as e:
                    print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | {type(e).__name__} {str(e)[:100]} |", flush=True)
                    continue
                if not err < 1e-4:
                    print(f"| {n} | {k} | {fa} | {fb} | {m} | {label} | WRONG | | | | | {err:.1e} |", flush=True)
                    continue
                timed.append((label, jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg)), err))
            xla, us = [], {l: [] for l, _, _ in timed}
            for _ in range(ROUNDS):
                xla.append(kernel_us(_XLA_BF16, xla_args, torch))
                for l, fn, _ in timed:
                    us[l].append(kernel_us(fn, [(xa, w) for w in ws], torch))
            xu = statistics.median(xla)
            print(f"| {n} | {k} | bf16 | bf16 | {m} | XLA bf16 | {xu:.2f} | {' / '.join(f'{t:.2f}' for t in xla)} | | | 1.00x | |")
            for l, fn, err in timed:
                t = statistics.median(us[l])
                print(f"| {n} | {k} | {fa} | {fb} | {m} | {l} | {t:.2f} | {' / '.join(f'{v:.2f}' for v in us[l])} | "
                      f"{wall_us(fn, [(xa, w) for w in ws]):.2f} | {100 * read_us / t:.0f}% | {xu / t:.2f}x | {err:.1e} |", flush=True)
        del ws
    print(f"# elapsed {time.time() - t0:.0f} s", flush=True)
