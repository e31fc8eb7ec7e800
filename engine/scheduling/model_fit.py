"""An EngineConfig settled against the loaded model: its trained block, and the settings it refuses."""
from __future__ import annotations

import dataclasses
import logging
import weakref

from engine.config import EngineConfig

logger = logging.getLogger(__name__)
_WARNED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> blocks already warned of


def config_for_model(config: EngineConfig, lm) -> EngineConfig:
    """``config`` with its block length settled for ``lm`` (a DiffusionLM), after refusing what the
    model's layout cannot run.

    Unset ``block_length``, ``threshold`` and ``gen_length`` become what the checkpoint's
    generation_config.json names (``DiffusionLM.decoding_defaults``); else the block is the one a
    block-causal or canvas model was trained with, else DEFAULT_BLOCK_LENGTH, and the threshold
    DEFAULT_THRESHOLD. An unset ``enable_prefix_caching`` is on where it is exact (block-causal
    layouts). A model with a rule of its own (``RowLayout.own_rule``: a canvas model's) decodes with it when the
    config names none, and a rule takes its unset settings from the checkpoint (``DecodingRule.settle``). A
    model told another block than it was trained with runs it, with one warning per loaded model and block
    (``RowLayout.untrained_block_warning``)."""
    from engine.rules import DEFAULT_DECODING, DEFAULT_THRESHOLD, rule_class  # they load torch: imported here

    if config.decoding is None:  # unset: the model's own rule, else the default; its settings are checked now
        config = dataclasses.replace(config, decoding=lm.layout.own_rule or DEFAULT_DECODING)
    rule = rule_class(config.decoding)
    refusal = config_refusal(config, lm) or rule.refusal(lm.layout)
    if refusal is not None:
        raise ValueError(refusal)
    trained = lm.layout.trained_block
    if config.enable_prefix_caching is None:
        config = dataclasses.replace(config, enable_prefix_caching=prefix_caching(config, lm))
    config = rule.settle(config, lm.generation_settings)
    checkpoint = lm.decoding_defaults
    config = dataclasses.replace(config, threshold=_first_set(config.threshold, checkpoint.get("threshold"),
                                                              DEFAULT_THRESHOLD),
                                 gen_length=_first_set(config.gen_length, checkpoint.get("gen_length")))
    if config.block_length is None:
        return dataclasses.replace(config, block_length=block_length_for(config, lm))
    if trained is not None and config.block_length != trained and _first_time(lm, config.block_length):
        logger.warning(lm.layout.untrained_block_warning(config.block_length))
    return config


def prefix_caching(config: EngineConfig, lm) -> bool:
    """Whether ``config`` caches prompt blocks on ``lm``: its own ``enable_prefix_caching``, else wherever that is
    exact (the layout caches prefixes and the family sees no reason against it under ``config``)."""
    return lm.layout.prefix_caching(config, exact=_prefix_cache_refusal(config, lm) is None)


def config_refusal(config: EngineConfig, lm) -> str | None:
    """Why ``lm``'s family and layout cannot run ``config`` (naming the setting), or None."""
    from engine.models.families import family_named, family_settings  # they load torch: imported here

    family = family_named(lm.family)
    for name, value in config.family_settings:
        if name not in family.own_settings:
            return (f"EngineConfig.{name}={value!r}: {family.title} has no such setting; it is "
                    f"{family_settings()[name][0]}'s: leave it unset")
    if (refusal := lm.layout.refusal(config)) is not None:
        return refusal
    if config.enable_prefix_caching and (why := _prefix_cache_refusal(config, lm)) is not None:
        return f"EngineConfig.enable_prefix_caching: {why}: leave enable_prefix_caching unset"
    return None


def _prefix_cache_refusal(config: EngineConfig, lm) -> str | None:
    """The family's reason a prompt's keys and values could not be reused under ``config``, or None."""
    from engine.models.families import family_named

    refusal = family_named(lm.family).prefix_cache_refusal
    return refusal(config) if refusal is not None else None


def block_length_for(config: EngineConfig, lm) -> int:
    """The block ``config`` decodes ``lm`` with: its own, else the checkpoint's, else the layout's default."""
    return config.block_length or lm.decoding_defaults.get("block_length") or (
        lm.layout.default_block())


def _first_set(*values):
    """The first value that is not None (None if all are)."""
    return next((value for value in values if value is not None), None)


def _first_time(lm, block_length: int) -> bool:
    """Whether ``lm``'s model has not been warned of ``block_length`` yet (then it is, from now on)."""
    warned = _WARNED.setdefault(lm.model, set())
    if block_length in warned:
        return False
    warned.add(block_length)
    return True
