"""The checkpoint families served, one module each, listed once here.

Adding a family is a module of this package that defines a :class:`~engine.models.family.Family`
named ``FAMILY``, its entry in :data:`FAMILIES`, its fixture (``scripts/make_fixtures.py``) and its config
(``configs/``): see docs/architecture.md, "Adding a family".
"""
from __future__ import annotations

import functools
from pathlib import Path

from engine.models.families import (
    diffusion_gemma,
    dream,
    fast_dllm_v2,
    llada,
    llada2,
    nemotron_labs_diffusion,
    sdar,
)
from engine.models.families.unserved import unserved_diffusion_model
from engine.models.family import CheckpointIds, Family
from engine.rules.base import Setting

FAMILIES: tuple[Family, ...] = (llada.FAMILY, dream.FAMILY, sdar.FAMILY, llada2.FAMILY, diffusion_gemma.FAMILY,
                                 nemotron_labs_diffusion.FAMILY, fast_dllm_v2.FAMILY)

__all__ = ["FAMILIES", "CheckpointIds", "Family", "detect_family", "family_named", "family_settings", "served"]


def served() -> str:
    """The families served, as a person writes them: "LLaDA, Dream, SDAR, LLaDA2, DiffusionGemma"."""
    return ", ".join(family.title for family in FAMILIES)


@functools.cache
def family_settings() -> dict[str, tuple[str, Setting]]:
    """Every setting one family owns (``Family.own_settings``), by its flat name: (the family's title, the setting)."""
    return {name: (family.title, setting) for family in FAMILIES for name, setting in family.own_settings.items()}


def family_named(name: str) -> Family:
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"no family named {name!r} (served: {served()})")


def detect_family(config: dict, directory: Path) -> Family:
    """The family of the checkpoint whose ``config.json`` is ``config``; a known diffusion LM that is not
    served, or any other model, is refused naming the families served."""
    unserved = unserved_diffusion_model(config)
    if unserved is not None:
        raise ValueError(f"{directory}/config.json is {unserved}, a diffusion LM this engine does not serve "
                         f"(served: {served()})")
    for family in FAMILIES:
        if family.recognises(config):
            return family
    raise ValueError(f"{directory}/config.json is none of the served families {served()} "
                     f"(model_type={config.get('model_type')!r}, architectures={config.get('architectures')!r})")
