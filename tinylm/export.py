"""Write a :class:`BidirectionalTransformer` as an HF-format checkpoint in a served family's layout
(``engine.models.families``: its weight names and its ``config_json``)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.models.families import family_named
from engine.models.transformer import BidirectionalTransformer


def save_checkpoint(model: BidirectionalTransformer, directory: Path, family: str, config_json: dict,
                    dtype: torch.dtype = torch.bfloat16) -> None:
    """Save weights under the family's own names (``model.safetensors``) plus ``config.json``; a
    router's weight and expert bias are saved in float32 whatever ``dtype`` is."""
    weight_names = family_named(family).weight_names
    if family_named(family).checkpoint_views:  # per-expert tensors, LLaDA2's fused query_key_value
        tensors = {weight_names.theirs_of(ours): tensor for ours, tensor in model.checkpoint_tensors().items()}
        tensors.pop(None, None)
    else:
        names = weight_names.theirs(model.config.num_layers)
        tensors = {names[ours]: tensor for ours, tensor in model.state_dict().items()}
    state = {}
    for name, tensor in tensors.items():
        if name == weight_names.theirs_of("lm_head.weight") and model.config.tie_word_embeddings:
            continue
        keep = tensor.dtype == torch.float32 and ".mlp.gate." in name
        state[name] = tensor.detach().to(torch.float32 if keep else dtype).contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    (directory / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
