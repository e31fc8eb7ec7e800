"""A family's own settings: its module declares them, users give them by their flat names, and a model of
another family refuses them naming their owner."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.models.families import FAMILIES, family_settings
from engine.models.loader import load_model
from engine.scheduling.model_fit import config_for_model

FIXTURES = Path(__file__).parent / "fixtures"


def test_a_family_setting_is_gathered_apart_from_the_rule_settings_and_read_back_as_an_attribute():
    config = EngineConfig(causal_context=False, threshold=0.5)
    assert config.family_settings == (("causal_context", False),)
    assert config.rule_settings == ()
    assert config.causal_context is False
    assert EngineConfig().causal_context is True  # unset: its owner's default


def test_a_family_setting_survives_the_flat_dict_a_yaml_writes():
    from pydantic import TypeAdapter

    adapter = TypeAdapter(EngineConfig)
    config = adapter.validate_python({"causal_context": False, "max_batch_size": 4})
    assert config.causal_context is False
    assert adapter.dump_python(config)["causal_context"] is False


def test_every_family_setting_is_owned_by_exactly_one_family_and_no_rule():
    from engine.rules import owned_settings

    declared = [name for family in FAMILIES for name in family.own_settings]
    assert sorted(declared) == sorted(family_settings())
    assert not set(family_settings()) & set(owned_settings())
    assert family_settings()["causal_context"][0] == "Nemotron-Labs-Diffusion"


def test_a_bad_value_is_refused_naming_the_setting_and_its_family():
    with pytest.raises(ValueError, match=r"EngineConfig.causal_context: must be True or False.*Nemotron"):
        EngineConfig(causal_context="yes")


def test_another_familys_model_refuses_the_setting_naming_its_owner():
    sdar = load_model(FIXTURES / "tiny-sdar")
    with pytest.raises(ValueError, match="SDAR has no such setting; it is Nemotron-Labs-Diffusion's"):
        config_for_model(EngineConfig(causal_context=True), sdar)
