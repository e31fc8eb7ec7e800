"""The paper's evaluation, one function per table or figure. Each returns JSON-ready raw figures.

Every comparison runs its systems interleaved in one process (see :func:`systems.interleaved`).
"""
from __future__ import annotations

from dataclasses import dataclass

from benchmarks.perfmodel.host_model import HostModel
from benchmarks.summary import median, median_item
from benchmarks.systems import SYSTEMS, RunResult, interleaved
from benchmarks.throughput import project_run
from benchmarks.workloads import Workload
from engine.models.layout import blocks_needed
from engine.models.loader import DiffusionLM

PROJECTION = ("llada-8b", "h200")  # the projected columns: LLaDA-8B shapes on one H200


@dataclass(frozen=True)
class Scale:
    """How much of each workload a suite runs (the full suite must fit ~20 min on 2 cores: four schedules
    on four workloads, two of them replays with 256-token canvases)."""

    heldout: int | None  # held-out requests for the throughput table (None: the whole split)
    humaneval: int | None
    rounds: int  # interleaved rounds per comparison; medians are reported
    sweep_requests: int  # requests per point of the batch-size sweep
    batch_sizes: tuple[int, ...]
    ablation_requests: int
    ablation_rounds: int
    capacity_budget: int  # bounding-box tokens of the capacity table
    replay_requests: int = 48  # requests of each length-replay workload (benchmarks.replay)
    humaneval_max_new_tokens: int = 256  # the clip of the canonical-solution length caps


SCALES = {
    "full": Scale(heldout=32, humaneval=24, rounds=2, sweep_requests=16, batch_sizes=(1, 4, 16),
                  ablation_requests=24, ablation_rounds=1, capacity_budget=4096),
    "quick": Scale(heldout=16, humaneval=8, rounds=1, sweep_requests=4, batch_sizes=(1, 4, 16),
                   ablation_requests=8, ablation_rounds=1, capacity_budget=2048, replay_requests=16),
    "smoke": Scale(heldout=2, humaneval=2, rounds=1, sweep_requests=2, batch_sizes=(1, 2),
                   ablation_requests=2, ablation_rounds=1, capacity_budget=1024, humaneval_max_new_tokens=32,
                   replay_requests=2),
}
BATCH_SIZE = 16


def projected(result: RunResult, host: HostModel) -> dict:
    """A run's per-forward trace priced for LLaDA-8B on an H200 with the host model (and the old
    projection beside it): **projected**, not measured."""
    figures = project_run(result, host, *PROJECTION)
    return {key: figures[key] for key in ("tokens_per_s", "mfu", "total_s", "refresh_s", "window_s",
                                          "host_bound_calls", "calls", "old_tokens_per_s", "old_mfu")}


def _median_of(runs: list[RunResult], key: str) -> float:
    return median(run.stats[key] for run in runs)


def _summary(label: str, runs: list[RunResult], host: HostModel) -> dict:
    middle = median_item(runs, key=lambda run: run.tokens_per_s)
    return {"label": label, "system": middle.system, "rounds": len(runs), "projected": projected(middle, host),
            "tokens_per_s": _median_of(runs, "tokens_per_s"),
            "tokens_per_s_all": [run.tokens_per_s for run in runs],
            "accuracy": middle.accuracy, "outputs_digest": middle.extra["outputs_digest"],
            **{key: _median_of(runs, key) for key in (
                "effective_compute_ratio", "useful_row_fraction", "padding_fraction",
                "scheduler_overhead_fraction", "rows_per_forward", "denoise_steps", "window_forwards",
                "generated_tokens", "peak_bounding_box_tokens")},
            "peak_rows": middle.peak_rows, "mean_step_rows": middle.mean_step_rows,
            "requests": middle.requests}


def throughput(cases: list[tuple[Workload, DiffusionLM]], scale: Scale, host: HostModel, log=print) -> dict:
    """Table II (and the per-request latencies behind Fig. 2): every schedule at batch 16.

    cases: each workload with the model it runs on (a replay workload's model steers its EOS)."""
    tables = {}
    for workload, lm in cases:
        variants = {system: {"system": system, "max_batch_size": BATCH_SIZE} for system in SYSTEMS}
        runs = interleaved(lm, variants, workload, scale.rounds, log)
        rows = [_summary(label, results, host) for label, results in runs.items()]
        block_sync = next(row for row in rows if row["system"] == "block_sync")["tokens_per_s"]
        for row in rows:
            row["speedup_of_block_sync"] = block_sync / row["tokens_per_s"] if row["tokens_per_s"] else None
        tables[workload.name] = {"workload_notes": workload.notes, "rows": rows,
                                 "identical_outputs": len({row["outputs_digest"] for row in rows}) == 1}
    return tables


def batch_sweep(lm: DiffusionLM, workload: Workload, scale: Scale, host: HostModel, log=print) -> dict:
    """Fig. 3 (effective compute ratio, useful row fraction) and Fig. 4 (latency percentiles) per batch size."""
    points = []
    for batch_size in scale.batch_sizes:
        variants = {system: {"system": system, "max_batch_size": batch_size} for system in SYSTEMS}
        runs = interleaved(lm, variants, workload, 1, log)
        for label, results in runs.items():
            points.append({"batch_size": batch_size, **_summary(label, results, host)})
    return {"workload": workload.name, "requests": len(workload), "points": points}


def capacity(lm: DiffusionLM, workload: Workload, scale: Scale, host: HostModel, log=print) -> dict:
    """Table IV: under one token budget, the largest batch each system runs safely.

    ``static``/``shrink`` fix their batch size up front (Fast-dLLM's ``batch_size``): it is safe only if
    the worst batch of the workload fits, i.e. rows x (longest prompt + longest canvas) <= budget.
    ``continuous``/``block_sync`` admit by the budget, so they are safe at any batch size; what they sustain is
    measured (peak and mean concurrent rows, with as many arena slots as the budget could ever fill).
    """
    budget = scale.capacity_budget
    widths = _row_widths(lm, workload)
    static_rows = budget // max(widths)
    result = {"workload": workload.name, "token_budget": budget, "widest_row": max(widths),
              "narrowest_row": min(widths), "static_safe_batch": static_rows, "systems": []}
    admitted_rows = max(budget // min(widths), 1)  # arena slots: as many rows as the budget can ever hold
    variants = {
        "continuous": {"system": "continuous", "max_batch_size": admitted_rows, "token_budget": budget},
        "block_sync": {"system": "block_sync", "max_batch_size": admitted_rows, "token_budget": budget},
        "static": {"system": "static", "max_batch_size": max(static_rows, 1), "token_budget": budget},
        "shrink": {"system": "shrink", "max_batch_size": max(static_rows, 1), "token_budget": budget},
    }
    runs = interleaved(lm, variants, workload, 1, log)
    for label, results in runs.items():
        run = results[0]
        result["systems"].append({
            "system": label, "max_batch_size": variants[label]["max_batch_size"],
            "peak_rows": run.peak_rows, "mean_rows": run.mean_step_rows,
            "peak_bounding_box_tokens": run.stats["peak_bounding_box_tokens"],
            "within_budget": run.stats["peak_bounding_box_tokens"] <= budget,
            "tokens_per_s": run.tokens_per_s, "accuracy": run.accuracy, "projected": projected(run, host)})
    return result


def _row_widths(lm: DiffusionLM, workload: Workload, block_length: int = 32) -> list[int]:
    """prompt + canvas of every request, as the engine will size its row."""
    from engine.models.prompts import encode_prompt

    widths = []
    for prompt, params in zip(workload.prompts, workload.params):
        prompt_length = len(encode_prompt(lm.tokenizer, prompt, lm.vocab_size))
        widths.append(prompt_length + blocks_needed(params.max_new_tokens, block_length) * block_length)
    return widths


def ablations(lm: DiffusionLM, workload: Workload, scale: Scale, host: HostModel, log=print) -> dict:
    """Block length 16/32/64 (throughput, accuracy); sorted vs arrival-order queue (throughput, padding).
    On the default ``continuous`` schedule."""
    workload = workload.head(scale.ablation_requests)
    lengths = {f"L={length}": {"system": "continuous", "max_batch_size": BATCH_SIZE, "block_length": length}
               for length in (16, 32, 64)}
    length_runs = interleaved(lm, lengths, workload, scale.ablation_rounds, log)
    queues = {"sorted": {"system": "continuous", "max_batch_size": BATCH_SIZE, "sort_pending": True},
              "arrival": {"system": "continuous", "max_batch_size": BATCH_SIZE, "sort_pending": False}}
    queue_runs = interleaved(lm, queues, workload, scale.ablation_rounds, log)
    return {"workload": workload.name, "requests": len(workload),
            "block_length": [_summary(label, runs, host) for label, runs in length_runs.items()],
            "queue_order": [_summary(label, runs, host) for label, runs in queue_runs.items()]}
