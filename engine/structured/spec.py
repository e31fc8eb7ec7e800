"""A request's ``structured_outputs`` value, read and checked without a grammar library (no torch).

The value takes vLLM's ``StructuredOutputsParams`` names, exactly one of them set::

    {"json": <schema dict or JSON text>}   {"regex": "..."}   {"choice": ["yes", "no"]}
    {"grammar": "<EBNF, xgrammar's dialect of GBNF>"}        {"json_object": True}

A key set to None counts as not set, as an Arrow struct column fills keys other rows set.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint as text, so equal constraints share one compiled grammar."""

    kind: str  # one of KINDS
    source: str  # the schema as compact JSON, the regex, the choices as a JSON list, the grammar ("" for json_object)

    @property
    def key(self) -> tuple[str, str]:
        return self.kind, self.source


def grammar_spec(value: Any) -> GrammarSpec:
    """The constraint ``value`` asks for; ValueError naming the field (``structured_outputs.<kind>``) if malformed."""
    if not isinstance(value, Mapping):
        raise ValueError(f"structured_outputs must be a dict with one of {KINDS}, got {type(value).__name__}")
    given = {key: item for key, item in value.items() if item is not None}
    unknown = sorted(set(given) - set(KINDS))
    if unknown:
        raise ValueError(f"structured_outputs has unsupported key(s) {unknown}; supported: {list(KINDS)}")
    if len(given) != 1:
        raise ValueError(f"structured_outputs must set exactly one of {list(KINDS)}, got {sorted(given) or 'none'}")
    ((kind, item),) = given.items()
    return GrammarSpec(kind, _source(kind, item))


def _source(kind: str, item: Any) -> str:
    field = f"structured_outputs.{kind}"
    if kind == "json":
        schema = _parsed_schema(item, field)
        return json.dumps(schema, separators=(",", ":"))  # keys in their order: properties are written in it
    if kind == "json_object":
        if item is not True:
            raise ValueError(f"{field} must be true, got {item!r}")
        return ""
    if kind == "choice":
        if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or not item or not all(
                isinstance(choice, str) and choice for choice in item):
            raise ValueError(f"{field} must be a non-empty list of non-empty strings, got {item!r}")
        return json.dumps(list(item))
    if not isinstance(item, str) or not item:
        raise ValueError(f"{field} must be a non-empty string, got {item!r}")
    return item


def _parsed_schema(item: Any, field: str) -> dict[str, Any]:
    """A JSON schema given as a dict or as JSON text."""
    if isinstance(item, str):
        try:
            item = json.loads(item)
        except json.JSONDecodeError as error:
            raise ValueError(f"{field} is not valid JSON: {error}") from None
    if not isinstance(item, Mapping):
        raise ValueError(f"{field} must be a JSON schema object, got {type(item).__name__}")
    return dict(item)


def structured_outputs_problem(value: Any) -> str | None:
    """Why ``value`` is not a valid ``structured_outputs`` (a message that starts with the field), or None."""
    if value is None:
        return None
    try:
        grammar_spec(value)
    except ValueError as error:
        return str(error)
    return None
