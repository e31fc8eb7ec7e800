"""How EngineConfig and SamplingParams take the settings a rule or a family owns by their flat names.

A rule module declares its own settings (``DecodingRule.own_settings``), a family module its own
(``Family.own_settings``). The two frozen dataclasses keep their core fields and gather every other key a rule
owns into ``rule_settings``, and EngineConfig every key a family owns into ``family_settings``; an attribute
read of such a name returns the value given, else its default. A key that nobody owns is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Any

GATHERED = ("rule_settings", "family_settings")  # the fields that hold the owned settings, not given by name


def set_fields(config: Any, values: dict[str, Any], owner: str) -> None:
    """Set ``config``'s fields from ``values`` (their defaults where not given), and gather every other key, a
    setting a rule or a family owns, into ``rule_settings`` or ``family_settings``; a key that is neither a
    field nor owned is refused by name."""
    rules, families = _owners(config)
    values = dict(values)
    given = {name: dict(values.pop(name, ())) for name in GATHERED}
    for field in _core_fields(config):
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
        object.__setattr__(config, field.name, values.pop(field.name, default))
    unknown = sorted(set(values) - set(rules) - set(families))
    if unknown:
        known = sorted({field.name for field in _core_fields(config)} | set(rules) | set(families))
        raise ValueError(f"{owner}: unknown field(s) {unknown}; known fields: {known}")
    object.__setattr__(config, "rule_settings", tuple(sorted(
        (given["rule_settings"] | {name: value for name, value in values.items() if name in rules}).items())))
    if families:
        object.__setattr__(config, "family_settings", tuple(sorted(
            (given["family_settings"] | {name: value for name, value in values.items() if name in families}).items())))


def owned_setting(config: Any, name: str, engine_default: bool) -> Any:
    """A rule's or a family's setting read as an attribute: the value given, else its owner's default (a
    request's rule setting: None, the engine's)."""
    if name.startswith("__") or name in GATHERED:
        raise AttributeError(name)
    from engine.rules import owned_settings

    rules = owned_settings()  # a request's rule settings are read at every step: the families are asked only after
    if name in rules:
        return dict(config.rule_settings).get(name, rules[name][1].default if engine_default else None)
    families = _owners(config)[1]
    if name in families:
        return dict(config.family_settings).get(name, families[name][1].default)
    raise AttributeError(f"{type(config).__name__} has no field or owned setting {name!r}")


def flat_dict(config: Any) -> dict[str, Any]:
    """``config``'s fields with its owned settings flat, as a YAML writes them."""
    flat = {field.name: getattr(config, field.name) for field in _core_fields(config)}
    for name in GATHERED:
        flat |= dict(getattr(config, name, ()))
    return flat


def pydantic_schema(cls: type) -> Any:
    """How a pydantic model validates a field of type ``cls``: an instance as it is; a mapping of its fields and
    the owned settings by name (any other key is "unknown" at its own location), built by ``cls(**mapping)``, so
    the values are checked by the class itself. Dumped as its flat dict."""
    from pydantic_core import core_schema

    rules, families = _owners(cls)
    names = [field.name for field in _core_fields(cls)] + list(rules) + list(families)
    mapping = core_schema.typed_dict_schema(
        {name: core_schema.typed_dict_field(core_schema.any_schema(), required=False) for name in names},
        extra_behavior="forbid")

    def build(value: Any, validate: Any) -> Any:
        return value if isinstance(value, cls) else cls(**validate(value))

    return core_schema.no_info_wrap_validator_function(
        build, mapping, serialization=core_schema.plain_serializer_function_ser_schema(flat_dict))


def _core_fields(config: Any) -> list[dataclasses.Field]:
    return [field for field in dataclasses.fields(config) if field.name not in GATHERED]


def _owners(config: Any) -> tuple[dict[str, tuple[str, Any]], dict[str, tuple[str, Any]]]:
    """The settings rules own, and those families own where ``config`` (a class or an instance) takes them."""
    from engine.models.families import family_settings  # loads the family modules (and torch)
    from engine.rules import owned_settings  # loads the rule modules

    takes_families = "family_settings" in config.__dataclass_fields__
    return owned_settings(), family_settings() if takes_families else {}
