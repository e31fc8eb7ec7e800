"""Structured output's cost and what it does to answers: tokens per row forward, grammar share, accuracy.

Rates: the same prompts run free and under a JSON schema (``json``) or ``json_object``, on the random LLaDA
fixture (one character a token) or the shipped tiny model (``--model tiny``, its held-out prompts). Committed
tokens are whole decoded blocks (every position of a block is committed once); the grammar share is the time
spent in ``engine.structured.rows`` (bitmasks, masked proposals, runs kept, rollbacks) over the run's wall time.

Accuracy (``--accuracy N``): the tiny model's exact answers on N held-out counting prompts, free, under a regex
every right answer matches, and under a choice among three answers (the right one, each number one higher,
the numbers reversed).

    python -m research structured-output [--model tiny] [--rows 16 64] [--accuracy 100] [--decoding quota]
"""
from __future__ import annotations

import argparse
import functools
import re
import time
from pathlib import Path

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from tinylm.tasks import read_jsonl

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-llada"
HELDOUT = Path(__file__).resolve().parents[1] / "assets" / "data" / "heldout.jsonl"
COUNTING = r"[0-9]+( [0-9]+)*"  # every held-out answer matches it
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "color", "n"], "additionalProperties": False}
CONSTRAINTS = {"free": None, "json": {"json": SCHEMA}, "json_object": {"json_object": True}}


def timed(engine: BlockServeEngine) -> list[float]:
    """Wrap the block rows' constrained-row calls so their time adds up in the returned one-item list."""
    spent = [0.0]
    rows = engine.runner.rows.constrained
    for name in ("propose", "keep_runs", "settle"):
        method = getattr(rows, name)

        @functools.wraps(method)
        def wrapper(*args, _method=method, **kwargs):
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - started
        setattr(rows, name, wrapper)
    return spent


def prompts_for(model: str, rows: int) -> list:
    """The held-out counting prompts as chats for the tiny model, plain text for a fixture."""
    if model != "tiny":
        return [f"question {index}: answer" for index in range(rows)]
    return [[{"role": "user", "content": row["prompt"]}] for row in read_jsonl(HELDOUT)[:rows]]


def run(lm, config: EngineConfig, prompts: list, max_new_tokens: int, constraint: dict | None) -> dict:
    engine = BlockServeEngine(lm, config)
    spent = timed(engine)
    params = SamplingParams(max_new_tokens=max_new_tokens, structured_outputs=constraint)
    started = time.perf_counter()
    outputs = engine.generate(prompts, params)
    wall = time.perf_counter() - started
    stats = engine.stats()
    committed = stats.blocks_decoded * engine.config.block_length
    return {"ended": sum(output.finish_reason == "eos" for output in outputs),
            "committed_per_row_forward": committed / stats.row_forwards,
            "answer_tokens_per_row_forward": stats.generated_tokens / stats.row_forwards,
            "grammar_share": spent[0] / wall, "wall_s": wall}


def rates(lm, args: argparse.Namespace) -> None:
    print("| rows | constraint | ended by itself | committed / row forward | answer tokens / row forward "
          "| grammar share | wall |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        config = EngineConfig(max_batch_size=rows, decoding=args.decoding, steps_per_block=args.steps_per_block)
        prompts = prompts_for(args.model, rows)
        for name, constraint in CONSTRAINTS.items():
            result = run(lm, config, prompts, args.max_new_tokens, constraint)
            print(f"| {rows} | {name} | {result['ended']}/{rows} | {result['committed_per_row_forward']:.2f} | "
                  f"{result['answer_tokens_per_row_forward']:.2f} | {result['grammar_share']:.0%} | "
                  f"{result['wall_s']:.1f} s |")


def three_answers(row: dict) -> list[str]:
    """The right answer, each number one higher, and the numbers reversed (distinct, in that order)."""
    numbers = row["answer"].split()
    shifted = " ".join(str(int(number) + 1) for number in numbers)
    return list(dict.fromkeys([row["answer"], shifted, " ".join(reversed(numbers))]))


def accuracy(lm, args: argparse.Namespace) -> None:
    rows = read_jsonl(HELDOUT)[:args.accuracy]
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16, decoding=args.decoding,
                                               steps_per_block=args.steps_per_block))
    chats = [[{"role": "user", "content": row["prompt"]}] for row in rows]
    settings = {"free": [None] * len(rows), "regex": [{"regex": COUNTING}] * len(rows),
                "choice of three": [{"choice": three_answers(row)} for row in rows]}
    print("| constraint | exact answers | answers that match the regex |")
    print("|---|---|---|")
    for name, constraints in settings.items():
        outputs = engine.generate(chats, [SamplingParams(max_new_tokens=args.max_new_tokens, structured_outputs=c)
                                          for c in constraints])
        right = sum(output.text == row["answer"] for output, row in zip(outputs, rows))
        matching = sum(re.fullmatch(COUNTING, output.text) is not None for output in outputs)
        print(f"| {name} | {right}/{len(rows)} | {matching}/{len(rows)} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(FIXTURE), help='"tiny" or a checkpoint directory')
    parser.add_argument("--rows", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--accuracy", type=int, default=0, help="held-out rows for the accuracy table (tiny)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--decoding", default=None, help="None: the model's own settings, else threshold")
    parser.add_argument("--steps-per-block", type=int, default=None)
    args = parser.parse_args(argv)
    lm = load_model(args.model, dtype="float32")
    run(lm, EngineConfig(max_batch_size=1), ["warm"], 8, None)  # warm-up, so the first row is not its cost
    if args.rows:
        rates(lm, args)
    if args.accuracy:
        accuracy(lm, args)


if __name__ == "__main__":
    main()
