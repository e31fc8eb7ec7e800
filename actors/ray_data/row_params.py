"""Per-row ``sampling_params``, as Ray's LLM processors accept them: vLLM's names or ours.

A Ray user writes ``preprocess=lambda row: {"messages": ..., "sampling_params": {"max_tokens": 64,
"temperature": 0.0}}``. Arrow turns a column of such dicts into a struct column, filling keys a row
lacks with null, so nulls mean "not set". A key we cannot honour is the row's error, never ignored:
``top_k`` (vLLM's -1 is off), ``top_p`` and ``logit_bias`` are honoured as on the OpenAI routes, vLLM's
other keys (penalties, ``n``, ``logprobs``, ...) are refused by name. ``structured_outputs`` (vLLM's) comes
back from Arrow as plain Python: a struct's nulls for keys other rows set are dropped at every depth, arrays
become lists and numpy scalars numbers, before the engine compiles it (a schema given as JSON text is untouched).
"""
from __future__ import annotations

from typing import Any

from actors.ray_data.batch_rows import is_missing, without_arrow_nulls
from engine import SamplingParams

NOT_PER_ROW = ("logprobs",)  # the output has no column for them yet: refused, not dropped
NOT_INTEGRAL = ("temperature", "top_p", "logit_bias", "ignore_eos", "structured_outputs")


def sampling_params_for_row(defaults: SamplingParams, values: Any) -> SamplingParams | str:
    """``defaults`` with the row's values applied (:meth:`SamplingParams.from_openai`), or an error
    message naming the bad key."""
    if is_missing(values):
        return defaults
    if not isinstance(values, dict):
        return f"sampling_params must be a dict, got {type(values).__name__}"
    given = {key: value if key in NOT_INTEGRAL else _integral(value)
             for key, value in values.items() if not is_missing(value)}
    if isinstance(given.get("logit_bias"), dict):  # a key other rows set comes as null here
        given["logit_bias"] = {key: bias for key, bias in given["logit_bias"].items() if not is_missing(bias)}
    if "structured_outputs" in given:  # a struct of nulls only: another row's constraint, not this row's
        given["structured_outputs"] = without_arrow_nulls(given["structured_outputs"]) or None
    try:
        params = SamplingParams.from_openai(given, defaults, refused=NOT_PER_ROW)
    except ValueError as error:
        return f"sampling_params: {error}"
    return params.validation_error() or params


def _integral(value: Any) -> Any:
    """2.0 -> 2 (numeric columns with nulls arrive as floats); anything else is left for the engine."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
