"""Aten operations and logit positions per step of anchored rows (Nemotron-Labs-Diffusion's fixture).

``benchmarks.host_ops`` counts block rows' steps; this counts anchored rows', in
their dLM threshold mode and batched self-speculation, on 16 prompts of 3 to 40 tokens, and times each run three
times (the minimum). Run it in two checkouts to compare commits:

    python -m benchmarks.anchored_ops
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch

from benchmarks.host_ops import OpCounter
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-nemotron_labs_diffusion"
MODES = {"threshold_0.5": {"decoding": "threshold", "threshold": 0.5},
         "linear_spec_0.5": {"decoding": "linear_spec", "threshold": 0.5}}


def measure(lm, prompts: list[list[int]], settings: dict) -> dict:
    params = SamplingParams(max_new_tokens=48, stop_at_eos=False)
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **settings))
    with OpCounter() as counter:
        outputs = engine.generate(prompts, params)
    steps, trace = engine.stats().denoise_steps, list(engine.stats_collector.trace)
    walls = []
    for _ in range(3):
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **settings))
        start = time.perf_counter()
        engine.generate(prompts, params)
        walls.append(time.perf_counter() - start)
    return {"steps": steps, "ops_per_step": round(sum(counter.counts.values()) / steps, 1),
            "logit_positions": sum(record.logit_positions for record in trace), "wall_s_min": round(min(walls), 3),
            "tokens": sum(len(output.token_ids) for output in outputs)}


def seeded_prompts(count: int) -> list[list[int]]:
    """``count`` prompts of 3 to 39 token ids in 10 to 89, the same at every run."""
    rng = random.Random(0)
    return [[rng.randrange(10, 90) for _ in range(rng.randrange(3, 40))] for _ in range(count)]


def main() -> None:
    torch.set_num_threads(1)
    lm = load_model(FIXTURE, dtype="float32")
    prompts = seeded_prompts(16)
    print(json.dumps({mode: measure(lm, prompts, settings) for mode, settings in MODES.items()}))


if __name__ == "__main__":
    main()
