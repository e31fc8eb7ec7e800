"""Honest accounting of where the engine's time and compute went, and the per-forward trace."""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.scheduling.trace import ForwardRecord

TRACE_LIMIT = 200_000  # forwards kept for benchmarks (a long-running server keeps the latest ones)


@dataclass
class EngineStats:
    generated_tokens: int = 0  # tokens in finished outputs (trimmed at EOS)
    prompt_tokens: int = 0  # prompt tokens of finished requests
    cached_prompt_tokens: int = 0  # of them, read from the prefix cache instead of computed
    finished_requests: int = 0
    elapsed_s: float = 0.0  # wall time inside step()
    model_time_s: float = 0.0  # wall time inside the runner (forward + decoding rule)
    denoise_steps: int = 0  # steps that ran the model (one forward each: a step packs its parts)
    refresh_forwards: int = 0  # calls with a refresh part (rows starting a block)
    window_forwards: int = 0  # calls with a window part (rows continuing a block on the cache)
    rows_per_forward: float = 0.0  # rows computed per call, averaged over calls
    rows_per_window_forward: float = 0.0  # window rows per call, over calls with a window part
    rows_per_step_while_waiting: float = 0.0  # rows computed per step, over steps with requests pending
    blocks_decoded: int = 0  # row-blocks completed
    row_forwards: int = 0  # rows computed, summed over steps: each is one forward of that row's block
    counters: dict[str, int] = dataclasses.field(default_factory=dict)  # the decoding rule's own counts, summed
    # by name (DecodingRule.counters declares them), and the engine's: constrained_requests (finished under
    # structured_outputs), constraints_refused (requests whose structured_outputs could not run)
    effective_compute_ratio: float = 0.0  # mean over steps of unfinished requests / max_batch_size
    useful_row_fraction: float = 0.0  # mean over steps of unfinished requests' rows / rows computed
    padding_fraction: float = 0.0  # pad positions / bounding-box positions of the forwards run
    peak_bounding_box_tokens: int = 0

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Output tokens per row forward: the parallelism of the decoding rule (LLaDA2.1's "TPF")."""
        return self.generated_tokens / self.row_forwards if self.row_forwards else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens read from the prefix cache over all prompt tokens of finished requests."""
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def scheduler_overhead_fraction(self) -> float:
        return (self.elapsed_s - self.model_time_s) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {
            "tokens_per_s": self.tokens_per_s, "tokens_per_forward": self.tokens_per_forward,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "scheduler_overhead_fraction": self.scheduler_overhead_fraction}


class StatsCollector:
    def __init__(self, max_batch_size: int):
        self.max_batch_size = max_batch_size
        self.totals = EngineStats()
        self.trace: collections.deque[ForwardRecord] = collections.deque(maxlen=TRACE_LIMIT)
        self._unfinished_rows_sum = 0
        self._useful_rows_sum = 0.0
        self._rows_sum = 0
        self._window_rows_sum = 0
        self._waiting_steps = 0
        self._waiting_rows_sum = 0
        self._box_tokens = 0
        self._pad_tokens = 0

    def record_step(self, record: ForwardRecord, *, useful_rows: int, unfinished_requests: int,
                    pending_requests: int, blocks_completed: int, model_time_s: float, row_forwards: int = 0,
                    counters: Sequence[Mapping[str, int]] = ()) -> None:
        """One forward: its shape, how many of its rows decode their own output, and how many running
        requests are unfinished (computed this step or waiting for a block boundary)."""
        totals = self.totals
        self.trace.append(record)
        totals.denoise_steps += 1
        totals.refresh_forwards += record.refresh_rows > 0
        totals.window_forwards += record.window_rows > 0
        totals.blocks_decoded += blocks_completed
        totals.row_forwards += row_forwards
        for row in counters:
            for name, count in row.items():
                totals.counters[name] = totals.counters.get(name, 0) + count
        totals.model_time_s += model_time_s
        box = record.bounding_box_tokens
        totals.peak_bounding_box_tokens = max(totals.peak_bounding_box_tokens, box)
        self._unfinished_rows_sum += unfinished_requests
        self._useful_rows_sum += useful_rows / max(record.rows, 1)
        self._rows_sum += record.rows
        self._window_rows_sum += record.window_rows
        if pending_requests:
            self._waiting_steps += 1
            self._waiting_rows_sum += record.rows
        self._box_tokens += box
        self._pad_tokens += box - record.real_tokens

    def record_finished(self, num_tokens: int, prompt_tokens: int = 0, cached_tokens: int = 0) -> None:
        self.totals.generated_tokens += num_tokens
        self.totals.prompt_tokens += prompt_tokens
        self.totals.cached_prompt_tokens += cached_tokens
        self.totals.finished_requests += 1

    def count(self, name: str, amount: int = 1) -> None:
        """Add to one of the engine's own counters, kept beside the rule's (``EngineStats.counters``)."""
        self.totals.counters[name] = self.totals.counters.get(name, 0) + amount

    def add_elapsed(self, seconds: float) -> None:
        self.totals.elapsed_s += seconds

    def snapshot(self) -> EngineStats:
        steps, windows = self.totals.denoise_steps, self.totals.window_forwards
        return dataclasses.replace(
            self.totals, counters=dict(self.totals.counters),
            effective_compute_ratio=self._unfinished_rows_sum / (steps * self.max_batch_size) if steps else 0.0,
            useful_row_fraction=self._useful_rows_sum / steps if steps else 0.0,
            padding_fraction=self._pad_tokens / self._box_tokens if self._box_tokens else 0.0,
            rows_per_forward=self._rows_sum / steps if steps else 0.0,
            rows_per_window_forward=self._window_rows_sum / windows if windows else 0.0,
            rows_per_step_while_waiting=(self._waiting_rows_sum / self._waiting_steps
                                         if self._waiting_steps else 0.0))
