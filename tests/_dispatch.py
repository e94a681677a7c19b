"""Test helpers: turn a dispatch entry's opt-in (backends.KernelEntry.opt_in) off or on for one test or module."""

import dataclasses

from jax_blockscale import backends


def set_opt_in(monkeypatch, target: str, module: str, opt_in) -> None:
    """Give every entry of `module` on `target` this `opt_in` (None: automatic dispatch may choose it)."""
    entries = tuple(dataclasses.replace(e, opt_in=opt_in) if e.module == module else e
                    for e in backends.KERNEL_TABLE[target])
    monkeypatch.setitem(backends.KERNEL_TABLE, target, entries)


def enable_entry(monkeypatch, target: str, module: str) -> None:
    """Let automatic dispatch on `target` choose `module`'s entries (as if they were not opt-in)."""
    set_opt_in(monkeypatch, target, module, None)
