"""Peak memory of one DiffusionGemma step against its rows, at the release's vocabulary and canvas, on the CPU.

``python -m research canvas-memory [--rows 2,8,32] [--vocab 262144] [--canvas 256] [--out DIR]``

The model is the tiny fixture's (``scripts.make_gemma_fixture``: three layers of hidden size 32, built by
transformers' own classes with their own random weights) with the release's vocabulary and canvas, written
to a temporary directory and run in float32 on one CPU thread. Each row count runs in a fresh process. An
engine of that many slots admits that many one-canvas requests and takes two steps: the first stores the
prompts and denoises, the second only denoises. Three figures per row count:

* ``step peak``: the torch CPU allocator's peak during the second step, above what it held before (the
  profiler's memory events), which is what a step adds on any device;
* ``RSS growth``: the process's peak resident memory after both steps less before them (``ru_maxrss``);
* ``priced``: the vocabulary temporaries the engine's memory model counts for those rows
  (``MemoryModel.step_bytes`` of no bounding box), what its fit check adds to the activations.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RELEASE_VOCAB, RELEASE_CANVAS = 262_144, 256


def write_model(directory: Path, vocab: int, canvas: int) -> None:
    """The tiny fixture's DiffusionGemma with ``vocab`` tokens and canvases of ``canvas``."""
    from transformers import DiffusionGemmaForBlockDiffusion

    from scripts.make_fixtures import CHARACTERS
    from scripts.make_gemma_fixture import END_TURN, build_tokenizer, tiny_config

    tokenizer = build_tokenizer(CHARACTERS)
    config = tiny_config(tokenizer)
    config.text_config.vocab_size, config.canvas_length = vocab, canvas
    DiffusionGemmaForBlockDiffusion(config).eval().save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    generation = {"eos_token_id": [config.text_config.eos_token_id, tokenizer.convert_tokens_to_ids(END_TURN)],
                  "pad_token_id": config.text_config.pad_token_id}
    (directory / "generation_config.json").write_text(json.dumps(generation) + "\n")


def allocator_peak(run) -> int:
    """Bytes the torch CPU allocator holds at most while ``run()`` runs, above what it held before."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    peak, nodes = 0, list(profiler.profiler.kineto_results.experimental_event_tree())
    while nodes:
        node = nodes.pop()
        if node.tag == _EventType.Allocation:
            peak = max(peak, node.extra_fields.total_allocated)
        nodes.extend(node.children)
    return peak


def max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def measure_rows(model: Path, rows: int) -> dict:
    """One engine of ``rows`` slots, two steps of ``rows`` requests (run in a fresh process)."""
    from engine import BlockServeEngine, EngineConfig, SamplingParams
    from engine.models.loader import load_model
    from engine.runner.memory import memory_model

    torch.set_num_threads(1)
    lm = load_model(model)
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=rows))
    canvas = engine.config.block_length
    for row in range(rows):
        engine.add_request([2, 40 + row % 50, 41, 42], SamplingParams(max_new_tokens=canvas, seed=row))
    before = max_rss_bytes()
    engine.step()
    step_peak = allocator_peak(engine.step)
    return {"rows": rows, "vocab": lm.vocab_size, "canvas": canvas, "step_peak_bytes": step_peak,
            "rss_growth_bytes": max_rss_bytes() - before,
            "rows_per_chunk": getattr(engine.runner, "rows_per_chunk", rows),
            "priced_bytes": memory_model(lm, engine.config).step_bytes(0, rows)}


def gb(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.2f} GB"


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="2,8,32", help="comma-separated row counts, one process each")
    parser.add_argument("--vocab", type=int, default=RELEASE_VOCAB)
    parser.add_argument("--canvas", type=int, default=RELEASE_CANVAS)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--model", type=Path, default=None, help=argparse.SUPPRESS)  # a child: measure one count
    args = parser.parse_args(argv)
    if args.model is not None:
        print(json.dumps(measure_rows(args.model, int(args.rows))))
        return []
    results = []
    with tempfile.TemporaryDirectory() as directory:
        write_model(Path(directory), args.vocab, args.canvas)
        for rows in (int(count) for count in args.rows.split(",")):
            child = subprocess.run([sys.executable, "-m", "research.canvas_memory", "--model", directory,
                                    "--rows", str(rows)], capture_output=True, text=True, check=True, cwd=ROOT)
            results.append(json.loads(child.stdout.strip().splitlines()[-1]))
            row = results[-1]
            print(f"{rows:>3} rows (chunks of {row['rows_per_chunk']}): step peak {gb(row['step_peak_bytes'])}, "
                  f"RSS growth {gb(row['rss_growth_bytes'])}, priced {gb(row['priced_bytes'])}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "canvas_memory.json").write_text(json.dumps(
            {"command": "python -m research canvas-memory " + " ".join(argv or sys.argv[1:]),
             "torch": torch.__version__, "results": results}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
