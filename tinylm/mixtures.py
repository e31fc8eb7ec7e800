"""Training examples for the tiny model: the states the block decoder visits, in a chosen mixture.

Every example is the prompt (never masked) followed by the full answer canvas (``CANVAS_BLOCKS`` blocks
of ``BLOCK`` tokens, the answer then EOS padding), as at inference: a canvas whose end depended on the
answer length would let the model read the stop off the canvas (the trial's leak). Kinds of state:

* ``plain``: LLaDA masking over the whole canvas with ratio t ~ U(0, 1], loss weighted 1/t;
* ``semi_ar``: blocks before a current block clean, the current block masked with ratio t (weight
  1/t), later blocks fully masked (weight 0.25);
* ``frontier``: the current block has a committed prefix of random length and the rest masked, the
  frontier the threshold decoder advances (a block decoded from all-mask is the empty prefix);
* ``stop``: the frontier sits at the answer's last number or at its EOS, the two positions where the
  count must end.

The current block is drawn from the answer's blocks and the one after its EOS. EOS padding after the
terminating EOS is down-weighted (0.2): it is trivial and would dominate the loss.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from tinylm.tasks import BLOCK, CANVAS_BLOCKS, example_key, make_example

CANVAS = BLOCK * CANVAS_BLOCKS
KINDS = ("plain", "semi_ar", "frontier", "stop")
MIXTURES: dict[str, dict[str, float]] = {
    "semi-ar": {"semi_ar": 0.75, "plain": 0.25},  # the recipe before decoder states were added
    "frontier": {"frontier": 0.4, "stop": 0.2, "semi_ar": 0.25, "plain": 0.15},
}
PADDING_WEIGHT, LATER_BLOCKS_WEIGHT = 0.2, 0.25


@dataclass(frozen=True)
class TokenIds:
    eos: int
    mask: int
    bos: int


def canvas_mask(rng: random.Random, kind: str, answer_tokens: int) -> tuple[list[bool], list[float]]:
    """Which canvas positions are masked, and each position's loss scale, for one kind of state.
    ``answer_tokens`` counts the numbers and the terminating EOS."""
    eos_block = (answer_tokens - 1) // BLOCK
    current = rng.randint(0, min(CANVAS_BLOCKS - 1, eos_block + 1))
    if kind == "plain":
        t = max(rng.random(), 1e-3)
        return [rng.random() < t for _ in range(CANVAS)], [1.0 / t] * CANVAS
    if kind == "semi_ar":
        t = max(rng.random(), 1e-3)
        inside = [rng.random() < t for _ in range(BLOCK)]
        scale_inside = [1.0 / t] * BLOCK
    elif kind in ("frontier", "stop"):
        if kind == "stop":  # frontier at the last number (index answer_tokens - 2) or at the EOS
            current, prefix = divmod(answer_tokens - 1 - rng.randint(0, 1), BLOCK)
        else:
            prefix = rng.randint(0, BLOCK - 1)
        inside = [i >= prefix for i in range(BLOCK)]
        scale_inside = [1.0] * BLOCK
    else:
        raise ValueError(f"unknown kind of training state {kind!r}; known: {KINDS}")
    later = CANVAS_BLOCKS - 1 - current
    masked = [False] * (current * BLOCK) + inside + [True] * (later * BLOCK)
    scale = [0.0] * (current * BLOCK) + scale_inside + [LATER_BLOCKS_WEIGHT] * (later * BLOCK)
    if not any(inside):
        masked[current * BLOCK + rng.randrange(BLOCK)] = True
    return masked, scale


def build_example(rng: random.Random, tokenizer, excluded: set, ids: TokenIds, kind: str):
    while True:
        example = make_example(rng)
        if example_key(example) not in excluded:
            break
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": example.prompt}],
                                           add_generation_prompt=True, tokenize=True, return_dict=False)
    answer = tokenizer(example.answer, add_special_tokens=False)["input_ids"] + [ids.eos]
    target = answer + [ids.eos] * (CANVAS - len(answer))
    weights = [1.0] * len(answer) + [PADDING_WEIGHT] * (CANVAS - len(answer))
    masked, scale = canvas_mask(rng, kind, len(answer))
    inputs = prompt + [ids.mask if m else token for m, token in zip(masked, target)]
    labels = [-100] * len(prompt) + [token if m else -100 for m, token in zip(masked, target)]
    loss_weights = [0.0] * len(prompt) + [w * s if m else 0.0 for m, w, s in zip(masked, weights, scale)]
    return inputs, labels, loss_weights


def make_batch(rng: random.Random, tokenizer, excluded: set, ids: TokenIds, batch_size: int,
               mixture: dict[str, float]):
    kinds = rng.choices(list(mixture), weights=list(mixture.values()), k=batch_size)
    rows = [build_example(rng, tokenizer, excluded, ids, kind) for kind in kinds]
    width = max(len(r[0]) for r in rows)
    input_ids = torch.full((batch_size, width), ids.eos, dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    weights = torch.zeros(batch_size, width)
    key_mask = torch.zeros(batch_size, width, dtype=torch.bool)
    positions = torch.zeros(batch_size, width, dtype=torch.long)
    for row, (inputs, row_labels, row_weights) in enumerate(rows):
        pad = width - len(inputs)  # left padding, positions from each row's first real token
        input_ids[row, pad:] = torch.tensor(inputs)
        labels[row, pad:] = torch.tensor(row_labels)
        weights[row, pad:] = torch.tensor(row_weights)
        key_mask[row, pad:] = True
        positions[row, pad:] = torch.arange(len(inputs))
    return input_ids, positions, key_mask, labels, weights
