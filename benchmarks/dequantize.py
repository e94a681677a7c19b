"""`jb.dequantize(q, bfloat16)` kernel time against an XLA `x * 2` pass and against the unpacked path.

    python -m benchmarks.dequantize                      # mxfp4, nvfp4, mxfp8; 8192 x 8192 and 8192 x 28672
    python -m benchmarks.dequantize --tiny               # tiny shape, checks the harness (CPU: no kernel time)

Why: on Hopper the upcast GEMMs dequantize large MX / nvfp4 operands to bf16 in XLA first
(`_triton/upcast.predecoded_sides`), so this pass is part of every mxfp8 / nvfp4 training step. Rows, per
format and shape, profiled in turn for `--rounds` rounds (median; the clock drifts between rows measured one
after the other):
  - `bf16`: `jb.dequantize(q, jnp.bfloat16)`, what the upcast path runs (fp4: each byte's two values
    packed into one uint32, `quantize._dequantize_fp4_pairs`);
  - `f32->bf16`: `jb.dequantize(q, jnp.float32).astype(jnp.bfloat16)`, the same bits through the general
    path (fp4: the nibbles unpacked into a (..., K/2, 2) stack, which XLA compiles as a concatenate fusion);
  - `x*2`: an XLA elementwise pass over a bf16 array of the same shape (read + write).
Rates count ideal bytes: codes and scales read once, bf16 written once. Both dequantize rows are checked bit
for bit against each other before timing. Kernel time: CUPTI (`_kernel_time.kernel_times`), R distinct
operand sets rotated.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import argparse  # noqa: E402
import statistics  # noqa: E402
from typing import Optional  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402

from ._kernel_time import kernel_times  # noqa: E402

FORMATS = ("mxfp4", "nvfp4", "mxfp8")
SHAPES = ((8192, 8192), (8192, 28672))


def _ideal_bytes(q: jb.BlockScaledArray) -> int:
    """Codes and scales read once (the tensor scale ignored), bf16 written once."""
    return q.values.nbytes + q.scales.nbytes + int(np.prod(q.shape)) * 2


def _same_bits(a: jax.Array, b: jax.Array) -> bool:
    return bool((jax.lax.bitcast_convert_type(a, jnp.uint16) == jax.lax.bitcast_convert_type(b, jnp.uint16)).all())


def run(formats, shapes, sets: int, rounds: int) -> list[dict]:
    """One dict per (format, shape, row): median kernel us over rounds (nan without a GPU) and GB/s."""
    rows = []
    ops = {"bf16": jax.jit(lambda q: jb.dequantize(q, jnp.bfloat16)),
           "f32->bf16": jax.jit(lambda q: jb.dequantize(q, jnp.float32).astype(jnp.bfloat16))}
    double = jax.jit(lambda x: x * 2)
    for fmt in formats:
        for shape in shapes:
            keys = jax.random.split(jax.random.key(sum(shape)), sets)
            xs = [jax.random.normal(k, shape, jnp.bfloat16) for k in keys]
            qs = [jax.jit(lambda x: jb.quantize(x, fmt))(x) for x in xs]
            if not _same_bits(ops["bf16"](qs[0]), ops["f32->bf16"](qs[0])):
                raise AssertionError(f"{fmt} {shape}: the two dequantize paths differ")
            args = {"bf16": [(q,) for q in qs], "f32->bf16": [(q,) for q in qs], "x*2": [(x,) for x in xs]}
            fns = {**ops, "x*2": double}
            times = {label: [] for label in fns}
            for _ in range(rounds):
                for label, fn in fns.items():
                    times[label].append(kernel_times(fn, args[label]).profile.kernel_s * 1e6)
            ideal = {"bf16": _ideal_bytes(qs[0]), "f32->bf16": _ideal_bytes(qs[0]), "x*2": xs[0].nbytes * 2}
            for label, us in times.items():
                med = statistics.median(us) if all(u > 0 for u in us) else float("nan")
                rows.append(dict(fmt=fmt, shape=shape, row=label, us=med, gbs=ideal[label] / med / 1e3))
                print(f"{fmt:<6} {shape[0]}x{shape[1]:<6} {label:<10} {med:9.1f} us {ideal[label] / med / 1e3:7.0f} GB/s "
                      f"(rounds {' '.join(f'{u:.1f}' for u in us)})", flush=True)
    return rows


def main(argv: Optional[list[str]] = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--formats", default=",".join(FORMATS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sets", type=int, default=4, help="distinct operand sets rotated (>= 4 at 8192^2: > L2)")
    ap.add_argument("--tiny", action="store_true", help="64 x 256, 2 sets, 1 round (CPU: checks the harness)")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.sets < 1:
        ap.error("--rounds and --sets must be >= 1")
    shapes = ((64, 256),) if a.tiny else SHAPES
    sets, rounds = (2, 1) if a.tiny else (a.sets, a.rounds)
    print(f"dequantize: {jax.devices()[0].device_kind}, {rounds} round(s)", flush=True)
    return run([f for f in a.formats.split(",") if f], shapes, sets, rounds)


if __name__ == "__main__":
    main()
