"""Kernel time: the sum of the GPU kernel durations (CUPTI) that one operation launches, beside wall clock.

Why: a wall-clock loop over jitted calls also reads the host's launch gaps, which on kernels of a few tens
of µs moves the number by up to ~40%. CUPTI records each kernel's start and end on the GPU, so the sum of
the durations of the kernels one call launched is what the device spent on it, whatever the host did.

How (`profile`): the caller's `run()` (one call: typically one jit over R distinct operand sets, so that
nothing is served from L2) is launched `calls` times inside one profiler trace, then blocked on. Every
kernel in the trace belongs to those calls (compilation and warm-up happen before the trace), so

    kernel time per operation = sum of kernel durations / (calls * ops_per_call)

and the kernel list is the same sum per kernel name. Memcpy and memset activity is summed separately.
Concurrent kernels on several streams are summed, not merged: this is device work, not a busy span.

Where the events come from, in order (`backend="auto"`):

1. `jax.profiler.trace` (no torch needed): the XSpace it writes is read with `jax.profiler.ProfileData`;
   GPU planes are named "/device:GPU:<n>", and their "Stream #<id>(...)" lines hold one event per kernel,
   memcpy or memset. Derived summary lines ("XLA Modules", "XLA Ops", ...) repeat the same time and are
   skipped. CUPTI activity is process-wide, so kernels that torch launches (cuBLAS) are recorded too.
2. `torch.profiler` with CUDA activity (kineto, also CUPTI; it records JAX's kernels as well), used when
   the jax trace has no GPU plane or no kernel in it (e.g. the jax wheel found no CUPTI) and torch with
   CUDA imports.

On a machine without a GPU the trace still runs (it must not crash) and the result is empty, with a note.
"""

from __future__ import annotations

import dataclasses
import glob
import math
import os
import re
import statistics
import tempfile
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import jax

# The name scope of the XLA dequantize passes before jax_blockscale's upcast GEMMs: it reaches the fused
# kernels' HLO metadata, not their names, so `reclassify` reads it from the compiled program.
from jax_blockscale._triton.problem import DEQUANTIZE_SCOPE

__all__ = ["DeviceEvent", "KernelStat", "KernelProfile", "KernelTime", "aggregate", "classify", "breakdown",
           "fusion_op_names", "reclassify", "events_from_planes", "profile", "kernel_times", "GEMM", "QUANT",
           "DEQUANT", "OTHER"]

GEMM, QUANT, DEQUANT, OTHER = "gemm", "quantization", "dequantize", "other"
KERNEL, MEMCPY, MEMSET = "kernel", "memcpy", "memset"

# XSpace lines on a GPU plane that summarize the stream lines (produced by XLA / xprof post-processing):
# counting them as well would count the same time twice.
_DERIVED_LINES = ("XLA Modules", "XLA Ops", "XLA TraceMe", "TensorFlow Ops", "TensorFlow Name Scope",
                  "Framework Ops", "Framework Name Scope", "Source code", "Steps", "Launch Stats",
                  "CUPTI overhead", "Async XLA Ops")


@dataclasses.dataclass(frozen=True)
class DeviceEvent:
    """One activity record: a kernel, a memcpy or a memset, and how long it ran on the device."""

    name: str
    duration_ns: float
    kind: str = KERNEL  # KERNEL | MEMCPY | MEMSET


@dataclasses.dataclass(frozen=True)
class KernelStat:
    """One kernel name's share of one operation: seconds and launches per operation, and its class."""

    name: str
    seconds: float
    launches: float
    category: str


@dataclasses.dataclass(frozen=True)
class KernelProfile:
    """Per-operation device time from one trace (NaN where the trace had no GPU events; `note` says why)."""

    kernel_s: float  # kernels only
    memcpy_s: float  # memcpy + memset activity
    launches: float  # kernel launches per operation
    kernels: tuple[KernelStat, ...]  # longest first
    calls: int = 0
    ops_per_call: int = 1
    source: str = ""  # "jax.profiler" | "torch.profiler" | "" (none)
    note: str = ""

    @property
    def ok(self) -> bool:
        return math.isfinite(self.kernel_s) and self.kernel_s > 0

    def top(self, n: int = 8) -> tuple[KernelStat, ...]:
        return self.kernels[:n]

    def summary(self, n: int = 3, width: int = 60) -> str:
        """'name 12.3us x1; ...' for a CSV cell (commas would split it)."""
        parts = [f"{_short_name(k.name, width)} {k.seconds * 1e6:.4g}us x{k.launches:.3g}" for k in self.top(n)]
        return "; ".join(parts).replace(",", " ")


@dataclasses.dataclass(frozen=True)
class KernelTime:
    """`kernel_times`'s answer: the kernel profile and the wall clock per operation beside it."""

    profile: KernelProfile
    wall_s: float  # median over samples of back-to-back calls, per operation
    wall_min_s: float


EMPTY = KernelProfile(math.nan, math.nan, math.nan, ())


def _short_name(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


# ---- pure functions: aggregation and classification ------------------------------------------------


def aggregate(events: Iterable[DeviceEvent], calls: int, ops_per_call: int = 1, *, source: str = "",
              note: str = "") -> KernelProfile:
    """Per-operation totals from the events of `calls` calls of `ops_per_call` operations each.

    Raises ValueError for a non-positive count. With no kernel event the times are NaN (not 0: "nothing
    measured" must not read as "free").
    """
    if calls < 1 or ops_per_call < 1:
        raise ValueError(f"calls and ops_per_call must be >= 1, got {calls} and {ops_per_call}")
    per_name: dict[str, list[float]] = {}
    copy_ns = 0.0
    for e in events:
        if e.kind == KERNEL:
            acc = per_name.setdefault(e.name, [0.0, 0])
            acc[0] += float(e.duration_ns)
            acc[1] += 1
        elif e.kind in (MEMCPY, MEMSET):
            copy_ns += float(e.duration_ns)
        else:
            raise ValueError(f"unknown event kind {e.kind!r}")
    ops = calls * ops_per_call
    if not per_name:
        return dataclasses.replace(EMPTY, memcpy_s=copy_ns / ops / 1e9 if copy_ns else math.nan, calls=calls,
                                   ops_per_call=ops_per_call, source=source, note=note or "no kernel events")
    stats = sorted((KernelStat(name, ns / ops / 1e9, count / ops, classify(name))
                    for name, (ns, count) in per_name.items()), key=lambda k: (-k.seconds, k.name))
    total = sum(ns for ns, _ in per_name.values())
    return KernelProfile(total / ops / 1e9, copy_ns / ops / 1e9, sum(c for _, c in per_name.values()) / ops,
                         tuple(stats), calls, ops_per_call, source, note)


# Our kernels (Triton function names in jax_blockscale/_triton and the names new ones will take) and the
# vendor GEMM libraries' kernels: cuBLAS(Lt) ("nvjet", "sm90_xmma_gemm", "cublas", split-K "splitKreduce"),
# CUTLASS, and XLA's own Triton GEMM fusions ("gemm_fusion_dot", "triton_gemm"). XLA loop/reduce fusions
# carry the fusion's name, not what it computes, so by name a dequantize or quantize done by XLA counts as
# other; `reclassify` then moves jax_blockscale's dequantize passes by their HLO metadata.
_QUANT_RE = re.compile(r"^_*(jbs_)?quantize", re.IGNORECASE)
_GEMM_RE = re.compile(r"gemm|cutlass|xmma|nvjet|cublas|splitkreduce|block_fp8_\w*kernel|upcast_kernel|decode|gemv|"
                      r"scaled_gemm|matmul_kernel|wgmma", re.IGNORECASE)


def classify(name: str) -> str:
    """GEMM, QUANT or OTHER for a kernel name (quantization is checked first: names start with it)."""
    if _QUANT_RE.search(name):
        return QUANT
    if _GEMM_RE.search(name):
        return GEMM
    return OTHER


# One HLO instruction line of `compiled.as_text()`: its name and its metadata's op_name.
_HLO_OP_NAME_RE = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = [^\n]*?metadata=\{[^\n}]*?op_name="([^"\n]*)"', re.MULTILINE)


def fusion_op_names(hlo_text: str) -> dict[str, str]:
    """Kernel name -> the `op_name` metadata of the HLO instruction it runs, from a compiled program's text
    (`compiled.as_text()`): XLA names a fusion's kernel after the instruction, with '.' and '-' as '_'."""
    out = {}
    for m in _HLO_OP_NAME_RE.finditer(hlo_text):
        out.setdefault(m.group(1).replace(".", "_").replace("-", "_"), m.group(2))
    return out


def reclassify(p: KernelProfile, op_names: dict[str, str]) -> KernelProfile:
    """`p` with the XLA kernels whose HLO op_name (`fusion_op_names`) lies in jax_blockscale's dequantize
    scope counted as DEQUANT (the decode passes before a Hopper upcast GEMM), not OTHER."""
    stats = tuple(dataclasses.replace(k, category=DEQUANT)
                  if k.category == OTHER and DEQUANTIZE_SCOPE in op_names.get(k.name, "") else k
                  for k in p.kernels)
    return dataclasses.replace(p, kernels=stats)


def breakdown(p: KernelProfile) -> dict[str, float]:
    """Seconds per operation in each class; the classes sum to `p.kernel_s`."""
    out = {GEMM: 0.0, QUANT: 0.0, DEQUANT: 0.0, OTHER: 0.0}
    for k in p.kernels:
        out[k.category] += k.seconds
    return out if p.kernels else {c: math.nan for c in out}


# ---- reading a trace -------------------------------------------------------------------------------


def _event_kind(name: str, stat_names: Callable[[], set[str]]) -> str:
    low = name.lower()
    if low.startswith("memcpy"):
        return MEMCPY
    if low.startswith("memset"):
        return MEMSET
    stats = stat_names()
    if "memcpy_details" in stats:
        return MEMCPY
    if "memset_details" in stats:
        return MEMSET
    return KERNEL


def _stat_names(event: Any) -> set[str]:
    out = set()
    for s in getattr(event, "stats", ()) or ():
        try:
            out.add(s[0] if isinstance(s, tuple) else getattr(s, "name", str(s)))
        except Exception:  # noqa: BLE001 - an unreadable stat is not a reason to drop the event
            continue
    return out


def _device_lines(plane: Any) -> list[Any]:
    """The stream lines of a GPU plane; if it has none by that name, every line that is not a summary."""
    lines = list(plane.lines)
    streams = [ln for ln in lines if ln.name.startswith("Stream #")]
    if streams:
        return streams
    return [ln for ln in lines if ln.name not in _DERIVED_LINES and not ln.name.startswith("XLA ")]


def is_gpu_plane(name: str) -> bool:
    return bool(re.fullmatch(r"/device:GPU:\d+", name))


def events_from_planes(planes: Iterable[Any]) -> tuple[list[DeviceEvent], int]:
    """Device events of every GPU plane (objects with .name and .lines; lines with .name and .events;
    events with .name, .duration_ns and .stats) and how many GPU planes there were."""
    out, n_planes = [], 0
    for plane in planes:
        if not is_gpu_plane(plane.name):
            continue
        n_planes += 1
        for line in _device_lines(plane):
            for e in line.events:
                kind = _event_kind(e.name, lambda e=e: _stat_names(e))
                out.append(DeviceEvent(e.name, float(e.duration_ns), kind))
    return out, n_planes


def _options() -> Optional[Any]:
    """No Python tracer and no HLO protos in the trace: both cost seconds per trace and are not read."""
    try:
        opts = jax.profiler.ProfileOptions()
    except Exception:  # noqa: BLE001 - older jax: default options
        return None
    for name, value in (("python_tracer_level", 0), ("host_tracer_level", 1), ("enable_hlo_proto", False)):
        try:
            setattr(opts, name, value)
        except Exception:  # noqa: BLE001
            pass
    return opts


def _jax_trace(run_calls: Callable[[], None]) -> tuple[list[DeviceEvent], str]:
    """Events of the GPU planes of a jax.profiler trace around `run_calls`, and a note if there were none."""
    from jax.profiler import ProfileData
    with tempfile.TemporaryDirectory(prefix="jbs_trace_") as d:
        opts = _options()
        ctx = jax.profiler.trace(d, profiler_options=opts) if opts is not None else jax.profiler.trace(d)
        with ctx:
            run_calls()
        files = sorted(glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
        if not files:
            return [], "jax.profiler wrote no .xplane.pb"
        data = ProfileData.from_file(files[-1])
        events, n_planes = events_from_planes(data.planes)
    if not n_planes:
        return events, "jax.profiler trace has no /device:GPU plane"
    return events, ""


def _torch_trace(torch: Any, run_calls: Callable[[], None]) -> tuple[list[DeviceEvent], str]:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_calls()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        dur_ns = (e.time_range.end - e.time_range.start) * 1e3  # kineto's FunctionEvent times are in µs
        out.append(DeviceEvent(e.name, dur_ns, _event_kind(e.name, set)))
    return out, "" if out else "torch.profiler recorded no CUDA events"


def _cuda_torch() -> Optional[Any]:
    try:
        import torch
    except Exception:  # noqa: BLE001
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:  # noqa: BLE001
        return None


_state: dict[str, str] = {}  # backend that worked in this process ("jax" | "torch" | "none")


def profile(run: Callable[[], Any], *, calls: int, ops_per_call: int = 1, backend: str = "auto",
            block: Callable[[Any], Any] = jax.block_until_ready) -> KernelProfile:
    """Kernel time per operation of `run()` (already compiled and warmed up), launched `calls` times
    back to back inside one trace and blocked on at the end. `run()` does `ops_per_call` operations.

    backend: "jax", "torch" or "auto" (the first that worked in this process, jax at first; the other
    when it finds no GPU plane or no kernel in it). Never raises for a profiler failure: the profile is then
    empty and `note` says why.
    """
    if backend not in ("auto", "jax", "torch"):
        raise ValueError(f"backend must be auto, jax or torch, not {backend!r}")
    if calls < 1 or ops_per_call < 1:
        raise ValueError(f"calls and ops_per_call must be >= 1, got {calls} and {ops_per_call}")

    def run_calls() -> None:
        outs = [run() for _ in range(calls)]
        block(outs)

    if backend != "auto":
        order = [backend]
    elif _state.get("auto") == "none":
        return dataclasses.replace(EMPTY, calls=calls, ops_per_call=ops_per_call,
                                   note="no profiler gave GPU events earlier in this process")
    else:  # the one that worked before first; the other if it finds nothing (e.g. kernels it cannot see)
        order = sorted(("jax", "torch"), key=lambda b: b != _state.get("auto", "jax"))
    notes = []
    for name in order:
        torch = _cuda_torch() if name == "torch" else None
        if name == "torch" and torch is None:
            notes.append("torch with CUDA not importable")
            continue
        try:
            events, why = _jax_trace(run_calls) if name == "jax" else _torch_trace(torch, run_calls)
        except Exception as e:  # noqa: BLE001 - a profiler that fails must not stop a benchmark
            events, why = [], f"{name} profiler failed: {type(e).__name__}: {e}"[:300]
        if not why and not any(e.kind == KERNEL for e in events):
            why = f"{name} trace: GPU plane without kernel events"
        if not why:
            if backend == "auto":
                _state.setdefault("auto", name)  # the first that worked stays first: one source per run
            source = "jax.profiler" if name == "jax" else "torch.profiler"
            return aggregate(events, calls, ops_per_call, source=source)
        notes.append(why)
        if name == "jax" and jax.default_backend() != "gpu":
            break  # no GPU: nothing else will find kernels
    if backend == "auto" and jax.default_backend() == "gpu" and "auto" not in _state:
        _state["auto"] = "none"
    return dataclasses.replace(EMPTY, calls=calls, ops_per_call=ops_per_call, note="; ".join(notes))


def trace_calls(wall_per_call_s: float, *, minimum: int = 2, target_s: float = 0.02, maximum: int = 50) -> int:
    """How many calls to trace: enough for ~`target_s` of device work, within [minimum, maximum]."""
    if not math.isfinite(wall_per_call_s) or wall_per_call_s <= 0:
        return minimum
    return max(minimum, min(maximum, math.ceil(target_s / wall_per_call_s)))


def kernel_times(fn: Callable, arg_sets: Sequence[tuple], *, warmup: int = 2, ops_per_call: int = 1,
                 samples: int = 5, sample_s: float = 5e-3, backend: str = "auto",
                 block: Callable[[Any], Any] = jax.block_until_ready) -> KernelTime:
    """Kernel time and wall clock per operation of `fn(*args)`, rotating over `arg_sets`.

    The caller passes distinct argument sets whose bytes together exceed the L2 (> 100 MB on H100/H200),
    so consecutive calls never find their operands in L2. `warmup` calls compile and settle first. Wall
    clock: `samples` samples of back-to-back calls (at least `sample_s` long each, so host work overlaps
    device work), median and minimum per operation. Kernel time: `profile` over enough calls for ~20 ms.
    """
    if not arg_sets:
        raise ValueError("arg_sets is empty")
    n = len(arg_sets)
    for i in range(max(warmup, 1)):
        block(fn(*arg_sets[i % n]))

    def sample(calls: int) -> float:
        t0 = time.perf_counter()
        block([fn(*arg_sets[i % n]) for i in range(calls)])
        return time.perf_counter() - t0

    first = sample(n) / n
    calls = max(n, min(256, math.ceil(sample_s / max(first, 1e-9))))
    walls = [sample(calls) / (calls * ops_per_call) for _ in range(max(samples, 1))]
    wall = statistics.median(walls)
    counter = iter(range(1 << 62))
    prof = profile(lambda: fn(*arg_sets[next(counter) % n]), calls=max(n, trace_calls(wall * ops_per_call)),
                   ops_per_call=ops_per_call, backend=backend, block=block)
    return KernelTime(prof, wall, min(walls))
