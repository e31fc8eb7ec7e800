"""What a checkpoint family module defines: one :class:`Family`, read by the loader, the export and the
fixtures. A family module maps its checkpoint's ``config.json`` and weight names onto the one transformer
(``engine.models.transformer``) and says how its rows are laid out (``engine.models.layout``)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from engine.models.checkpoint import WeightNames
from engine.models.layout import RowLayout
from engine.rules.base import Setting


@dataclass(frozen=True)
class CheckpointIds:
    """The token ids an exported checkpoint's ``config.json`` names (a family writes the ones it has)."""

    mask_id: int
    eos_id: int
    pad_id: int
    bos_id: int | None = None


@dataclass(frozen=True)
class Family:
    name: str  # lower case, as DiffusionLM.family and messages give it: "sdar"
    title: str  # as people write it: "SDAR"
    recognises: Callable[[dict], bool]  # config.json -> whether it is a checkpoint of this family
    transformer_config: Callable[[dict], Any]  # config.json -> the model's shape (a TransformerConfig for
    # the one transformer, else what model_class takes);
    # raises ValueError naming a key whose computation the engine would not reproduce
    layout: Callable[[dict], RowLayout]  # config.json -> how its rows are laid out and attended
    weight_names: WeightNames  # the checkpoint's tensor names <-> the transformer's
    end_of_turn_token: str  # a committed one ends a request, as EOS does
    mask_token: str  # the tokenizer's mask token, when config.json names no mask_token_id
    config_json: Callable[[Any, CheckpointIds, int | None], dict]  # the export's config.json
    # (the third argument: a block-causal checkpoint's trained block)
    mask_token_id: int | None = None  # the release's mask id, when the tokenizer lacks mask_token
    checkpoint_views: bool = False  # weights export by the transformer's checkpoint-level views (fused
    # or per-expert tensors), not one name per parameter
    model_class: type[nn.Module] | None = None  # a model of its own (None: the one transformer)
    image_tokens: Callable[[dict], tuple[int, ...]] | None = None  # config.json -> ids only an image
    # request carries (a text-only family refuses them)
    rule_settings: Callable[[dict], dict] | None = None  # config.json -> the settings its rules take from
    # the checkpoint besides generation_config.json's (LLaDA2.2's DELETE / SPLIT ids; DecodingRule.settle)
    decoding: Mapping[str, Any] = field(default_factory=dict)  # the EngineConfig fields of its own
    # decoding (its configs/*.yaml use them); the engine's defaults apply where a config sets none
    own_settings: Mapping[str, Setting] = field(default_factory=dict)  # the EngineConfig settings it alone reads,
    # by their flat names; a model of another family refuses them by name
    prefix_cache_refusal: Callable[[Any], str | None] | None = None  # an EngineConfig -> why a prompt's keys and
    # values could not be reused under it (None: they can wherever its layout caches prefixes)
