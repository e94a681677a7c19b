"""What the suite times: our matmul and the JAX/XLA baselines, as (operands, op, reference) triples.

Every implementation is an `op(*operands)` traced inside one jit over R operand sets (see `_timing`), and
a float32 reference of the same operands that the first output is checked against before any timing:

- ours: `jb.matmul` on operands pre-quantized by `jb.quantize_operand` (quantization is not timed);
  reference `jb.reference.matmul` on the same quantized operands.
- xla_bf16: `lax.dot_general`, bf16 in, f32 accumulation, bf16 out; reference the f32 dot.
- xla_fp8_tensor: what jnp gives for FP8 — float8_e4m3fn operands with one scale each, f32 accumulation,
  times the two scalars, bf16 out; reference the f32 dot of the dequantized operands.
- xla_dequant: our BlockScaledArray operands dequantized with `jb.dequantize` to bf16, then the bf16 dot,
  all in one jit; reference as ours.
- jax_scaled_matmul: `jax.nn.scaled_matmul` on the mxfp8 operands (e8m0 scales); 'n/a' where the
  platform has no lowering for it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import subprocess
import sys
from typing import Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax

import jax_blockscale as jb

from ._kernel_time import KernelProfile, profile, trace_calls
from ._timing import Timing, TimingConfig, jax_sampler, measure, rel_errors

NT = (((1,), (1,)), ((), ()))  # a (M, K) x b (N, K): contract both last axes
BF16, F32 = jnp.bfloat16, jnp.float32
E4M3_MAX = 448.0
MATMUL_TOL = 1e-2  # relative Frobenius error, bf16 output


@dataclasses.dataclass
class Outcome:
    """One timed (or not) implementation of one case."""

    impl: str
    status: str  # ok | check_failed | n/a | error | skipped
    timing: Optional[Timing] = None
    rel_err: float = math.nan  # relative Frobenius error of the first output vs its reference
    max_rel_err: float = math.nan  # max |y - ref| / max |ref|
    path: str = ""
    note: str = ""
    kernel: Optional[KernelProfile] = None  # per-operation kernel time, when cfg.kernel_time
    # Profiles the (compiled, warmed-up) implementation again: interleaved rounds (block_fp8_variants
    # --rounds) compare implementations measured side by side, not minutes apart as clocks drift.
    reprofile: Optional[Callable[[], KernelProfile]] = dataclasses.field(default=None, repr=False, compare=False)


def short(e: BaseException, n: int = 300) -> str:
    """An exception as one CSV-friendly line."""
    text = f"{type(e).__name__}: {e}".replace("\n", " ").replace(",", ";")
    return text if len(text) <= n else text[: n - 3] + "..."


def run_jax(impl: str, op: Callable, sets: list, ref: Callable, cfg: TimingConfig, *, tol: float = MATMUL_TOL,
            post: Optional[Callable] = None, path: str = "", note: str = "", na_on_error: bool = False) -> Outcome:
    """Check `op` on set 0 against `ref`, then time it over all sets (one jit, R ops, see `_timing`).

    `post` maps the output to what is compared (quantization: dequantize); it is not timed.
    """
    run_all = jax.jit(lambda sets: [op(*s) for s in sets])
    try:
        outs = jax.block_until_ready(run_all(sets))  # compiles; also the warm-up call
    except Exception as e:  # noqa: BLE001 - a baseline the platform lacks must not stop the run
        return Outcome(impl, "n/a" if na_on_error else "error", path=path, note=short(e))
    first = jax.jit(post)(outs[0]) if post else outs[0]
    fro, mx = rel_errors(first, jax.jit(ref)(*sets[0]))
    del outs
    if not fro < tol:  # NaN fails too
        return Outcome(impl, "check_failed", None, fro, mx, path, f"rel err {fro:.3g} >= {tol:g}; not timed")
    timing = measure(jax_sampler(run_all, sets), len(sets), cfg)

    def reprofile() -> KernelProfile:
        return profile(lambda: run_all(sets), calls=trace_calls(timing.median_s * len(sets)), ops_per_call=len(sets))

    return Outcome(impl, "ok", timing, fro, mx, path, note, reprofile() if cfg.kernel_time else None, reprofile)


# ---- operands --------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def dense_pair(key: jax.Array, m: int, n: int, k: int) -> tuple[jax.Array, jax.Array]:
    """bf16 activations (M, K) and weight (N, K), standard normal."""
    ka, kb = jax.random.split(key)
    return jax.random.normal(ka, (m, k), BF16), jax.random.normal(kb, (n, k), BF16)


@functools.partial(jax.jit, static_argnums=(2, 3))
def quantized_pair(x: jax.Array, w: jax.Array, fa: str, fb: str):
    """Our operands: each side by `jb.quantize_operand` ("bf16" keeps it dense)."""
    return jb.quantize_operand(x, fa, side="a"), jb.quantize_operand(w, fb, side="b")


def _per_tensor_fp8(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    scale = jnp.maximum(jnp.max(jnp.abs(x.astype(F32))), 1e-30) / E4M3_MAX
    return (x.astype(F32) / scale).astype(jnp.float8_e4m3fn), scale


@jax.jit
def fp8_tensor_operands(x: jax.Array, w: jax.Array):
    """(a8, scale_a, b8, scale_b): per-tensor e4m3, scale = amax / 448."""
    return (*_per_tensor_fp8(x), *_per_tensor_fp8(w))


# ---- ops and their references ----------------------------------------------------------------------


def _f32_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a.astype(F32), b.astype(F32), NT, precision=lax.Precision.HIGHEST,
                           preferred_element_type=F32)


# The XLA baselines are the dot a JAX user writes, `x @ w.T` on bf16 operands: a bf16 product (cuBLAS
# accumulates in fp32 and rounds once on output). Until 2026-11-24 they asked for an fp32 product and cast it
# (`preferred_element_type=F32).astype(BF16)`), which XLA runs as a separate convert kernel or picks another
# GEMM for: on an H100 that made the baseline 6-10% slower at 8192^3 and the Llama shapes and 21% slower at
# 4096 x 7168 x 2048 (a Triton gemm fusion instead of cuBLAS), 0-6% at decode sizes, so every ratio against
# "XLA bf16" or "XLA dequant+dot" measured before then flatters us by that much.
def xla_bf16(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a, b, NT)


def xla_bf16_ref(a: jax.Array, b: jax.Array) -> jax.Array:
    return _f32_dot(a, b)


def xla_fp8_tensor(a8, sa, b8, sb) -> jax.Array:
    return (lax.dot_general(a8, b8, NT, preferred_element_type=F32) * sa * sb).astype(BF16)


def xla_fp8_tensor_ref(a8, sa, b8, sb) -> jax.Array:
    return _f32_dot(a8.astype(F32) * sa, b8.astype(F32) * sb)


def ours(a, b) -> jax.Array:
    return jb.matmul(a, b, out_dtype=BF16)


def ours_ref(a, b) -> jax.Array:
    return jb.reference.matmul(a, b)


def _as_bf16(x) -> jax.Array:
    return jb.dequantize(x, BF16) if isinstance(x, jb.BlockScaledArray) else x.astype(BF16)


def xla_dequant(a, b) -> jax.Array:
    return lax.dot_general(_as_bf16(a), _as_bf16(b), NT)  # bf16 product, as xla_bf16


def jax_scaled_matmul(a: jb.BlockScaledArray, b: jb.BlockScaledArray) -> jax.Array:
    """mxfp8 x mxfp8 through `jax.nn.scaled_matmul`: e4m3 values, e8m0 scales (a free bitcast), batch 1."""
    sa = lax.bitcast_convert_type(a.scales, jnp.float8_e8m0fnu)
    sb = lax.bitcast_convert_type(b.scales, jnp.float8_e8m0fnu)
    out = jax.nn.scaled_matmul(a.values[None], b.values[None], sa[None], sb[None], preferred_element_type=F32)
    return out[0].astype(BF16)


# ---- quantization ----------------------------------------------------------------------------------

QUANT_FORMATS = {"mxfp8": ("mxfp8", "a"), "nvfp4": ("nvfp4", "a"), "fp8_1x128": ("fp8_block", "a")}
QUANT_TOL = {"mxfp8": 0.06, "fp8_1x128": 0.06, "nvfp4": 0.25}  # rel. error of dequantize(q) vs x


def quantize_op(name: str) -> Callable:
    fmt, side = QUANT_FORMATS[name]
    return lambda x: jb.quantize_operand(x, fmt, side=side)


def dequantize_f32(q: jb.BlockScaledArray) -> jax.Array:
    """`post` of a quantization row: its check compares dequantize(q) with x."""
    return jb.dequantize(q, F32)


def quantize_ref(x: jax.Array) -> jax.Array:
    return x.astype(F32)


def xla_elementwise(x: jax.Array) -> jax.Array:
    """One streaming pass (read + write) over the tensor: the bandwidth yardstick for quantization."""
    return (x * 2).astype(BF16)


def xla_elementwise_ref(x: jax.Array) -> jax.Array:
    return x.astype(F32) * 2


def xla_copy(x: jax.Array) -> jax.Array:
    """The copy ceiling: x + 1 (not x + 0, which XLA simplifies away), read once, written once."""
    return x + jnp.asarray(1, x.dtype)


def xla_copy_ref(x: jax.Array) -> jax.Array:
    return x.astype(F32) + 1


def xla_read(x: jax.Array) -> jax.Array:
    """The read ceiling, for weight-streaming (decode) bounds: max |x| over the tensor, read once. A max
    is exact in any order, so the check compares bits, not a rounded sum."""
    return jnp.max(jnp.abs(x)).astype(F32)


def xla_read_ref(x: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(x.astype(F32)))


# ---- jax.nn.scaled_matmul availability -------------------------------------------------------------

_PROBE = """
import jax, jax.numpy as jnp
a = jnp.ones((1, 128, 128), jnp.float8_e4m3fn)
s = jnp.ones((1, 128, 4), jnp.float8_e8m0fnu)
y = jax.jit(lambda a, b, sa, sb: jax.nn.scaled_matmul(a, b, sa, sb, preferred_element_type=jnp.float32))(a, a, s, s)
assert float(y[0, 0, 0]) == 128.0, float(y[0, 0, 0])
"""


@functools.lru_cache(maxsize=None)
def scaled_matmul_unavailable() -> Optional[str]:
    """None if `jax.nn.scaled_matmul` runs here, else why not.

    On a GPU the probe runs in a child process, because a cuDNN block-scaled call the GPU cannot run may
    abort the process rather than raise; on a CPU the in-process attempt raises cleanly (no lowering).
    """
    if not hasattr(jax.nn, "scaled_matmul"):
        return f"jax {jax.__version__} has no jax.nn.scaled_matmul"
    if jax.default_backend() == "cpu":
        return None  # tried in process; the error text lands in the row
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    try:
        r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return "probe of jax.nn.scaled_matmul timed out"
    if r.returncode == 0:
        return None
    lines = [line for line in (r.stderr or r.stdout).strip().splitlines() if line.strip()]
    return f"probe failed (rc {r.returncode}): " + (lines[-1] if lines else "no output")

