"""An EngineConfig settled against the loaded model: its trained block, and the settings it refuses."""
from __future__ import annotations

import dataclasses
import logging

from engine.config import EngineConfig

logger = logging.getLogger(__name__)


def config_for_model(config: EngineConfig, lm) -> EngineConfig:
    """``config`` with its block length settled for ``lm`` (a DiffusionLM), after refusing what the
    model's layout cannot run.

    An unset ``block_length`` becomes the block a block-causal model was trained with, else
    DEFAULT_BLOCK_LENGTH. A block-causal model told another block runs it, with one warning: its
    attention mask then differs from the one it was trained with."""
    refusal = lm.layout.refusal(config)
    if refusal is not None:
        raise ValueError(refusal)
    trained = lm.layout.trained_block
    if config.block_length is None:
        return dataclasses.replace(config, block_length=lm.layout.default_block())
    if trained is not None and config.block_length != trained:
        logger.warning("EngineConfig.block_length=%d on %s, which was trained with blocks of %d: its "
                       "block-causal mask differs from training (leave block_length unset to run %d)",
                       config.block_length, lm.family, trained, trained)
    return config


def block_length_for(config: EngineConfig, lm) -> int:
    """The block ``config`` decodes ``lm`` with: its own, else the layout's default."""
    return config.block_length or lm.layout.default_block()
