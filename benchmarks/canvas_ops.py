"""Aten operations per step of canvas rows (DiffusionGemma's fixture), with the answers' digest.

``benchmarks.host_ops`` counts block rows' steps and ``benchmarks.anchored_ops`` anchored rows'; this counts
canvas rows' on 12 seeded prompts of 3 to 39 tokens, plain and with ``logit_bias`` and ``logprobs``. The digest
is a hash of every answer's tokens, so two commits that print the same one gave the same tokens. Run it in two
checkouts to compare commits:

    python -m benchmarks.canvas_ops
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from benchmarks.anchored_ops import seeded_prompts
from benchmarks.host_ops import OpCounter
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-diffusion_gemma"
MODES = {"plain": {}, "bias_and_logprobs": {"logit_bias": {7: 2.0, 11: -1.5}, "logprobs": 2}}


def measure(lm, prompts: list[list[int]], settings: dict) -> dict:
    params = [SamplingParams(max_new_tokens=24, seed=seed, **settings) for seed in range(len(prompts))]
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=4, max_denoising_steps=6))
    with OpCounter() as counter:
        outputs = engine.generate(prompts, params)
    steps = engine.stats().denoise_steps
    answers = json.dumps([list(output.token_ids) for output in outputs]).encode()
    return {"steps": steps, "ops_per_step": round(sum(counter.counts.values()) / steps, 1),
            "tokens": sum(len(output.token_ids) for output in outputs),
            "digest": hashlib.sha256(answers).hexdigest()[:16]}


def main() -> None:
    torch.set_num_threads(1)
    lm = load_model(FIXTURE, dtype="float32")
    prompts = seeded_prompts(12)
    print(json.dumps({mode: measure(lm, prompts, settings) for mode, settings in MODES.items()}))


if __name__ == "__main__":
    main()
