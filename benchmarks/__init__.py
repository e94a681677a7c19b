"""Benchmarks for jax_blockscale; `python -m benchmarks.suite` runs the Hopper speed suite (issue #4)."""
