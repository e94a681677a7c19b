"""Session-31 experiments on decode_wgmma's structure at 16 rows (bf16 x mxfp4 / nvfp4), none adopted.

Runs only at the commit that added it (the kernel flags it sets were removed in the next one); results and
conclusions: benchmarks/results/decode_wgmma_structure_h100_2026-11-24_session31.md.

    python -m benchmarks.decode_wgmma_structure check 7168x4096,... 16     # TMA weight ring (config.tma), bitwise checks
    python -m benchmarks.decode_wgmma_structure tiled 7168x4096,...        # weight bytes / scales stored tile-major
    python -m benchmarks.decode_wgmma_structure controls 7168x4096,...     # no activation loads / no decode (wrong results)
    python -m benchmarks.decode_wgmma_structure streamk 7168x4096,... 16   # stream-K persistent programs
"""
import sys
import numpy as np
import jax, jax.numpy as jnp
import jax_blockscale as jb
from benchmarks import decode as bd
from jax_blockscale._triton import decode_wgmma as dw
from jax_blockscale._triton.problem import GemmProblem


def check():
    bad = 0
    for fa, fb, m, n, k in [("bf16", "mxfp4", 16, 7168, 4096), ("bf16", "nvfp4", 3, 7000, 2048),
                            ("bf16", "mxfp4", 5, 1000, 1024), ("mxfp8", "mxfp4", 16, 7168, 2048),
                            ("nvfp4", "nvfp4", 9, 520, 4096), ("bf16", "mxfp8", 16, 7168, 2048),
                            ("bf16", "mxfp4", 32, 4100, 4096), ("bf16", "nvfp4", 64, 7168, 4096)]:
        w = bd._weights(fb, n, k, 3)[0]
        x = bd._activation(fa, m, k)
        p = GemmProblem(1, False, m, n, k, bd._KIND[fa], bd._KIND[fb], "bf16")
        base = dw.default_config(p)
        outs = []
        for cfg in (base, base.replace(tma=True), base.replace(tma=True, num_stages=4),
                    base.replace(tma=True, num_stages=3, block_k=128)):
            try:
                dw.check_config(p, cfg)
            except ValueError as e:
                print("skip", cfg, e); continue
            outs.append(np.asarray(jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg, out_dtype=jnp.float32))(x, w)))
        ref = np.asarray(jb.reference.matmul(x, w, out_dtype=jnp.float32), np.float64)
        err = [float(np.linalg.norm(o - ref) / np.linalg.norm(ref)) for o in outs]
        same = [bool((o.view(np.uint32) == outs[0].view(np.uint32)).all()) for o in outs[1:3]]
        ok = all(e < 1e-5 for e in err) and all(same)
        bad += not ok
        print(f"{fa}x{fb} m{m} n{n} k{k}: rel err {['%.1e' % e for e in err]} tma st2 bitwise == cp.async: {same} {'OK' if ok else 'BAD'}", flush=True)
    return bad


def configs(p):
    base = dw.default_config(p)
    out = [(f"cp.async st{base.num_stages} sp{base.split_k}", base)]
    for st in (2, 3, 4):
        out.append((f"tma st{st} sp{base.split_k}", base.replace(tma=True, num_stages=st)))
    out.append((f"tma st2 sp{base.split_k * 2}", base.replace(tma=True, split_k=base.split_k * 2)))
    ok = []
    for label, cfg in out:
        try:
            dw.check_config(p, cfg)
            ok.append((label, cfg))
        except ValueError as e:
            print("skip", label, e)
    return ok


def _tile(w, chunk, rows=64):
    """The weight's bytes and scales tile-major: (N / rows, K / chunk, rows, chunk bytes), same array shapes."""
    import dataclasses
    v, s = w.values, w.scales
    n, kb = v.shape
    cb = chunk // 2
    ks = s.shape[1]
    nck = kb // cb
    sb = ks // nck
    tv = v.reshape(n // rows, rows, nck, cb).transpose(0, 2, 1, 3).reshape(n, kb)
    ts = s.reshape(n // rows, rows, nck, sb).transpose(0, 2, 1, 3).reshape(n, ks)
    return dataclasses.replace(w, values=tv, scales=ts)


def tiled(shapes, rounds=2):
    import statistics
    torch = bd._torch()
    print(f"device: {jax.devices()[0].device_kind}; us per matmul (CUPTI), median of {rounds} rounds")
    print("| N | K | weights | config | us | rounds | wall us | % same-size read | vs XLA bf16 | bitwise == untiled |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        bf16_ws = bd._weights("bf16", n, k, 0)
        xla_args = [(bd._activation("bf16", 16, k), w) for w in bf16_ws]
        for fb in ("mxfp4", "nvfp4"):
            ws, nb, read_us = bd._weights_and_read(torch, fb, n, k)
            x = bd._activation("bf16", 16, k)
            p = GemmProblem(1, False, 16, n, k, "bf16", bd._KIND[fb], "bf16")
            base = dw.default_config(p)
            cands = [("row-major default", False, base), ("tiled default", True, base),
                     ("tiled st3", True, base.replace(num_stages=3)), ("tiled sp4", True, base.replace(split_k=base.split_k * 2)),
                     ("tiled sp1", True, base.replace(split_k=1)), ("tiled c128 st4", True, base.replace(block_k=128, num_stages=4))]
            timed = []
            ref = None
            for label, til, cfg in cands:
                try:
                    dw.check_config(p, cfg)
                except ValueError as e:
                    print("skip", label, e); continue
                wl = [_tile(w, cfg.block_k) for w in ws] if til else ws
                dw._TILED_EXPERIMENT = til
                fn = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg, out_dtype=jnp.float32))
                out = np.asarray(fn(x, wl[0]))
                same = ""
                if ref is None:
                    ref = out
                else:
                    same = bool((out.view(np.uint32) == ref.view(np.uint32)).all()) if cfg.split_k == base.split_k and cfg.block_k == base.block_k else \
                        f"{np.abs(out - ref).max() / np.abs(ref).max():.1e}"
                dw._TILED_EXPERIMENT = False
                timed.append((label, til, fn, wl, same))
            xla, us = [], {t[0]: [] for t in timed}
            for _ in range(rounds):
                xla.append(bd.kernel_us(bd._XLA_BF16, xla_args, torch))
                for label, til, fn, wl, _ in timed:
                    dw._TILED_EXPERIMENT = til
                    us[label].append(bd.kernel_us(fn, [(x, w) for w in wl], torch))
                    dw._TILED_EXPERIMENT = False
            xu = statistics.median(xla)
            print(f"| {n} | {k} | bf16 | XLA bf16 | {xu:.2f} | | | | 1.00x | |", flush=True)
            for label, til, fn, wl, same in timed:
                t = statistics.median(us[label])
                wall = bd.wall_us(fn, [(x, w) for w in wl])
                print(f"| {n} | {k} | {fb} | {label} | {t:.2f} | {' / '.join(f'{v:.2f}' for v in us[label])} | {wall:.2f} | "
                      f"{100 * read_us / t:.0f}% | {xu / t:.2f}x | {same} |", flush=True)
            del ws


def controls(shapes, rounds=2):
    import statistics
    torch = bd._torch()
    print(f"device: {jax.devices()[0].device_kind}; us per matmul (CUPTI), median of {rounds} rounds; controls give wrong results")
    print("| N | K | rows | weights | config | us | rounds | % same-size read | vs XLA bf16 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        ws, nb, read_us = bd._weights_and_read(torch, "mxfp4", n, k)
        bf16_ws = bd._weights("bf16", n, k, 0)
        for m in (16, 32):
            x = bd._activation("bf16", m, k)
            xla_args = [(bd._activation("bf16", m, k), w) for w in bf16_ws]
            p = GemmProblem(1, False, m, n, k, "bf16", "e2m1", "bf16")
            base = dw.default_config(p)
            cands = [("default", 0, base), ("control: no activation loads", 1, base), ("control: no activation loads, no decode", 3, base),
                     ("default sp4", 0, base.replace(split_k=base.split_k * 2)),
                     ("control 1 sp4", 1, base.replace(split_k=base.split_k * 2)),
                     ("control 3 sp4", 3, base.replace(split_k=base.split_k * 2))]
            fns = []
            for label, ctl, cfg in cands:
                dw._CONTROL = ctl
                fn = jax.jit(lambda x, w, cfg=cfg: jb.matmul(x, w, config=cfg))
                jax.block_until_ready(fn(x, ws[0]))
                fns.append((label, ctl, fn))
            dw._CONTROL = 0
            xla, us = [], {f[0]: [] for f in fns}
            for _ in range(rounds):
                xla.append(bd.kernel_us(bd._XLA_BF16, xla_args, torch))
                for label, ctl, fn in fns:
                    us[label].append(bd.kernel_us(fn, [(x, w) for w in ws], torch))
            xu = statistics.median(xla)
            print(f"| {n} | {k} | {m} | bf16 | XLA bf16 | {xu:.2f} | | | 1.00x |", flush=True)
            for label, ctl, fn in fns:
                t = statistics.median(us[label])
                print(f"| {n} | {k} | {m} | mxfp4 | {label} | {t:.2f} | {' / '.join(f'{v:.2f}' for v in us[label])} | "
                      f"{100 * read_us / t:.0f}% | {xu / t:.2f}x |", flush=True)
        del ws


def streamk(shapes, rows_list=(16,), rounds=2):
    import functools
    import statistics
    torch = bd._torch()
    orig = dw.launch
    print(f"device: {jax.devices()[0].device_kind}; us per matmul (CUPTI), median of {rounds} rounds")
    print("| N | K | rows | weights | config | us | rounds | wall us | % same-size read | vs XLA bf16 | rel err | max diff vs default |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, k in shapes:
        bf16_ws = bd._weights("bf16", n, k, 0)
        for fb in ("mxfp4", "nvfp4"):
            ws, nb, read_us = bd._weights_and_read(torch, fb, n, k)
            for m in rows_list:
                x = bd._activation("bf16", m, k)
                xla_args = [(bd._activation("bf16", m, k), w) for w in bf16_ws]
                p = GemmProblem(1, False, m, n, k, "bf16", bd._KIND[fb], "bf16")
                cfg = dw.default_config(p)
                cands = [("default (split-K grid)", None)] + [(f"stream-K P{pp} st{st}", (pp, st))
                                                           for pp, st in ((132, 2), (264, 2), (264, 3), (396, 2))]
                ref = np.asarray(jb.reference.matmul(x, ws[0], out_dtype=jnp.float32), np.float64)
                fns, base = [], None
                for label, knobs in cands:
                    dw.launch = orig if knobs is None else functools.partial(dw.launch_streamk, programs=knobs[0], stages=knobs[1])
                    f32 = jax.jit(lambda x, w: jb.matmul(x, w, config=cfg, out_dtype=jnp.float32))
                    out = np.asarray(f32(x, ws[0]), np.float64)
                    fn = jax.jit(lambda x, w: jb.matmul(x, w, config=cfg))
                    jax.block_until_ready(fn(x, ws[0]))
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


if __name__ == "__main__" and sys.argv[1] == "streamk":
    streamk([tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")], tuple(int(r) for r in sys.argv[3].split(",")))
elif __name__ == "__main__" and sys.argv[1] == "controls":
    controls([tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")])
elif __name__ == "__main__" and sys.argv[1] == "tiled":
    tiled([tuple(int(v) for v in s.split("x")) for s in sys.argv[2].split(",")])
elif __name__ == "__main__":
    if "check" in sys.argv[1:]:
        if check():
            print("CHECK FAILED"); sys.exit(1)
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["7168x4096"])]
    rows = tuple(int(r) for r in (sys.argv[3].split(",") if len(sys.argv) > 3 else ["16"]))
    bd.wgmma_knob_configs = configs
    pairs = [tuple(x.split(":")) for x in (sys.argv[4].split(",") if len(sys.argv) > 4 else ["bf16:mxfp4", "bf16:nvfp4"])]
    bd.wgmma_knobs(bd._torch(), shapes, rows, pairs, rounds=2)



