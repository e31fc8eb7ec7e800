"""How EngineConfig and SamplingParams take the settings a rule owns by their flat names.

A rule module declares its own settings (``DecodingRule.own_settings``). The two frozen dataclasses keep
their core fields and gather every other key a rule owns into ``rule_settings``; an attribute read of such a
name returns the value given, else its default. A key that neither a field nor a rule names is refused.
"""
from __future__ import annotations

import dataclasses
from typing import Any


def set_fields(config: Any, values: dict[str, Any], owner: str) -> None:
    """Set ``config``'s fields from ``values`` (their defaults where not given), and gather every other key, a
    setting a rule owns, into ``rule_settings``; a key that is neither is refused by name."""
    from engine.rules import owned_settings  # loads the rule modules (and torch)

    values = dict(values)
    given = dict(values.pop("rule_settings", ()))
    for field in dataclasses.fields(config):
        if field.name != "rule_settings":
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            object.__setattr__(config, field.name, values.pop(field.name, default))
    unknown = sorted(set(values) - set(owned_settings()))
    if unknown:
        known = sorted({field.name for field in dataclasses.fields(config)} - {"rule_settings"} | set(owned_settings()))
        raise ValueError(f"{owner}: unknown field(s) {unknown}; known fields: {known}")
    object.__setattr__(config, "rule_settings", tuple(sorted((given | values).items())))


def rule_setting(config: Any, name: str, engine_default: bool) -> Any:
    """A rule setting read as an attribute: the value given, else the owning rule's default (a request's: None,
    the engine's)."""
    if name.startswith("__") or name == "rule_settings":
        raise AttributeError(name)
    from engine.rules import owned_settings

    owner = owned_settings().get(name)
    if owner is None:
        raise AttributeError(f"{type(config).__name__} has no field or rule setting {name!r}")
    return dict(config.rule_settings).get(name, owner[1].default if engine_default else None)


def flat_dict(config: Any) -> dict[str, Any]:
    """``config``'s fields with its rule settings flat, as a YAML writes them."""
    values = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    return {name: value for name, value in values.items() if name != "rule_settings"} | dict(config.rule_settings)


def pydantic_schema(cls: type) -> Any:
    """How a pydantic model validates a field of type ``cls``: an instance as it is; a mapping of its fields and
    the rule settings by name (any other key is "unknown" at its own location), built by ``cls(**mapping)``, so
    the values are checked by the class itself. Dumped as its flat dict."""
    from pydantic_core import core_schema

    from engine.rules import owned_settings

    names = [field.name for field in dataclasses.fields(cls) if field.name != "rule_settings"] + list(owned_settings())
    mapping = core_schema.typed_dict_schema(
        {name: core_schema.typed_dict_field(core_schema.any_schema(), required=False) for name in names},
        extra_behavior="forbid")

    def build(value: Any, validate: Any) -> Any:
        return value if isinstance(value, cls) else cls(**validate(value))

    return core_schema.no_info_wrap_validator_function(
        build, mapping, serialization=core_schema.plain_serializer_function_ser_schema(flat_dict))
