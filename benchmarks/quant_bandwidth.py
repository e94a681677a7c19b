"""Device bandwidth of jnp quantization vs an XLA elementwise pass (issue #4 target: >= 0.8x), on one GPU.

Run from the repository root (jax_blockscale importable) on the GPU machine:

    python /tmp/quant_bw_gpu.py            # or: python quant_bw_gpu.py --n 8192 --k 8 --reps 10

For each op it jits ONE function that applies the op to K distinct bf16 (N, N) inputs (an unrolled Python
loop; K * 128 MiB at N = 8192), calls it `reps` times (each call blocked on), and reports the median call
time divided by K. Bandwidth = (bytes read + bytes written) / time, counting each input once and every
output leaf (values, scales, tensor scale) once: the "logical" traffic of the op. The x*2 baseline reads
and writes bf16 (N, N). Also printed:
  - phys2: the same time but counting the input twice (one reduction + one elementwise pass is the least
    a reduce-then-scale quantizer can read in XLA; no single XLA fusion both reduces a block and
    rescales it, so 'logical' can reach at most ~(in + out) / (2 in + out) of x*2's logical rate);
  - pin=off rows: the same quantizer with the per-block optimization barriers disabled
    (jax_blockscale.quantize._PIN_PER_BLOCK = False), to see which way XLA:GPU fuses better;
  - the top-level kernels of the compiled module (one input), to count passes over the big tensor;
  - a bit-exactness check: GPU results against the CPU backend (whose results the test suite checks
    against an independent float64 spec model) on random and adversarial 1024 x 1024 inputs.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import sys
import time

sys.path.insert(0, ".")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_blockscale as jb  # noqa: E402
from jax_blockscale.formats import format_for_side  # noqa: E402

qmod = importlib.import_module("jax_blockscale.quantize")

OPS = {
    "x*2": lambda x: x * 2,
    "mxfp8": lambda x: jb.quantize(x, "mxfp8"),  # rceil, the default
    "mxfp8 floor": lambda x: jb.quantize(x, "mxfp8", rounding="floor"),
    "nvfp4": lambda x: jb.quantize(x, "nvfp4"),
    "fp8_block 1x128 (a)": lambda x: jb.quantize(x, format_for_side("fp8_block", "a")),
    "mxfp4": lambda x: jb.quantize(x, "mxfp4"),
    "fp8_block 128x128 (b)": lambda x: jb.quantize(x, format_for_side("fp8_block", "b")),
}


def _nbytes(tree) -> int:
    return sum(int(np.prod(l.shape)) * jnp.dtype(l.dtype).itemsize for l in jax.tree_util.tree_leaves(tree))


def _kernels(op, x) -> str:
    """The compiled module's top-level kernels (fusions, custom calls, copies) with output shapes."""
    text = jax.jit(op).lower(x).compile().as_text()
    entry = text[text.index("ENTRY"):]
    entry = entry[: entry.index("\n}\n")]
    rows = []
    for line in entry.splitlines()[1:]:
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\(", line)
        if not m or m.group(3) in ("parameter", "tuple", "get-tuple-element", "bitcast", "constant"):
            continue
        kind = re.search(r"kind=(\w+)", line)
        rows.append(f"{m.group(3)}{'/' + kind.group(1) if kind else ''} -> {m.group(2)}")
    return f"{len(rows)} kernels: " + "; ".join(rows)


def _time(op, xs, reps):
    f = jax.jit(lambda *args: tuple(op(a) for a in args))
    jax.block_until_ready(f(*xs))  # compile + warm up
    jax.block_until_ready(f(*xs))
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*xs))
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) / len(xs), f


def _bits(a):
    a = np.asarray(a)
    return a.view(np.uint8) if a.dtype.itemsize == 1 else a.view(np.uint32) if a.dtype.itemsize == 4 else a


def _explain_mismatch(x, fmt, leaf, idx, got, want):
    """Prints one differing entry: which leaf, both results, and the input block behind it (the row's 16 or
    32 elements along the last axis), with which of its values are float32 subnormals (XLA:CPU flushes
    them, XLA:GPU keeps them)."""
    g, w = np.asarray(got)[idx], np.asarray(want)[idx]
    row, col = idx[0], idx[-1]
    block = {"nvfp4": 16, "mxfp8": 32, "mxfp4": 32}.get(fmt, 128)
    if leaf == 0:  # values: packed fp4 pairs hold two elements per byte
        col = col * (2 if fmt in ("nvfp4", "mxfp4") else 1)
    start = (col // block) * block
    xb = np.asarray(x, np.float32)[row, start:start + block]
    tiny = np.abs(xb) < np.float32(2.0**-126)
    print(f"    leaf {leaf} at {idx}: GPU {g!r} CPU {w!r}; block x[{row}, {start}:{start + block}] amax "
          f"{np.max(np.abs(xb)):.9g}, float32 subnormals in the block: {int(np.sum(tiny & (xb != 0)))}; "
          f"values {xb.tolist()}")


def check_gpu_vs_cpu():
    """Quantizes the same inputs on the GPU and on the CPU backend; every leaf must agree bit for bit."""
    rng = np.random.default_rng(0)
    n = 1024
    x = rng.standard_normal((n, n)) * np.exp(rng.uniform(-6, 6, (n, 1)))
    x = x * np.exp(rng.uniform(-3, 3, (n, n)))
    x = x.astype(np.float32)
    # Adversarial rows for fp8_block 1x128: amax pinned so that scale = amax / 448 is not a power of two,
    # elements at x = scale * (e4m3 value or midpoint) and their float32 neighbours, where a division that
    # is 1 ulp off flips the code.
    grid = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(jnp.float8_e4m3fn).astype(np.float64)))
    grid = grid[np.isfinite(grid) & (grid <= 448)]
    targets = np.concatenate([grid[1:], (grid[1:] + grid[:-1]) / 2])
    for i in range(256):
        amax = np.float32(rng.uniform(1, 2) * 2.0 ** rng.integers(-20, 20))
        scale = amax / np.float32(448)
        t = rng.choice(targets, 127)
        v = (t * np.float64(scale)).astype(np.float32)
        v = (v.view(np.int32) + rng.integers(-2, 3, v.size).astype(np.int32)).view(np.float32)
        v = np.minimum(v, amax) * rng.choice([-1, 1], v.size).astype(np.float32)
        x[i, :128] = np.concatenate([[amax], v])
    x[300, 5] = np.nan
    x[301, 70] = -np.inf
    x[302] = 0
    cases = [("mxfp8", {}), ("mxfp8", {"rounding": "floor"}), ("mxfp4", {"rounding": "even"}),
             ("nvfp4", {}), ("nvfp4", {"tensor_scale": 0.3}),
             ("fp8_block", {"block": (1, 128)}), ("fp8_block", {"block": (128, 128)})]
    cpu = jax.devices("cpu")[0]
    gpu = jax.devices()[0]
    all_ok = True
    for dtype in (jnp.float32, jnp.bfloat16):
        for fmt, kw in cases:
            f = jax.jit(lambda v, fmt=fmt, kw=kw: jb.quantize(v, fmt, **kw))
            xd = jnp.asarray(x, dtype)
            got = jax.tree_util.tree_leaves(f(jax.device_put(xd, gpu)))
            want = jax.tree_util.tree_leaves(f(jax.device_put(xd, cpu)))
            bad = sum(int(np.sum(_bits(g) != _bits(w))) for g, w in zip(got, want))
            all_ok &= bad == 0
            print(f"  {np.dtype(dtype).name:8s} {fmt:9s} {str(kw):22s} GPU vs CPU mismatching entries: {bad}")
            for leaf, (g, w) in enumerate(zip(got, want)):
                for idx in np.argwhere(_bits(g) != _bits(w))[:4]:
                    _explain_mismatch(xd, fmt, leaf, tuple(idx), g, w)
    print("  bit-exact on GPU:", "YES" if all_ok else "NO")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--k", type=int, default=8, help="distinct inputs per call (>= 4)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of: " + ", ".join(OPS))
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-kernels", action="store_true")
    args = ap.parse_args()
    print(jax.devices()[0], "jax", jax.__version__)
    keys = jax.random.split(jax.random.key(0), args.k)
    make = jax.jit(lambda k: (jax.random.normal(k, (args.n, args.n), jnp.float32)
                              * jnp.exp(jax.random.uniform(k, (args.n, 1), minval=-4.0, maxval=4.0))
                              ).astype(jnp.bfloat16))
    xs = [make(k) for k in keys]
    jax.block_until_ready(xs)
    in_bytes = _nbytes(xs[0])
    base_bw = None
    print(f"\nbf16 {args.n}x{args.n} ({in_bytes / 2**20:.0f} MiB), {args.k} distinct inputs per jit, "
          f"median of {args.reps} calls / {args.k}")
    print(f"{'op':28s} {'us/op':>9s} {'GB/s':>8s} {'ratio':>6s} {'phys2 GB/s':>11s} {'ratio':>6s}")
    for name in args.ops.split(","):
        op = OPS[name]
        for pin in ((True, False) if name != "x*2" else (True,)):
            qmod._PIN_PER_BLOCK = pin
            t, f = _time(op, xs, args.reps)
            out_bytes = _nbytes(jax.eval_shape(op, xs[0]))
            bw = (in_bytes + out_bytes) / t / 1e9
            phys = (2 * in_bytes + out_bytes) / t / 1e9
            if name == "x*2":
                base_bw = bw
            label = name if name == "x*2" else f"{name} pin={'on' if pin else 'off'}"
            ratio = bw / base_bw if base_bw else float("nan")
            print(f"{label:28s} {t * 1e6:9.1f} {bw:8.0f} {ratio:6.2f} {phys:11.0f} {phys / base_bw:6.2f}", flush=True)
            if not args.no_kernels:
                print("    " + _kernels(op, xs[0]))
            del f
    qmod._PIN_PER_BLOCK = True
    if not args.no_check:
        print("\nGPU vs CPU bit-exactness (1024 x 1024, random + adversarial):")
        check_gpu_vs_cpu()


if __name__ == "__main__":
    main()
