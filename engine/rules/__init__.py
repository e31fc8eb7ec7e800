"""The decoding rules: one module each, listed once here.

A rule is the one object that knows how a block (or a canvas) is decoded: its settings and their
validation, the layouts and request settings it refuses, which positions of a row need logits, and,
from a step's logits, what it writes and whether the row's block is final (``engine.rules.base``).
``EngineConfig.decoding`` names a rule by the key it has here. This module imports no torch: a rule's
module is loaded when a config that names it is validated or run.
"""
from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.rules.base import DecodingRule, Setting

# EngineConfig.decoding -> "module:class" under engine.rules
RULES = {
    "threshold": "threshold:Threshold",
    "low_confidence": "threshold:LowConfidence",
    "quota": "quota:Quota",
    "low_confidence_static": "quota:LowConfidenceStatic",
    "low_confidence_dynamic": "quota:LowConfidenceDynamic",
    "factor": "factor:Factor",
    "factor_prefix": "factor:FactorPrefix",
    "dream": "dream:Dream",
    "joint_threshold": "joint_threshold:JointThreshold",
    "joint_threshold_indel": "joint_threshold_indel:JointThresholdIndel",
    "entropy_bound": "entropy_bound:EntropyBound",
    "autoregressive": "autoregressive:Autoregressive",
    "linear_spec": "linear_spec:LinearSpec",
}
DECODING_RULES = tuple(RULES)
DEFAULT_THRESHOLD = 0.9  # the threshold rules' confidence when neither the config nor the checkpoint names one
DEFAULT_DECODING = "threshold"  # what an unset EngineConfig.decoding decodes with on a model without a rule of its own


def rule_class(name: str) -> type[DecodingRule]:
    """The class of the rule ``EngineConfig.decoding`` calls ``name``."""
    if name not in RULES:
        raise ValueError(f"decoding must be one of {DECODING_RULES}, got {name!r}")
    module, cls = RULES[name].split(":")
    return getattr(importlib.import_module(f"engine.rules.{module}"), cls)


@functools.cache
def owned_settings() -> dict[str, tuple[str, Setting]]:
    """Every setting one rule owns (``DecodingRule.own_settings``), by its flat name: (the rule, the setting)."""
    owners: dict[str, tuple[str, Setting]] = {}
    for name in RULES:
        for setting, declared in rule_class(name).own_settings.items():
            owners.setdefault(setting, (name, declared))
    return owners


def make_rule(name: str, **settings: Any) -> DecodingRule:
    """A rule built from its own settings by EngineConfig's names, e.g. ``make_rule("quota", steps_per_block=4)``."""
    return rule_class(name)(**settings)


def settings_problems(config: Any) -> list[tuple[str, str]]:
    """Every rule's settings that ``config`` sets to invalid values, then what the chosen rule needs."""
    problems: dict[str, str] = {}
    for name in dict.fromkeys(RULES.values()):
        module, cls = name.split(":")
        for field, problem in getattr(importlib.import_module(f"engine.rules.{module}"), cls).settings_problems(config):
            problems.setdefault(field, problem)
    for setting, value in config.rule_settings:
        owner, declared = owned_settings()[setting]
        if config.decoding is not None and setting not in rule_class(config.decoding).own_settings:
            problems.setdefault(setting, f"is a setting of decoding={owner!r}; this config decodes with "
                                         f"{config.decoding!r}: leave it unset")
        elif (problem := declared.problem(value)) is not None:
            problems.setdefault(setting, problem)
    if config.decoding in RULES:
        for field, problem in rule_class(config.decoding).requirement_problems(config):
            problems.setdefault(field, problem)
    return list(problems.items())


def rule_for(config: Any, mask_id: int | None = None, logit_shift: int = 0) -> DecodingRule:
    """The rule an engine config asks for (unset: DEFAULT_DECODING), on a model with this mask id and shift."""
    return rule_class(config.decoding or DEFAULT_DECODING).from_config(config, mask_id=mask_id,
                                                                        logit_shift=logit_shift)
