"""The GPU run's engine runs: every schedule, eager and compiled, on the steered replay, guarded in time;
each run's own trace projected beside what it measured."""
from __future__ import annotations

import copy
import dataclasses
import json
import time
from pathlib import Path

from benchmarks.perfmodel.hardware import DEVICES, MODELS
from benchmarks.perfmodel.host_model import HostModel
from benchmarks.perfmodel.projection import Constants, forward_flops, project
from benchmarks.replay import CANVAS_TOKENS, replay
from benchmarks.systems import SYSTEMS
from engine import BlockServeEngine, EngineConfig
from engine.models import ModelOptions
from engine.models.loader import DiffusionLM, apply_model_options

WARMUP_REQUESTS = 2
COMPILE_RESERVE_S = 120  # a schedule's compiled warm-up is not interruptible: start it only with this left


def mode_model(lm: DiffusionLM, mode: str) -> DiffusionLM:
    """``lm`` itself for "eager"; for "compiled", a copy of its model (same weights) loaded compiled."""
    if mode != "compiled":
        return lm
    model = copy.deepcopy(lm.model)
    apply_model_options(model, ModelOptions(compile=True))
    return dataclasses.replace(lm, model=model)


def guarded_run(engine: BlockServeEngine, prompts, params, stop_at: float) -> tuple[float, bool]:
    """Queue everything, step until done or ``stop_at`` (checked every step): (seconds, timed out)."""
    started = time.perf_counter()
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    while engine.has_unfinished_requests():
        if time.perf_counter() > stop_at:
            return time.perf_counter() - started, True
        engine.step()
    return time.perf_counter() - started, False


def projection_errors(trace, tokens: int, measured_s: float, device_key: str, host: HostModel,
                      fitted: Constants) -> tuple[dict, dict]:
    """Projected seconds of the run's own trace (host model with default and fitted constants; the old
    projection) and each one's relative error against the measured seconds."""
    projected = {"host model, default": project(trace, tokens, "llada-8b", device_key, host=host),
                 "host model, fitted": project(trace, tokens, "llada-8b", device_key, fitted, host=host),
                 "old, default": project(trace, tokens, "llada-8b", device_key)}
    seconds = {label: figures["total_s"] for label, figures in projected.items()}
    return seconds, {label: value / measured_s - 1 for label, value in seconds.items()}


def run_engine_modes(lm: DiffusionLM, calibration: dict, requests: int, batch_size: int, modes: list[str],
                     deadline: float, run_cap_s: float, trace_dir: Path, smoke: bool) -> dict:
    workload = replay("humaneval", lm, requests)
    host = HostModel.from_dict(calibration["host_model"])
    fitted = Constants(**calibration["fitted"])
    key = calibration["device_key"]
    widest = max(map(len, workload.prompt_token_ids)) + CANVAS_TOKENS
    trace_dir.mkdir(parents=True, exist_ok=True)
    out: dict = {"workload": workload.workload.notes, "modes": {}}
    for mode in modes:
        steered = workload.steered(mode_model(lm, mode))
        runs = out["modes"][mode] = {}
        for system in SYSTEMS:
            if time.perf_counter() > deadline - (COMPILE_RESERVE_S if mode == "compiled" else 10):
                runs[system] = "skipped: time budget"  # a compile cannot be cut short once started
                continue
            config = {"schedule": system, "max_batch_size": batch_size, "max_model_len": widest}
            engine = BlockServeEngine(steered, EngineConfig(**config))
            warm_started = time.perf_counter()
            guarded_run(engine, workload.prompt_token_ids[:WARMUP_REQUESTS],
                        workload.workload.params[:WARMUP_REQUESTS], deadline)
            warmup_s = time.perf_counter() - warm_started
            engine.reset_stats()
            seconds, timed_out = guarded_run(engine, workload.prompt_token_ids, workload.workload.params,
                                             min(deadline, time.perf_counter() + run_cap_s))
            steered.model.verify()
            runs[system] = summarize_run(engine, workload, seconds, timed_out, warmup_s, key, host, fitted)
            with open(trace_dir / f"{mode}-{system}.jsonl", "w") as handle:
                for record in engine.stats_collector.trace:
                    handle.write(json.dumps(record.to_dict()) + "\n")
    return out


def summarize_run(engine: BlockServeEngine, workload, seconds: float, timed_out: bool, warmup_s: float,
                  key: str, host: HostModel, fitted: Constants) -> dict:
    stats = engine.stats()
    trace = list(engine.stats_collector.trace)
    tokens = stats.generated_tokens
    projected_s, errors = projection_errors(trace, tokens, seconds, key, host, fitted)
    flops = sum(forward_flops(record, MODELS["llada-8b"]) for record in trace)
    row_steps = sum(record.rows for record in trace)
    answer_blocks = sum(length // 32 + 1 for length in workload.answer_lengths)  # each request's own blocks
    return {"measured_s": seconds, "timed_out": timed_out, "warmup_s": warmup_s, "generated_tokens": tokens,
            "tokens_per_s": tokens / seconds if seconds else 0.0, "forwards": len(trace),
            "row_steps": row_steps, "row_steps_per_block": row_steps / answer_blocks,
            "rows_per_forward": stats.rows_per_forward, "padding_fraction": stats.padding_fraction,
            "mfu": flops / seconds / DEVICES[key].peak_flops if seconds else 0.0,
            "projected_s": projected_s, "projection_error": errors,
            "projected_tokens_per_s": {label: tokens / value for label, value in projected_s.items() if value}}
