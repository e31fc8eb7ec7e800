"""Structured output's cost: tokens a row forward commits and the share of the run spent on grammars.

The same prompts run free and under a JSON schema (``json``) or ``json_object`` on a fixture whose tokenizer
spells ASCII one character a token (the shipped tiny model's WordPiece tokenizer is refused). Committed tokens
are whole decoded blocks (every position of a block is committed once); the grammar share is the time spent in
``engine.structured.rows`` (bitmasks, masked proposals, runs kept, rollbacks) over the run's wall time.

    python -m research structured-output [--rows 16 64] [--max-new-tokens 64] [--decoding threshold]
"""
from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tiny-llada"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "color", "n"], "additionalProperties": False}
CONSTRAINTS = {"free": None, "json": {"json": SCHEMA}, "json_object": {"json_object": True}}


def timed(engine: BlockServeEngine) -> list[float]:
    """Wrap the block runner's constrained-row calls so their time adds up in the returned one-item list."""
    spent = [0.0]
    rows = engine.runner.constrained
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


def run(lm, config: EngineConfig, rows: int, max_new_tokens: int, constraint: dict | None) -> dict:
    engine = BlockServeEngine(lm, config)
    spent = timed(engine)
    prompts = [f"question {index}: answer" for index in range(rows)]
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--decoding", default="threshold")
    parser.add_argument("--steps-per-block", type=int, default=None)
    args = parser.parse_args(argv)
    lm = load_model(FIXTURE, dtype="float32")
    run(lm, EngineConfig(max_batch_size=1), 1, 8, None)  # warm-up, so the first row of the table is not its cost
    print("| rows | constraint | ended by itself | committed / row forward | answer tokens / row forward "
          "| grammar share | wall |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        config = EngineConfig(max_batch_size=rows, decoding=args.decoding, steps_per_block=args.steps_per_block)
        for name, constraint in CONSTRAINTS.items():
            result = run(lm, config, rows, args.max_new_tokens, constraint)
            print(f"| {rows} | {name} | {result['ended']}/{rows} | {result['committed_per_row_forward']:.2f} | "
                  f"{result['answer_tokens_per_row_forward']:.2f} | {result['grammar_share']:.0%} | "
                  f"{result['wall_s']:.1f} s |")


if __name__ == "__main__":
    main()
