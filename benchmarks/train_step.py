"""Time one training step of the example transformer LM per recipe, against bf16 in the same run.

    python benchmarks/train_step.py                          # GPU: d_model 2048, seq 2048, batch 8, 4 layers
    python benchmarks/train_step.py --preset d4096           # d_model 4096, 2 layers, seq 1024, batch 8
    python benchmarks/train_step.py --recipes bf16,mxfp8 --steps 20 --no-kernel-time

The model is `examples/train_tiny.py`'s `TinyLM` (every block projection is a block-scaled `Dense`; the
embedding, attention core, LayerNorms and the vocab head stay bf16), with `nn.scan` over `nn.remat` blocks.
Its attention core is fused (`jax.nn.dot_product_attention`: cuDNN flash attention on an NVIDIA GPU;
`--attention naive` materializes the f32 scores, as the model did before 2026-11-24), and its layer scan is
rolled (`--scan-unroll N` runs N layers per iteration; unrolled, XLA no longer copies the saved residuals
into the scan's stacked buffers and back). The step is forward + backward + AdamW, jitted. Timing is
device-time honest: the step is compiled and run `--warmup` times first, then each of `--steps` steps is
timed on its own with `jax.block_until_ready`, and the median is reported (min alongside). Every recipe runs in the same process
on the same data, so the ratio to bf16 compares like with like. Prints a table and writes a CSV under
benchmarks/results/. Which kernel each recipe's GEMMs use on this target (native, upcast, reference) is
printed too: on Hopper only block FP8 has a native MMA; MX and nvfp4 are decoded to bf16 in registers.

Kernel time (`--kernel-time`, the default on a GPU): `--trace-steps` more steps run inside a profiler trace
and the CUPTI kernel durations are summed per step (benchmarks/_kernel_time.py), split into GEMM (our Triton
kernels, cuBLAS/cuBLASLt, CUTLASS, XLA's Triton GEMM fusions), quantization (kernels named quantize_*;
quantization that XLA fuses into loop fusions cannot be told apart by name and counts as other), dequantize
(the XLA passes that decode MX / nvfp4 operands to bf16 before a Hopper upcast GEMM: found through the
compiled program's HLO metadata, jax_blockscale names their scope) and other, with the top kernels of each
recipe. Kernel time is free of host launch gaps; the wall clock stays beside it.

Without a GPU this runs a tiny config with a warning (the numbers then only show that the path works).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import importlib.util
import pathlib
import math
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

import jax_blockscale as jb
from jax_blockscale.recipes import get_recipe

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/train_step.py` puts benchmarks/, not the root, on the path
    sys.path.insert(0, str(ROOT))

from benchmarks._kernel_time import (DEQUANT, GEMM, OTHER, QUANT, KernelProfile, breakdown,  # noqa: E402
                                     fusion_op_names, profile, reclassify)

DEFAULT_RECIPES = ("bf16", "mxfp8", "nvfp4", "fp8_deepseek")
PRESETS = {  # the two training shapes
    "d2048": dict(d_model=2048, layers=4, heads=16, seq=2048, batch=8, vocab=8192),
    "d4096": dict(d_model=4096, layers=2, heads=32, seq=1024, batch=8, vocab=8192),
}


def _load_example():
    spec = importlib.util.spec_from_file_location("train_tiny", ROOT / "examples" / "train_tiny.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _paths(recipe_name: str, target: str) -> str:
    """Which path each of the recipe's GEMMs takes here, e.g. 'fprop native, dgrad native, wgrad upcast'."""
    r = get_recipe(recipe_name)
    out = []
    for gemm in ("fprop", "dgrad", "wgrad"):
        fa, fb = getattr(r, gemm)
        if fa is None and fb is None:
            out.append(f"{gemm} dense")
            continue
        if r.decodes():  # decoded bf16 inputs (Recipe.gemm_inputs): XLA's dot
            out.append(f"{gemm} decoded")
            continue
        a = "bf16" if fa is None else fa
        b = "bf16" if fb is None else fb
        dummy = [jax.eval_shape(lambda f=f: jb.quantize(jnp.zeros((128, 128)), f)) if f != "bf16"
                 else jnp.zeros((1, 128), jnp.bfloat16) for f in (a, b)]  # K must match: explain checks it
        out.append(f"{gemm} {jb.explain(dummy[0], dummy[1], target=target).path}")
    return ", ".join(out)


def make_step(example, cfg, recipe: str):
    """(step, carry, tokens): the jitted forward + backward + AdamW step of TinyLM with `recipe`, and its
    initial (params, opt state) in a list that `run_step` advances."""
    model = example.TinyLM(cfg, recipe)
    key = jax.random.key(cfg.seed)
    tokens = jax.random.randint(key, (cfg.batch, cfg.seq + 1), 0, cfg.vocab)
    params = jax.jit(model.init)(key, tokens[:, :-1])
    opt = optax.adamw(1e-4)
    state = jax.jit(opt.init)(params)

    def loss_fn(p, tokens):
        logits = model.apply(p, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def step(params, state, tokens):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return step, [params, state], tokens


def run_step(step, carry: list, tokens) -> jax.Array:
    """One step: advances carry = [params, state] in place, returns the loss (not blocked on)."""
    carry[0], carry[1], loss = step(carry[0], carry[1], tokens)
    return loss


def time_step(example, cfg, recipe: str, warmup: int, steps: int, trace_steps: int = 0
              ) -> tuple[list[float], KernelProfile | None, float]:
    """Wall seconds per training step (each measured alone) of TinyLM with `recipe`, with `trace_steps` > 0
    the kernel profile per step of that many more steps traced together, and the compiled step's scratch
    memory in bytes (XLA's temp allocation: activations kept for the backward live there)."""
    step, carry, tokens = make_step(example, cfg, recipe)
    # One compilation: the compiled executable reports its memory and runs the steps.
    step = step.lower(*carry, tokens).compile()
    temp = step.memory_analysis()
    temp_bytes = getattr(temp, "temp_size_in_bytes", math.nan) if temp is not None else math.nan
    op_names = fusion_op_names(step.as_text() or "")  # XLA kernel -> HLO op_name: finds the dequantize passes
    for _ in range(warmup):
        jax.block_until_ready(run_step(step, carry, tokens))
    times = []
    loss = None
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = jax.block_until_ready(run_step(step, carry, tokens))
        times.append(time.perf_counter() - t0)
    if loss is not None and not bool(jnp.isfinite(loss)):
        raise RuntimeError(f"{recipe}: the loss is not finite ({loss})")
    kernel = profile(lambda: run_step(step, carry, tokens), calls=trace_steps) if trace_steps > 0 else None
    if kernel is not None:
        kernel = reclassify(kernel, op_names)
    return times, kernel, temp_bytes


def _ms(v: float) -> str:
    return f"{v * 1e3:.2f}" if math.isfinite(v) else "-"


def _ratio(v: float, base: float) -> str:
    return f"{v / base:.3f}" if math.isfinite(v) and math.isfinite(base) and base > 0 else "-"


def report(rows: list[dict], target: str, top: int = 8) -> str:
    """The markdown tables: per recipe wall and kernel time per step with the breakdown and ratios vs bf16,
    then each recipe's top kernels."""
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    bw = base["wall_s"] if base else math.nan
    bk = base["kernel_s"] if base else math.nan
    # time / bf16's time: below 1 is faster than bf16 (the speedup is its inverse)
    bo = base["other_s"] if base else math.nan
    # "GEMM-only bound": the step if quantization and dequantization cost nothing and everything else cost
    # what bf16's does (this recipe's GEMM time + bf16's other), as a time ratio to bf16: what faster
    # quantization, decode-free GEMMs and fewer extra kernels could reach with these GEMMs.
    out = ["| recipe | remat saves | scratch MiB | wall ms | kernel ms | GEMM ms | quant ms | dequant ms | other ms | "
           "memcpy ms | wall / bf16 time | kernel / bf16 time | GEMM-only bound / bf16 | tokens/s (wall) | "
           "GEMM paths on " + target + " |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        temp = r.get("temp_mib", math.nan)
        out.append(f"| {r['recipe']} | {r['remat_saves']} | {temp:.0f} | {_ms(r['wall_s'])} | {_ms(r['kernel_s'])} | "
                   f"{_ms(r['gemm_s'])} | {_ms(r['quant_s'])} | {_ms(r.get('dequant_s', math.nan))} | "
                   f"{_ms(r['other_s'])} | {_ms(r['memcpy_s'])} | "
                   f"{_ratio(r['wall_s'], bw)} | {_ratio(r['kernel_s'], bk)} | {_ratio(r['gemm_s'] + bo, bk)} | "
                   f"{r['tokens_per_s']:.0f} | {r['paths']} |")
    for r in rows:
        kp = r.get("profile")
        if kp is None or not kp.ok:
            if kp is not None:
                out += ["", f"{r['recipe']}: no kernel time ({kp.note})"]
            continue
        out += ["", f"Top kernels, {r['recipe']}, remat saves {r['remat_saves']} ({kp.launches:.0f} launches per "
                f"step, {kp.source}):", "",
                "| kernel | ms per step | launches | class | share |", "|---|---|---|---|---|"]
        for k in kp.top(top):
            name = k.name if len(k.name) <= 90 else k.name[:87] + "..."
            out.append(f"| `{name}` | {k.seconds * 1e3:.3f} | {k.launches:.3g} | {k.category} | "
                       f"{100 * k.seconds / kp.kernel_s:.1f}% |")
    return "\n".join(out)


def parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES))
    p.add_argument("--preset", choices=sorted(PRESETS), default="d2048",
                   help="model and batch sizes (d2048: the defaults; d4096: d_model 4096, 2 layers, seq 1024); "
                        "the flags below override single sizes")
    for name in ("d_model", "layers", "heads", "seq", "batch", "vocab"):
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--trace-steps", type=int, default=3, help="steps traced for the kernel time")
    p.add_argument("--kernel-time", dest="kernel_time", action="store_true", default=None,
                   help="sum CUPTI kernel durations per step (default: on when there is a GPU)")
    p.add_argument("--no-kernel-time", dest="kernel_time", action="store_false")
    p.add_argument("--no-remat", action="store_true")
    p.add_argument("--scan-unroll", type=int, default=1, help="layers per iteration of the layer scan "
                   "(Config.scan_unroll; the number of layers unrolls it: no stacked residual copies)")
    p.add_argument("--attention", default="fused", help="the attention core: fused (jax.nn.dot_product_attention, "
                   "cuDNN on an NVIDIA GPU) or naive (f32 scores materialized, the model before 2026-11-24)")
    p.add_argument("--remat-saves", default="weights+inputs",
                   help="comma-separated Config.remat_saves values (nothing, weights, weights+inputs); each "
                        "quantizing recipe runs once per value, bf16 once (it has nothing to save)")
    p.add_argument("--top", type=int, default=8, help="kernels listed per recipe")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    return p.parse_args(argv)


def main(argv=None) -> list[dict]:
    a = parse(argv)
    example = _load_example()
    backend = jax.default_backend()
    sizes = {k: (getattr(a, k) if getattr(a, k) is not None else v) for k, v in PRESETS[a.preset].items()}
    kernel_time = a.kernel_time if a.kernel_time is not None else backend == "gpu"
    if backend != "gpu":
        print(f"WARNING: no GPU (backend {backend}): running a tiny config; the times only show the path "
              f"works, they say nothing about kernel speed.", file=sys.stderr)
        sizes = dict(d_model=128, layers=2, heads=4, seq=128, batch=2, vocab=256)
        a.steps, a.warmup, a.trace_steps = min(a.steps, 3), 1, min(a.trace_steps, 2)
    example.check_attention(a.attention, "--attention")  # before anything compiles
    cfg = dataclasses.replace(example.Config(), remat=not a.no_remat, attention=a.attention,
                              scan_unroll=a.scan_unroll, **sizes)
    target = jb.detect_target()
    device = jax.devices()[0].device_kind
    # e.g. "fused (cudnn)": which attention kernel the step runs is part of what the ratio means
    attention = f"fused ({example.attention_implementation()})" if cfg.attention == "fused" else cfg.attention
    print(f"jax {jax.__version__}, {device} (target {target}); {a.preset if backend == 'gpu' else 'tiny'}: {cfg}; "
          f"kernel time {'on' if kernel_time else 'off'}")

    saves = a.remat_saves.split(",")
    for v in saves:
        example.remat_policy(v)  # refuses an unknown value before anything compiles
    # The policy only matters under remat and for recipes that quantize: others run once.
    runs = [(r, v) for r in a.recipes.split(",")
            for v in (saves if cfg.remat and get_recipe(r).quantizes else saves[:1])]
    rows = []
    for recipe, saved in runs:
        run_cfg = dataclasses.replace(cfg, remat_saves=saved)
        times, kp, temp_bytes = time_step(example, run_cfg, recipe, a.warmup, a.steps,
                                          a.trace_steps if kernel_time else 0)
        split = breakdown(kp) if kp is not None else {c: math.nan for c in (GEMM, QUANT, DEQUANT, OTHER)}
        rows.append(dict(recipe=recipe, remat_saves=saved if cfg.remat and get_recipe(recipe).quantizes else "-",
                         wall_s=statistics.median(times), wall_min_s=min(times), temp_mib=temp_bytes / 2**20,
                         kernel_s=kp.kernel_s if kp is not None else math.nan, gemm_s=split[GEMM],
                         quant_s=split[QUANT], dequant_s=split[DEQUANT], other_s=split[OTHER],
                         memcpy_s=kp.memcpy_s if kp is not None else math.nan, profile=kp,
                         paths=_paths(recipe, target)))
        print(f"  {recipe} (remat saves {rows[-1]['remat_saves']}): wall {_ms(rows[-1]['wall_s'])} ms, kernel "
              f"{_ms(rows[-1]['kernel_s'])} ms per step", flush=True)
    tokens = cfg.batch * cfg.seq
    for r in rows:
        r["tokens_per_s"] = tokens / r["wall_s"]
    print(f"\n## Training step, {device}, {datetime.date.today().isoformat()} (jax {jax.__version__}; "
          f"d_model {cfg.d_model}, {cfg.layers} layers, seq {cfg.seq}, batch {cfg.batch}, remat {cfg.remat}, "
          f"attention {attention})\n")
    print(report(rows, target, a.top))
    path = write_csv(rows, a.out, target, device, sizes, cfg, a, attention)
    print(f"\nwrote {path}")
    return rows


CSV_FIELDS = ["recipe", "remat_saves", "scratch_mib", "median_ms", "min_ms", "ratio_vs_bf16", "tokens_per_s", "paths",
              "kernel_ms", "gemm_ms", "quant_ms", "dequant_ms", "other_ms", "memcpy_ms", "kernel_ratio_vs_bf16",
              "kernel_launches", "kernel_source", "top_kernels"]


def write_csv(rows: list[dict], out: str, target: str, device: str, sizes: dict, cfg, a, attention: str
              ) -> pathlib.Path:
    """One CSV row per recipe: the original columns (median_ms is wall clock) plus the kernel-time ones."""
    base = next((r for r in rows if r["recipe"] == "bf16"), None)
    out_dir = pathlib.Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"train_step_{target}_d{cfg.d_model}_s{cfg.seq}_{stamp}.csv"
    meta = dict(device=device, target=target, jax=jax.__version__, **sizes, remat=cfg.remat,
                attention=attention, scan_unroll=cfg.scan_unroll, warmup=a.warmup,
                steps=a.steps, trace_steps=a.trace_steps)
    num = lambda v, d=4: f"{v:.{d}g}" if math.isfinite(v) else ""  # noqa: E731
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[*meta, *CSV_FIELDS])
        writer.writeheader()
        for r in rows:
            kp = r["profile"]
            writer.writerow({**meta, "recipe": r["recipe"], "remat_saves": r["remat_saves"],
                             "scratch_mib": num(r.get("temp_mib", math.nan), 6), "median_ms": num(r["wall_s"] * 1e3, 6),
                             "min_ms": num(r["wall_min_s"] * 1e3, 6),
                             "ratio_vs_bf16": num(r["wall_s"] / base["wall_s"]) if base else "",
                             "tokens_per_s": num(r["tokens_per_s"], 6), "paths": r["paths"],
                             "kernel_ms": num(r["kernel_s"] * 1e3, 6), "gemm_ms": num(r["gemm_s"] * 1e3),
                             "quant_ms": num(r["quant_s"] * 1e3),
                             "dequant_ms": num(r.get("dequant_s", math.nan) * 1e3), "other_ms": num(r["other_s"] * 1e3),
                             "memcpy_ms": num(r["memcpy_s"] * 1e3),
                             "kernel_ratio_vs_bf16": num(r["kernel_s"] / base["kernel_s"]) if base else "",
                             "kernel_launches": num(kp.launches) if kp is not None else "",
                             "kernel_source": (kp.source or kp.note) if kp is not None else "",
                             "top_kernels": kp.summary(a.top) if kp is not None and kp.ok else ""})
    return path


if __name__ == "__main__":
    main(sys.argv[1:])
