"""FP8 weights against bf16 on one GPU, at LLaDA2.0-mini's layer shapes: step time, memory and answers.

    python -m research gpu-checks --stages fp8 --out DIR           # one GPU (FP8 tensor cores: H100, H200)
    python -m research gpu-checks --stages fp8 --smoke --out DIR   # the same path on the CPU, the tiny fixture

A bf16 checkpoint in LLaDA2's layout is drawn at random on the device with LLaDA2.0-mini's widths (hidden 2048, 16
query and 4 key/value heads of 128, a dense first layer of MLP 5120, then 256 experts of 512 with 8 per token in
8 groups of which 4 are chosen, one shared expert) but 8 layers, so that both models fit one H100 beside each
other, and the fixture's tokenizer and vocabulary. It is loaded twice: as stored, and with ``quantization="fp8"``
(each linear but the ignored ones quantized at load, ``engine.layers.quantization``). Both engines step in turn
on the same requests until done or the deadline (``cut``). Reported: the median step of each and their ratio,
each model's weight bytes, the memory its load took and the peak of a solo warm-up run above it, how many times
``torch._scaled_mm`` ran (zero: the dequantizing fallback was the path), and how many answers and answer tokens
agree (per-token activation rounding changes a random model's argmaxes; the count is the figure, not a check).
"""
from __future__ import annotations

import collections
import contextlib
import json
import shutil
import tempfile
from pathlib import Path

import torch

from benchmarks.host_ops import FIXTURES
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig
from engine.layers.fp8 import FP8, scaled_mm_supported
from engine.models import load_model
from engine.models.families import family_named
from engine.models.loader import DiffusionLM
from research.compiled_step import Workload
from research.gpu_tensor_parallel import in_turn
from scripts.fixture_parts import random_model
from tinylm.export import save_checkpoint

FIXTURE = FIXTURES / "tiny-llada2"
LLADA2_MINI = {"num_hidden_layers": 8, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 4,
               "head_dim": 128, "rotary_dim": 64, "intermediate_size": 5120, "moe_intermediate_size": 512,
               "num_experts": 256, "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
               "num_shared_experts": 1, "first_k_dense_replace": 1}


def write_checkpoint(directory: Path, overrides: dict, device: str) -> Path:
    """The fixture's config with ``overrides`` and random bf16 weights of that shape (drawn on ``device``),
    beside the fixture's tokenizer."""
    config = json.loads((FIXTURE / "config.json").read_text()) | overrides | {"torch_dtype": "bfloat16"}
    shape = family_named("llada2").transformer_config(config)
    with torch.device(device):
        model = random_model(shape, torch.Generator(device).manual_seed(0))
    save_checkpoint(model, directory, "llada2", config, dtype=torch.bfloat16)
    del model
    for file in FIXTURE.iterdir():
        if file.suffix != ".safetensors" and file.name != "config.json":
            shutil.copy(file, directory / file.name)
    return directory


@contextlib.contextmanager
def counting_scaled_mm():
    """How many times ``torch._scaled_mm`` ran inside the block."""
    counts: collections.Counter = collections.Counter()
    original = torch._scaled_mm

    def counted(*args, **kwargs):
        counts["scaled_mm"] += 1
        return original(*args, **kwargs)

    torch._scaled_mm = counted
    try:
        yield counts
    finally:
        torch._scaled_mm = original


def memory_now(device: str) -> int:
    return torch.cuda.memory_allocated() if device == "cuda" else 0


def loaded(directory: Path, device: str, quantization: str | None) -> tuple[DiffusionLM, dict]:
    """The checkpoint loaded in bf16 (FP8 where ``quantization`` says), its weight bytes and the memory it took."""
    before = memory_now(device)
    lm = load_model(directory, device=device, dtype="bfloat16", quantization=quantization)
    weights = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    fp8 = sum(p.numel() * p.element_size() for p in lm.model.parameters() if p.dtype == FP8)
    return lm, {"weight_bytes": weights, "fp8_weight_bytes": fp8, "load_allocated_bytes": memory_now(device) - before}


def agreement(ours: list[list[int]], theirs: list[list[int]]) -> dict:
    """Answers equal, and answer tokens equal at the same position (over the bf16 answers' tokens)."""
    return {"answers_equal": sum(a == b for a, b in zip(ours, theirs)), "of": len(theirs),
            "tokens_equal": sum(x == y for a, b in zip(ours, theirs) for x, y in zip(a, b)),
            "of_tokens": sum(map(len, theirs))}


def compare(directory: Path, device: str, requests: int, new_tokens: int, batch: int, stop_at: float) -> dict:
    models, memory = {}, {}
    for mode, quantization in (("bf16", None), ("fp8", "fp8")):
        models[mode], memory[mode] = loaded(directory, device, quantization)
    prompts, params = Workload(requests=requests, new_tokens=new_tokens).prompts(models["bf16"])
    config = EngineConfig(max_batch_size=batch, max_model_len=256)
    for mode, lm in models.items():  # a solo warm-up run each: kernels, allocator, and its peak above the weights
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        before = memory_now(device)
        in_turn({mode: BlockServeEngine(lm, config)}, prompts[:batch], params[:batch], stop_at)
        memory[mode]["run_peak_above_bytes"] = (torch.cuda.max_memory_allocated() - before) if device == "cuda" else 0
    with counting_scaled_mm() as counts:
        result = in_turn({mode: BlockServeEngine(lm, config) for mode, lm in models.items()}, prompts, params,
                         stop_at)
    step_ms = {mode: median(times) * 1e3 if times else None for mode, times in result["steps"].items()}
    layer = models["fp8"].model.config
    return {"requests": requests, "new_tokens": new_tokens, "batch": batch, "cut": result["cut"],
            "steps": {mode: len(times) for mode, times in result["steps"].items()}, "step_ms": step_ms,
            "fp8_over_bf16": step_ms["fp8"] / step_ms["bf16"] if step_ms["fp8"] and step_ms["bf16"] else None,
            "memory": memory, "scaled_mm_calls": counts["scaled_mm"],
            "scaled_mm_supported": scaled_mm_supported(torch.device(device), layer.hidden_size, layer.hidden_size),
            "agreement": None if result["answers"] is None else agreement(result["answers"]["fp8"],
                                                                          result["answers"]["bf16"])}


def fp8_weights(device: str, smoke: bool, stop_at: float) -> dict:
    """The ``fp8`` stage of ``research.gpu_checks``."""
    overrides = {} if smoke else LLADA2_MINI
    with tempfile.TemporaryDirectory() as scratch:
        directory = write_checkpoint(Path(scratch) / "llada2-shaped", overrides, device)
        if device == "cuda":
            torch.cuda.empty_cache()
        result = compare(directory, device, 2 if smoke else 16, 8 if smoke else 64, 2 if smoke else 16, stop_at)
    print(f"fp8: {json.dumps(result)}", flush=True)
    return {"overrides": overrides, "family": "llada2"} | result
