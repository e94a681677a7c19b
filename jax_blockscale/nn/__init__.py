"""Flax layers with block-scaled recipes: `jax_blockscale.nn.linen.Dense` and `jax_blockscale.nn.nnx.Linear`.

Flax is optional: this package imports nothing from it; `linen` and `nnx` are imported on first access
(`from jax_blockscale.nn import linen` or `jax_blockscale.nn.nnx`), and need `pip install flax`.
"""

from __future__ import annotations

import importlib

__all__ = ["linen", "nnx"]


def __getattr__(name: str):
    if name in __all__:
        try:
            return importlib.import_module(f".{name}", __name__)
        except ImportError as e:
            if getattr(e, "name", None) and e.name.split(".")[0] == "flax":
                raise ImportError(f"jax_blockscale.nn.{name} needs Flax: pip install flax") from e
            raise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
