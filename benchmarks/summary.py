"""The one median and the one percentile of benchmarks/ (every experiment reports with these).

* :func:`median` is the lower median: an observed value (for an even count, the lower of the two
  middle ones), so "the median run" and "the median figure" are the same run.
* :func:`percentile` interpolates linearly between order statistics (numpy's default), so p99 of few
  values lies between the two slowest.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def median(values: Iterable[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of no values")
    return ordered[(len(ordered) - 1) // 2]


def median_item(items: Sequence[T], key: Callable[[T], float]) -> T:
    """The item whose ``key`` is the :func:`median` of all keys."""
    if not items:
        raise ValueError("median of no items")
    return sorted(items, key=key)[(len(items) - 1) // 2]


def percentile(values: Sequence[float], q: float) -> float:
    if len(values) == 0:
        return float("nan")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    return {f"p{q}": percentile(values, q) for q in qs}
