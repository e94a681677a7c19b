"""Tuned launch configurations: one JSON table per device kind, a heuristic for everything else.

`_triton/configs/<device slug>.json` (slug: the lower-cased `jax.Device.device_kind` with runs of other
characters as "_", e.g. "nvidia_h200") maps each kernel module to rules tried in order:

    {"kernels": {"block_fp8": [{"rows": [1, 16], "n": [1, 8192], "config": {"block_m": 64, ...}}, ...]}}

A rule matches a problem with an unbatched weight when each of its "rows" (activation rows: batch * M),
"n" and "k" ranges (inclusive) holds it; a missing range matches anything. Batched weights always take
the heuristic. The first match wins, so
exact shapes go before shape classes. No match, or no table for this device: the kernel module's
`default_config(p, target)` heuristic. Nothing is autotuned at run time: a fresh process would pay for it
on every shape. `benchmarks/tune.py` measures candidates on a device and writes the table.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any, Optional

from .problem import GemmProblem, TileConfig

TABLE_DIR = Path(__file__).with_name("configs")


def device_slug(device_kind: str) -> str:
    """"NVIDIA H100 80GB HBM3" -> "nvidia_h100_80gb_hbm3"."""
    return re.sub(r"[^a-z0-9]+", "_", device_kind.lower()).strip("_")


@functools.lru_cache(maxsize=None)
def load_table(device_kind: str) -> Optional[dict[str, Any]]:
    """The parsed table for `device_kind`, or None when no file exists for it."""
    path = TABLE_DIR / f"{device_slug(device_kind)}.json"
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _holds(bounds: Optional[list[int]], value: int) -> bool:
    return bounds is None or bounds[0] <= value <= bounds[1]


def lookup(table: Optional[dict[str, Any]], kernel: str, p: GemmProblem) -> Optional[TileConfig]:
    """The first rule of `table` for `kernel` that matches `p`, as a TileConfig; None if none does."""
    if table is None:
        return None
    if p.b_batched:  # rules are measured on one shared weight (swapped decode needs it): heuristics here
        return None
    rows = p.batch * p.m
    for rule in table.get("kernels", {}).get(kernel, ()):
        if _holds(rule.get("rows"), rows) and _holds(rule.get("n"), p.n) and _holds(rule.get("k"), p.k):
            return TileConfig(**rule["config"])
    return None


def select(kernel: str, launcher, p: GemmProblem, target: str, device_kind: Optional[str]) -> TileConfig:
    """The configuration a launch uses when the caller gives none: the device's table, else the heuristic."""
    table = load_table(device_kind) if device_kind else None
    found = lookup(table, kernel, p)
    if found is not None:
        return found
    return launcher.default_config(p, target)
