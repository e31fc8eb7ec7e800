"""The output columns of a served row, as Ray's vLLM stage names them where the meaning is the same."""
from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from actors.ray_data.batch_rows import is_missing, without_arrow_nulls
from engine import RequestOutput

OUTPUT_SCHEMA = pa.schema([
    # named as Ray's vLLM stage names them
    ("generated_text", pa.string()), ("generated_tokens", pa.list_(pa.int64())),
    ("num_generated_tokens", pa.int64()), ("num_input_tokens", pa.int64()),
    ("time_taken_llm", pa.float64()), ("__inference_error__", pa.string()),
    # ours
    ("finish_reason", pa.string()), ("num_blocks", pa.int64()), ("queue_s", pa.float64()),
    ("actor_id", pa.string()), ("node_id", pa.string()), ("device", pa.string()),
    # the row's own sampling_params as a JSON object ("{}": it set none), replacing the input column
    ("sampling_params", pa.string()),
])


class RowError(RuntimeError):
    """A row could not be served and ``should_continue_on_error`` is False."""


def output_row(result: RequestOutput | str, placement: dict[str, str], sampling_params: Any = None) -> dict[str, Any]:
    """The :data:`OUTPUT_SCHEMA` values of one row: its engine output, or the message of a row that
    never became a request; ``placement`` holds ``actor_id``, ``node_id`` and ``device``;
    ``sampling_params`` is the row's own (:func:`params_json`)."""
    params = params_json(sampling_params)
    if isinstance(result, str):
        return dict(generated_text="", generated_tokens=[], num_generated_tokens=0, num_input_tokens=0,
                    time_taken_llm=0.0, __inference_error__=result, finish_reason="error",
                    num_blocks=0, queue_s=0.0, **placement, sampling_params=params)
    return dict(generated_text=result.text, generated_tokens=list(result.token_ids),
                num_generated_tokens=len(result.token_ids),
                num_input_tokens=len(result.prompt_token_ids), time_taken_llm=result.latency_s,
                __inference_error__=result.error or "", finish_reason=result.finish_reason,
                num_blocks=result.num_blocks, queue_s=result.queue_s, **placement, sampling_params=params)


def params_json(values: Any) -> str:
    """A row's ``sampling_params`` as a JSON object, without the keys it left null (``{}``: it set none).

    Passed through as they came, rows that set different keys make a struct column whose shape differs
    from batch to batch (plain pyarrow, reading the files together, drops the keys of all but the first),
    and values Arrow cannot unify are pickled (only Ray reads those back). One string column reads anywhere."""
    return json.dumps({} if is_missing(values) else without_arrow_nulls(values), sort_keys=True, default=str)


def output_columns(outputs: list[dict[str, Any]]) -> dict[str, pa.Array]:
    """Output rows as typed Arrow columns (an all-empty error column is still a string column)."""
    return {field.name: pa.array([output[field.name] for output in outputs], field.type)
            for field in OUTPUT_SCHEMA}


def raise_first_error(outputs: list[dict[str, Any]]) -> None:
    """Raise :class:`RowError` for the first failed row of a batch (``should_continue_on_error=False``)."""
    for index, output in enumerate(outputs):
        if output["__inference_error__"]:
            raise RowError(f"row {index} of the batch failed: {output['__inference_error__']} "
                           "(should_continue_on_error=False)")
