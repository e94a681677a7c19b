"""examples/train_tiny.py: quantized training tracks bf16 (the MLP and the tiny transformer LM).

Margin: every run starts from the same weights and sees the same batches, so the recipes differ only by
arithmetic. The final loss (mean of the last 10% of steps) of mxfp8 and DeepSeek FP8 must be within 3% of
bf16's (relative); the differences seen on CPU are at most 0.3%. Both models must also have learned
(final loss below half the first).
"""

import pathlib
import sys

import pytest

from _examples import load_example

ROOT = pathlib.Path(__file__).resolve().parents[1]
MARGIN = 0.03


@pytest.fixture(scope="module")
def train_tiny():
    yield from load_example("train_tiny")


def test_quantized_losses_track_bf16(train_tiny, tmp_path):
    png = tmp_path / "loss.png"
    curves = train_tiny.run(train_tiny.Config(), png=str(png), verbose=False)
    assert set(curves) == {"mlp", "lm"}
    for model, by_recipe in curves.items():
        assert set(by_recipe) == {"bf16", "mxfp8", "fp8_deepseek"}
        base = train_tiny.final_loss(by_recipe["bf16"])
        assert base < 0.5 * by_recipe["bf16"][0], f"{model} did not learn"
        for recipe in ("mxfp8", "fp8_deepseek"):
            final = train_tiny.final_loss(by_recipe[recipe])
            assert abs(final - base) <= MARGIN * base, f"{model} {recipe}: {final:.4f} vs bf16 {base:.4f}"
    pytest.importorskip("matplotlib")
    assert png.stat().st_size > 10_000


def test_plot_is_skipped_without_matplotlib(train_tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    import numpy as np

    assert train_tiny.plot({"mlp": {"bf16": np.ones(3)}}, str(tmp_path / "x.png")) is None
    assert "skipping the loss-curve plot" in capsys.readouterr().out
    assert not (tmp_path / "x.png").exists()


def test_fused_attention_matches_the_naive_core(train_tiny):
    """The default attention core (jax.nn.dot_product_attention; XLA's off NVIDIA GPUs) is the same causal
    softmax attention as the naive one the benchmarks used before: same outputs to bf16 rounding, and the
    first position attends to itself only."""
    import jax
    import jax.numpy as jnp

    q, k, v = (jax.random.normal(key, (2, 48, 3, 32), jnp.float32).astype(jnp.bfloat16)
               for key in jax.random.split(jax.random.key(1), 3))
    fused = train_tiny.causal_attention(q, k, v, "fused").astype(jnp.float32)
    naive = train_tiny.causal_attention(q, k, v, "naive").astype(jnp.float32)
    assert fused.shape == naive.shape == q.shape
    assert float(jnp.max(jnp.abs(fused - naive))) <= 2e-2
    assert bool(jnp.all(fused[:, 0] == v[:, 0].astype(jnp.float32)))
    if jax.default_backend() == "cpu":
        assert train_tiny.attention_implementation() == "xla"
    with pytest.raises(ValueError, match="attention must be one of"):
        train_tiny.causal_attention(q, k, v, "flash")
