"""Tasks a person can check at a glance, with the answer length readable from the prompt.

``count from 17 to 52`` -> ``17 18 19 ... 52`` and ``count down from 52 to 17`` -> ``52 51 ... 17``.
Each number in the answer is fixed by its neighbour, so the text locates itself, and the stop point is
a local fact (the last number is in the prompt). Answer lengths are drawn uniformly from 1 to
``MAX_ANSWER_CHARS`` characters (1 to 6 blocks of 32 tokens); the wording around the instruction varies
so prompt lengths spread too.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path

TASKS = ("count_up", "count_down")
MAX_ANSWER_CHARS = 192
MAX_NUMBER = 999
PREFIXES = ("", "", "please ", "hey, ", "could you ", "now ", "I need you to ", "quick one: ",
            "for a test of the server, please ", "my little sister wants to see if you can ",
            "without any extra words, ", "just for fun, ")
SUFFIXES = ("", "", ".", "!", " please", ", thanks", " for me", " and nothing else",
            ", one number after another", " (separate the numbers with spaces)")


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


def make_example(rng: random.Random, task: str | None = None) -> Example:
    task = task or rng.choice(TASKS)
    target = rng.randint(1, MAX_ANSWER_CHARS)
    while True:
        start = rng.randint(0, MAX_NUMBER)
        step = 1 if task == "count_up" else -1
        stop, length = start, len(str(start))
        while 0 <= stop + step <= MAX_NUMBER and length + 1 + len(str(stop + step)) <= target:
            stop += step
            length += 1 + len(str(stop))
        if length >= target - 4:  # the start was not too close to the range's end
            break
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


def write_jsonl(examples: list[Example], path: Path, id_prefix: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for index, example in enumerate(examples):
            row = {"id": f"{id_prefix}-{index:05d}", **asdict(example)}
            f.write(json.dumps(row) + "\n")


def read_jsonl(path: Path) -> list[dict]:
    with Path(path).open() as f:
        return [json.loads(line) for line in f if line.strip()]
