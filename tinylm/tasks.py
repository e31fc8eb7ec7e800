"""Tasks a person can check at a glance, with the answer length readable from the prompt.

``count from 17 to 52`` -> ``17 18 19 ... 52`` and ``count down from 52 to 17`` -> ``52 51 ... 17``.
Every number is one token (``tinylm/tokenizer.py``), so each answer token is fixed by its neighbour and
the stop is a local fact: EOS follows the token that equals the prompt's last number. Numbers run
from 0 to ``MAX_TASK_NUMBER`` and answer lengths are drawn uniformly from 1 to ``MAX_ANSWER_TOKENS``
numbers, so with the EOS the answers span 1 to ``CANVAS_BLOCKS`` blocks of ``BLOCK`` tokens evenly;
the wording around the instruction varies so prompt lengths spread too. (The problem size, block 8
over a 64-token canvas, was chosen by measurement: README, "The tiny model".)
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

TASKS = ("count_up", "count_down")
BLOCK = 8  # the tiny configs' block_length
CANVAS_BLOCKS = 8  # the tiny configs' max_new_tokens = BLOCK * CANVAS_BLOCKS = 64
MAX_ANSWER_TOKENS = BLOCK * CANVAS_BLOCKS - 1  # + EOS fills the canvas
MAX_NUMBER = 399  # every number up to this is one token of the tiny tokenizer (its vocabulary: tasks' words)
MAX_TASK_NUMBER = 99  # the tasks use the first hundred
assert MAX_TASK_NUMBER <= MAX_NUMBER and MAX_ANSWER_TOKENS <= MAX_TASK_NUMBER + 1
PREFIXES = ("", "", "please ", "hey, ", "could you ", "now ", "I need you to ", "quick one: ",
            "for a test of the server, please ", "my little sister wants to see if you can ",
            "without any extra words, ", "just for fun, ")
SUFFIXES = ("", "", ".", "!", " please", ", thanks", " for me", " and nothing else",
            ", one number after another", " (separate the numbers with spaces)")
HELDOUT_SEED, DEMO_SEED, VALIDATION_SEED = 1234, 5678, 4321
HELDOUT_SIZE, DEMO_SIZE, VALIDATION_SIZE = 200, 2400, 64


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer: str
    start: int
    stop: int


def count_answer(start: int, stop: int) -> str:
    step = 1 if stop >= start else -1
    return " ".join(str(n) for n in range(start, stop + step, step))


def vocabulary_words() -> tuple[str, ...]:
    """Every word and punctuation mark the prompts use, in a stable order (one token each)."""
    text = " ".join(PREFIXES + SUFFIXES + ("count from to down", "user assistant system"))
    words: dict[str, None] = {}
    for word in text.replace(",", " , ").replace(".", " . ").replace("!", " ! ").replace(
            ":", " : ").replace("(", " ( ").replace(")", " ) ").split():
        words.setdefault(word, None)
    return tuple(words)


def answer_length(example: Example) -> int:
    """Answer tokens, EOS excluded (one per number)."""
    return abs(example.stop - example.start) + 1


def make_example(rng: random.Random, task: str | None = None) -> Example:
    task = task or rng.choice(TASKS)
    length = rng.randint(1, MAX_ANSWER_TOKENS)
    if task == "count_up":
        start = rng.randint(0, MAX_TASK_NUMBER - length + 1)
        stop = start + length - 1
    else:
        start = rng.randint(length - 1, MAX_TASK_NUMBER)
        stop = start - length + 1
    core = f"count from {start} to {stop}" if task == "count_up" else f"count down from {start} to {stop}"
    prompt = rng.choice(PREFIXES) + core + rng.choice(SUFFIXES)
    return Example(task, prompt, count_answer(start, stop), start, stop)


def make_split(seed: int, size: int, exclude: set[tuple[str, int, int]] = frozenset()) -> list[Example]:
    rng = random.Random(seed)
    examples, seen = [], set(exclude)
    while len(examples) < size:
        example = make_example(rng, TASKS[len(examples) % len(TASKS)])
        key = (example.task, example.start, example.stop)
        if key not in seen:
            seen.add(key)
            examples.append(example)
    return examples


def example_key(example: Example) -> tuple[str, int, int]:
    return (example.task, example.start, example.stop)


def define_splits() -> tuple[list[Example], list[Example], list[Example]]:
    """Held-out (scored), validation (checkpoint and decoding selection) and demo splits, disjoint."""
    heldout = make_split(HELDOUT_SEED, HELDOUT_SIZE)
    validation = make_split(VALIDATION_SEED, VALIDATION_SIZE, exclude={example_key(e) for e in heldout})
    demo = make_split(DEMO_SEED, DEMO_SIZE, exclude={example_key(e) for e in heldout + validation})
    return heldout, validation, demo


def validation_rows() -> list[dict]:
    return [{"id": f"validation-{i:05d}", **asdict(e)} for i, e in enumerate(define_splits()[1])]


def write_jsonl(examples: list[Example], path: Path, id_prefix: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for index, example in enumerate(examples):
            row = {"id": f"{id_prefix}-{index:05d}", **asdict(example)}
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
