"""Per-row ``sampling_params``, as Ray's LLM processors accept them: vLLM's names or ours.

A Ray user writes ``preprocess=lambda row: {"messages": ..., "sampling_params": {"max_tokens": 64,
"temperature": 0.0}}``. Arrow turns a column of such dicts into a struct column, filling keys a row
lacks with null, so nulls mean "not set". A key we cannot honour is the row's error, never ignored:
``top_k`` (vLLM's -1 is off), ``top_p`` and ``logit_bias`` are honoured as on the OpenAI routes, vLLM's
other keys (penalties, ``n``, ``logprobs``, ...) are refused by name.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from actors.batch_rows import is_missing
from engine import SamplingParams

VLLM_NAMES = {"max_tokens": "max_new_tokens"}  # vLLM name -> ours; ignore_eos is handled below
NOT_PER_ROW = ("logprobs",)  # the output has no column for them yet: refused, not dropped
OUR_NAMES = tuple(field.name for field in dataclasses.fields(SamplingParams) if field.name not in NOT_PER_ROW)
SUPPORTED = tuple(sorted({*VLLM_NAMES, *OUR_NAMES, "ignore_eos"}))


def sampling_params_for_row(defaults: SamplingParams, values: Any) -> SamplingParams | str:
    """``defaults`` with the row's values applied, or an error message naming the bad key."""
    if is_missing(values):
        return defaults
    if not isinstance(values, dict):
        return f"sampling_params must be a dict, got {type(values).__name__}"
    given = {key: value for key, value in values.items() if not is_missing(value)}
    unknown = sorted(set(given) - set(SUPPORTED))
    if unknown:
        return f"sampling_params: unsupported key(s) {unknown}; supported: {list(SUPPORTED)}"
    changes: dict[str, Any] = {}
    for key, value in given.items():
        if key == "ignore_eos":
            changes["stop_at_eos"] = not bool(value)
        elif key == "top_k":  # vLLM's -1 (off) is our 0
            changes["top_k"] = 0 if _integral(value) == -1 else _integral(value)
        elif key == "logit_bias":
            bias = _token_bias(value)
            if isinstance(bias, str):
                return bias
            changes["logit_bias"] = bias
        else:
            changes[VLLM_NAMES.get(key, key)] = value if key in ("temperature", "top_p") else _integral(value)
    params = dataclasses.replace(defaults, **changes)
    return params.validation_error() or params


def _integral(value: Any) -> Any:
    """2.0 -> 2 (numeric columns with nulls arrive as floats); anything else is left for the engine."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _token_bias(value: Any) -> dict[int, float] | str:
    """{token id: bias} from a row (ids as ints or digit strings: Arrow struct fields are strings; a key
    other rows set comes as null here), or an error message."""
    if not isinstance(value, dict):
        return f"sampling_params: logit_bias must be a dict of token id -> bias, got {type(value).__name__}"
    bias = {}
    for key, number in value.items():
        if is_missing(number):
            continue
        if isinstance(key, str) and key.isdigit():
            key = int(key)
        if not isinstance(key, int) or isinstance(key, bool):
            return f"sampling_params: logit_bias keys must be token ids, got {key!r}"
        bias[key] = number
    return bias
