"""A tiny LLaDA2.2-layout checkpoint: the LLaDA2 fixture with LLaDA2.2's config keys.

``tiny-llada2`` (8 experts, top-2) plus ``block_size`` 32, ``expert_capacity`` 4 (a routing block keeps half
the experts, so block routing and the per-token gate choose differently), the DELETE / SPLIT ids and
LLaDA2.2's two stop ids. DELETE and SPLIT are two ordinary characters of the vocabulary (as the release's
are base ids, not added tokens) whose output rows are scaled up, so that they win some argmaxes and the
editing rule deletes and splits on a random model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
EXPERT_CAPACITY = 4
BLOCK_SIZE = 32
DELETE_TOKEN, SPLIT_TOKEN = "~", "`"  # characters of the fixture's vocabulary
EDIT_ROW_SCALE = 1.6  # their output rows, scaled: they win some argmaxes


def write_llada22(directory: Path, with_edit_ids: bool = True) -> Path:
    """Write the LLaDA2.2-layout fixture to ``directory`` (without the DELETE / SPLIT ids: a checkpoint the
    editing rule refuses)."""
    shutil.copytree(FIXTURES / "tiny-llada2", directory, dirs_exist_ok=True)
    vocab = json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"]
    delete_id, split_id = vocab[DELETE_TOKEN], vocab[SPLIT_TOKEN]
    config = json.loads((directory / "config.json").read_text())
    config |= {"block_size": BLOCK_SIZE, "expert_capacity": EXPERT_CAPACITY, "rope_theta": 3000000.0}
    if with_edit_ids:
        config |= {"delete_token_id": delete_id, "split_token_id": split_id}
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = json.loads((directory / "generation_config.json").read_text())
    generation["eos_token_id"] = [generation["eos_token_id"], vocab["<|role_end|>"]]
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    weights = load_file(str(directory / "model.safetensors"))
    for token in (delete_id, split_id):
        weights["lm_head.weight"][token] *= EDIT_ROW_SCALE
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
