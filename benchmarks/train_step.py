"""Time one training step of the example transformer LM per recipe, against bf16 in the same run.

    python benchmarks/train_step.py                          # GPU: d_model 2048, seq 2048, batch 8, 4 layers
    python benchmarks/train_step.py --recipes bf16,mxfp8 --steps 20

The model is `examples/train_tiny.py`'s `TinyLM` (every block projection is a block-scaled `Dense`; the
embedding, attention core, LayerNorms and the vocab head stay bf16), with `nn.scan` over `nn.remat` blocks,
and the step is forward + backward + AdamW, jitted. Timing is device-time honest: the step is compiled
and run `--warmup` times first, then each of `--steps` steps is timed on its own with
`jax.block_until_ready`, and the median is reported (min alongside). Every recipe runs in the same process
on the same data, so the ratio to bf16 compares like with like. Prints a table and writes a CSV under
benchmarks/results/. Which kernel each recipe's GEMMs use on this target (native, upcast, reference) is
printed too: on Hopper only block FP8 has a native MMA; MX and nvfp4 are decoded to bf16 in registers.

Without a GPU this runs a tiny config with a warning (the numbers then only show that the path works).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import importlib.util
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax

import jax_blockscale as jb
from jax_blockscale.recipes import get_recipe

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_RECIPES = ("bf16", "mxfp8", "nvfp4", "fp8_deepseek")


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
        a = "bf16" if fa is None else fa
        b = "bf16" if fb is None else fb
        dummy = [jax.eval_shape(lambda f=f: jb.quantize(jnp.zeros((128, 128)), f)) if f != "bf16"
                 else jnp.zeros((1, 128), jnp.bfloat16) for f in (a, b)]  # K must match: explain checks it
        out.append(f"{gemm} {jb.explain(dummy[0], dummy[1], target=target).path}")
    return ", ".join(out)


def time_step(example, cfg, recipe: str, warmup: int, steps: int) -> list[float]:
    """Seconds per training step (each measured alone) of TinyLM with `recipe`."""
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

    for _ in range(warmup):
        params, state, loss = jax.block_until_ready(step(params, state, tokens))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        params, state, loss = jax.block_until_ready(step(params, state, tokens))
        times.append(time.perf_counter() - t0)
    if not bool(jnp.isfinite(loss)):
        raise RuntimeError(f"{recipe}: the loss is not finite ({loss})")
    return times


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default=",".join(DEFAULT_RECIPES))
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--no-remat", action="store_true")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    a = p.parse_args(argv)

    example = _load_example()
    backend = jax.default_backend()
    sizes = dict(d_model=a.d_model, layers=a.layers, heads=a.heads, seq=a.seq, batch=a.batch, vocab=a.vocab)
    if backend != "gpu":
        print(f"WARNING: no GPU (backend {backend}): running a tiny config; the times only show the path "
              f"works, they say nothing about kernel speed.", file=sys.stderr)
        sizes = dict(d_model=128, layers=2, heads=4, seq=128, batch=2, vocab=256)
        a.steps, a.warmup = min(a.steps, 3), 1
    cfg = dataclasses.replace(example.Config(), remat=not a.no_remat, **sizes)
    target = jb.detect_target()
    device = jax.devices()[0].device_kind
    print(f"jax {jax.__version__}, {device} (target {target}); {cfg}")

    rows = []
    for recipe in a.recipes.split(","):
        times = time_step(example, cfg, recipe, a.warmup, a.steps)
        rows.append(dict(recipe=recipe, median_ms=1e3 * statistics.median(times), min_ms=1e3 * min(times),
                         paths=_paths(recipe, target)))
        print(f"  {recipe}: median {rows[-1]['median_ms']:.2f} ms", flush=True)
    base = next((r["median_ms"] for r in rows if r["recipe"] == "bf16"), None)
    tokens = cfg.batch * cfg.seq
    print(f"\n{'recipe':>14} {'median ms':>10} {'min ms':>9} {'vs bf16':>8} {'tokens/s':>10}  "
          f"GEMM paths on {target}")
    for r in rows:
        r["ratio_vs_bf16"] = r["median_ms"] / base if base else float("nan")
        r["tokens_per_s"] = tokens / (r["median_ms"] / 1e3)
        print(f"{r['recipe']:>14} {r['median_ms']:>10.2f} {r['min_ms']:>9.2f} {r['ratio_vs_bf16']:>8.3f} "
              f"{r['tokens_per_s']:>10.0f}  {r['paths']}")

    out_dir = pathlib.Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = out_dir / f"train_step_{target}_{stamp}.csv"
    with open(path, "w", newline="") as f:
        meta = dict(device=device, target=target, jax=jax.__version__, **sizes, remat=cfg.remat,
                    warmup=a.warmup, steps=a.steps)
        writer = csv.DictWriter(f, fieldnames=[*meta, "recipe", "median_ms", "min_ms", "ratio_vs_bf16",
                                               "tokens_per_s", "paths"])
        writer.writeheader()
        for r in rows:
            writer.writerow({**meta, **r})
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:])
