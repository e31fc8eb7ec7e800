"""DiffusionGemma on prompts of 50 to 1,000 tokens against transformers' batches of 16 (``python -m research
diffusion-gemma --workload spread``; its options are that experiment's, ``research.diffusion_gemma``).

Ours runs every prompt at once (16 rows at most, continuous batching); transformers' ``generate`` runs
left-padded batches of 16 in arrival order, each seeded with 0, and, as a control, the same batches after
sorting the prompts by length. The batch-1 reference gives the answers ours must equal, untimed.
"""
from __future__ import annotations

import json
import random
from itertools import accumulate
from pathlib import Path

import torch

from research.diffusion_gemma_runs import (
    FIXTURE,
    SETTINGS,
    demo_prompts,
    run_ours,
    run_reference_alone,
    run_reference_batched,
)

SPREAD_SCALES = {"smoke": (16, 16, 1), "quick": (48, 32, 2), "full": (128, 64, 3)}
SHORTEST, LONGEST, BATCH = 50, 1000, 16  # the spread workload's prompt lengths (tokens), transformers' batch


def spread_prompts(count: int) -> list[str]:
    """``count`` prompts of SHORTEST to LONGEST characters (the fixture's tokens), log-uniform, shuffled with
    a fixed seed; each is the demo prompts, joined by spaces, from its own one on, cut to its length."""
    demos = demo_prompts(10**6)
    text = " ".join(demos + demos)  # wraps around
    offsets = list(accumulate((len(demo) + 1 for demo in demos), initial=0))
    lengths = [round(SHORTEST * (LONGEST / SHORTEST) ** (index / (count - 1))) for index in range(count)]
    random.Random(0).shuffle(lengths)
    return [text[offsets[index * 37 % len(demos)]:][:length] for index, length in enumerate(lengths)]


def batches(items: list, size: int = BATCH) -> list[list]:
    return [items[first:first + size] for first in range(0, len(items), size)]


def run_reference_batches(reference, lm, prompts: list[str], new_tokens: int, settings: dict):
    """transformers' batched ``generate`` on BATCH prompts at a time, in their order."""
    elapsed, answers = 0.0, []
    for batch in batches(prompts):
        batch_s, batch_answers = run_reference_batched(reference, lm, batch, new_tokens, settings)
        elapsed, answers = elapsed + batch_s, answers + batch_answers
    return elapsed, answers


def measure_spread(scale: str, repeats: int | None = None, compile: bool = False) -> list[dict]:
    from transformers import DiffusionGemmaForBlockDiffusion

    from engine.models.loader import load_model

    torch.set_num_threads(1)
    count, new_tokens, scale_repeats = SPREAD_SCALES[scale]
    repeats = repeats or scale_repeats
    lm = load_model(FIXTURE, compile=compile)
    prompts = spread_prompts(count)
    lengths = [len(lm.tokenizer(prompt).input_ids) for prompt in prompts]
    by_length = sorted(prompts, key=len)  # one character a token
    padding = {order: 1 - sum(lengths) / sum(len(batch) * max(batch) for batch in batches(chosen))
               for order, chosen in (("batched", lengths), ("sorted", sorted(lengths)))}  # of prompt positions
    reference = DiffusionGemmaForBlockDiffusion.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    rows = []
    for name, settings in SETTINGS.items():
        rounds = []  # each system's seconds, interleaved: each system once per round
        if compile:  # every bucket the workload meets is compiled before the timed rounds
            run_ours(lm, prompts, new_tokens, settings)
        for _ in range(repeats):
            ours_s, ours = run_ours(lm, prompts, new_tokens, settings)
            batched_s, batched = run_reference_batches(reference, lm, prompts, new_tokens, settings)
            sorted_s, in_order = run_reference_batches(reference, lm, by_length, new_tokens, settings)
            rounds.append({"ours": ours_s, "batched": batched_s, "sorted": sorted_s})
        best = {key: min(round_[key] for round_ in rounds) for key in rounds[0]}
        _, alone = run_reference_alone(reference, lm, prompts, new_tokens, settings)
        tokens = {"ours": sum(map(len, ours)), "batched": sum(map(len, batched)), "sorted": sum(map(len, in_order))}
        rate = {key: tokens[key] / best[key] for key in best}
        rows.append({"settings": name, "compiled": compile, "prompts": count, "max_new_tokens": new_tokens,
                     "repeats": repeats,
                     "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": sum(lengths) / count},
                     "padding_share": padding,
                     **{f"{key}_tokens": tokens[key] for key in tokens}, **{f"{key}_s": best[key] for key in best},
                     **{f"{key}_tok_s": rate[key] for key in rate},
                     "ours_vs_batched": rate["ours"] / rate["batched"], "ours_vs_sorted": rate["ours"] / rate["sorted"],
                     "rounds_s": rounds,  # a round's ratio: tokens[key] / round[key] over the same for ours
                     "equal_to_reference": sum(a == b for a, b in zip(ours, alone)),
                     "unequal_prompt_tokens": [length for a, b, length in zip(ours, alone, lengths) if a != b]})
    return rows


def spread(scale: str, repeats: int | None, out: Path | None, compile: bool = False) -> None:
    rows = measure_spread(scale, repeats, compile)
    for row in rows:
        print(f"{row['settings']:>8}: {row['prompts']} prompts of {row['prompt_tokens']['min']}-"
              f"{row['prompt_tokens']['max']} tokens ({row['padding_share']['batched']:.0%} of transformers' prompt "
              f"positions padding): ours {row['ours_tok_s']:.0f} tok/s, transformers batches of {BATCH} "
              f"{row['batched_tok_s']:.0f} (x{row['ours_vs_batched']:.2f}), sorted by length "
              f"{row['sorted_tok_s']:.0f} (x{row['ours_vs_sorted']:.2f}); equal to the batch-1 reference "
              f"{row['equal_to_reference']}/{row['prompts']}")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        name = f"diffusion_gemma_spread{'_compiled' if compile else ''}.json"
        (out / name).write_text(json.dumps({"measured": rows}, indent=2) + "\n")
