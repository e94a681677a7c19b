"""Eight host CPU devices for the whole test session, so tests/test_sharding.py can build meshes on a
CPU-only machine; the `hopper` fixture for lowering tests (target detection sees an H100).

XLA reads XLA_FLAGS when JAX first initializes its CPU backend; pytest imports this file before any test
module, so the flag is in place even when another test module imports jax first. Tests that do not ask for
a sharding still run on one device (jax's default placement), so this changes nothing for them.
"""

import os

import pytest

_FLAG = "--xla_force_host_platform_device_count=8"

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()


# Opt-in exhaustive grids (the GPU tests' full cross products). Off by default so that
# `pytest tests/test_gpu_*.py` stays a few minutes on one GPU; `--exhaustive` (or `-m exhaustive`) runs them.
def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="also run the tests marked `exhaustive` (full GPU grids)")


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: part of a full grid; runs with --exhaustive or -m exhaustive")


def pytest_collection_modifyitems(config, items):
    import pytest

    if config.getoption("--exhaustive") or "exhaustive" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="exhaustive grid: run with --exhaustive")
    for item in items:
        if "exhaustive" in item.keywords:
            item.add_marker(skip)


class FakeH100:
    """What target detection reads from a device, as an H100 reports it (for lowering on a CPU machine)."""

    platform = "gpu"
    compute_capability = "9.0"
    device_kind = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def hopper(monkeypatch):
    """Target detection sees an H100 (this machine has none); everything after it is the real lowering."""
    from jax_blockscale import primitive

    monkeypatch.setattr(primitive, "_lowering_device", lambda ctx: FakeH100())
