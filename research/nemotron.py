"""Nemotron-Labs-Diffusion's three modes side by side: tokens per forward and tokens per second.

    python -m research nemotron                       # the fixture and a 32-layer copy, batch 1 and 16
    python -m research nemotron --layers 2 --prompts 4 --rounds 1

One engine per (model, mode, batch) runs the same prompts (8 to 64 tokens) to exactly ``--new-tokens`` tokens
each (``stop_at_eos=False``), in rounds that visit every engine once in turn, so a slow spell of the machine
falls on every mode alike. Modes: ``threshold`` 0.9 (the dLM mode), ``autoregressive``, and ``linear_spec``
with a draft threshold of 0.0, batched. Reported per engine: the median tok/s of its rounds, tokens per
forward (generated tokens over model calls, and per row: over the forwards each row took), and its answers
against ``autoregressive``'s (speculation must give them).

The fixture's weights are random, so a draft rarely matches the verified tokens and the dLM mode commits
what its sharpened head makes confident: the tokens per forward here describe this model, not the release.
``--project`` prices each mode's per-row forwards at Nemotron-Labs-Diffusion-8B's shapes on one H200 with the
roofline of ``benchmarks.perfmodel``, for given tokens per forward (the release's acceptance is not ours to
measure here).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from benchmarks.results_io import write_results
from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from engine.models.loader import DiffusionLM
from research.nemotron_projection import projection_rows
from scripts.make_nemotron_fixture import random_weights, tiny_config

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-nemotron_labs_diffusion"
MODES = {"dlm": {"decoding": "threshold", "threshold": 0.9}, "autoregressive": {"decoding": "autoregressive"},
         "linear_spec": {"decoding": "linear_spec", "threshold": 0.0}}


def with_layers(num_layers: int, directory: Path) -> DiffusionLM:
    """The fixture's layout, widths and tokenizer with ``num_layers`` random layers (the fixture's own draw for
    its two)."""
    if num_layers == 2:
        return load_model(FIXTURE)
    for file in FIXTURE.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, directory / file.name)
    config = json.loads((FIXTURE / "config.json").read_text()) | {"num_hidden_layers": num_layers}
    (directory / "config.json").write_text(json.dumps(config))
    shape = dataclasses.replace(tiny_config(config["vocab_size"]), num_layers=num_layers)
    save_file(random_weights(shape, torch.Generator().manual_seed(num_layers), config["mask_token_id"]),
              str(directory / "model.safetensors"))
    return load_model(directory)


def workload(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(0, 90) for _ in range(rng.randrange(8, 65))] for _ in range(count)]


def run_once(engine: BlockServeEngine, prompts: list[list[int]], new_tokens: int) -> tuple[float, list, dict]:
    engine.reset_stats()
    started = time.perf_counter()
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False))
    seconds = time.perf_counter() - started
    stats = engine.stats().to_dict()
    return seconds, [output.token_ids for output in outputs], stats


def measure(lm: DiffusionLM, layers: int, prompts: list[list[int]], batches: list[int], new_tokens: int,
            rounds: int, max_model_len: int | None = None) -> list[dict]:
    engines = {(mode, batch): BlockServeEngine(lm, EngineConfig(max_batch_size=batch, max_model_len=max_model_len,
                                                                **settings))
               for mode, settings in MODES.items() for batch in batches}
    for engine in engines.values():  # warm-up: allocator, kernels
        engine.generate(prompts[:2], SamplingParams(max_new_tokens=4))
    seconds: dict = {key: [] for key in engines}
    answers, stats = {}, {}
    for _ in range(rounds):
        for key, engine in engines.items():
            elapsed, answers[key], stats[key] = run_once(engine, prompts, new_tokens)
            seconds[key].append(elapsed)
    tokens = len(prompts) * new_tokens
    rows = []
    for (mode, batch), times in seconds.items():
        record = stats[mode, batch]
        rows.append({"layers": layers, "mode": mode, "batch": batch, "tokens": tokens,
                     "model_calls": record["denoise_steps"], "row_forwards": record["row_forwards"],
                     "tokens_per_call": tokens / record["denoise_steps"],
                     "tokens_per_row_forward": tokens / record["row_forwards"],
                     "tok_s": tokens / median(times), "round_tok_s": [tokens / t for t in times],
                     "answers_equal_autoregressive": sum(a == b for a, b in zip(
                         answers[mode, batch], answers["autoregressive", batch]))})
    return rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="2,32", help="comma-separated layer counts (2: the fixture)")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    prompts, batches = workload(args.prompts), [int(b) for b in args.batches.split(",")]
    rows = []
    for layers in (int(n) for n in args.layers.split(",")):
        with tempfile.TemporaryDirectory() as scratch:
            rows += measure(with_layers(layers, Path(scratch)), layers, prompts, batches, args.new_tokens, args.rounds)
            for row in rows[-len(MODES) * len(batches):]:
                print(f"{row['layers']:>2} layers  {row['mode']:<15} batch {row['batch']:>2}: {row['tok_s']:8.1f} "
                      f"tok/s  {row['tokens_per_row_forward']:.2f} tokens per row forward  "
                      f"{row['tokens_per_call']:.2f} per call  answers = AR {row['answers_equal_autoregressive']}/"
                      f"{len(prompts)}", flush=True)
    results = {"measured": rows, "h200_projection": projection_rows()}
    if args.out is not None:
        write_results(args.out, "nemotron", results, ["nemotron", *(argv or [])], program="python -m research")
    return results


if __name__ == "__main__":
    main()
