"""Private: Triton kernels and their launchers. The public entry point is `jax_blockscale.matmul`."""
