"""Model-size options of the drivers' ``--make-checkpoint`` and their ``--time`` mode (``throughput.py``).

Plain torch, like ``peer_common``: a driver imports this before its pinned transformers. ``--time`` runs the
peer's own generate loop at batch 1 over the prompts, one warm-up prompt first, and writes what the engine's
side (``engine_timed.py``) needs to run the same prompts with the same settings, plus the loop's seconds.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

# option -> config.json field; None keeps the driver's tiny default
SIZES = {"hidden": "hidden_size", "intermediate": "intermediate_size", "layers": "num_hidden_layers",
         "heads": "num_attention_heads", "kv_heads": "num_key_value_heads", "head_dim": "head_dim",
         "vocab": "vocab_size", "experts": "num_experts", "experts_per_tok": "num_experts_per_tok",
         "shared_experts": "num_shared_experts", "moe_intermediate": "moe_intermediate_size",
         "first_dense": "first_k_dense_replace", "n_group": "n_group", "topk_group": "topk_group"}
MOE_ONLY = ("experts", "experts_per_tok", "shared_experts", "moe_intermediate", "first_dense", "n_group",
            "topk_group")


def add_options(parser: argparse.ArgumentParser, moe: bool) -> argparse.ArgumentParser:
    sizes = parser.add_argument_group("model size of --make-checkpoint (default: the driver's tiny model)")
    for option in SIZES:
        if moe or option not in MOE_ONLY:
            sizes.add_argument(f"--{option.replace('_', '-')}", type=int, default=None)
    timing = parser.add_argument_group("--time: the peer's generate loop at batch 1, timed (writes --out)")
    timing.add_argument("--time", action="store_true", help="time the generate loop instead of dumping logits")
    timing.add_argument("--lengths", default="8,16,24,32,40,48,56,64",
                        help="prompt lengths of generated prompts (comma-separated), when no --prompts")
    timing.add_argument("--threads", type=int, default=1, help="torch threads (the same on both sides)")
    return parser


def sized(tiny: dict, args: argparse.Namespace) -> dict:
    """The driver's tiny config with the size options given on the command line."""
    config = dict(tiny)
    config.update({field: getattr(args, option) for option, field in SIZES.items()
                   if getattr(args, option, None) is not None})
    return config


def lengths(args: argparse.Namespace) -> list[int]:
    return [int(part) for part in args.lengths.split(",") if part.strip()]


def timed_loop(generate_one: Callable[[list[int]], dict], prompts: list[list[int]]) -> dict:
    """``generate_one(prompt) -> {"tokens": [...], ...}`` over every prompt after one warm-up call on the first;
    wall seconds of the loop alone (perf_counter)."""
    warm = time.perf_counter()
    with torch.no_grad():
        generate_one(prompts[0])
        warm = time.perf_counter() - warm
        start = time.perf_counter()
        results = [generate_one(prompt) for prompt in prompts]
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "warmup_seconds": warm, "results": results,
            "generated_tokens": sum(len(r["tokens"]) for r in results)}


def write_timing(args: argparse.Namespace, header: dict, timing: dict) -> dict:
    """The ``--time`` report: ``header`` (family, checkpoint, config, settings, ...) plus the loop's figures."""
    report = {**header, "threads": torch.get_num_threads(), "batch_size": 1, **timing}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report) + "\n")
    print(json.dumps({"out": args.out, "prompts": len(timing["results"]), "seconds": round(timing["seconds"], 3),
                      "generated_tokens": timing["generated_tokens"]}))
    return report
