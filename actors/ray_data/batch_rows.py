"""The one place that knows Ray Data batch formats: read a column as Python values, add typed columns.

A batch arrives as a ``pyarrow.Table`` (``batch_format="pyarrow"``, what the pipeline uses: input
columns such as chat messages pass through untouched), a ``pandas.DataFrame``, or Ray's default
``dict[str, numpy.ndarray]``. Whatever came in goes back out in the same shape, with the new columns
added as typed Arrow arrays so an all-null ``error`` column is still a string column in Parquet. Ray's
processor stages hand over a list of row dicts instead; :func:`input_rows` reads both.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

Batch = Any  # pa.Table | pandas.DataFrame | dict[str, np.ndarray] | list[dict] (Ray's processor stages)

INPUT_COLUMNS = {  # what a row may hold, in Ray's LLM processor format
    "messages": "a chat (gets the chat template)",
    "prompt": "raw text or token ids",
    "sampling_params": "per-row SamplingParams (vLLM or BlockServe names)",
}


def to_python(value: Any) -> Any:
    """numpy arrays and scalars (nested, as Ray makes of list<struct> columns) -> plain Python."""
    if isinstance(value, np.ndarray):
        return [to_python(item) for item in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {key: to_python(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_python(item) for item in value]
    return value


def is_missing(value: Any) -> bool:
    """None, or the NaN that pandas and numpy put where a value is missing."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def without_arrow_nulls(value: Any) -> Any:
    """A value read back from Arrow as plain Python: dicts without the null entries Arrow adds for the keys
    other rows set (at every depth), lists for arrays and sequences, numbers for numpy scalars."""
    if isinstance(value, Mapping):
        return {key: without_arrow_nulls(item) for key, item in value.items() if not is_missing(item)}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [without_arrow_nulls(item) for item in value]
    return value.item() if isinstance(value, np.generic) else value


def num_rows(batch: Batch) -> int:
    if isinstance(batch, pa.Table):
        return batch.num_rows
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values()))) if batch else 0
    return len(batch)  # pandas


def column_names(batch: Batch) -> list[str]:
    if isinstance(batch, pa.Table):
        return batch.column_names
    return list(batch.keys()) if isinstance(batch, Mapping) else list(batch.columns)


def column_values(batch: Batch, name: str) -> list[Any] | None:
    """The column as a list of plain Python values, or None when the batch has no such column."""
    if name not in column_names(batch):
        return None
    if isinstance(batch, pa.Table):
        return batch.column(name).to_pylist()
    if isinstance(batch, Mapping):
        column = batch[name]
        if isinstance(column, (pa.Array, pa.ChunkedArray)):  # a column that with_columns added
            return column.to_pylist()
        return [to_python(value) for value in column]
    return [to_python(value) for value in batch[name].tolist()]


def rows_of_columns(batch: Batch, names: list[str]) -> list[dict[str, Any]]:
    """One dict of the named columns' plain Python values per row."""
    if isinstance(batch, list):
        return [{name: row[name] for name in names} for row in batch]
    values = [column_values(batch, name) for name in names]
    return [dict(zip(names, row)) for row in zip(*values)]


def take_rows(batch: Batch, start: int, end: int) -> Batch:
    """Rows ``[start, end)`` of the batch, in its own format."""
    if isinstance(batch, pa.Table):
        return batch.slice(start, end - start)
    if isinstance(batch, Mapping):
        return {name: column[start:end] for name, column in batch.items()}
    if isinstance(batch, list):
        return batch[start:end]
    return batch.iloc[start:end].reset_index(drop=True)  # pandas: with_columns aligns on the index


def input_rows(batch: Batch, columns: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """One dict of :data:`INPUT_COLUMNS` values (plain Python) per row; a column the batch lacks is left
    out. ``columns`` maps those names to the batch's own column names (default: the same names)."""
    columns = columns or {name: name for name in INPUT_COLUMNS}
    if isinstance(batch, list):
        return [{name: to_python(row[column]) for name, column in columns.items() if column in row}
                for row in batch]
    values = {name: column_values(batch, column) for name, column in columns.items()}
    present = {name: column for name, column in values.items() if column is not None}
    return [{name: column[index] for name, column in present.items()} for index in range(num_rows(batch))]


def with_columns(batch: Batch, columns: dict[str, pa.Array]) -> Batch:
    """``batch`` plus ``columns`` (replacing same-named ones), in the batch's own format."""
    if isinstance(batch, pa.Table):
        for name, array in columns.items():
            if name in batch.column_names:
                batch = batch.set_column(batch.column_names.index(name), name, array)
            else:
                batch = batch.append_column(name, array)
        return batch
    if isinstance(batch, Mapping):
        return {**batch, **columns}
    batch = batch.copy()
    for name, array in columns.items():
        batch[name] = array.to_pandas()
    return batch
