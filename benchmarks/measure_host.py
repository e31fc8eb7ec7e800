"""Measure the host model on this machine: the experiment behind ``python -m benchmarks host-model``.

The model itself (:class:`benchmarks.perfmodel.host_model.HostModel`: operations per kind of forward x
seconds per operation, plus a gap per step) is priced by the performance model. Here its figures are
measured on the engine itself. The operation counts come from ``benchmarks.host_ops.OpCounter`` over
whole steps of a random model of the projected family at 1 and at 32 layers (per kind: refresh,
window, packed), on the steered HumanEval replay (whose steering adds ~30 operations a step).
``seconds_per_op`` and ``gap_s`` are fitted (a line through the window steps of both depths: slope per
operation, intercept the gap) to the measured seconds of the same steps on a model of tiny dimensions,
where compute is negligible: on the CPU that is dispatch cost, on a GPU dispatch + launch.
:func:`measure` runs in seconds; ``main`` keeps the result in ``benchmarks/calibration/host-<device>.json``.
"""
from __future__ import annotations

import datetime
import json
import time

from benchmarks.perfmodel import host_model
from benchmarks.perfmodel.host_model import KINDS, HostModel, fit_seconds_per_op


def _steps(engine, prompts, params, counting: bool, clock=time.perf_counter) -> list[tuple[str, float]]:
    """(kind, operations or seconds) of every step that ran a forward, the workload run to the end."""
    from benchmarks.host_ops import OpCounter

    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    rows = []
    while engine.has_unfinished_requests():
        before = len(engine.stats_collector.trace)
        if counting:
            with OpCounter() as counter:
                engine.step()
            value = float(counter.total)
        else:
            started = clock()
            engine.step()
            value = clock() - started
        if len(engine.stats_collector.trace) > before:
            rows.append((engine.stats_collector.trace[-1].kind, value))
    return rows


def _per_kind(rows: list[tuple[str, float]], q: float) -> dict[str, float]:
    """The q-th percentile of each kind's values (a low one for times: least disturbed by other load)."""
    from benchmarks.summary import percentile

    return {kind: percentile([v for k, v in rows if k == kind], q) for kind in KINDS
            if any(k == kind for k, _ in rows)}


def measure(fixture: str = "tiny-llada", device: str = "cpu", deep_layers: int = 32, prompts: int = 8,
            repeats: int = 2, compile: bool = False, **engine_config) -> HostModel:
    """Count and time steps of ``fixture``'s family at 1 and ``deep_layers`` layers (tiny dimensions).

    One torch thread: at these sizes more threads only add synchronisation (and on a shared CPU, far
    worse). On the CPU a step's time is this process's CPU time (what the operations cost, not the
    waits for a core another process holds); on a GPU it is wall time (the step ends with its sync).
    Times are each kind's 10th percentile over ``repeats`` runs; 4 rows so rows join mid-block and
    packed steps occur."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(fixture, device, deep_layers, prompts, repeats, compile, engine_config)
    finally:
        torch.set_num_threads(threads)


def _measure(fixture: str, device: str, deep_layers: int, prompts: int, repeats: int, compile: bool,
             engine_config: dict) -> HostModel:
    import torch

    from benchmarks.host_ops import FIXTURES, with_layers
    from benchmarks.replay import replay
    from engine import BlockServeEngine, EngineConfig
    from engine.models import load_model

    lm = load_model(FIXTURES / fixture, dtype="float32")
    workload = replay("humaneval", lm, prompts)  # the commit profile staggers blocks: packed steps occur
    prompt_ids, params = workload.prompt_token_ids, workload.workload.params
    ops, seconds = {}, {}
    for layers in (1, deep_layers):
        model_lm = workload.steered(with_layers(lm, layers, device=device, compile=compile))
        engine = BlockServeEngine(model_lm, EngineConfig(**({"max_batch_size": 4} | engine_config)))
        engine.generate(prompt_ids[:2], params[:2])  # warm-up (first-call allocations, compilation)
        ops[layers] = _per_kind(_steps(engine, prompt_ids, params, counting=True), 50)
        clock = time.perf_counter if device.startswith("cuda") else time.process_time
        timed = [row for _ in range(repeats) for row in _steps(engine, prompt_ids, params, False, clock)]
        seconds[layers] = _per_kind(timed, 10)
    kinds = [kind for kind in KINDS if kind in ops[1] and kind in ops[deep_layers]]
    per_layer = {kind: (ops[deep_layers][kind] - ops[1][kind]) / (deep_layers - 1) for kind in kinds}
    fixed = {kind: ops[1][kind] - per_layer[kind] for kind in kinds}
    fitted = ["window"] if "window" in kinds else kinds  # the smallest tensors: compute is least there
    points = [(ops[layers][kind], seconds[layers][kind]) for layers in ops for kind in fitted]
    seconds_per_op, gap_s = fit_seconds_per_op(points)
    where = torch.cuda.get_device_name() if device.startswith("cuda") else "this CPU (process CPU time)"
    source = (f"measured {datetime.date.today().isoformat()} on {where}: {fixture} family at 1 and "
              f"{deep_layers} layers{', compiled' if compile else ''}, engine {engine_config or 'defaults'}")
    return HostModel({k: round(v, 1) for k, v in fixed.items()}, {k: round(v, 2) for k, v in per_layer.items()},
                     seconds_per_op, gap_s, source)


def main(argv: list[str] | None = None) -> HostModel:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks host-model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--deep-layers", type=int, default=32)
    parser.add_argument("--compile", action="store_true", help="models loaded with compile=True")
    args = parser.parse_args(argv)
    model = measure(device=args.device, deep_layers=args.deep_layers, compile=args.compile)
    path = host_model.save(model, args.device.split(":")[0] + ("-compiled" if args.compile else ""))
    print(json.dumps(model.to_dict(), indent=1))
    print(f"wrote {path}")
    return model
