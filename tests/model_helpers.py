"""Shared by the model tests: the tiny random LLaDA and Dream checkpoints in ``tests/fixtures`` (written by
``scripts/make_fixtures.py`` in the real on-disk formats), read raw or loaded, and random left-padded rows."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from engine.models import DiffusionLM, load_model

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LLADA_DIR = FIXTURES / "tiny-llada"
DREAM_DIR = FIXTURES / "tiny-dream"
FAMILY_DIRS = {"llada": LLADA_DIR, "dream": DREAM_DIR}


def read_config(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def raw_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory, read with safetensors directly (all shards)."""
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def load_families(dtype: str) -> dict[str, DiffusionLM]:
    """Both fixtures loaded in ``dtype``, by family (the ``loaded`` and ``loaded64`` fixtures of conftest)."""
    return {family: load_model(directory, dtype=dtype) for family, directory in FAMILY_DIRS.items()}


def left_padded(lengths: list[int], vocab: int, pad_id: int, seed: int):
    """Random token rows, left-padded to the longest; positions count from each row's first token."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    input_ids = torch.full((len(lengths), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(lengths), width), dtype=torch.long)
    key_mask = torch.zeros((len(lengths), width), dtype=torch.bool)
    for row, length in enumerate(lengths):
        input_ids[row, width - length:] = torch.randint(0, vocab, (length,), generator=generator)
        position_ids[row, width - length:] = torch.arange(length)
        key_mask[row, width - length:] = True
    return input_ids, position_ids, key_mask


def our_logits(lm: DiffusionLM, input_ids, position_ids, key_mask) -> torch.Tensor:
    hidden = lm.model.forward_full(input_ids, position_ids, key_mask)
    return lm.model.logits(hidden)
