"""LLaDA2.2's insert / delete editing against LLaDA2.1's editing and LLaDA2.0's rules, on one LLaDA2.2 checkpoint.

The LLaDA2.2-layout fixture (``scripts/make_llada22_fixture.write_llada22``: ``tiny-llada2`` with block routing on,
``expert_capacity`` 4 of 8 experts over blocks of 32, DELETE and SPLIT ids, LLaDA2.2's two stop ids) and its
32-layer copy (same config, random layers, the DELETE / SPLIT output rows scaled as the fixture scales them, so
that they win some argmaxes), float32, one thread. Every mode decodes the same model, block routing included:
only the rule differs.

* ``LLaDA2.0``: ``low_confidence_dynamic``, 0.95, 32 steps a block (``configs/llada2-mini.yaml``);
* ``threshold``: plain ``threshold`` 0.95 (the rule an outside engine's 325 tok/s baseline used);
* ``S``: ``joint_threshold`` 0.5 / 0.0 / 16 (LLaDA2.1's editing, ``configs/llada2.1-mini.yaml``);
* ``indel``: ``joint_threshold_indel`` 0.5 / 0.0 / 16 (``configs/llada2.2-mini.yaml``).

Rounds, lockstep stepping, the workload and the figures are ``research.editing``'s: ratios to LLaDA2.0 are
taken within a round and their median over rounds is reported. Counts (tokens per forward, edits, deletes,
splits) do not depend on the machine.

    python -m research indel-editing                    # 32 requests, batch 16, 3 rounds, 3 and 32 layers
    python -m research indel-editing --layers 32 --rounds 5
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from benchmarks.host_ops import with_layers
from engine.models import load_model
from research.block_causal import torch_threads
from research.editing import compare
from scripts.make_llada22_fixture import EDIT_ROW_SCALE, write_llada22

MODES = {  # name -> EngineConfig settings
    "LLaDA2.0": {"decoding": "low_confidence_dynamic", "threshold": 0.95, "steps_per_block": 32},
    "threshold": {"decoding": "threshold", "threshold": 0.95},
    "S": {"decoding": "joint_threshold", "threshold": 0.5, "editing_threshold": 0.0, "max_post_steps": 16},
    "indel": {"decoding": "joint_threshold_indel", "threshold": 0.5, "editing_threshold": 0.0,
              "max_post_steps": 16},
}
BASELINE = "LLaDA2.0"


def llada22(directory: Path, layers: int):
    """The LLaDA2.2 fixture, or its copy ``layers`` deep with the fixture's DELETE / SPLIT rows scaled."""
    fixture = load_model(write_llada22(directory), dtype="float32")
    if layers == fixture.model.config.num_layers:
        return fixture
    lm = with_layers(fixture, layers)
    with torch.no_grad():
        for key in ("delete_token_id", "split_token_id"):
            lm.model.lm_head.weight[lm.generation_settings[key]] *= EDIT_ROW_SCALE
    return lm


def markdown(results: list[dict]) -> str:
    lines = ["| layers | mode | tokens / forward | edits | deletes | splits | steps | rows / step "
             "| ms a full window step | tok/s | step ms / LLaDA2.0 | tok/s / LLaDA2.0 (rounds) |", "|" + "---|" * 12]
    for result in results:
        for name, row in result["modes"].items():
            spread = f"{min(row['tokens_per_s_ratios']):.3f} to {max(row['tokens_per_s_ratios']):.3f}"
            lines.append(f"| {result['layers']} | {name} | {row['tokens_per_forward']:.2f} | {row['edits']} | "
                         f"{row['deletes']} | {row['splits']} | {row['steps']} | {row['rows_per_step']} | "
                         f"{row['step_ms']:.2f} | {row['tokens_per_s']:.1f} | {row['step_ms_ratio']:.3f} | "
                         f"{row['tokens_per_s_ratio']:.3f} ({spread}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", default="3,32", help="comma-separated depths; 3 is the fixture itself")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16, help="the engines' max_batch_size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    results = []
    with torch_threads(1), tempfile.TemporaryDirectory() as directory:
        for layers in (int(value) for value in args.layers.split(",")):
            lm = llada22(Path(directory) / f"llada2.2-{layers}", layers)
            results.append(compare(lm, layers, args.requests, args.batch, args.rounds, MODES, BASELINE))
            print(json.dumps(results[-1]), flush=True)
    print(markdown(results))
    return results


if __name__ == "__main__":
    main()
