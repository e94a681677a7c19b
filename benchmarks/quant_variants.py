"""The quantization kernel's launch variants, timed against an XLA `x * 2` pass: which to make the default.

    python -m benchmarks.quant_variants                 # every case x variant, bf16 8192 x 8192, on a GPU
    python -m benchmarks.quant_variants --cases mxfp8+T,fp8_1x128+T --modes direct --warps 4,8
    python -m benchmarks.quant_variants --tiny          # tiny shape, checks the harness (CPU: no kernel time)
    python -m benchmarks.quant_variants --cases nvfp4,fp8_1x128 --default-plan --divs f64,f32   # quotient paths
    python -m benchmarks.quant_variants --cases mxfp8,mxfp8+T --default-plan --cvts int,hw --t-words 0,1
    python -m benchmarks.quant_variants --cases fp8_1x128+T,mxfp8+T --default-plan --strips 1,2,4 --warps 4,8
    python -m benchmarks.quant_variants --cases fp8_1x128+T,fp8_1x128+128T --default-plan --gluon   # + Gluon
    python -m benchmarks.quant_variants --cases fp8_1x128+T,fp8_1x128+128T --gluon-variants --modes none
    python -m benchmarks.quant_variants --cases mxfp8+T,nvfp4,nvfp4+T --default-plan --gluon   # MX Gluon
    python -m benchmarks.quant_variants --cases mxfp8+T,nvfp4+mxfp8T --modes none --gluon --decoded

A variant is (column-side mode, program tile, warps) of `_triton/quantize_kernels.plan`: the column side
computed from `tl.trans(x)` ("trans"), down x's columns with only the codes transposed ("direct"), or as
the row side's codes transposed ("reuse", square fp8 tiles on both sides), each side in one pass over the
tile or in `strips` passes over strips of it (plan's strips=); with --gluon, also the Gluon kernel that
takes the case (`_triton/quantize_fp8_gluon.py` for fp8 1x128 + transposed, `_triton/quantize_mx_gluon.py`
for MX / nvfp4 sides; mode "gluon"), with --gluon-variants its launch variants; with --decoded also the
Gluon MX kernel writing decoded bf16 values (`quantize_primitive.decoded_pair`, the recipes' GEMM inputs on
Hopper), its ideal bytes the bf16 values written. Every variant's outputs are first
compared bit for bit with the jnp quantizer run on the same device (`quantize_primitive._reference`); a
variant that differs is reported and not timed. Rate: ideal bytes (input read once + every output written)
per second of kernel time (CUPTI, `_kernel_time`), as a fraction of the `x * 2` pass's rate (bf16 read +
written), the metric of issue #11.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import math  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale import quantize_primitive as qp  # noqa: E402
from jax_blockscale._triton import quantize_fp8_gluon as qg  # noqa: E402
from jax_blockscale._triton import quantize_mx_gluon as qm  # noqa: E402
from jax_blockscale._triton import quantize_kernels as qk  # noqa: E402
from jax_blockscale.formats import get_format  # noqa: E402

from ._kernel_time import kernel_times  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
FP8_1x128 = get_format("fp8_block", block=(1, 128))
FP8_128 = get_format("fp8_block", block=(128, 128))
CASES = {  # label -> (row format, column format); nvfp4 sides get the tensor scale passed in
    "mxfp8": (get_format("mxfp8"), None),
    "nvfp4": (get_format("nvfp4"), None),
    "fp8_1x128": (FP8_1x128, None),
    "mxfp8+T": (get_format("mxfp8"), get_format("mxfp8")),
    "nvfp4+T": (get_format("nvfp4"), get_format("nvfp4")),
    "fp8_1x128+T": (FP8_1x128, FP8_1x128),
    "fp8_128x128+T": (FP8_128, FP8_128),
    "fp8_1x128+128T": (FP8_1x128, FP8_128),  # fp8_deepseek's activations: x^T as a 128 x 128 weight tile
    "nvfp4+mxfp8T": (get_format("nvfp4"), get_format("mxfp8")),  # the nvfp4 recipe's activations
    "mxfp4+T": (get_format("mxfp4"), get_format("mxfp4")),
}
TILES = ((16, 256), (32, 128), (32, 256), (64, 64), (64, 128), (128, 64), (128, 128))


def _nbytes(shapes) -> int:
    return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in shapes if s != (1,))


# The Gluon fp8 kernel's variants: launch settings (`quantize_fp8_gluon.CONFIGS` keys) over its defaults, {} =
# the defaults; --gluon-variants times all of these.
GLUON_VARIANTS = [{}] + [dict(num_warps=w, column_thread_tile=ct, row_thread_columns=rc) for w, ct, rc in (
    (4, (16, 2), 16), (8, (16, 2), 16), (8, (16, 2), 32), (8, (32, 1), 16), (8, (32, 1), 32), (4, (32, 1), 32),
    (8, (16, 4), 32), (16, (16, 2), 16), (8, (8, 4), 16))] + [
    dict(num_warps=8, column_thread_tile=ct, row_thread_columns=rc, maxnreg=m)
    for ct, rc in (((32, 1), 32), ((16, 2), 16)) for m in (64, 80)]


def gluon_mx_variants(row, col, decoded: bool = False) -> list[dict]:
    """The Gluon MX / nvfp4 kernel's launch variants for a pair (`quantize_mx_gluon.CONFIG_KEYS`), {} first
    (the defaults): warps; with a column side, its lanes along consecutive blocks (the tile one pass of
    them high), columns per thread and one or two strips wide; without, 16-64 rows by 128 or 256 columns;
    the row side's columns per thread (two blocks, or one nvfp4 block: without a column side, or with one
    strip); then the defaults under register caps. decoded: the DECODED kernel's (its one-byte MX columns
    spread a block over lanes, so their strips are narrower and hold up to 8 columns per thread)."""
    rs, cs = qk.Side(row), qk.Side(col)
    base = qm.default_config(rs, cs, decoded)
    spread = decoded and col is not None and col.elements_per_byte == 1  # up to 8 columns per thread
    shapes = []  # (warps, tile, column lanes, column columns per thread, row columns per thread)
    one_block = sorted({row.block, 32}) if row is not None else [32]
    for w in (4, 8):
        if col is None:
            shapes += [(w, (tr, tc), base["column_block_lanes"], base["column_thread_columns"], rt)
                       for tr in (16, 32, 64) for tc in (128, 256) for rt in one_block]
            continue
        for cl, cc, strips in itertools.product((2, 4, 8), (1, 2, 4, 8) if spread else (1, 2), (1, 2)):
            strip = qm.column_strip(col, dict(column_block_lanes=cl, column_thread_columns=cc, num_warps=w), decoded)
            shapes += [(w, (col.block * cl, strip * strips), cl, cc, rt)
                       for rt in (one_block if strips == 1 else [32])]
    out = [{}]
    for w, tile, cl, cc, rt in shapes:
        cfg = dict(num_warps=w, tile=tile, row_thread_columns=rt, column_thread_columns=cc, column_block_lanes=cl)
        try:
            qm.check_config(rs, cs, {**base, **cfg}, decoded)
        except ValueError:
            continue
        if {**base, **cfg} != base:
            out.append(cfg)
    return out + [dict(maxnreg=m) for m in (64, 80)]  # the defaults, more programs per SM


def _gluon_module(row, col):
    module, _ = qp._gluon_kernel((8192, 8192), jnp.bfloat16, (row, "rceil"), (col, "rceil"), 90)
    return module


def _launcher(shape, row, col, variant):
    """The kernel as the primitive launches it, with this variant's plan overrides; and its four output
    (shape, dtype)s."""
    if isinstance(variant, dict):  # a Gluon variant
        decoded = variant.get("decoded", False)
        shapes = qp.out_shapes((1,) + shape, (row, "rceil"), (col, "rceil"), decoded)
        run = functools.partial(qp._launch, row=(row, "rceil"), col=(col, "rceil"), compute_capability=90,
                                kernel="gluon", **variant)
        return jax.jit(lambda x, ts: run(x[None], ts)), shapes
    mode, tile, warps, div, cvt, words, strips = variant
    overrides = dict(col_mode=mode, tile=tile, num_warps=warps, div=div, cvt=cvt, t_words=words, strips=strips)
    p = qk.plan(1, *shape, qk.Side(row), qk.Side(col), **overrides)
    run = functools.partial(qp._launch, row=(row, "rceil"), col=(col, "rceil"), compute_capability=90, **overrides)
    return jax.jit(lambda x, ts: run(x[None], ts)), p.out_shapes


def variants(row, col, modes, tiles, warps, divs=("f64",), cvts=("hw",), words=(None,), strips=(None,)):
    out = []
    quotient = any(f is not None and f.name in ("nvfp4", "fp8_block") for f in (row, col))
    fp8 = any(f is not None and f.element.bits == 8 for f in (row, col))
    for mode, tile, w, div, cvt, tw, st in itertools.product(modes, tiles, warps, divs, cvts, words, strips):
        if col is None and (mode != modes[0] or tw != words[0] or st != strips[0]):
            continue  # no column side: the mode and its transpose do not matter
        if not quotient and div != divs[0]:
            continue  # MX sides divide by powers of two: no quotient path to choose
        if not fp8 and cvt != cvts[0]:
            continue  # no 8-bit elements: the integer encoder either way
        try:
            qk.plan(1, 8192, 8192, qk.Side(row), qk.Side(col), col_mode=mode if col is not None else None,
                    tile=tile, num_warps=w, div=div, cvt=cvt, t_words=tw if col is not None else None,
                    strips=st if col is not None else None)
        except ValueError:
            continue  # e.g. t_words for fp4 column codes, strips of a "reuse" side
        out.append((mode if col is not None else None, tile, w, div, cvt, tw if col is not None else None,
                    st if col is not None else None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--modes", default="trans,direct,reuse")
    ap.add_argument("--tiles", default=",".join(f"{a}x{b}" for a, b in TILES))
    ap.add_argument("--warps", default=None, help="default 4,8 (the plan's own with --default-plan)")
    ap.add_argument("--divs", default="f64,f32", help="element quotient paths (plan's div=) for nvfp4 / fp8")
    ap.add_argument("--cvts", default="hw,int", help="fp8 element encoders (plan's cvt=): hw (sm_89+), int")
    ap.add_argument("--t-words", default="1,0",
                    help="column codes through shared memory as words (1) or bytes (0) (plan's t_words=)")
    ap.add_argument("--strips", default="1", help="passes per side over strips of the tile (plan's strips=)")
    ap.add_argument("--default-plan", action="store_true",
                    help="the plan's own tile and warps (unless --warps is given) and column mode: a quick run")
    ap.add_argument("--gluon", action="store_true",
                    help="also time the Gluon fp8 1x128 + transposed kernel where it applies (row mode 'gluon')")
    ap.add_argument("--gluon-variants", action="store_true",
                    help="time the Gluon kernel's launch variants (GLUON_VARIANTS) where it applies")
    ap.add_argument("--decoded", action="store_true",
                    help="with --gluon / --gluon-variants: each MX Gluon variant also writing decoded bf16 values")
    ap.add_argument("--tiny", action="store_true", help="256 x 512, R = 2 (CPU: checks the harness only)")
    ap.add_argument("--time-budget", type=float, default=400.0, help="seconds; no new variant starts after")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    shape, r = ((256, 512), 2) if args.tiny else ((8192, 8192), 4)
    modes = args.modes.split(",")
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")]
    warps = [int(w) for w in (args.warps or "4,8").split(",")]
    divs = args.divs.split(",")
    cvts = args.cvts.split(",")
    words = [bool(int(w)) for w in args.t_words.split(",")]
    strips = [int(v) for v in args.strips.split(",")]
    on_gpu = jax.default_backend() == "gpu"
    keys = jax.random.split(jax.random.key(0), r)
    xs = [jax.random.normal(k, shape, jnp.bfloat16) for k in keys]
    device = jax.devices()[0].device_kind
    start = time.perf_counter()
    lines = [f"## Quantization kernel variants, {device}, {datetime.date.today()} (bf16 {shape[0]}x{shape[1]}, "
             f"kernel time, {r} operand sets)", "",
             "| case | mode | tile | warps | div | cvt | words | strips | kernel µs | wall µs | vs x*2 | bits |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = kernel_times(jax.jit(lambda x: x * 2), [(x,) for x in xs])
    base_rate = 2 * xs[0].nbytes / base.profile.kernel_s if on_gpu else math.nan
    print(f"x*2: kernel {base.profile.kernel_s * 1e6:.1f} us, wall {base.wall_s * 1e6:.1f} us", flush=True)
    if args.decoded and on_gpu:  # the bytes of decoded values on both sides: read once, write twice
        two = kernel_times(jax.jit(lambda x: (x * 2, x * 3)), [(x,) for x in xs])
        rate = 3 * xs[0].nbytes / two.profile.kernel_s
        lines.insert(2, f"(x*2, x*3), read once and written twice (the ceiling for decoded values on both sides): "
                        f"kernel {two.profile.kernel_s * 1e6:.1f} µs, {rate / base_rate:.3f} of x*2's rate\n")
        print(lines[2], flush=True)
    for label in args.cases.split(","):
        row, col = CASES[label]
        tss = [jnp.stack([jb.nvfp4_tensor_scale(x) if isinstance(f, type(get_format("nvfp4"))) else
                          jnp.float32(1.0) for f in (row, col)]).astype(jnp.float32) for x in xs]
        wants = {d: jax.jit(lambda x, ts, d=d: qp._reference(x[None], ts, row=(row, "rceil"), col=(col, "rceil"),
                                                             decoded=d))(xs[0], tss[0])
                 for d in ((False, True) if args.decoded else (False,))}
        if args.default_plan:
            p0 = qk.plan(1, *shape, qk.Side(row), qk.Side(col))
            tiles_c = [(p0.constexprs["BR"], p0.constexprs["BC"])]
            warps_c = warps if args.warps else [p0.num_warps]
            modes_c = [modes[0]] if col is None else [p0.constexprs["COL_MODE"]]  # the plan's column mode
        else:
            tiles_c, warps_c, modes_c = tiles, warps, modes
        todo = variants(row, col, modes_c, tiles_c, warps_c, divs, cvts, words, strips)
        module = _gluon_module(row, col)
        if (args.gluon or args.gluon_variants) and module is not None:
            every = GLUON_VARIANTS if module is qg else gluon_mx_variants(row, col)
            chosen = every if args.gluon_variants else every[:1]
            if args.decoded and module is qm:  # the Gluon MX variants writing decoded values, then codes
                decoded = gluon_mx_variants(row, col, True) if args.gluon_variants else [{}]
                chosen = [dict(v, decoded=True) for v in decoded] + chosen
            todo = chosen + todo
        for variant in todo:
            if time.perf_counter() - start > args.time_budget:
                print(f"time budget reached: {label} {variant} and later skipped", flush=True)
                break
            if isinstance(variant, dict) and module is qg:
                cfg = {**qg.CONFIGS[col.tile[0]], **variant}
                shape_ = "x".join(map(str, cfg["column_thread_tile"]))
                cap = f", maxnreg {cfg['maxnreg']}" if cfg["maxnreg"] else ""
                head = (f"| {label} | gluon{'' if variant else ' (default)'} cols {shape_}, rows 1x"
                        f"{cfg['row_thread_columns']}{cap} | 128x128 | {cfg['num_warps']} | f32 | hw | - | - |")
            elif isinstance(variant, dict):
                cfg = {**qm.default_config(qk.Side(row), qk.Side(col), variant.get("decoded", False)),
                       **{k: v for k, v in variant.items() if k != "decoded"}}
                cols_ = (f", cols {col.block}x{cfg['column_thread_columns']} {cfg['column_block_lanes']} lanes"
                         if col is not None else "")
                cap = f", maxnreg {cfg['maxnreg']}" if cfg["maxnreg"] else ""
                plain = {k: v for k, v in variant.items() if k != "decoded"}
                kind = (" decoded" if variant.get("decoded") else "") + ("" if plain else " (default)")
                head = (f"| {label} | gluon-mx{kind} rows 1x{cfg['row_thread_columns']}"
                        f"{cols_}{cap} | {cfg['tile'][0]}x{cfg['tile'][1]} | {cfg['num_warps']} | f32 | hw | - | - |")
            else:
                mode, tile, w, div, cvt, tw, st = variant
                head = (f"| {label} | {mode or '-'} | {tile[0]}x{tile[1]} | {w} | {div} | {cvt} | "
                        f"{'-' if tw is None else int(tw)} | {st or '-'} |")
            if not on_gpu:  # the kernel does not run on a CPU (no interpreter here): the plan only
                lines.append(f"{head} - | - | - | not run (CPU) |")
                continue
            try:
                fn, out_shapes = _launcher(shape, row, col, variant)
                want = wants[isinstance(variant, dict) and variant.get("decoded", False)]
                got = fn(xs[0], tss[0])
                # An absent side's outputs are (1,) placeholders the kernel never writes (the primitive
                # drops them): only real outputs are compared.
                names = ("row values", "row scales", "column values", "column scales")
                bad = {name: int((np.asarray(g).view(np.uint8) != np.asarray(w_).view(np.uint8)).sum())
                       for name, g, w_, (shape_, _) in zip(names, got, want, out_shapes) if shape_ != (1,)}
                if any(bad.values()):
                    detail = ", ".join(f"{n}: {c}" for n, c in bad.items() if c)
                    lines.append(f"{head} - | - | - | bytes differ ({detail}) |")
                    print(lines[-1], flush=True)
                    continue
                t = kernel_times(fn, list(zip(xs, tss)))
            except Exception as e:  # noqa: BLE001 - one variant failing must not stop the sweep
                lines.append(f"{head} - | - | - | error: {type(e).__name__}: {str(e)[:80]} |")
                print(lines[-1], flush=True)
                continue
            rate = (xs[0].nbytes + _nbytes(out_shapes)) / t.profile.kernel_s
            lines.append(f"{head} {t.profile.kernel_s * 1e6:.1f} | {t.wall_s * 1e6:.1f} | {rate / base_rate:.3f} | same |")
            print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = f"quant_variants_{device.lower().replace(' ', '_')}_{datetime.date.today()}.md"
    (out / name).write_text(text)
    print(f"wrote {out / name}")


if __name__ == "__main__":
    main()
