"""Runs every kernel path once on odd shapes, for `compute-sanitizer --tool memcheck`.

    compute-sanitizer --tool memcheck python benchmarks/memcheck_odd_shapes.py

Odd M/N/K exercise the masks (M=1 decode, M and N one past a tile, K not a multiple of the kernels' K
tile); each result is also checked against the jnp reference so a silent out-of-bounds read that
changes numbers fails here too.
"""

import jax
import jax.numpy as jnp
import numpy as np

import jax_blockscale as jb

PAIRS = [("mxfp8", "mxfp8"), ("mxfp6_e2m3", "mxfp6_e3m2"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"),
         ("mxfp8", "mxfp4"), ("bf16", "mxfp4"), ("fp8_block", "fp8_block")]
SHAPES = [(1, 129, 96), (129, 65, 200), (3, 2, 7, 33)]


def _q(x, fmt, side):
    return jb.quantize_operand(x, fmt, side=side)


def main():
    rng = np.random.default_rng(0)
    worst = 0.0
    for fa, fb in PAIRS:
        for shape in SHAPES:
            *lead, m, n, k = shape if len(shape) == 4 else (None, *shape)
            lead = [d for d in lead if d is not None]
            a = _q(jnp.asarray(rng.standard_normal((*lead, m, k)), jnp.float32), fa, "a")
            b = _q(jnp.asarray(rng.standard_normal((n, k)), jnp.float32), fb, "b")
            out = jax.block_until_ready(jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32))(a, b))
            ref = jb.reference.matmul(a, b)
            err = float(jnp.linalg.norm(out - ref) / jnp.maximum(jnp.linalg.norm(ref), 1e-30))
            worst = max(worst, err)
            print(f"{fa} x {fb} {shape}: rel err {err:.2e} ({jb.explain(a, b).path})")
    print(f"worst rel err {worst:.2e}")
    assert worst < 2e-3


if __name__ == "__main__":
    main()
