"""Honest accounting of where the engine's time and compute went."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch


@dataclass
class EngineStats:
    generated_tokens: int = 0  # tokens in finished outputs (trimmed at EOS)
    finished_requests: int = 0
    elapsed_s: float = 0.0  # wall time inside step()
    model_time_s: float = 0.0  # wall time inside forward passes
    block_cycles: int = 0
    denoise_steps: int = 0
    effective_compute_ratio: float = 0.0  # mean over steps of unfinished requests / max_batch_size
    useful_row_fraction: float = 0.0  # mean over steps of unfinished requests' rows / rows computed
    padding_fraction: float = 0.0  # pad positions / bounding-box positions of the cycles run
    peak_bounding_box_tokens: int = 0
    mean_rows: float = 0.0  # rows computed per step (rows whose block is done are not), averaged

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def scheduler_overhead_fraction(self) -> float:
        return (self.elapsed_s - self.model_time_s) / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {
            "tokens_per_s": self.tokens_per_s,
            "scheduler_overhead_fraction": self.scheduler_overhead_fraction}


class StatsCollector:
    def __init__(self, max_batch_size: int):
        self.max_batch_size = max_batch_size
        self.totals = EngineStats()
        self._unfinished_rows_sum = 0
        self._useful_rows_sum = 0.0
        self._rows_sum = 0
        self._box_tokens = 0
        self._pad_tokens = 0

    def record_cycle(self, *, has_masks: torch.Tensor, unfinished: torch.Tensor, box_tokens: int,
                     real_tokens: int, model_time_s: float) -> None:
        """has_masks: [steps, rows] bool, the rows computed at each step (those with masks left);
        unfinished: [rows] bool (request not yet finished)."""
        steps, rows = has_masks.shape
        totals = self.totals
        totals.block_cycles += 1
        totals.denoise_steps += steps
        totals.model_time_s += model_time_s
        totals.peak_bounding_box_tokens = max(totals.peak_bounding_box_tokens, box_tokens)
        self._unfinished_rows_sum += int(unfinished.sum()) * steps
        computed = has_masks.sum(-1).clamp(min=1)
        self._useful_rows_sum += float(((has_masks & unfinished[None]).sum(-1) / computed).sum())
        self._rows_sum += int(has_masks.sum())
        self._box_tokens += box_tokens
        self._pad_tokens += box_tokens - real_tokens

    def record_finished(self, num_tokens: int) -> None:
        self.totals.generated_tokens += num_tokens
        self.totals.finished_requests += 1

    def add_elapsed(self, seconds: float) -> None:
        self.totals.elapsed_s += seconds

    def snapshot(self) -> EngineStats:
        steps = self.totals.denoise_steps
        return dataclasses.replace(
            self.totals,
            effective_compute_ratio=self._unfinished_rows_sum / (steps * self.max_batch_size) if steps else 0.0,
            useful_row_fraction=self._useful_rows_sum / steps if steps else 0.0,
            padding_fraction=self._pad_tokens / self._box_tokens if self._box_tokens else 0.0,
            mean_rows=self._rows_sum / steps if steps else 0.0)
