"""Greedy generation with a decoder-only transformer whose projections use pre-quantized weights; tokens/s.

    python examples/generate.py --tiny                       # CPU: a small model, every format, < 1 min
    python examples/generate.py                              # GPU: d_model 4096, 4 layers, ffn 14336
    python examples/generate.py --batch 16 --kernel-time     # + CUPTI kernel time per token, top kernels

The model is Flax linen: token embedding, `layers` pre-RMSNorm blocks (fused qkv, RoPE, multi-head attention
over a bf16 KV cache, output projection, SwiGLU MLP with a fused gate/up projection and a down projection),
a final RMSNorm and an LM head. Every projection is a `jax_blockscale.nn.linen.Dense`; the LM head too, kept
bf16 unless `--quantize-head`. Weights are random (initialized once, in bf16, shared by every format): the
model is untrained, which is enough to measure speed and to compare the quantized model's logits with the
bf16 model's. The default size makes a decode step bound by reading the weights on an H100 (~2.5 GB of bf16
weights per token at batch 1, against ~17 MB of KV cache).

Weight formats and the recipe each one is served with (`quantize_params` quantizes every kernel once):

| --formats | recipe (activations x weights) | why |
|---|---|---|
| bf16 | bf16 x bf16 (XLA dot) | the baseline |
| mxfp4 | bf16 x mxfp4 (`w4a16`) | weight-only: no per-call quantization of the activations |
| nvfp4 | bf16 x nvfp4 | weight-only, as above |
| mxfp8 | bf16 x mxfp8 e4m3 | weight-only, as above |
| fp8_block | bf16 x fp8 128x128 (`w8a16_fp8`) | weight-only, as above: DeepSeek's FP8 checkpoint format (one row: `decode`'s GEMV, more: `dense_x_block_fp8`) |

Timing (`--loop fori`, the default): after prefill, the `--gen` decode steps run inside one jitted
`jax.lax.fori_loop` whose carry is the KV cache, the current token and the token buffer. Each step is the
whole decode step: embedding, every layer, the head and the greedy argmax; nothing goes to the host until
the loop ends. Time per token = wall clock of one such call (after warm-up calls; median of `--repeats`) /
`--gen`, so the number holds every kernel and no Python dispatch. `--loop step` instead calls one jitted
step per token from Python, with the cache donated (updated in place); the difference between the two is
the host's per-token dispatch cost. Tokens/s counts every sequence of the batch.

Check: the quantized model is run teacher-forced on the bf16 model's greedy tokens for `--check-steps`
steps (prefill included), so both see the same inputs; it reports how often its greedy token equals bf16's
and the relative L2 error of its logits, and whether the free-running greedy sequences start out identical.

`--kernel-time` traces the decode calls (`benchmarks/_kernel_time.py`: CUPTI via jax.profiler, or
torch.profiler) and prints the summed kernel time per token and the top kernels, beside which kernel
`jax_blockscale.explain` chooses for each projection (batch <= 64 rows: the `decode` entry for MX weights).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from typing import NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jax_blockscale as jb
from jax_blockscale.nn.linen import Dense, quantize_params
from jax_blockscale.recipes import Recipe, get_recipe

# Served recipe per weight format (module docstring's table).
WEIGHT_RECIPES: dict[str, Recipe] = {
    "bf16": get_recipe("bf16"),
    "mxfp4": get_recipe("w4a16"),
    "nvfp4": Recipe("w4a16_nvfp4", (None, "nvfp4"), inference=True),
    "mxfp8": Recipe("w8a16_mxfp8", (None, "mxfp8_e4m3"), inference=True),
    "fp8_block": get_recipe("w8a16_fp8"),
}
FORMATS = tuple(WEIGHT_RECIPES)
# The check's bounds (teacher-forced against bf16, `compare`): the least share of steps whose greedy token is
# bf16's, and the largest relative error of the logits. A random model's largest logits (about N(0, 1) over
# the vocabulary) lie close together, so a few greedy flips are expected, more with 4-bit weights.
MIN_AGREEMENT = {"bf16": 1.0, "mxfp8": 0.85, "fp8_block": 0.85, "mxfp4": 0.6, "nvfp4": 0.6}
MAX_LOGITS_ERR = {"bf16": 0.0, "mxfp8": 0.1, "fp8_block": 0.1, "mxfp4": 0.3, "nvfp4": 0.3}


@dataclasses.dataclass(frozen=True)
class Config:
    """Model and run sizes. The defaults are GPU-sized; `TINY` is for the CPU."""

    d_model: int = 4096
    layers: int = 4
    heads: int = 32
    ffn: int = 14336
    vocab: int = 32000
    prompt: int = 128
    gen: int = 128
    batch: int = 1
    seed: int = 0

    @property
    def max_len(self) -> int:
        return self.prompt + self.gen


# K of every projection a multiple of 256: the primitive pads K to that per call, copying the weight (README).
TINY = Config(d_model=256, layers=2, heads=4, ffn=512, vocab=512, prompt=16, gen=16)


# ------------------------------------------------------------------------------------------------- model


class KV(NamedTuple):
    """One layer's cache: keys and values (B, heads, max_len, head_dim), bf16. Heads before positions, so
    both attention products are batched dots in XLA's canonical layout and read the cache without a
    transpose."""

    k: jax.Array
    v: jax.Array


def empty_cache(cfg: Config) -> tuple[KV, ...]:
    shape = (cfg.batch, cfg.heads, cfg.max_len, cfg.d_model // cfg.heads)
    return tuple(KV(jnp.zeros(shape, jnp.bfloat16), jnp.zeros(shape, jnp.bfloat16)) for _ in range(cfg.layers))


def rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary position embedding of x (B, H, T, D) at positions (T,) (rotate-half form, base 10000)."""
    half = x.shape[-1] // 2
    freqs = 10000.0 ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[:, None] * freqs  # (T, half)
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _dense(features: int, recipe: Recipe, name: str, init_scale: float = 1.0) -> Dense:
    # param_dtype bf16: the bf16 baseline then reads 2 bytes per weight, with no per-call cast.
    init = nn.initializers.variance_scaling(init_scale, "fan_in", "truncated_normal")  # 1.0: lecun_normal
    return Dense(features, recipe=recipe, use_bias=False, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                 kernel_init=init, name=name)


def _norm(name: str) -> nn.RMSNorm:
    return nn.RMSNorm(dtype=jnp.bfloat16, param_dtype=jnp.bfloat16, name=name)


class Block(nn.Module):
    cfg: Config
    recipe: Recipe

    @nn.compact
    def __call__(self, x: jax.Array, cache: KV, pos: jax.Array) -> tuple[jax.Array, KV]:
        """x (B, T, D) at positions pos .. pos + T - 1; cache positions < pos hold the earlier tokens."""
        c, (b, t, d) = self.cfg, x.shape
        h, hd = c.heads, d // c.heads
        positions = pos + jnp.arange(t, dtype=jnp.int32)
        qkv = _dense(3 * d, self.recipe, "qkv")(_norm("attn_norm")(x))
        q, k, v = jnp.moveaxis(qkv.reshape(b, t, 3, h, hd), (2, 3), (0, 2))  # each (B, H, T, hd)
        q, k = rope(q, positions), rope(k, positions)
        # In place inside the decode loop: the cache is part of the loop's carry.
        start = (0, 0, pos, 0)
        cache = KV(jax.lax.dynamic_update_slice(cache.k, k.astype(jnp.bfloat16), start),
                   jax.lax.dynamic_update_slice(cache.v, v.astype(jnp.bfloat16), start))
        scores = jnp.einsum("bhtd,bhsd->bhts", q, cache.k, preferred_element_type=jnp.float32) / math.sqrt(hd)
        visible = jnp.arange(c.max_len)[None, :] <= positions[:, None]  # (T, max_len): causal, and no
        scores = jnp.where(visible, scores, -1e30)                       # unwritten cache entries
        probs = jax.nn.softmax(scores, axis=-1).astype(jnp.bfloat16)
        attn = jnp.einsum("bhts,bhsd->bhtd", probs, cache.v)
        # Projections into the residual stream start smaller (GPT-2's 1 / (2 * layers) variance), so that, as in
        # a trained model, each layer updates the stream rather than replacing it with its own random output.
        out_scale = 1.0 / (2 * c.layers)
        x = x + _dense(d, self.recipe, "out", out_scale)(jnp.moveaxis(attn, 1, 2).reshape(b, t, d))
        gate, up = jnp.split(_dense(2 * c.ffn, self.recipe, "gate_up")(_norm("mlp_norm")(x)), 2, axis=-1)
        x = x + _dense(d, self.recipe, "down", out_scale)(nn.silu(gate) * up)
        return x, cache


class DecoderLM(nn.Module):
    cfg: Config
    recipe: Recipe
    head_recipe: Recipe

    @nn.compact
    def __call__(self, tokens: jax.Array, cache: tuple[KV, ...], pos: jax.Array
                 ) -> tuple[jax.Array, tuple[KV, ...]]:
        """tokens (B, T) int32 at positions pos..pos+T-1 -> (the last position's logits (B, V) float32,
        the updated cache). The head runs on the last position only: prefill needs no other logits."""
        c = self.cfg
        # Unit-variance embeddings: the residual stream starts at the scale the RMSNorms normalize to.
        x = nn.Embed(c.vocab, c.d_model, dtype=jnp.bfloat16, param_dtype=jnp.bfloat16,
                     embedding_init=nn.initializers.normal(1.0), name="embed")(tokens)
        new_cache = []
        for i in range(c.layers):  # unrolled: each layer's weights are whole jit arguments, never sliced
            x, layer_cache = Block(c, self.recipe, name=f"layer_{i}")(x, cache[i], pos)
            new_cache.append(layer_cache)
        logits = _dense(c.vocab, self.head_recipe, "head")(_norm("final_norm")(x[:, -1]))
        return logits.astype(jnp.float32), tuple(new_cache)


# ------------------------------------------------------------------------------------------- generation


def model_for(cfg: Config, fmt: str, quantize_head: bool) -> DecoderLM:
    recipe = WEIGHT_RECIPES[fmt]
    return DecoderLM(cfg, recipe, recipe if quantize_head else WEIGHT_RECIPES["bf16"])


def init_params(cfg: Config) -> dict:
    """Random bf16 weights (the same tree serves every format before quantization)."""
    model = model_for(cfg, "bf16", False)
    tokens = jnp.zeros((cfg.batch, 1), jnp.int32)
    return jax.jit(model.init)(jax.random.key(cfg.seed), tokens, empty_cache(cfg), jnp.int32(0))


def serving_params(model: DecoderLM, params: dict) -> dict:
    """Every block-scaled Dense kernel as a BlockScaledArray in its recipe's weight format (once)."""
    if not model.recipe.quantizes and not model.head_recipe.quantizes:
        return params
    c = model.cfg
    return quantize_params(model, params, jnp.zeros((c.batch, 1), jnp.int32), empty_cache(c), jnp.int32(0))


def make_prefill(model: DecoderLM):
    @jax.jit
    def prefill(params, prompt, cache):
        logits, cache = model.apply(params, prompt, cache, jnp.int32(0))
        return logits, jnp.argmax(logits, axis=-1).astype(jnp.int32), cache
    return prefill


def make_decode(model: DecoderLM, steps: int, record_logits: bool = False):
    """jit(params, cache, token (B,), pos, forced (B, steps) or None) -> (greedy tokens (B, steps), logits
    (B, steps, V) or None, cache). Step i feeds the token at position pos + i and predicts the next one; its
    input is the previous step's greedy token, or forced[:, i - 1] when teacher-forced."""

    @jax.jit
    def decode(params, cache, token, pos, forced=None):
        b = token.shape[0]
        out = jnp.zeros((b, steps), jnp.int32)
        logits_out = jnp.zeros((b, steps, model.cfg.vocab), jnp.float32) if record_logits else None

        def body(i, carry):
            cache, token, out, logits_out = carry
            logits, cache = model.apply(params, token[:, None], cache, pos + i)
            greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            out = jax.lax.dynamic_update_slice(out, greedy[:, None], (0, i))
            if record_logits:
                logits_out = jax.lax.dynamic_update_slice(logits_out, logits[:, None], (0, i, 0))
            nxt = greedy if forced is None else jax.lax.dynamic_index_in_dim(forced, i, 1, keepdims=False)
            return cache, nxt, out, logits_out

        cache, _, out, logits_out = jax.lax.fori_loop(0, steps, body, (cache, token, out, logits_out))
        return out, logits_out, cache

    return decode


def make_step(model: DecoderLM):
    """One decode step per call, the cache donated: (params, cache, token, pos) -> (greedy, cache, pos + 1)."""

    def step(params, cache, token, pos):
        logits, cache = model.apply(params, token[:, None], cache, pos)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), cache, pos + 1

    return jax.jit(step, donate_argnums=(1,))


def _copy(tree):
    return jax.tree.map(jnp.copy, tree)


class Runner:
    """Generation with one format: compiled prefill, decode loop and per-token step, sharing one cache."""

    def __init__(self, cfg: Config, fmt: str, params: dict, quantize_head: bool, loop: str):
        self.cfg, self.fmt, self.loop = cfg, fmt, loop
        self.model = model_for(cfg, fmt, quantize_head)
        self.params = serving_params(self.model, params)
        self.prefill = make_prefill(self.model)
        self.decode = make_decode(self.model, cfg.gen)
        self.step = make_step(self.model) if loop == "step" else None
        self.pos0 = jnp.int32(cfg.prompt)  # on the device once, not transferred per generation

    def start(self, prompt: jax.Array):
        """Prefill: (its logits, first greedy token, cache) for the prompt."""
        logits, token, cache = self.prefill(self.params, prompt, empty_cache(self.cfg))
        self.prompt_state = (token, cache)
        return logits, token, cache

    def generate(self):
        """The `gen` decode steps from the prefilled state, as timed: greedy tokens (B, gen), unblocked."""
        token, cache = self.prompt_state
        pos = self.pos0
        if self.loop == "fori":
            return self.decode(self.params, cache, token, pos)[0]
        out = []
        for _ in range(self.cfg.gen):
            token, cache, pos = self.step(self.params, cache, token, pos)
            out.append(token)
        return jnp.stack(out, axis=1)

    def timed(self, repeats: int, warmup: int = 2) -> tuple[float, np.ndarray]:
        """(median seconds per decode step, the greedy tokens). In step mode the donated cache is a fresh
        copy for every run, made before the clock starts."""
        token, cache0 = self.prompt_state
        tokens = None
        times = []
        for r in range(warmup + repeats):
            if self.loop == "step":
                self.prompt_state = (token, jax.block_until_ready(_copy(cache0)))
            t0 = time.perf_counter()
            tokens = jax.block_until_ready(self.generate())
            if r >= warmup:
                times.append(time.perf_counter() - t0)
        self.prompt_state = (token, cache0)
        return statistics.median(times) / self.cfg.gen, np.asarray(tokens)

    def weight_bytes(self) -> int:
        """Bytes of weights one decode step reads: every parameter but the embedding table (B rows of it
        are gathered)."""
        leaves = jax.tree_util.tree_leaves_with_path(self.params)
        return sum(x.nbytes for path, x in leaves if "embed" not in jax.tree_util.keystr(path))


# ------------------------------------------------------------------------------------------------ checks


@dataclasses.dataclass
class Check:
    agreement: float  # teacher-forced steps whose greedy token equals bf16's
    logits_rel_err: float  # ||logits - bf16 logits|| / ||bf16 logits|| over the same steps
    same_prefix: int  # free-running: leading generated tokens identical to bf16's (the worst batch row)
    passed: bool


def teacher_forced_logits(runner: Runner, prompt: jax.Array, inputs: Optional[jax.Array], steps: int):
    """Logits (B, steps, V) of the prefill and then of steps - 1 decode steps, and the greedy tokens of those
    steps (B, steps). `inputs` (B, >= steps - 1): the tokens fed to the decode steps, the first one included
    (the bf16 model's greedy tokens, so that one greedy flip at prefill cannot put a different token in the
    KV cache for every later step); None: the model's own greedy tokens."""
    logits0, first, cache = runner.start(prompt)
    token, forced = (first, None) if inputs is None else (inputs[:, 0], inputs[:, 1:])
    toks, logits, _ = make_decode(runner.model, steps - 1, record_logits=True)(
        runner.params, cache, token, jnp.int32(runner.cfg.prompt), forced)
    return (jnp.concatenate([logits0[:, None], logits], axis=1),
            jnp.concatenate([first[:, None], toks], axis=1))


def compare(fmt: str, logits: jax.Array, ref_logits: jax.Array, tokens: np.ndarray,
            ref_tokens: np.ndarray) -> Check:
    logits, ref_logits = np.asarray(logits, np.float64), np.asarray(ref_logits, np.float64)
    agreement = float(np.mean(np.argmax(logits, -1) == np.argmax(ref_logits, -1)))
    err = float(np.linalg.norm(logits - ref_logits) / max(np.linalg.norm(ref_logits), 1e-30))
    differ = tokens != ref_tokens
    prefix = int(np.min(np.where(differ.any(axis=1), differ.argmax(axis=1), tokens.shape[1])))
    return Check(agreement, err, prefix, agreement >= MIN_AGREEMENT[fmt] and err <= MAX_LOGITS_ERR[fmt])


# ------------------------------------------------------------------------------------------- kernel time


def _kernel_time_module():
    try:
        from benchmarks import _kernel_time
    except ImportError:  # run as `python examples/generate.py`: the repository root is not on the path
        import pathlib
        sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
        from benchmarks import _kernel_time
    return _kernel_time


def kernel_profile(runner: Runner, top: int, calls: int = 2):
    """Kernel time per decode step (CUPTI) over `calls` timed-mode generations; prints the top kernels."""
    kt = _kernel_time_module()
    token, cache0 = runner.prompt_state
    # Step mode donates the cache: fresh copies made before the trace, so their copies are not counted.
    caches = iter([jax.block_until_ready(_copy(cache0)) for _ in range(calls)] if runner.loop == "step" else [])

    def run():
        if runner.loop == "step":
            runner.prompt_state = (token, next(caches))
        return runner.generate()

    prof = kt.profile(run, calls=calls, ops_per_call=runner.cfg.gen)
    runner.prompt_state = (token, cache0)
    if not prof.ok:
        print(f"    kernel time: none ({prof.note})")
        return prof
    split = kt.breakdown(prof)
    print(f"    kernel time {prof.kernel_s * 1e6:.1f} us/step = {prof.kernel_s * 1e6 / runner.cfg.batch:.1f} us/token "
          f"({prof.source}; gemm {split[kt.GEMM] * 1e6:.1f}, quantization {split[kt.QUANT] * 1e6:.1f}, other "
          f"{split[kt.OTHER] * 1e6:.1f} us/step), {prof.launches:.1f} launches/step; top kernels per step:")
    for k in prof.top(top):
        print(f"      {k.seconds * 1e6:8.2f} us  x{k.launches:<5.3g} {k.category:<12} {k.name[:110]}")
    return prof


def explain_kernels(runner: Runner) -> list[str]:
    """Which kernel `jb.explain` picks for each distinct projection of a decode step (rows = batch)."""
    lines, seen = [], set()
    flat = jax.tree_util.tree_flatten_with_path(
        runner.params, is_leaf=lambda x: isinstance(x, jb.BlockScaledArray))[0]
    for path, leaf in flat:
        if not isinstance(leaf, jb.BlockScaledArray) or leaf.shape in seen:
            continue
        seen.add(leaf.shape)
        name = [getattr(k, "key", "") for k in path][-2]  # ("params", "layer_0", "qkv", "kernel") -> qkv
        recipe = runner.model.head_recipe if name == "head" else runner.model.recipe
        act = recipe.fprop[0] or jax.ShapeDtypeStruct((runner.cfg.batch, leaf.shape[-1]), jnp.bfloat16)
        choice = jb.explain(act, leaf, rows=runner.cfg.batch)
        lines.append(f"{name} (N {leaf.shape[0]}, K {leaf.shape[1]}): {choice.kernel or choice.path}")
    return lines


# ------------------------------------------------------------------------------------------------- main


def run(cfg: Config, formats=FORMATS, *, loop: str = "fori", quantize_head: bool = False, repeats: int = 3,
        check_steps: int = 32, kernel_time: bool = False, top: int = 8, verbose: bool = True) -> dict[str, dict]:
    """Generates with each format; returns {format: {ms_per_step, tokens_per_s, weight_bytes, check, ...}}."""
    if loop not in ("fori", "step"):
        raise ValueError(f"loop must be 'fori' or 'step', got {loop!r}")
    if cfg.d_model % cfg.heads or (cfg.d_model // cfg.heads) % 2:
        raise ValueError(f"d_model {cfg.d_model} must split into {cfg.heads} heads of an even size")
    unknown = [f for f in formats if f not in WEIGHT_RECIPES]
    if unknown:
        raise ValueError(f"unknown formats {unknown}; choose from {', '.join(FORMATS)}")
    if not 1 <= check_steps <= cfg.gen:
        raise ValueError(f"check_steps must be in [1, gen={cfg.gen}], got {check_steps}")
    say = print if verbose else (lambda *a, **k: None)
    say(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), {cfg}, loop {loop}, "
        f"head {'quantized' if quantize_head else 'bf16'}; random weights (untrained)")
    params = init_params(cfg)
    prompt = jax.random.randint(jax.random.key(cfg.seed + 1), (cfg.batch, cfg.prompt), 0, cfg.vocab, jnp.int32)
    # bf16 first and always: it is the reference of the checks and the speedups.
    ordered = ["bf16"] + [f for f in formats if f != "bf16"]
    results: dict[str, dict] = {}
    for fmt in ordered:
        runner = Runner(cfg, fmt, params, quantize_head, loop)
        _, first, _ = runner.start(prompt)
        sec, tokens = runner.timed(repeats)
        tokens = np.concatenate([np.asarray(first)[:, None], tokens], axis=1)
        if fmt == "bf16":  # the reference: its free-running steps are the inputs the others are forced to
            ref_logits, ref_steps = teacher_forced_logits(runner, prompt, None, check_steps)
            ref_tokens = tokens
            check = compare(fmt, ref_logits, ref_logits, tokens, ref_tokens)
        else:
            logits, _ = teacher_forced_logits(runner, prompt, ref_steps, check_steps)
            check = compare(fmt, logits, ref_logits, tokens, ref_tokens)
        res = results[fmt] = dict(ms_per_step=sec * 1e3, tokens_per_s=cfg.batch / sec,
                                  weight_bytes=runner.weight_bytes(), check=check, tokens=tokens)
        gbs = res["weight_bytes"] / sec / 1e9
        say(f"{fmt:>9}: {res['ms_per_step']:8.3f} ms/step {res['tokens_per_s']:9.1f} tokens/s "
            f"{results['bf16']['ms_per_step'] / res['ms_per_step']:5.2f}x bf16   weights "
            f"{res['weight_bytes'] / 1e9:.3f} GB/step, {gbs:.0f} GB/s")
        say(f"           check: greedy = bf16's on {check.agreement:.0%} of {check_steps} teacher-forced steps "
            f"(>= {MIN_AGREEMENT[fmt]:.0%}), logits rel err {check.logits_rel_err:.3f} (<= {MAX_LOGITS_ERR[fmt]}), "
            f"free-running: first {check.same_prefix}/{tokens.shape[1]} tokens identical: "
            f"{'ok' if check.passed else 'FAILED'}")
        if kernel_time:
            say("    kernels: " + ("; ".join(explain_kernels(runner)) if fmt != "bf16" else "XLA dots"))
            res["kernel_profile"] = kernel_profile(runner, top)
        del runner  # its quantized weights: one format's tree in memory at a time
    say(summary(cfg, results, loop))
    return results


def summary(cfg: Config, results: dict[str, dict], loop: str) -> str:
    """A markdown table of the results (the README's)."""
    base = results["bf16"]["ms_per_step"]
    rows = [f"\nbatch {cfg.batch}, prompt {cfg.prompt}, {cfg.gen} decode steps ({loop} loop), wall clock per step:",
            "| weights | ms/step | tokens/s | vs bf16 | check |", "|---|---|---|---|---|"]
    for fmt, r in results.items():
        c = r["check"]
        rows.append(f"| {fmt} | {r['ms_per_step']:.3f} | {r['tokens_per_s']:.0f} | {base / r['ms_per_step']:.2f}x | "
                    f"{'ok' if c.passed else 'FAILED'} ({c.agreement:.0%}, {c.logits_rel_err:.3f}) |")
    return "\n".join(rows)


def main(argv=None) -> dict[str, dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help=f"CPU-sized model: {TINY}")
    for field in dataclasses.fields(Config):
        p.add_argument("--" + field.name.replace("_", "-"), type=int, default=None,
                       help=f"default {field.default} ({getattr(TINY, field.name)} with --tiny)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma-separated weight formats")
    p.add_argument("--loop", choices=("fori", "step"), default="fori",
                   help="fori: all decode steps in one jitted fori_loop (default); step: one jitted call per "
                        "token with the cache donated")
    p.add_argument("--quantize-head", action="store_true", help="quantize the LM head too")
    p.add_argument("--repeats", type=int, default=3, help="timed generations per format (median)")
    p.add_argument("--check-steps", type=int, default=32, help="teacher-forced steps compared with bf16")
    p.add_argument("--kernel-time", action="store_true", help="CUPTI kernel time per token and top kernels")
    p.add_argument("--top", type=int, default=8, help="kernels listed with --kernel-time")
    a = p.parse_args(argv)
    base = TINY if a.tiny else Config()
    cfg = dataclasses.replace(base, **{f.name: getattr(a, f.name) for f in dataclasses.fields(Config)
                                       if getattr(a, f.name) is not None})
    return run(cfg, tuple(a.formats.split(",")), loop=a.loop, quantize_head=a.quantize_head, repeats=a.repeats,
               check_steps=min(a.check_steps, cfg.gen), kernel_time=a.kernel_time, top=a.top)


if __name__ == "__main__":
    main(sys.argv[1:])
