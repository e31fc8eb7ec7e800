"""The runs both DiffusionGemma comparisons time (``research.diffusion_gemma`` and its spread workload):
our engine on every prompt at once, and transformers' ``generate`` alone or batched, on the fixture."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-diffusion_gemma"
DEMO = Path(__file__).resolve().parents[1] / "assets" / "data" / "demo.jsonl"
SETTINGS = {"default": {}, "adaptive": {"stability_threshold": 0, "confidence_threshold": 0.3}}


def demo_prompts(count: int) -> list[str]:
    lines = DEMO.read_text().splitlines()[:count]
    return [json.loads(line)["prompt"] for line in lines]


def run_ours(lm, prompts: list[str], new_tokens: int, settings: dict) -> tuple[float, list[list[int]]]:
    from engine import BlockServeEngine, EngineConfig, SamplingParams

    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16, max_denoising_steps=16, **settings))
    params = [SamplingParams(max_new_tokens=new_tokens, seed=seed) for seed in range(len(prompts))]
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    return time.perf_counter() - started, [output.token_ids for output in outputs]


def cut(tokens: list[int], stops: tuple[int, ...], cap: int) -> list[int]:
    stop = next((index for index, token in enumerate(tokens) if token in stops), len(tokens))
    return tokens[:min(stop, cap)]


def run_reference_alone(reference, lm, prompts: list[str], new_tokens: int, settings: dict):
    answers, started = [], time.perf_counter()
    for seed, prompt in enumerate(prompts):
        ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
        torch.manual_seed(seed)
        out = reference.generate(ids, max_new_tokens=new_tokens, max_denoising_steps=16, **settings)
        answers.append(cut(out.sequences[0, ids.shape[1]:].tolist(), lm.special_ids.stop_ids, new_tokens))
    return time.perf_counter() - started, answers


def run_reference_batched(reference, lm, prompts: list[str], new_tokens: int, settings: dict):
    lm.tokenizer.padding_side = "left"
    batch = lm.tokenizer(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(0)
    started = time.perf_counter()
    out = reference.generate(batch.input_ids, attention_mask=batch.attention_mask, max_new_tokens=new_tokens,
                             max_denoising_steps=16, **settings)
    elapsed = time.perf_counter() - started
    width = batch.input_ids.shape[1]
    return elapsed, [cut(row[width:].tolist(), lm.special_ids.stop_ids, new_tokens) for row in out.sequences]
