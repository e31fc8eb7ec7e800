"""Where a compiled step's time goes, by phase: a cProfile of engine steps, each function's own time
put in one of five phases.

* ``kernels``: the arithmetic: inductor's generated C++ kernels, the GEMMs and attention it calls out to
  (``torch.mm``, ``torch.addmm``, an ``aten`` fallback such as CPU flash attention, a MoE layer's
  grouped GEMMs), and the eager parts' own aten calls (the LM head, the decoding rule);
* ``graph_launch``: the generated Python wrapper around the kernels (its ``call`` and subgraph
  functions, buffer allocations and tensor views); a captured CUDA graph replaces it with one replay;
* ``guards``: dynamo's frame entry with its guard check, and the AOT runtime wrappers;
* ``forward_prep``: our code between the engine's forward call and the graph (``engine.models``:
  bucketing, padding, input buffers);
* ``engine``: the rest of the step (scheduling, the step's inputs, logits, decoding, the host sync).

Profiling inflates Python-heavy phases more than kernels, so phases are shares of a profiled step,
not wall times; the step times themselves come from unprofiled rounds (``research.compiled_step``).
:func:`top_operations` lists a run's costliest operations by own time instead, each generated kernel
by name when inductor's kernel profile was on while it compiled.
"""
from __future__ import annotations

import cProfile
import pstats
from collections.abc import Callable

KERNEL_BUILTINS = ("torch.mm", "torch.addmm", "torch.bmm", "torch._grouped_mm", "torch._ops.aten",
                   "torch._C._nn.linear", "torch.softmax", "torch.where", "torch.isin", "torch.cat")
WRAPPER_BUILTINS = ("_reinterpret_tensor", "_empty_strided")
PHASES = ("kernels", "graph_launch", "guards", "forward_prep", "engine")


def phase_of(file: str, name: str) -> str:
    """The phase of one profiled function (``file``, ``name`` as pstats keys them)."""
    if file == "~":  # a builtin: ``{built-in method ...}`` / ``{method ...}``
        if ".kernel" in name or any(kernel in name for kernel in KERNEL_BUILTINS):
            return "kernels"
        if any(wrapper in name for wrapper in WRAPPER_BUILTINS):
            return "graph_launch"
        if "of 'torch._C.TensorBase' objects" in name:
            return "kernels"
        return "engine"
    if "torchinductor_" in file:
        return "graph_launch"
    if "torch/_dynamo" in file or "torch/_functorch" in file or "torch/_inductor" in file:
        return "guards"
    if "engine/models/" in file:
        return "forward_prep"
    return "engine"


def phase_shares(profile: cProfile.Profile, steps: int) -> dict[str, float]:
    """Milliseconds per step of each phase under the profiler (own time, so the phases add up)."""
    totals = dict.fromkeys(PHASES, 0.0)
    for (file, _, name), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        totals[phase_of(file, name)] += own
    return {phase: round(seconds * 1e3 / steps, 2) for phase, seconds in totals.items()}


def top_operations(run: Callable[[], int], top: int = 15) -> list[dict]:
    """The ``top`` operations of ``run`` (which returns its step count) by own time a step, under
    torch.profiler: aten operations, the compiled graphs' wrappers, and their kernels when
    ``torch._inductor.config.cpp.enable_kernel_profile`` was set before compiling."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        steps = run()
    events = sorted(profiled.key_averages(), key=lambda event: -event.self_cpu_time_total)[:top]
    return [{"operation": event.key[:100], "ms_a_step": round(event.self_cpu_time_total / 1e3 / steps, 3),
             "calls_a_step": round(event.count / steps, 1)} for event in events]
