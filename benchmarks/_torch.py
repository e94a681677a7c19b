"""PyTorch cuBLAS blockwise FP8 (DeepSeek 1x128 activations x 128x128 weights) on our fp8_block operands.

The very bytes `jb.quantize_operand(..., "fp8_block")` produced are handed to torch, so the baseline
multiplies the same numbers as ours. Layouts (cuBLASLt's, as torch checks them; built and tested with numpy
in `_cublas_layout.py`):

- a: (M_pad, K) e4m3, row-major, M zero-padded to a multiple of 4 (cuBLAS wants the activation-scale
  leading dimension 16-byte aligned, e.g. for M = 1); the output is sliced back to M rows.
- b: (K, N) e4m3, column-major, i.e. `w.t()` of our row-major (N, K) weight.
- scale_a: (M_pad, K/128) float32, strides (1, M_pad) ("outer-dim-major").
- scale_b: (ceil(K/128), ceil(N/128)) float32, strides (1, round_up(ceil(K/128), 4)): our (ceil(N/128),
  K/128) weight scales, rows padded to a multiple of 4 floats; older layouts are tried after it.

Operands cross from JAX by DLPack and are copied (`clone`) into torch-owned memory, then the device is
synchronized while the JAX array is still referenced. Without that wait the copy, queued on torch's stream,
may run after JAX has freed the temporary (the fp8 bitcast, the M padding) and reused its memory for the
next operand set: the check then multiplies another set's numbers (relative error ~sqrt(2), which is what
4096x4096x7168 showed in the 2026-11-21 sweep).

Call: `torch.nn.functional.scaled_mm(a, b, scale_a, ScalingType.BlockWise1x128, scale_b,
ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)` (torch >= 2.10; the enum members were spelled
`Blockwise_1x128` in some releases), else `torch._scaled_mm(a, b, scale_a, scale_b,
out_dtype=torch.bfloat16)`, which infers the same recipe from the scale shapes. Each (entry point, scale_b
layout) is tried until one runs and passes the check, then the swapped problem out^T = w @ x^T (128x128 on
mat1, 1x128 on mat2: another cuBLAS configuration, in case one is wrong for a shape); the row's `path`
says which ran, and failures before it are in the note. None working: an 'n/a' (or 'check_failed') row
whose note holds every attempt's error. Timing: the R sets in one CUDA graph, CUDA events; kernel time from the profiler
(`_kernel_time`), as for every other row.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_blockscale as jb

from . import _cublas_layout as cl
from ._baselines import MATMUL_TOL, Outcome, short
from ._kernel_time import profile, trace_calls
from ._timing import TimingConfig, measure, torch_sampler

IMPL = "torch_blockwise"


def _to_torch(torch: Any, x: jax.Array) -> Any:
    """A jax array as a torch-owned CUDA tensor (module docstring: why the synchronize)."""
    fp8 = x.dtype == jnp.float8_e4m3fn
    if fp8:
        x = lax.bitcast_convert_type(x, jnp.uint8)  # DLPack has no portable fp8 code
    x = jax.block_until_ready(x)
    try:
        t = torch.from_dlpack(x).cuda().clone()
        torch.cuda.synchronize()  # the copy has read x before x (a temporary) can be freed and reused
    except Exception:  # noqa: BLE001 - older DLPack paths, CPU arrays
        t = torch.from_numpy(np.asarray(x).copy()).cuda()
    return t.view(torch.float8_e4m3fn) if fp8 else t


def _strided(torch: Any, s: cl.StridedScales) -> Any:
    return torch.from_numpy(s.storage).cuda().as_strided(s.shape, s.strides)


class _Set:
    """One operand set in every layout the attempts use (module docstring; `_cublas_layout`)."""

    def __init__(self, torch: Any, qa: jb.BlockScaledArray, qb: jb.BlockScaledArray):
        va = qa.values
        m, k = va.shape
        n = qb.values.shape[0]
        m_pad = cl.padded_m(m)
        if m_pad != m:
            va = jnp.pad(va.astype(jnp.float32), ((0, m_pad - m), (0, 0))).astype(va.dtype)
        self.a = _to_torch(torch, va).contiguous()  # (M_pad, K) row-major; a.t() is x^T column-major
        self.b = _to_torch(torch, qb.values).contiguous().t()  # (K, N) column-major; b.t() is w row-major
        sa = cl.scale_a_1x128(np.asarray(qa.scales), m_pad)
        variants = cl.scale_b_variants(np.asarray(qb.scales), n, k)
        self.sa = _strided(torch, sa)
        self.sbs = [_strided(torch, v) for v in variants]
        sw, sxt = cl.swapped_scales(sa, variants[0])
        self.sw, self.sxt = _strided(torch, sw), _strided(torch, sxt)


def _member(enum: Any, *names: str) -> Any:
    return next((getattr(enum, n) for n in names if hasattr(enum, n)), None)


def _entry_points(torch: Any) -> list[tuple[str, Callable]]:
    """The blockwise FP8 entry points this torch has, newest first, as fn(a, b, sa, sb, swapped): with
    swapped, a carries the 128x128 scales and b the 1x128 ones."""
    F = torch.nn.functional
    out = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        r1 = _member(F.ScalingType, "BlockWise1x128", "Blockwise_1x128")
        r2 = _member(F.ScalingType, "BlockWise128x128", "Blockwise_128x128")
        if r1 is not None and r2 is not None:
            out.append(("F.scaled_mm", lambda a, b, sa, sb, swapped: F.scaled_mm(
                a, b, sa, r2 if swapped else r1, sb, r1 if swapped else r2, output_dtype=torch.bfloat16)))
    if hasattr(torch, "_scaled_mm"):  # infers the recipe from the scale shapes and strides
        out.append(("torch._scaled_mm", lambda a, b, sa, sb, swapped: torch._scaled_mm(
            a, b, sa, sb, out_dtype=torch.bfloat16)))
    return out


def _attempts(torch: Any, labels: list[str]) -> list[tuple[str, Callable[[_Set], Any]]]:
    """(tag, set -> (M_pad, N) output) in the order tried: each entry point with each scale_b layout, then
    each entry point on the swapped problem out^T = w @ x^T (another cuBLAS configuration)."""
    out = []
    for name, fn in _entry_points(torch):
        for v, label in enumerate(labels):
            tag = name if len(labels) == 1 else f"{name} [{label}]"
            out.append((tag, lambda s, fn=fn, v=v: fn(s.a, s.b, s.sa, s.sbs[v], False)))
    for name, fn in _entry_points(torch):
        out.append((f"{name} swapped (w @ x^T)^T",
                    lambda s, fn=fn: fn(s.b.t(), s.a.t(), s.sw, s.sxt, True).t()))
    return out


def _errors(torch: Any, y: Any, ref: jax.Array) -> tuple[float, float]:
    r = torch.from_numpy(np.asarray(ref, np.float32)).cuda()
    d = y.float() - r
    fro = (torch.linalg.norm(d) / torch.linalg.norm(r).clamp_min(1e-30)).item()
    mx = (d.abs().max() / r.abs().max().clamp_min(1e-30)).item()
    return fro, mx


def _launcher(torch: Any, run_all: Callable[[], Any]) -> tuple[Callable[[], Any], str]:
    """A CUDA graph of the R matmuls (host launch cost out of the measurement), else the eager loop."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run_all()  # cuBLASLt picks its algorithm and workspace before capture
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = run_all()
        return (lambda g=graph, keep=outs: g.replay()), "cuda graph"
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        return run_all, f"eager loop (graph capture failed: {short(e, 120)})"


def torch_blockwise(pairs: list[tuple[jb.BlockScaledArray, jb.BlockScaledArray]], ref0: jax.Array,
                    cfg: TimingConfig) -> Outcome:
    """Check on set 0 against `ref0` (f32 reference of pairs[0]), then time all sets; never raises."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return Outcome(IMPL, "n/a", note=f"torch not importable: {short(e)}")
    if not torch.cuda.is_available():
        return Outcome(IMPL, "n/a", note=f"torch {torch.__version__} sees no CUDA device")
    try:
        return _run(torch, pairs, ref0, cfg)
    except Exception as e:  # noqa: BLE001
        return Outcome(IMPL, "n/a", note=f"torch {torch.__version__}: {short(e)}")


def _run(torch: Any, pairs: list, ref0: jax.Array, cfg: TimingConfig) -> Outcome:
    m, k = pairs[0][0].values.shape
    n = pairs[0][1].values.shape[0]
    sets = [_Set(torch, qa, qb) for qa, qb in pairs]
    labels = [v.label for v in cl.scale_b_variants(np.asarray(pairs[0][1].scales), n, k)]
    notes = [f"torch {torch.__version__}"] + ([f"M padded to {cl.padded_m(m)}"] if m % 4 else [])
    failures, wrong = [], None
    for tag, attempt in _attempts(torch, labels):  # the first that runs and passes the check is timed
        try:
            y = attempt(sets[0])
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            failures.append(f"{tag}: {short(e, 200)}")
            continue
        fro, mx = _errors(torch, y[:m], ref0)
        if fro < MATMUL_TOL:
            launch, how = _launcher(torch, lambda attempt=attempt: [attempt(s) for s in sets])
            launch()
            torch.cuda.synchronize()
            timing = measure(torch_sampler(torch, launch), len(sets), cfg)
            def reprofile(launch=launch, timing=timing):
                return profile(launch, calls=trace_calls(timing.median_s * len(sets)), ops_per_call=len(sets),
                               block=lambda _: torch.cuda.synchronize())

            extra = [f"{f} (fell back)" for f in failures]
            return Outcome(IMPL, "ok", timing, fro, mx, tag, "; ".join(notes + extra + [how]),
                           reprofile() if cfg.kernel_time else None, reprofile)
        failures.append(f"{tag}: rel err {fro:.3g}")
        wrong = wrong or Outcome(IMPL, "check_failed", None, fro, mx, tag)
    text = "; ".join(notes + (failures or ["no scaled_mm entry point"]))
    if wrong is not None:
        wrong.note = text + "; not timed"
        return wrong
    return Outcome(IMPL, "n/a", note=text)
