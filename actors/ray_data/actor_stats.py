"""What one Ray Data actor instance reports to the driver: row counts, a latency sample, engine stats.

The driver adds the snapshots up (``pipeline.stats``); an actor sends a full snapshot (not a delta)
after each batch, through a :class:`~actors.ray_data.stats_registry.RegistryClient` to the job's registry.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

LATENCY_SAMPLES = 2048  # per actor instance, for the driver's latency-by-length plot
ERROR_KINDS = 16  # distinct error messages counted per actor instance; later new ones count as OTHER_ERRORS
ERROR_CHARS = 300  # of a message: enough to say what failed, short enough for a snapshot per batch
OTHER_ERRORS = "(other messages)"


@dataclass
class LatencyReservoir:
    """A uniform sample of at most ``capacity`` (generated tokens, latency) pairs of every pair added
    (reservoir sampling: each of the ``seen`` pairs is kept with probability capacity / seen)."""

    capacity: int = LATENCY_SAMPLES
    seen: int = 0
    samples: list[tuple[int, float]] = field(default_factory=list)
    _rng: random.Random = field(default_factory=lambda: random.Random(0), repr=False)

    def add(self, num_tokens: int, latency_s: float) -> None:
        self.seen += 1
        if len(self.samples) < self.capacity:
            self.samples.append((num_tokens, latency_s))
        elif (slot := self._rng.randrange(self.seen)) < self.capacity:
            self.samples[slot] = (num_tokens, latency_s)

    def to_dict(self) -> dict[str, list]:
        return {"num_generated_tokens": [s[0] for s in self.samples], "latency_s": [s[1] for s in self.samples]}


@dataclass
class ActorStats:
    """Counts of one actor instance since it started (output rows as :mod:`actors.ray_data.row_outputs` makes them)."""

    rows: int = 0
    error_rows: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # error rows by message (ERROR_KINDS at most)
    first_error: dict[str, Any] | None = None  # {"message", "at" (epoch s)}: the first error row's
    batches: int = 0
    sequence: int = 0  # snapshots taken: the registry keeps an instance's latest
    latencies: LatencyReservoir = field(default_factory=LatencyReservoir)

    def record(self, outputs: list[dict[str, Any]]) -> None:
        self.batches += 1
        for output in outputs:
            self.rows += 1
            if output["finish_reason"] == "error":
                self._count_error(output["__inference_error__"])
            else:
                self.latencies.add(output["num_generated_tokens"], output["time_taken_llm"])

    def _count_error(self, message: str) -> None:
        message = message[:ERROR_CHARS] or "(no message)"
        self.error_rows += 1
        if self.first_error is None:
            self.first_error = {"message": message, "at": time.time()}
        # rows with a per-row detail in their message (a length, an index) would grow the snapshot without end
        self.errors[message if message in self.errors or len(self.errors) < ERROR_KINDS else OTHER_ERRORS] += 1

    def snapshot(self, identity: dict[str, Any], **measured: Any) -> dict[str, Any]:
        """``identity`` (actor, instance, node, device, model, restarted, tensor_parallel_size) and these
        counts, plus the ``measured`` engine and device figures: everything the driver aggregates, as plain JSON."""
        self.sequence += 1
        return {**identity, "sequence": self.sequence, "reported_at": time.time(), "rows": self.rows,
                "error_rows": self.error_rows, "errors": dict(self.errors), "first_error": self.first_error,
                "batches": self.batches, **measured, "samples": self.latencies.to_dict()}
