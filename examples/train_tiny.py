"""Train a small MLP and a tiny transformer LM with bf16, mxfp8 and DeepSeek FP8 recipes; compare losses.

    python examples/train_tiny.py                      # CPU-sized: both models, 3 recipes, 30-50 s on 2 cores
    python examples/train_tiny.py --d-model 512 --seq 256 --layers 4 --steps 500   # on a GPU

Every run starts from the same initial weights and sees the same synthetic batches, so the curves differ
only by the recipe's arithmetic. The models are Flax linen; every projection is a
`jax_blockscale.nn.linen.Dense` with the recipe, except the output heads, which stay bf16 as is common
practice for low-precision training. Transformer blocks are stacked with `nn.scan` over `nn.remat`, which
keeps the quantized weights and projection inputs for the backward (`jax_blockscale.checkpoint_policy`;
`--remat-saves`). The attention core is `jax.nn.dot_product_attention` (cuDNN on an NVIDIA GPU;
`--attention naive` for the materialized-scores version).

Tasks (synthetic, so nothing is downloaded):
- MLP: regression onto a fixed random teacher MLP, x ~ N(0, 1), mean squared error.
- LM: next-token prediction on sequences from a fixed sparse random Markov chain (each token has 4 likely
  successors); the loss floor is the chain's entropy rate, printed at the start.

Writes a loss-curve PNG (needs matplotlib; skipped with a message otherwise) and returns the loss curves.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

import jax_blockscale as jb
from jax_blockscale.nn.linen import Dense

RECIPES = ("bf16", "mxfp8", "fp8_deepseek")


@dataclasses.dataclass(frozen=True)
class Config:
    """Sizes and schedule. Defaults are CPU-sized; multiples of 128 suit the GPU kernels."""

    d_model: int = 64
    layers: int = 2
    heads: int = 4
    seq: int = 32
    batch: int = 16
    vocab: int = 64
    mlp_in: int = 64
    mlp_hidden: int = 128
    mlp_out: int = 16
    steps: int = 120
    lr: float = 3e-3
    seed: int = 0
    remat: bool = True
    # What the remat'd blocks keep for the backward (jax_blockscale.checkpoint_policy): "nothing" (recompute
    # all), "weights" (the quantized weights: no re-quantization of W), "weights+inputs" (and the quantized
    # block-projection inputs; the default: an fp8_deepseek step on an H100 at d4096 spends 3.7 ms instead of
    # 5.6 in quantization and keeps ~0.6 GB more, benchmarks/train_step.py). bf16 layers have nothing named,
    # so for them all three recompute everything.
    remat_saves: str = "weights+inputs"
    # The attention core (bf16 in every recipe): "fused" is jax.nn.dot_product_attention, cuDNN's flash
    # attention on an NVIDIA GPU and XLA's elsewhere; "naive" materializes the (B, H, S, S) f32 scores
    # (what this model did until 2026-11-24: at d_model 2048, seq 2048 that is 2 GiB per layer and about
    # 40% of a bf16 training step on an H100, a cost no real model pays).
    attention: str = "fused"
    # Layers per iteration of the layer scan (nn.scan's unroll; `layers` unrolls it fully). Rolled, every
    # residual the blocks save is copied into the scan's stacked buffer and back out for the backward (XLA
    # cannot write a custom call's output into a slice of that buffer, nor hand a slice to one); unrolled,
    # XLA drops the stacking.
    scan_unroll: int = 1


# ------------------------------------------------------------------------------------------------ models


class MLP(nn.Module):
    hidden: int
    out: int
    recipe: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:  # (B, D_in) -> (B, out)
        x = x.astype(jnp.bfloat16)
        for _ in range(2):
            x = nn.gelu(Dense(self.hidden, recipe=self.recipe, dtype=jnp.bfloat16)(x))
        return nn.Dense(self.out, dtype=jnp.bfloat16)(x).astype(jnp.float32)


class Block(nn.Module):
    """Pre-LayerNorm transformer block; all four projections use the recipe."""

    d_model: int
    heads: int
    recipe: str
    attention: str = "fused"

    @nn.compact
    def __call__(self, x: jax.Array, _) -> tuple[jax.Array, None]:  # x (B, S, D)
        b, s, d = x.shape
        dense = lambda f: Dense(f, recipe=self.recipe, dtype=jnp.bfloat16)  # noqa: E731
        h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        q, k, v = jnp.split(dense(3 * d)(h).reshape(b, s, 3 * self.heads, d // self.heads), 3, axis=2)
        x = x + dense(d)(causal_attention(q, k, v, self.attention).reshape(b, s, d))
        h = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        x = x + dense(d)(nn.gelu(dense(4 * d)(h)))
        return x, None


ATTENTION = ("fused", "naive")


def attention_implementation() -> str:
    """jax.nn.dot_product_attention's implementation here: cuDNN on an NVIDIA GPU (its `None` means XLA)."""
    device = jax.devices()[0]
    return "cudnn" if device.platform == "gpu" and "cuda" in device.client.platform_version.lower() else "xla"


def check_attention(kind: str, name: str = "attention") -> None:
    """ValueError unless `kind` is one of ATTENTION (`name`: what the message calls it, e.g. a flag)."""
    if kind not in ATTENTION:
        raise ValueError(f"{name} must be one of {ATTENTION}, got {kind!r}")


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, kind: str) -> jax.Array:
    """Causal softmax attention, (B, S, H, Dh) bf16 each -> (B, S, H, Dh) bf16; `kind` from ATTENTION."""
    check_attention(kind)
    if kind == "fused":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attention_implementation())
    s = q.shape[1]
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) / np.sqrt(q.shape[-1])
    mask = jnp.tril(jnp.ones((s, s), bool))
    probs = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1).astype(jnp.bfloat16)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


REMAT_SAVES = ("nothing", "weights", "weights+inputs")


def remat_policy(saves: str):
    """The `nn.remat` policy for Config.remat_saves."""
    if saves not in REMAT_SAVES:
        raise ValueError(f"remat_saves must be one of {REMAT_SAVES}, got {saves!r}")
    if saves == "nothing":
        return None
    return jb.checkpoint_policy(weights=True, inputs=saves == "weights+inputs")


class TinyLM(nn.Module):
    cfg: Config
    recipe: str

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:  # (B, S) int -> logits (B, S, V) f32
        c = self.cfg
        x = nn.Embed(c.vocab, c.d_model)(tokens) + self.param(
            "pos", nn.initializers.normal(0.02), (c.seq, c.d_model))[: tokens.shape[1]]
        x = x.astype(jnp.bfloat16)
        block = nn.remat(Block, policy=remat_policy(c.remat_saves)) if c.remat else Block
        stack = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True}, length=c.layers,
                        unroll=c.scan_unroll)
        x, _ = stack(c.d_model, c.heads, self.recipe, c.attention, name="blocks")(x, None)
        x = nn.LayerNorm(dtype=jnp.bfloat16)(x)
        return nn.Dense(c.vocab, dtype=jnp.bfloat16, name="head")(x).astype(jnp.float32)


# -------------------------------------------------------------------------------------------------- data


def markov_chain(vocab: int, seed: int, successors: int = 4) -> tuple[jax.Array, float]:
    """A sparse random transition matrix (log-probs, (V, V)) and its entropy rate in nats."""
    rng = np.random.default_rng(seed)
    probs = np.zeros((vocab, vocab))
    for i in range(vocab):
        probs[i, rng.choice(vocab, successors, replace=False)] = rng.dirichlet(np.ones(successors))
    # Stationary distribution by power iteration; the entropy rate is its average row entropy.
    pi = np.full(vocab, 1.0 / vocab)
    for _ in range(500):
        pi = pi @ probs
    row_h = -np.sum(np.where(probs > 0, probs * np.log(np.where(probs > 0, probs, 1)), 0), axis=1)
    return jnp.log(jnp.asarray(probs, jnp.float32) + 1e-30), float(pi @ row_h)


def lm_batch(key: jax.Array, log_probs: jax.Array, batch: int, seq: int) -> jax.Array:
    """(batch, seq + 1) tokens from the chain."""
    k0, k1 = jax.random.split(key)
    first = jax.random.randint(k0, (batch,), 0, log_probs.shape[0])

    def step(tok, k):
        nxt = jax.random.categorical(k, log_probs[tok])
        return nxt, nxt

    _, rest = jax.lax.scan(step, first, jax.random.split(k1, seq))
    return jnp.concatenate([first[:, None], rest.T], axis=1)


# ------------------------------------------------------------------------------------------------ training


def train(task: "Task", recipe: str, cfg: Config) -> np.ndarray:
    """The loss curve (steps,) of `task` trained with `recipe` (AdamW, warmup + cosine schedule)."""
    loss_fn, params, batch_fn = task.loss_for(recipe), task.params, task.batch_fn
    schedule = optax.warmup_cosine_decay_schedule(0.0, cfg.lr, cfg.steps // 10, cfg.steps)
    opt = optax.adamw(schedule, weight_decay=0.0)
    state = jax.jit(opt.init)(params)

    @jax.jit
    def step(params, state, i):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch_fn(i))
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(cfg.steps):
        params, state, loss = step(params, state, i)
        losses.append(loss)
    return np.asarray(jax.device_get(losses), np.float32)


@dataclasses.dataclass(frozen=True)
class Task:
    """A model family on its data: initial params (shared by every recipe), batches, and the loss."""

    params: Any
    batch_fn: Callable[[jax.Array], Any]  # step index -> batch
    loss_for: Callable[[str], Callable]  # recipe -> loss_fn(params, batch)


def mlp_task(cfg: Config) -> Task:
    """Regression of the MLP onto a fixed random teacher MLP."""
    key = jax.random.key(cfg.seed)
    x0 = jnp.zeros((cfg.batch, cfg.mlp_in))
    teacher = MLP(cfg.mlp_hidden, cfg.mlp_out, "bf16")
    t_params = jax.jit(teacher.init)(jax.random.fold_in(key, 1), x0)
    # The parameter tree does not depend on the recipe: initialize once (with the cheap bf16 recipe, jitted)
    # and start every recipe from the same weights.
    params = jax.jit(MLP(cfg.mlp_hidden, cfg.mlp_out, "bf16").init)(jax.random.fold_in(key, 2), x0)

    def batch_fn(i):
        x = jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, 3), i), (cfg.batch * 4, cfg.mlp_in))
        return x, teacher.apply(t_params, x)

    def loss_for(recipe):
        model = MLP(cfg.mlp_hidden, cfg.mlp_out, recipe)
        return lambda p, batch: jnp.mean((model.apply(p, batch[0]) - batch[1]) ** 2)

    return Task(params, batch_fn, loss_for)


def lm_task(cfg: Config, log_probs: jax.Array) -> Task:
    """Next-token prediction on the Markov chain `log_probs`."""
    key = jax.random.key(cfg.seed)
    params = jax.jit(TinyLM(cfg, "bf16").init)(jax.random.fold_in(key, 2), jnp.zeros((1, cfg.seq), jnp.int32))

    def batch_fn(i):
        return lm_batch(jax.random.fold_in(jax.random.fold_in(key, 3), i), log_probs, cfg.batch, cfg.seq)

    def loss_for(recipe):
        model = TinyLM(cfg, recipe)

        def loss_fn(p, tokens):
            logits = model.apply(p, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        return loss_fn

    return Task(params, batch_fn, loss_for)


def final_loss(curve: np.ndarray) -> float:
    """Mean of the last 10% of steps (at least 5), which smooths batch noise."""
    return float(np.mean(curve[-max(5, len(curve) // 10):]))


def plot(curves: dict[str, dict[str, np.ndarray]], path: str, floor: Optional[float] = None) -> Optional[str]:
    """Loss curves, one panel per model; returns the path, or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the loss-curve plot (pip install matplotlib)")
        return None
    fig, axes = plt.subplots(2, len(curves), figsize=(5.5 * len(curves), 6.4), squeeze=False,
                             gridspec_kw={"height_ratios": [2, 1]}, sharex="col")
    for col, (model, by_recipe) in enumerate(curves.items()):
        top, bottom = axes[0, col], axes[1, col]
        base = by_recipe.get("bf16")
        for recipe, curve in by_recipe.items():
            line, = top.plot(curve, label=f"{recipe} (final {final_loss(curve):.4f})", lw=1.2)
            if base is not None and recipe != "bf16":
                bottom.plot(curve - base, color=line.get_color(), lw=1.0, label=recipe)
        if model == "lm" and floor is not None:
            top.axhline(floor, color="gray", ls=":", label=f"entropy floor {floor:.3f}")
        top.set(title={"mlp": "MLP regression (MSE)", "lm": "tiny transformer LM (cross-entropy)"}[model],
                ylabel="loss", yscale="log" if model == "mlp" else "linear")
        top.legend()
        bottom.axhline(0.0, color="gray", lw=0.8)
        bottom.set(xlabel="step", ylabel="loss - bf16 loss")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(cfg: Config = Config(), recipes=RECIPES, models=("mlp", "lm"), png: Optional[str] = "loss_curves.png",
        verbose: bool = True) -> dict[str, dict[str, np.ndarray]]:
    """Trains each model with each recipe; returns {model: {recipe: loss curve}} and writes `png`."""
    log_probs, floor = markov_chain(cfg.vocab, cfg.seed)
    curves: dict[str, dict[str, np.ndarray]] = {m: {} for m in models}
    if verbose:
        print(f"backend {jax.default_backend()}, {cfg}\nLM entropy floor {floor:.3f} nats")
    for model in models:
        task = mlp_task(cfg) if model == "mlp" else lm_task(cfg, log_probs)
        for recipe in recipes:
            t0 = time.perf_counter()
            curve = train(task, recipe, cfg)
            curves[model][recipe] = curve
            if verbose:
                print(f"{model:>4} {recipe:>13}: first {curve[0]:.4f}  final {final_loss(curve):.4f}  "
                      f"({time.perf_counter() - t0:.1f} s)")
    if png:
        out = plot(curves, png, floor)
        if out and verbose:
            print(f"wrote {out}")
    return curves


def main(argv=None) -> dict[str, dict[str, float]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        if field.type == "bool":
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            p.add_argument(flag, type=type(field.default), default=field.default)
    p.add_argument("--recipes", default=",".join(RECIPES), help="comma-separated recipe names")
    p.add_argument("--models", default="mlp,lm", help="comma-separated: mlp, lm")
    p.add_argument("--png", default="loss_curves.png", help="loss-curve image ('' for none)")
    a = p.parse_args(argv)
    cfg = Config(**{f.name: getattr(a, f.name) for f in dataclasses.fields(Config)})
    curves = run(cfg, tuple(a.recipes.split(",")), tuple(a.models.split(",")), a.png or None)
    return {m: {r: final_loss(c) for r, c in by.items()} for m, by in curves.items()}


if __name__ == "__main__":
    main(sys.argv[1:])
