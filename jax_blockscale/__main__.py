"""Demo: `python -m jax_blockscale [--m M --n N --k K]`.

Prints the JAX backend and target, which path each format pair takes here, then quantizes and multiplies a
matrix in each format: error against the unquantized float32 product, agreement with the jnp reference,
and the time per call.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_blockscale as jb

_DEMO_PAIRS = (
    ("mxfp8", "mxfp8"), ("mxfp8_e5m2", "mxfp8_e5m2"), ("mxfp6_e2m3", "mxfp6_e2m3"),
    ("mxfp6_e3m2", "mxfp6_e3m2"), ("mxfp4", "mxfp4"), ("nvfp4", "nvfp4"), ("mxfp8", "mxfp4"),
    ("bf16", "mxfp4"), ("fp8_block", "fp8_block"),
)


def _time(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(reps):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / reps


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jax_blockscale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--m", type=_positive_int, default=256, help="rows of the activations a (M, K) (default 256)")
    parser.add_argument("--n", type=_positive_int, default=512, help="rows of the weight b (N, K) (default 512)")
    parser.add_argument("--k", type=_positive_int, default=1024, help="contraction size K (default 1024)")
    parser.add_argument("--reps", type=_positive_int, default=5,
                        help="timed calls per format pair, after one warm-up call (default 5)")
    args = parser.parse_args(argv)

    target = jb.detect_target()
    print(f"jax {jax.__version__}, backend {jax.default_backend()}, device {jax.devices()[0].device_kind}, "
          f"target {target}")
    # target=None: explain for this machine's device, whatever it is (an explicit target must be one of the
    # dispatch table's, and a GPU without kernels, e.g. sm_80, is not).
    print(jb.explain_all())
    print()

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((args.m, args.k), np.float32))
    w = jnp.asarray(rng.standard_normal((args.n, args.k), np.float32) / np.sqrt(args.k))
    exact = x @ w.T
    flops = 2 * args.m * args.n * args.k
    print(f"{'a':>11} x {'b':<11} {'path':<9} {'rel err vs fp32':>15} {'vs reference':>13} {'ms/call':>8} "
          f"{'TFLOP/s':>8}")
    matmul = jax.jit(lambda a, b: jb.matmul(a, b, out_dtype=jnp.float32))
    for fa, fb in _DEMO_PAIRS:
        a, b = jb.quantize_operand(x, fa, side="a"), jb.quantize_operand(w, fb, side="b")
        out = matmul(a, b)
        ref = jb.reference.matmul(a, b)
        err = float(jnp.linalg.norm(out - exact) / jnp.linalg.norm(exact))
        agree = float(jnp.linalg.norm(out - ref) / jnp.linalg.norm(ref))
        seconds = _time(matmul, a, b, reps=args.reps)
        path = jb.explain(a, b).path
        print(f"{fa:>11} x {fb:<11} {path:<9} {err:>15.3e} {agree:>13.1e} {seconds * 1e3:>8.3f} "
              f"{flops / seconds / 1e12:>8.2f}")


if __name__ == "__main__":
    main()
