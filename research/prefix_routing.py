"""Does the job's routing by shared prefix help the prefix cache? Two jobs on the tiny SDAR fixture, one
with ``bucketing.group_prefixes`` on and one with it off, on the same input: ``rows`` prompts, each one of
four instructions (about 450 tokens) before a demo question, shuffled. Two CPU actors, batches of 4, one
batch in flight per actor, and a prefix cache of one row's width, so an actor holds about one
instruction at a time.

``python -m research prefix-routing [--rows N] [--out DIR]``
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPICS = ("arithmetic", "geography", "history of science", "cooking")


def write_input(path: Path, rows: int) -> None:
    demo = [json.loads(line) for line in (ROOT / "assets" / "data" / "demo.jsonl").read_text().splitlines()]
    prompts = []
    for index in range(rows):
        topic = TOPICS[index % len(TOPICS)]
        instruction = (f"You are a careful assistant for {topic}. Read the question, think about it step by step, "
                       f"and answer with the final answer only. Keep the answer short and never explain anything "
                       f"about {topic}. ") * 2
        prompts.append({"id": f"r{index}", "prompt": instruction + demo[index % len(demo)]["prompt"]})
    random.Random(1).shuffle(prompts)
    path.write_text("".join(json.dumps(row) + "\n" for row in prompts))


def run_job(input_path: Path, output: Path, group: bool) -> dict:
    overrides = ["model=tests/fixtures/tiny-sdar", "device=cpu", "dtype=float32", "sampling.max_new_tokens=8",
                 "engine.max_batch_size=4", "engine.token_budget=null", "engine.max_model_len=512",
                 "actors.num_gpus=0", "actors.num_actors=2", "actors.num_cpus=0.25", "actors.batch_size=4",
                 "actors.max_concurrent_batches=1", "bucketing.num_buckets=2",
                 f"bucketing.group_prefixes={str(group).lower()}"]
    command = [sys.executable, "-m", "pipeline.run", "--config", "configs/sdar-8b-chat.yaml", "--input",
               str(input_path), "--output", str(output), *(x for o in overrides for x in ("--set", o))]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True,
                   env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    stats = json.loads((output / "stats.json").read_text())
    totals = stats["totals"]
    return {"group_prefixes": group, "shared_prefixes": stats["run"]["shared_prefixes"],
            "prompt_tokens": totals["prompt_tokens"], "cached_prompt_tokens": totals["cached_prompt_tokens"],
            "hit_rate": totals["prefix_cache_hit_rate"], "actor_busy_s": totals["busy_s"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "prefix_routing")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    input_path = args.out / "input.jsonl"
    write_input(input_path, args.rows)
    results = [run_job(input_path, args.out / f"group_{group}", group) for group in (True, False)]
    for row in results:
        print(f"group_prefixes={row['group_prefixes']!s:5}: {row['cached_prompt_tokens']:,} of "
              f"{row['prompt_tokens']:,} prompt tokens from the cache ({row['hit_rate']:.0%}), actors busy "
              f"{row['actor_busy_s']:.1f} s")
    (args.out / "prefix_routing.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
