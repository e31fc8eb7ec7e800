"""Tensor parallel on the CPU: the same engine at tensor_parallel_size 1 and 2, on a wider SDAR-shaped model.

The fixture's tokenizer with random weights of the given width (``--hidden``, ``--layers``). Each setting runs
the same prompts: float64 for the tokens (TP 2 against TP 1), float32 for the step time, settings visited in turn
over ``--rounds`` rounds. Bytes between ranks are rank 0's view per step: the all-reduces and the logits'
all-gather its collectives moved, and the pickled engine calls it sent to the workers.
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.families import CheckpointIds, family_named
from engine.models.loader import load_model
from engine.parallel.shard import TRAFFIC
from scripts.make_fixtures import random_model, sharpened
from tinylm.export import save_checkpoint

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-sdar"
SETTINGS = (("TP 1, 1 thread", 1, 1), ("TP 1, 2 threads", 1, 2), ("TP 2, 1 thread each", 2, 1))


def wide_sdar(directory: Path, hidden: int, layers: int) -> Path:
    """The SDAR fixture's tokenizer and config at ``hidden`` width (8 heads, 4 key/value heads)."""
    fixture = load_model(FIXTURE)
    config = replace(fixture.model.config, hidden_size=hidden, num_layers=layers, num_heads=8, num_kv_heads=4,
                     head_dim=hidden // 8, rotary_dim=hidden // 8, intermediate_size=3 * hidden)
    ids = fixture.special_ids
    model = sharpened(random_model(config, torch.Generator().manual_seed(0)), ids.mask_id)
    config_json = family_named("sdar").config_json(config, CheckpointIds(ids.mask_id, ids.eos_id, ids.pad_id), 4)
    save_checkpoint(model, directory, "sdar", config_json, dtype=torch.float32)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"):
        if (FIXTURE / name).is_file():
            shutil.copy(FIXTURE / name, directory / name)
    return directory


def run(model: Path, size: int, threads: int, dtype: str, prompts: list[str], new_tokens: int) -> dict:
    torch.set_num_threads(threads)
    config = EngineConfig(max_batch_size=len(prompts), tensor_parallel_size=size)
    with BlockServeEngine.from_pretrained(model, config, dtype=dtype) as engine:
        params = SamplingParams(max_new_tokens=new_tokens, stop_at_eos=False)
        engine.generate(prompts[:2], params)  # warm-up
        TRAFFIC.reset()
        sent = engine.executor.bytes_sent
        ids = [engine.add_request(prompt, params) for prompt in prompts]
        steps, outputs, started = 0, {}, time.perf_counter()
        while len(outputs) < len(ids):
            outputs |= {output.request_id: output.token_ids for output in engine.step().finished}
            steps += 1
        elapsed = time.perf_counter() - started
        sent = engine.executor.bytes_sent - sent
    return {"tokens": [outputs[i] for i in ids], "steps": steps, "step_ms": 1000 * elapsed / steps,
            "collective_bytes_per_step": TRAFFIC.total_bytes / steps, "call_bytes_per_step": sent / steps}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m research tensor-parallel-cpu", description=__doc__)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    prompts = [f"question {n}: " + "count the sheep " * (1 + n % 4) for n in range(args.prompts)]
    with tempfile.TemporaryDirectory() as scratch:
        model = wide_sdar(Path(scratch), args.hidden, args.layers)
        exact = {size: run(model, size, 1, "float64", prompts, args.new_tokens)["tokens"] for size in (1, 2)}
        rows = {name: [] for name, _, _ in SETTINGS}
        for _ in range(args.rounds):
            for name, size, threads in SETTINGS:
                rows[name].append(run(model, size, threads, "float32", prompts, args.new_tokens))
    result = {"hidden": args.hidden, "layers": args.layers, "prompts": args.prompts, "new_tokens": args.new_tokens,
              "float64_tokens_equal": exact[1] == exact[2], "settings": {
                  name: {"step_ms": sorted(r["step_ms"] for r in runs)[len(runs) // 2], "steps": runs[0]["steps"],
                         "collective_bytes_per_step": runs[0]["collective_bytes_per_step"],
                         "call_bytes_per_step": runs[0]["call_bytes_per_step"],
                         "float32_tokens_equal_tp1": runs[0]["tokens"] == rows[SETTINGS[0][0]][0]["tokens"]}
                  for name, runs in rows.items()}}
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tensor_parallel_cpu.json").write_text(json.dumps(result, indent=2) + "\n")
