"""An EngineConfig settled against the loaded model: its trained block, and the settings it refuses."""
from __future__ import annotations

import dataclasses
import logging

from engine.config import DEFAULT_BLOCK_LENGTH, EngineConfig

logger = logging.getLogger(__name__)


def config_for_model(config: EngineConfig, lm) -> EngineConfig:
    """``config`` with its block length settled for ``lm`` (a DiffusionLM), after refusing what the
    model's family cannot honour.

    An unset ``block_length`` becomes the block a block-causal model was trained with, else
    DEFAULT_BLOCK_LENGTH. A block-causal model told another block runs it, with one warning: its
    attention mask then differs from the one it was trained with."""
    check_family_settings(config, lm)
    trained = trained_block_length(lm)
    if config.block_length is None:
        return dataclasses.replace(config, block_length=block_length_for(config, lm))
    if trained is not None and config.block_length != trained:
        logger.warning("EngineConfig.block_length=%d on %s, which was trained with blocks of %d: its "
                       "block-causal mask differs from training (leave block_length unset to run %d)",
                       config.block_length, lm.family, trained, trained)
    return config


def trained_block_length(lm) -> int | None:
    """The block a block-causal model was trained with; None for a full-attention model."""
    return lm.block_length if lm.attention == "block_causal" else None


def block_length_for(config: EngineConfig, lm) -> int:
    """The block ``config`` decodes ``lm`` with: its own, else the trained one, else DEFAULT_BLOCK_LENGTH."""
    return config.block_length or trained_block_length(lm) or DEFAULT_BLOCK_LENGTH


def check_family_settings(config: EngineConfig, lm) -> None:
    """Refuse settings the loaded model's family cannot honour, naming the setting."""
    if lm.attention != "block_causal":
        return
    family = lm.family
    if config.cache != "dual":
        raise ValueError(f"EngineConfig.cache: {config.cache!r} is a cache mode of full-attention families; "
                         f"{family} attends block-causally and caches each finished block: leave cache at 'dual'")
    if config.decoding == "dream":
        raise ValueError(f"EngineConfig.decoding: 'dream' is Dream's sampler over a whole canvas; {family} decodes "
                         f"block by block: use low_confidence_dynamic, low_confidence, threshold or quota")
