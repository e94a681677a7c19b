"""Test helper: turn an opt-in dispatch entry (backends.KernelEntry.opt_in) on for one test or module."""

import dataclasses

from jax_blockscale import backends


def enable_entry(monkeypatch, target: str, module: str) -> None:
    """Let automatic dispatch on `target` choose `module`'s entries (as if they were not opt-in)."""
    entries = tuple(dataclasses.replace(e, opt_in=None) if e.module == module else e
                    for e in backends.KERNEL_TABLE[target])
    monkeypatch.setitem(backends.KERNEL_TABLE, target, entries)
