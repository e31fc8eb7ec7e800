"""Score the tiny model on its held-out split with the reference decoder (the issue's bar).

    python -m tinylm.evaluate [--model tiny] [--limit N] [--json out.json] [--decoding threshold:0.9]

Settings: the tiny configs' (block length 8, max_new_tokens 64, dual cache, temperature 0), with the
decoding rule of ``configs/tiny-cpu.yaml`` unless ``--decoding`` names another (``threshold:<value>``,
or ``quota`` for one position per step).
Reports exact match per task, the share of answers whose EOS lands in the right block (decoded and
expected lengths span the same number of blocks) or within one block of it, and the decoded-length
histogram in blocks.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path

from engine.models import load_model
from engine.oracle.reference import reference_generate
from engine.rules import make_rule
from engine.rules.base import BlockRule
from tinylm.tasks import BLOCK, CANVAS_BLOCKS, read_jsonl, validation_rows

# The decoding the tiny configs use, chosen on the validation split (README, "The tiny model").
SHIPPED_DECODING = "threshold:0.7"
# What the exported checkpoint's generation_config.json names, so every engine decodes it so by default.
SHIPPED_DEFAULTS = {"block_length": BLOCK, "threshold": float(SHIPPED_DECODING.split(":")[1]),
                    "gen_length": BLOCK * CANVAS_BLOCKS}
HELDOUT = Path(__file__).resolve().parents[1] / "assets" / "data" / "heldout.jsonl"


def blocks_spanned(num_tokens: int) -> int:
    """Blocks an answer of this many tokens occupies with its EOS (which sits in the last one)."""
    return num_tokens // BLOCK + 1


def lengths_spread(histogram: dict[str, int], min_block_counts: int = 6) -> bool:
    """The bar's length condition: decoded lengths span at least ``min_block_counts`` block counts and
    no single bin (``"no EOS"`` included) holds more than half of the prompts."""
    block_counts = [key for key in histogram if key != "no EOS"]
    return len(block_counts) >= min_block_counts and max(histogram.values()) <= sum(histogram.values()) / 2


def selection_score(report: dict) -> float:
    """What picks the shipped checkpoint: the spread of lengths first (a model that ends every answer
    in block 1 is right for the one-block answers and useless), then exact match, then stopping in the
    right block, then within one block of it."""
    spread = lengths_spread(report["decoded_blocks_histogram"])
    return (spread - 1.0) + report["exact_match"] + 0.5 * report["right_block"] + 0.25 * report["near_block"]


def decode_rule(spec: str) -> BlockRule:
    """``threshold:<value>`` or ``quota`` (one position per step: ``steps_per_block`` = the block)."""
    kind, _, value = spec.partition(":")
    if kind == "threshold" and value:
        return make_rule("threshold", threshold=float(value))
    if kind == "quota" and not value:
        return make_rule("quota", steps_per_block=BLOCK)
    raise ValueError(f"decoding must be 'threshold:<value>' or 'quota', got {spec!r}")


def evaluate(model: str = "tiny", limit: int | None = None, rows: list[dict] | None = None,
             decoding: str = SHIPPED_DECODING) -> dict:
    rows = rows if rows is not None else read_jsonl(HELDOUT)
    report = evaluate_model(load_model(model, dtype="float32"), rows[:limit] if limit else rows, decoding)
    return {"model": str(model), "decoding": decoding, **report}


def evaluate_model(lm, rows: list[dict], decoding: str = SHIPPED_DECODING) -> dict:
    rule = decode_rule(decoding)
    per_task: dict[str, Counter] = defaultdict(Counter)
    histogram: Counter = Counter()
    samples, steps, blocks, started, expected_blocks = [], 0, 0, time.time(), []
    for row in rows:
        ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}],
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
        began = time.perf_counter()
        result = reference_generate(lm, ids, max_new_tokens=BLOCK * CANVAS_BLOCKS, block_length=BLOCK,
                                    rule=rule)
        seconds = time.perf_counter() - began
        text = lm.tokenizer.decode(result.token_ids, skip_special_tokens=True)
        counts = per_task[row["task"]]
        counts["total"] += 1
        counts["exact"] += text == row["answer"]
        expected_tokens = len(lm.tokenizer(row["answer"], add_special_tokens=False)["input_ids"])
        expected_blocks.append(blocks_spanned(expected_tokens))
        ended = result.finish_reason == "eos"
        counts["right_block"] += ended and result.num_blocks == expected_blocks[-1]
        counts["near_block"] += ended and abs(result.num_blocks - expected_blocks[-1]) <= 1
        histogram[result.num_blocks if result.finish_reason == "eos" else "no EOS"] += 1
        steps += result.num_steps
        blocks += result.num_blocks
        if len(samples) < 8:
            samples.append({"prompt": row["prompt"], "output": text, "expected": row["answer"],
                            "seconds": round(seconds, 3), "blocks": result.num_blocks})
    total = sum(c["total"] for c in per_task.values())
    return {
        "prompts": total, "seconds": round(time.time() - started, 1),
        "exact_match": sum(c["exact"] for c in per_task.values()) / total,
        "right_block": sum(c["right_block"] for c in per_task.values()) / total,
        "near_block": sum(c["near_block"] for c in per_task.values()) / total,
        "per_task": {task: {"exact_match": c["exact"] / c["total"], "right_block": c["right_block"] / c["total"],
                            "near_block": c["near_block"] / c["total"], "prompts": c["total"]}
                     for task, c in sorted(per_task.items())},
        "decoded_blocks_histogram": {str(k): v for k, v in sorted(histogram.items(), key=str)},
        "expected_blocks_histogram": {str(k): v for k, v in sorted(Counter(expected_blocks).items())},
        "steps_per_block": steps / max(1, blocks),
        "samples": samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--decoding", default=SHIPPED_DECODING, help="threshold:<value> or quota")
    parser.add_argument("--split", default=str(HELDOUT),
                        help="a jsonl split (default: held-out), or 'validation' (what picks the decoding)")
    args = parser.parse_args()
    if args.split == "validation":
        rows = validation_rows()
    else:
        rows = read_jsonl(Path(args.split))
    report = evaluate(args.model, args.limit, rows, args.decoding)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
