"""Eight host CPU devices for the whole test session, so tests/test_sharding.py can build meshes on a
CPU-only machine.

XLA reads XLA_FLAGS when JAX first initializes its CPU backend; pytest imports this file before any test
module, so the flag is in place even when another test module imports jax first. Tests that do not ask for
a sharding still run on one device (jax's default placement), so this changes nothing for them.
"""

import os

_FLAG = "--xla_force_host_platform_device_count=8"

if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
