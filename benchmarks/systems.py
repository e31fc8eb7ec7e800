"""The systems under test and one honest way to run them.

All four are schedules of the same engine on the same loaded model, so every difference measured is
the batching policy's. ``continuous`` is ours: rows advance block by block on their own. ``block_sync``
is BlockServe's block cycles. ``static`` is Fast-dLLM's fixed batches. ``shrink`` is Fast-dLLM v2 and
dInfer: finished rows leave, and nobody joins. A system's label is its engine schedule's name. Results
stored before the rename say ``step`` and ``block``; ``benchmarks.results_io.read_results`` maps them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.workloads import Workload, exact_match
from engine import BlockServeEngine, EngineConfig
from engine.models.loader import DiffusionLM

SYSTEMS = ("continuous", "block_sync", "static", "shrink")  # each one the engine schedule of that name


@dataclass
class RunResult:
    """One system over one workload: engine stats, per-request figures, accuracy."""

    system: str
    workload: str
    config: dict[str, Any]
    stats: dict[str, Any]
    accuracy: float | None
    requests: list[dict[str, Any]]  # per request: output_tokens, latency_s, queue_s, finish_reason
    peak_rows: int = 0  # most rows in one step
    mean_step_rows: float = 0.0  # rows per step (concurrent requests), averaged over steps
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.stats["tokens_per_s"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without the per-forward trace (``extra["trace"]``, for projections)."""
        extra = {key: value for key, value in self.extra.items() if key != "trace"}
        return asdict(dataclasses.replace(self, extra=extra))


def run_system(lm: DiffusionLM, system: str, workload: Workload, **config: Any) -> RunResult:
    """Queue the whole workload at once (an offline batch, as in the paper) and run it to the end."""
    engine_config = EngineConfig(schedule=system, **config)
    engine = BlockServeEngine(lm, engine_config)
    started = time.perf_counter()
    ids = [engine.add_request(prompt, params) for prompt, params in zip(workload.prompts, workload.params)]
    outputs, step_rows = {}, []
    while engine.has_unfinished_requests():
        finished = engine.step().finished
        # rows of the step just run = rows still running + rows it just evicted
        step_rows.append(engine.num_running + sum(o.finish_reason != "error" for o in finished))
        outputs.update((output.request_id, output) for output in finished)
    wall_s = time.perf_counter() - started
    verify = getattr(lm.model, "verify", None)  # a replay's steering checks it knew every row (one sync)
    if verify is not None:
        verify()
    ordered = [outputs[request_id] for request_id in ids]
    errors = [output.error for output in ordered if output.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"{system} on {workload.name}: {len(errors)} request(s) failed, first: {errors[0]}")
    requests = [{"output_tokens": len(o.token_ids), "latency_s": o.latency_s, "queue_s": o.queue_s,
                 "num_blocks": o.num_blocks, "finish_reason": o.finish_reason} for o in ordered]
    return RunResult(system=system, workload=workload.name, config=engine_config.to_dict(),
                     stats=engine.stats().to_dict(), accuracy=exact_match(ordered, workload.answers),
                     requests=requests, peak_rows=max(step_rows, default=0),
                     mean_step_rows=sum(step_rows) / max(len(step_rows), 1), wall_s=wall_s,
                     extra={"outputs_digest": outputs_digest(ordered), "trace": list(engine.stats_collector.trace)})


def outputs_digest(outputs) -> str:
    """A short fingerprint of every output's token ids: equal digests mean identical answers."""
    digest = hashlib.sha1()
    for output in outputs:
        digest.update(repr(output.token_ids).encode())
    return digest.hexdigest()[:12]


def interleaved(lm: DiffusionLM, variants: dict[str, dict[str, Any]], workload: Workload, rounds: int,
                log=print) -> dict[str, list[RunResult]]:
    """Run every variant once per round, in turn (A, B, C, A, B, C, ...), so machine noise hits all alike.

    variants: label -> keyword arguments of :func:`run_system` (``system`` plus EngineConfig fields),
    and optionally ``lm``: the model that variant runs on instead (one loaded with other options).
    """
    results: dict[str, list[RunResult]] = {label: [] for label in variants}
    for round_index in range(rounds):
        for label, arguments in variants.items():
            arguments = dict(arguments)
            result = run_system(arguments.pop("lm", lm), arguments.pop("system"), workload, **arguments)
            results[label].append(result)
            log(f"  [{workload.name}] round {round_index + 1}/{rounds} {label:>14}: "
                f"{result.tokens_per_s:8.1f} tok/s  ecr {result.stats['effective_compute_ratio']:.2f}  "
                f"urf {result.stats['useful_row_fraction']:.2f}  "
                f"overhead {result.stats['scheduler_overhead_fraction']:.1%}  acc {result.accuracy}")
    return results
