"""Prefix caching on the fixtures that cache prompts: the cache on against off, side by side, in one process.

    python -m research prefix-cache --scale quick --out runs/prefix-cache [--families diffusion_gemma]

Two workloads per family (tiny-sdar, blocks of 4; tiny-llada2, blocks of 32; tiny-diffusion_gemma, canvases
of 8 and pages of 16):

* ``instruction``: one shared instruction of ``--instruction`` tokens and ``--requests`` distinct questions
  of 8 to 24 tokens, as a batch job applies one prompt to every row;
* ``chat``: ``--conversations`` chats of ``--turns`` turns on one system prompt of a quarter of the
  instruction's length; each turn's prompt is the history (earlier prompts and answers) and a new message.

Each runs with the cache on and off, interleaved over ``--rounds`` rounds, on one loaded model: forwarded
tokens (through the linear layers), prompt tokens computed, the cache's hit rate, generated tokens per
second of engine time, and the H200 projection of the run's trace priced as SDAR-8B or LLaDA2.0-mini
(marked *; none for DiffusionGemma, whose canvas steps the trace's pricing does not model). Answers are
compared token for token. An ``eviction`` run sends ``evict_requests`` requests over 50 distinct prefixes
to a pool that holds 10 of them.
"""
from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

from benchmarks.perfmodel.projection import project
from benchmarks.results_io import write_results
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import DiffusionLM, load_model

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
FAMILIES = {"sdar": (FIXTURES / "tiny-sdar", {"decoding": "low_confidence_dynamic", "steps_per_block": 4}),
            "llada2": (FIXTURES / "tiny-llada2", {"decoding": "low_confidence_dynamic", "steps_per_block": 8}),
            "diffusion_gemma": (FIXTURES / "tiny-diffusion_gemma", {"max_denoising_steps": 8})}
SHAPES = {"sdar": "sdar-8b", "llada2": "llada2-mini"}  # whose shapes the H200 projection prices a trace with
SCALES = {"smoke": dict(instruction=128, requests=16, answer=32, conversations=4, turns=2, rounds=1,
                        evict_requests=100),
          "quick": dict(instruction=1024, requests=64, answer=64, conversations=8, turns=3, rounds=2,
                        evict_requests=400),
          "full": dict(instruction=1024, requests=256, answer=256, conversations=16, turns=4, rounds=3,
                       evict_requests=2000)}


def words(lm: DiffusionLM, rng: random.Random, count: int) -> list[int]:
    special = (set(lm.tokenizer.all_special_ids) | {lm.special_ids.mask_id, *lm.special_ids.stop_ids}
               | set(getattr(lm, "image_token_ids", ())))
    ordinary = [token for token in range(min(lm.vocab_size, 90)) if token not in special]
    return [rng.choice(ordinary) for _ in range(count)]


def instruction_prompts(lm: DiffusionLM, scale: dict) -> list[list[int]]:
    rng = random.Random(0)
    head = words(lm, rng, scale["instruction"])
    return [head + words(lm, rng, rng.randint(8, 24)) for _ in range(scale["requests"])]


def text_only(lm: DiffusionLM, tokens: list[int]) -> list[int]:
    """An answer as the next turn's prompt may hold it: without image tokens (the random fixture writes some)."""
    image = set(getattr(lm, "image_token_ids", ()))
    return [token for token in tokens if token not in image]


def run_chat(engine: BlockServeEngine, lm: DiffusionLM, scale: dict, params: SamplingParams) -> list[list[int]]:
    """Every conversation's turns, turn by turn (a turn's prompt holds the answers before it)."""
    rng = random.Random(1)
    system = words(lm, rng, scale["instruction"] // 4)
    histories = [system + words(lm, rng, 12) for _ in range(scale["conversations"])]
    answers = []
    for _ in range(scale["turns"]):
        outputs = engine.generate(histories, params)
        answers += [output.token_ids for output in outputs]
        histories = [h + text_only(lm, o.token_ids) + words(lm, rng, 12) for h, o in zip(histories, outputs)]
    return answers


def pool_tokens(workload: str, scale: dict) -> int:
    """A pool that holds the workload's shared prefixes: four instructions, or every conversation's history."""
    if workload == "instruction":
        return 4 * scale["instruction"]
    return scale["conversations"] * (scale["instruction"] // 4 + scale["turns"] * (scale["answer"] + 24))


def measure(lm: DiffusionLM, settings: dict, workload: str, caching: bool, scale: dict, shape: str | None) -> dict:
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16, enable_prefix_caching=caching,
                                               prefix_cache_tokens=pool_tokens(workload, scale), **settings))
    params = SamplingParams(max_new_tokens=scale["answer"], stop_at_eos=False)
    if workload == "instruction":
        answers = [o.token_ids for o in engine.generate(instruction_prompts(lm, scale), params)]
    else:
        answers = run_chat(engine, lm, scale, params)
    stats = engine.stats()
    return {"answers": answers, "forward_tokens": sum(r.forward_tokens for r in engine.stats_collector.trace),
            "prompt_tokens": stats.prompt_tokens, "cached_prompt_tokens": stats.cached_prompt_tokens,
            "computed_prompt_tokens": stats.prompt_tokens - stats.cached_prompt_tokens,
            "hit_rate": round(stats.prefix_cache_hit_rate, 4), "elapsed_s": stats.elapsed_s,
            "tokens_per_s": stats.tokens_per_s,
            "h200_tokens_per_s": project(list(engine.stats_collector.trace), stats.generated_tokens, shape,
                                         "h200")["tokens_per_s"] if shape else None}


def compare(lm: DiffusionLM, settings: dict, workload: str, scale: dict, shape: str | None) -> dict:
    rounds = {False: [], True: []}
    for _ in range(scale["rounds"]):
        for caching in (False, True):
            rounds[caching].append(measure(lm, settings, workload, caching, scale, shape))
    off, on = rounds[False][-1], rounds[True][-1]
    speedups = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(rounds[False], rounds[True])]
    keep = ("forward_tokens", "prompt_tokens", "cached_prompt_tokens", "computed_prompt_tokens", "hit_rate",
            "tokens_per_s", "h200_tokens_per_s")
    return {"off": {k: off[k] for k in keep}, "on": {k: on[k] for k in keep},
            "identical_answers": all(a["answers"] == b["answers"] for a, b in zip(rounds[False], rounds[True])),
            "forward_tokens_ratio": round(on["forward_tokens"] / off["forward_tokens"], 4),
            "computed_prompt_tokens_ratio": round(on["computed_prompt_tokens"] / off["computed_prompt_tokens"], 4),
            "speedups": [round(s, 3) for s in speedups], "median_speedup": round(statistics.median(speedups), 3),
            "h200_speedup": round(on["h200_tokens_per_s"] / off["h200_tokens_per_s"], 3) if shape else None}


def eviction(lm: DiffusionLM, settings: dict, scale: dict) -> dict:
    """``--evict_requests`` requests over 50 distinct 64-token prefixes, with a pool that holds 10 of them:
    the pool stays within its entries, evicts, and the answers equal those without a cache."""
    rng = random.Random(2)
    heads = [words(lm, rng, 64) for _ in range(50)]
    prompts = [rng.choice(heads) + words(lm, rng, rng.randint(2, 9)) for _ in range(scale["evict_requests"])]
    params = SamplingParams(max_new_tokens=8, stop_at_eos=False)
    answers, engines = [], []
    for caching in (False, True):
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16, enable_prefix_caching=caching,
                                                   prefix_cache_tokens=10 * 64, **settings))
        answers.append([o.token_ids for o in engine.generate(prompts, params)])
        engines.append(engine)
    index, stats = engines[1].runner.prefix_cache.index, engines[1].stats()
    return {"requests": len(prompts), "pool_blocks": index.capacity, "blocks_held": len(index),
            "evictions": index.evictions, "hit_rate": round(stats.prefix_cache_hit_rate, 4),
            "identical_answers": answers[0] == answers[1]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", choices=sorted(SCALES), default="quick")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    results = {}
    for family in args.families.split(","):
        path, settings = FAMILIES[family]
        lm = load_model(path, dtype="float32")
        for workload in ("instruction", "chat"):
            row = results[f"{family}/{workload}"] = compare(lm, settings, workload, scale, SHAPES.get(family))
            print(f"{family:>6} {workload:>11}: forwarded {row['off']['forward_tokens']} -> "
                  f"{row['on']['forward_tokens']} ({row['forward_tokens_ratio']}x), prompt computed "
                  f"{row['computed_prompt_tokens_ratio']}x, hit rate {row['on']['hit_rate']}, "
                  f"tok/s {row['median_speedup']}x (H200* {row['h200_speedup']}x), "
                  f"identical {row['identical_answers']}", flush=True)
        results[f"{family}/eviction"] = row = eviction(lm, settings, scale)
        print(f"{family:>6}    eviction: {row}", flush=True)
    if args.out is not None:
        write_results(args.out, "prefix_cache", {"scale": scale, "results": results}, ["prefix-cache", *(argv or [])],
                      program="python -m research")
    return results


if __name__ == "__main__":
    main()
