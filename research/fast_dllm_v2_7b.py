"""Fast-dLLM v2 at Fast_dLLM_v2_7B's layer shapes: the engine's tok/s, tokens per forward and model calls.

    python -m research gpu-checks --stages fast-dllm-v2 --out DIR           # one GPU, bf16
    python -m research gpu-checks --stages fast-dllm-v2 --smoke --out DIR   # the same path on the CPU, tiny

The family (``engine.models.families.fast_dllm_v2``) with Qwen2.5-7B's layers (28 layers, hidden 3584, 28 query
and 4 key/value heads of 128, MLP 18944, q/k/v bias, rope_theta 1e6) drawn at random in bf16 on the device, and
the tiny fixture's tokenizer and vocabulary (``scripts.make_fast_dllm_fixture``). The card's decoding:
``low_confidence`` at threshold 0.9 in sub-blocks of 8, blocks of 32, eager. One engine per batch size runs the
first ``max(batch, 4)`` of the same prompts to exactly ``new_tokens`` tokens each (``stop_at_eos=False``) in
rounds that visit every engine in turn; a deadline checked before every run stops the stage (``cut``). A random
model's confidences are not the release's: tokens per forward describe this model, what a forward costs is the
figure to read.
"""
from __future__ import annotations

import dataclasses
import random
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import ModelOptions, load_model
from engine.models.loader import DiffusionLM, apply_model_options
from engine.models.transformer import BidirectionalTransformer
from scripts.make_fast_dllm_fixture import write_fixture

QWEN25_7B = dict(num_layers=28, hidden_size=3584, num_heads=28, num_kv_heads=4, head_dim=128,
                 intermediate_size=18944, rope_theta=1000000.0)
SMOKE = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
             rope_theta=1000000.0)
DECODING = dict(decoding="low_confidence", threshold=0.9, sub_block_length=8, block_length=32)


def shaped(dims: dict, device: str, dtype: torch.dtype) -> DiffusionLM:
    """The tiny fixture's family, tokenizer and vocabulary with random layers of ``dims`` on ``device``."""
    with tempfile.TemporaryDirectory() as scratch:
        lm = load_model(write_fixture(Path(scratch) / "tiny-fast_dllm_v2"), device=device)
    config = dataclasses.replace(lm.model.config, **dims)
    torch.manual_seed(0)
    with torch.device(device):
        model = BidirectionalTransformer(config)
    model = model.to(dtype).eval().requires_grad_(False)
    apply_model_options(model, ModelOptions())
    return dataclasses.replace(lm, model=model)


def prompts(lm: DiffusionLM, count: int, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of 8 to 64 random ids of the vocabulary below the special tokens."""
    rng, top = random.Random(seed), min(lm.special_ids.mask_id, lm.special_ids.eos_id)
    return [[rng.randrange(0, top) for _ in range(rng.randrange(8, 65))] for _ in range(count)]


def run_once(engine: BlockServeEngine, work: list[list[int]], new_tokens: int) -> tuple[float, dict]:
    engine.reset_stats()
    started = time.perf_counter()
    outputs = engine.generate(work, SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False))
    seconds = time.perf_counter() - started
    assert all(len(output.token_ids) == new_tokens for output in outputs)
    return seconds, engine.stats().to_dict()


def share(work: list[list[int]], batch: int) -> list[list[int]]:
    """The prompts a batch size runs: the first ``max(batch, 4)`` (batch 1 serves four in a row, not all)."""
    return work[:max(batch, 4)]


def measure(lm: DiffusionLM, work: list[list[int]], batches: list[int], new_tokens: int, rounds: int,
            stop_at: float) -> dict:
    """Per batch size: median tok/s over the rounds run, tokens per model call and per row forward."""
    engines = {batch: BlockServeEngine(lm, EngineConfig(max_batch_size=batch, max_model_len=256, **DECODING))
               for batch in batches}
    for engine in engines.values():  # warm-up: allocator, kernels
        engine.generate(work[:1], SamplingParams(max_new_tokens=4))
    seconds: dict = {batch: [] for batch in batches}
    stats: dict = {}
    cut = False
    for _ in range(rounds):
        for batch, engine in engines.items():
            if time.perf_counter() > stop_at:
                cut = True
                break
            elapsed, stats[batch] = run_once(engine, share(work, batch), new_tokens)
            seconds[batch].append(elapsed)
    rows = []
    for batch, times in seconds.items():
        tokens = len(share(work, batch)) * new_tokens
        if times:
            rows.append({"batch": batch, "requests": len(share(work, batch)), "tokens": tokens, "rounds": len(times),
                         "model_calls": stats[batch]["denoise_steps"], "row_forwards": stats[batch]["row_forwards"],
                         "tokens_per_call": tokens / stats[batch]["denoise_steps"],
                         "tokens_per_row_forward": tokens / stats[batch]["row_forwards"],
                         "tok_s": tokens / median(times), "round_tok_s": [tokens / t for t in times]})
    return {"cut": cut, "measured": rows}


def fast_dllm_v2_7b(device: str, smoke: bool, stop_at: float) -> dict:
    """The ``fast-dllm-v2`` stage of ``research.gpu_checks``."""
    dims, dtype = (SMOKE, torch.float32) if smoke else (QWEN25_7B, torch.bfloat16)
    lm = shaped(dims, device, dtype)
    batches = [1, 2] if smoke else [1, 32]
    result = measure(lm, prompts(lm, 2 if smoke else 32), batches, 8 if smoke else 128, 1 if smoke else 2, stop_at)
    for row in result["measured"]:
        print(f"fast-dllm-v2 batch {row['batch']:>2}: {row['tok_s']:8.1f} tok/s  {row['tokens_per_call']:.2f} per "
              f"call  {row['model_calls']} calls", flush=True)
    return {"dims": dims, "dtype": str(dtype), "decoding": DECODING, "compiled": False} | result
