"""What aging (``max_wait_s``) costs in throughput, and what it buys the wide requests it rescues.

    python -m research aging [--steps 240] [--json out.json]

A steady stream, the case aging exists for: one short request (10-token prompt) arrives at every
engine step, and a wide one (150-token prompt) every ``--wide-every`` steps. With length-sorted,
fits-first admission under a token budget, the short requests keep filling the rows and a wide one may
never fit. Each setting runs the same arrivals on the same engine (tiny model, float32, CPU; fixed
lengths: ``stop_at_eos=False`` and the quota rule, so every run does the same work per request) and
reports CPU tokens/s, forward passes and rows per forward, the projected H200 tokens/s of its trace
(LLaDA-8B shapes, ``benchmarks.perfmodel.projection``), and the wide and short requests' latency in steps.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.perfmodel.projection import project
from benchmarks.summary import percentile
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model

SETTINGS = (None, 2.0, 0.5, 0.0)  # max_wait_s; None: no aging
SHORT_PROMPT, WIDE_PROMPT = [7] * 10, [9] * 150


def run(lm, max_wait_s: float | None, steps: int, wide_every: int) -> dict:
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, token_budget=8 * 80, max_wait_s=max_wait_s,
                                               decoding="quota", steps_per_block=4, block_length=32))
    params = SamplingParams(max_new_tokens=64, stop_at_eos=False)
    arrived: dict[str, tuple[str, int]] = {}  # request id -> (kind, arrival step)
    latency: dict[str, list[int]] = {"short": [], "wide": []}
    step, started = 0, time.perf_counter()
    while step < steps or engine.has_unfinished_requests():
        if step < steps:
            arrived[engine.add_request(SHORT_PROMPT, params)] = ("short", step)
            if step % wide_every == wide_every // 2:
                arrived[engine.add_request(WIDE_PROMPT, params)] = ("wide", step)
        for output in engine.step().finished:
            kind, at = arrived[output.request_id]
            latency[kind].append(step - at + 1)
        step += 1
        if step > 20 * steps:
            break  # without aging a wide request may never finish: report it as starved
    seconds = time.perf_counter() - started
    stats = engine.stats()
    wide_total = sum(kind == "wide" for kind, _ in arrived.values())
    projected = project(list(engine.stats_collector.trace), stats.generated_tokens, "llada-8b", "h200")
    return {
        "max_wait_s": max_wait_s, "engine_steps": step, "cpu_s": round(seconds, 2),
        "generated_tokens": stats.generated_tokens, "cpu_tokens_per_s": round(stats.generated_tokens / seconds, 1),
        "denoise_steps": stats.denoise_steps, "rows_per_forward": round(stats.rows_per_forward, 2),
        "projected_h200_tokens_per_s": round(projected["tokens_per_s"], 1),
        "wide_finished": f"{len(latency['wide'])}/{wide_total}",
        "wide_latency_steps_max": max(latency["wide"], default=None),
        "wide_latency_steps_mean": round(sum(latency["wide"]) / len(latency["wide"]), 1) if latency["wide"] else None,
        "short_latency_steps_p50": round(percentile(latency["short"], 50), 1),
        "short_latency_steps_p99": round(percentile(latency["short"], 99), 1),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=240, help="steps with arrivals")
    parser.add_argument("--wide-every", type=int, default=40)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    lm = load_model("tiny", dtype="float32")
    rows = [run(lm, setting, args.steps, args.wide_every) for setting in SETTINGS]
    baseline = rows[0]
    print(f"{'max_wait_s':>10} {'steps':>6} {'fwd':>6} {'rows/fwd':>8} {'CPU tok/s':>9} {'H200* tok/s':>11} "
          f"{'vs none*':>8} {'wide done':>9} {'wide max':>8} {'short p99':>9}")
    for row in rows:
        ratio = row["projected_h200_tokens_per_s"] / baseline["projected_h200_tokens_per_s"]
        row["projected_vs_no_aging"] = round(ratio, 3)
        print(f"{str(row['max_wait_s']):>10} {row['engine_steps']:>6} {row['denoise_steps']:>6} "
              f"{row['rows_per_forward']:>8} {row['cpu_tokens_per_s']:>9} {row['projected_h200_tokens_per_s']:>11} "
              f"{ratio:>8.3f} {row['wide_finished']:>9} {str(row['wide_latency_steps_max']):>8} "
              f"{row['short_latency_steps_p99']:>9}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
