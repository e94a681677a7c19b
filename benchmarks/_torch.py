"""PyTorch cuBLAS blockwise FP8 (DeepSeek 1x128 activations x 128x128 weights) on our fp8_block operands.

The very bytes `jb.quantize_operand(..., "fp8_block")` produced are handed to torch, so the baseline
multiplies the same numbers as ours. Layouts cuBLASLt wants (torch's ScaledBlas.cpp checks them):

- a: (M, K) e4m3, row-major. b: (K, N) e4m3, column-major, i.e. `w.t()` of our row-major (N, K) weight.
- scale_a: (M, K/128) float32 with strides (1, M) ("outer-dim-major"): `s.t().contiguous().t()`.
- scale_b: (round_up(K/128, 4), N/128) float32 with strides (1, round_up(K/128, 4)): our (N/128, K/128)
  weight scales, K blocks padded to a multiple of 4, then `.t()`.
- M is zero-padded to a multiple of 4 (cuBLAS wants the activation-scale leading dimension aligned, e.g.
  for M = 1); the output is sliced back to M rows.

Call: `torch.nn.functional.scaled_mm(a, b, scale_a, ScalingType.BlockWise1x128, scale_b,
ScalingType.BlockWise128x128, output_dtype=torch.bfloat16)` (torch >= 2.10; the enum members were spelled
`Blockwise_1x128` in some releases), else `torch._scaled_mm(a, b, scale_a, scale_b,
out_dtype=torch.bfloat16)`, which infers the same recipe from the scale shapes. Any failure becomes an
'n/a' row whose note holds the exception text. Timing: the R sets in one CUDA graph, CUDA events.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_blockscale as jb

from ._baselines import MATMUL_TOL, Outcome, short
from ._timing import TimingConfig, measure, torch_sampler

IMPL = "torch_blockwise"


def _to_torch(torch: Any, x: jax.Array) -> Any:
    """A jax array as a CUDA tensor: DLPack (zero copy) when it works, else through the host."""
    fp8 = x.dtype == jnp.float8_e4m3fn
    if fp8:
        x = lax.bitcast_convert_type(x, jnp.uint8)  # DLPack has no portable fp8 code
    try:
        t = torch.from_dlpack(x).cuda().clone()  # own the memory: x is a temporary
    except Exception:  # noqa: BLE001 - older DLPack paths, CPU arrays
        t = torch.from_numpy(np.asarray(x).copy()).cuda()
    return t.view(torch.float8_e4m3fn) if fp8 else t


def _operands(torch: Any, qa: jb.BlockScaledArray, qb: jb.BlockScaledArray) -> tuple:
    """(a, b, scale_a, scale_b) in cuBLASLt's layouts (module docstring); M padded to a multiple of 4."""
    va, sa = qa.values, qa.scales
    pad_m = -va.shape[0] % 4
    if pad_m:
        va = jnp.pad(va.astype(jnp.float32), ((0, pad_m), (0, 0))).astype(va.dtype)
        sa = jnp.pad(sa, ((0, pad_m), (0, 0)), constant_values=1.0)
    sb = qb.scales
    pad_k = -sb.shape[1] % 4
    if pad_k:
        sb = jnp.pad(sb, ((0, 0), (0, pad_k)), constant_values=1.0)
    a = _to_torch(torch, va).contiguous()
    b = _to_torch(torch, qb.values).contiguous().t()
    scale_a = _to_torch(torch, sa).t().contiguous().t()
    scale_b = _to_torch(torch, sb).contiguous().t()
    return a, b, scale_a, scale_b


def _member(enum: Any, *names: str) -> Any:
    return next((getattr(enum, n) for n in names if hasattr(enum, n)), None)


def _candidates(torch: Any) -> list[tuple[str, Callable]]:
    """The blockwise FP8 entry points this torch has, newest first."""
    F = torch.nn.functional
    out = []
    if hasattr(F, "scaled_mm") and hasattr(F, "ScalingType"):
        r1 = _member(F.ScalingType, "BlockWise1x128", "Blockwise_1x128")
        r2 = _member(F.ScalingType, "BlockWise128x128", "Blockwise_128x128")
        if r1 is not None and r2 is not None:
            out.append(("F.scaled_mm", lambda a, b, sa, sb: F.scaled_mm(a, b, sa, r1, sb, r2,
                                                                         output_dtype=torch.bfloat16)))
    if hasattr(torch, "_scaled_mm"):
        out.append(("torch._scaled_mm", lambda a, b, sa, sb: torch._scaled_mm(a, b, sa, sb,
                                                                               out_dtype=torch.bfloat16)))
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
    m = pairs[0][0].shape[0]
    sets = [_operands(torch, qa, qb) for qa, qb in pairs]
    notes = [f"torch {torch.__version__}"] + ([f"M padded to {m + (-m % 4)}"] if m % 4 else [])
    failures, wrong = [], None
    for name, fn in _candidates(torch):  # the first entry point that runs and passes the check is timed
        try:
            y = fn(*sets[0])
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            failures.append(f"{name}: {short(e, 200)}")
            continue
        fro, mx = _errors(torch, y[:m], ref0)
        if fro < MATMUL_TOL:
            launch, how = _launcher(torch, lambda fn=fn: [fn(*s) for s in sets])
            launch()
            torch.cuda.synchronize()
            timing = measure(torch_sampler(torch, launch), len(sets), cfg)
            extra = [f"{f} (fell back)" for f in failures]
            return Outcome(IMPL, "ok", timing, fro, mx, name, "; ".join(notes + extra + [how]))
        failures.append(f"{name}: rel err {fro:.3g}")
        wrong = wrong or Outcome(IMPL, "check_failed", None, fro, mx, name)
    text = "; ".join(notes + (failures or ["no scaled_mm entry point"]))
    if wrong is not None:
        wrong.note = text + "; not timed"
        return wrong
    return Outcome(IMPL, "n/a", note=text)
