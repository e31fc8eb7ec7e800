"""LLaDA2.1's token editing against LLaDA2.0's rule: tokens per forward, step cost and tokens per second.

Three decodings of one workload on the LLaDA2 fixture (``tests/fixtures/tiny-llada2``, 3 layers) and on
its 32-layer copy (same family and shapes, random layers), blocks of 32, float32, one thread:

* ``LLaDA2.0``: ``low_confidence_dynamic``, threshold 0.95, 32 steps a block (``configs/llada2-mini.yaml``);
* ``S``: ``joint_threshold``, threshold 0.5, editing_threshold 0.0, 16 post-mask forwards at most (the
  model card's speed mode, ``configs/llada2.1-mini.yaml``);
* ``Q``: ``joint_threshold``, 0.7 / 0.5 / 16 (its quality mode).

Each round runs the three on the same requests on fresh engines in lockstep, one step of each in turn, in
an order that rotates from round to round; a mode's ratios to LLaDA2.0 are taken within a round and
reported as their median over rounds (the JSON lists every round's). Tokens per second is a mode's output
tokens over its own steps' time. Stop tokens get a -100 logit bias, so every answer is its whole cap
whatever a random model writes. Tokens per forward is output tokens over row forwards
(``EngineStats.tokens_per_forward``): on a random fixture it says how this fixture's logits drive the rule,
nothing about a trained model's. The step cost is the median wall time of the window steps that ran a full
batch (``--batch`` rows continuing their blocks on the cache, no row starting one): the same forward under
every rule, but for the logits it reads (every position of the block past the prompt for editing, the
masks for LLaDA2.0) and the rule itself, and for the keys its windows read (each rule's rows are at other
columns at a given step: the median is shown).

    python -m research editing                      # 32 requests, batch 16, 3 rounds, 3 and 32 layers
    python -m research editing --layers 32 --rounds 5
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time

from benchmarks.host_ops import FIXTURES, mixed_prompts, with_layers
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from engine.models import load_model
from research.block_causal import torch_threads

BLOCK = 32
MODES = {  # name -> EngineConfig settings
    "LLaDA2.0": {"decoding": "low_confidence_dynamic", "threshold": 0.95, "steps_per_block": 32},
    "S": {"decoding": "joint_threshold", "threshold": 0.5, "editing_threshold": 0.0, "max_post_steps": 16},
    "Q": {"decoding": "joint_threshold", "threshold": 0.7, "editing_threshold": 0.5, "max_post_steps": 16},
}
BASELINE = "LLaDA2.0"


class ModeRun:
    """One mode's engine on the workload, stepped from outside; what its steps cost and counted."""

    def __init__(self, lm, settings: dict, prompts, params, batch: int):
        self.engine = BlockServeEngine(lm, EngineConfig(block_length=BLOCK, max_batch_size=batch, **settings))
        self.ids = [self.engine.add_request(prompt, p) for prompt, p in zip(prompts, params)]
        self.batch, self.busy_s, self.outputs = batch, 0.0, {}
        self.window_steps = []  # (seconds, logit positions, keys) of each window step of a full batch

    def step(self) -> None:
        before = time.perf_counter()
        report = self.engine.step()
        seconds, record = time.perf_counter() - before, self.engine.stats_collector.trace[-1]
        self.busy_s += seconds
        if report.num_rows == self.batch and record.kind == "window":
            self.window_steps.append((seconds, record.logit_positions, record.window_context))
        self.outputs |= {output.request_id: output.token_ids for output in report.finished}

    def summary(self) -> dict:
        stats = self.engine.stats()
        seconds, positions, keys = zip(*self.window_steps) if self.window_steps else ((float("nan"),),) * 3
        return {"tokens": [self.outputs[i] for i in self.ids], "step_ms": median(seconds) * 1e3,
                "window_steps": len(self.window_steps), "logit_positions": median(positions), "keys": median(keys),
                "steps": stats.denoise_steps, "row_forwards": stats.row_forwards,
                "post_mask_forwards": stats.counters.get("post_mask_forwards", 0),
                "edits": stats.counters.get("edits", 0), "deletes": stats.counters.get("deletes", 0),
                "splits": stats.counters.get("splits", 0),
                "generated_tokens": stats.generated_tokens, "tokens_per_forward": stats.tokens_per_forward,
                "tokens_per_s": stats.generated_tokens / self.busy_s}


def lockstep_round(lm, order: list[str], prompts, params, batch: int, modes: dict = MODES) -> dict[str, dict]:
    """The modes' engines on one workload, one step each in turn (``order``, names of ``modes``) until all
    are done: a change in the machine's load falls on every mode that is still running. Tokens per second
    is over each engine's own step time."""
    runs = {mode: ModeRun(lm, modes[mode], prompts, params, batch) for mode in order}
    while any(run.engine.has_unfinished_requests() for run in runs.values()):
        for run in runs.values():
            if run.engine.has_unfinished_requests():
                run.step()
    return {mode: run.summary() for mode, run in runs.items()}


def compare(lm, layers: int, requests: int, batch: int, rounds: int, modes: dict = MODES,
            baseline: str = BASELINE) -> dict:
    """Every mode of ``modes`` ``rounds`` times, interleaved; per mode its figures (medians over rounds) and
    its ratios to ``baseline`` (the median of each round's ratio)."""
    prompts, params = mixed_prompts(lm, requests)
    never_stop = {stop: -100.0 for stop in lm.special_ids.stop_ids}  # every answer is its whole cap
    params = [dataclasses.replace(p, logit_bias=never_stop) for p in params]
    names = list(modes)
    runs = {name: [] for name in names}
    for round_index in range(rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name, run in lockstep_round(lm, order, prompts, params, batch, modes).items():
            runs[name].append(run)
    table = {}
    for name in names:
        first, base = runs[name][0], runs[baseline]
        table[name] = {
            "tokens_per_forward": round(first["tokens_per_forward"], 3),
            "post_mask_share": round(first["post_mask_forwards"] / first["row_forwards"], 3),
            "edits": first["edits"], "deletes": first["deletes"], "splits": first["splits"],
            "steps": first["steps"], "window_steps": first["window_steps"],
            "logit_positions": first["logit_positions"], "keys": first["keys"],
            "rows_per_step": round(first["row_forwards"] / first["steps"], 2),
            "step_ms": round(median(run["step_ms"] for run in runs[name]), 2),
            "tokens_per_s": round(median(run["tokens_per_s"] for run in runs[name]), 1),
            "step_ms_ratios": [round(r["step_ms"] / b["step_ms"], 3) for r, b in zip(runs[name], base)],
            "tokens_per_s_ratios": [round(r["tokens_per_s"] / b["tokens_per_s"], 3) for r, b in zip(runs[name], base)],
            "tokens_per_forward_ratio": round(first["tokens_per_forward"] / base[0]["tokens_per_forward"], 3),
            "same_tokens_every_round": all(run["tokens"] == first["tokens"] for run in runs[name]),
        }
    for row in table.values():  # the median of the rounds' ratios
        row["step_ms_ratio"], row["tokens_per_s_ratio"] = (median(row[key]) for key in (
            "step_ms_ratios", "tokens_per_s_ratios"))
    return {"layers": layers, "requests": requests, "batch": batch, "rounds": rounds,
            "output_tokens": runs[baseline][0]["generated_tokens"], "modes": table}


def markdown(results: list[dict]) -> str:
    lines = ["| layers | mode | tokens / forward | post-mask forwards | edits | steps | rows / step | full window "
             "steps | their logit positions, keys | ms a full window step | tok/s | step ms / LLaDA2.0 "
             "| tok/s / LLaDA2.0 |", "|" + "---|" * 13]
    for result in results:
        for name, row in result["modes"].items():
            lines.append(f"| {result['layers']} | {name} | {row['tokens_per_forward']:.2f} | "
                         f"{row['post_mask_share']:.0%} | {row['edits']} | {row['steps']} | {row['rows_per_step']} | "
                         f"{row['window_steps']} | {row['logit_positions']}, {row['keys']} | "
                         f"{row['step_ms']:.2f} | {row['tokens_per_s']:.1f} | {row['step_ms_ratio']:.3f} | "
                         f"{row['tokens_per_s_ratio']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="3,32", help="comma-separated depths; 3 is the fixture itself")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="the engines' max_batch_size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    fixture = load_model(FIXTURES / "tiny-llada2", dtype="float32")
    results = []
    with torch_threads(1):  # the step's own cost on a shared machine, not parallel arithmetic
        for layers in (int(value) for value in args.layers.split(",")):
            lm = fixture if layers == fixture.model.config.num_layers else with_layers(fixture, layers)
            results.append(compare(lm, layers, args.requests, args.batch, args.rounds))
            print(json.dumps(results[-1]), flush=True)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
