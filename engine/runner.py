"""Runs one block cycle of a batch on the model: tensors in, committed blocks out. No policy."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.batch import BlockBatch
from engine.config import EngineConfig
from engine.decoding import DecodeRule, gumbel_noise, propose_tokens, select_commits
from engine.models.loader import DiffusionLM
from engine.models.transformer import KVCache


@dataclass
class CycleResult:
    """What one block cycle produced (data only)."""

    block_tokens: torch.Tensor  # [rows, block_length] the active blocks, fully committed
    has_masks: torch.Tensor  # [steps, rows] bool: row still had masks at that step
    model_time_s: float = 0.0

    @property
    def num_steps(self) -> int:
        return self.has_masks.shape[0]

    @property
    def steps_per_row(self) -> list[int]:
        return self.has_masks.sum(0).tolist()


class ModelRunner:
    def __init__(self, lm: DiffusionLM, config: EngineConfig):
        self.lm = lm
        self.cache_mode = config.cache
        self.rule = DecodeRule(config.decoding, config.threshold, config.factor, config.steps_per_block)
        self._sync = torch.cuda.synchronize if lm.device.type == "cuda" else (lambda: None)
        self._model_time = 0.0

    def _timed(self, function, *args, **kwargs):
        started = time.perf_counter()
        result = function(*args, **kwargs)
        self._sync()
        self._model_time += time.perf_counter() - started
        return result

    def _block_logits(self, batch: BlockBatch, step: int, cache: KVCache | None):
        """[rows, block_length, vocab] logits for the active blocks, and the (new) cache."""
        model, shift = self.lm.model, self.lm.logit_shift
        if step == 0 or self.cache_mode == "none":
            hidden, cache = self._timed(model.forward_full, batch.tokens, batch.positions, batch.key_mask,
                                        build_cache=self.cache_mode != "none")
            columns = batch.hidden_columns(shift)
            block_hidden = hidden.gather(1, columns[..., None].expand(-1, -1, hidden.shape[-1]))
        else:
            window = batch.dual_window(shift) if self.cache_mode == "dual" else batch.prefix_window(shift)
            tokens, positions = batch.gather_window(window)
            hidden = self._timed(model.forward_window, tokens, positions, window, cache)
            block_hidden = hidden[:, :batch.block_length]
        return self._timed(model.logits, block_hidden), cache

    @torch.no_grad()
    def run_block_cycle(self, batch: BlockBatch) -> CycleResult:
        """Denoise every row's active block until none has a mask left.

        A row whose block is done leaves the working batch (and its cache rows) for the rest of the
        cycle, so no step computes a row that has nothing left to commit.
        """
        self._model_time = 0.0
        mask_id = self.lm.tokens.mask_id
        blocks = batch.block_tokens()  # [rows, block_length]: every row's block, as it ends up
        masks_at_start = (blocks == mask_id).sum(-1)
        live = torch.arange(batch.num_rows, device=blocks.device)  # batch rows still in ``work``
        work, has_masks_history = batch, []
        sampled = bool((batch.temperatures > 0).any())
        step, cache = 0, None
        while True:
            block = work.block_tokens()
            masked = block == mask_id
            has_masks = masked.any(-1)
            if not bool(has_masks.all()):
                blocks[live[~has_masks]] = block[~has_masks]
                if not bool(has_masks.any()):
                    break
                keep = has_masks.nonzero().squeeze(-1)
                work, live, block, masked = work.select_rows(keep), live[keep], block[keep], masked[keep]
                cache = cache.select_rows(keep) if cache is not None else None
            logits, cache = self._block_logits(work, step, cache)
            noise = None
            if sampled:
                noise = gumbel_noise(work.seeds, work.global_steps(step), work.canvas_positions(),
                                     logits.shape[-1])
            candidates, confidence = propose_tokens(logits, work.temperatures, noise)
            step_tensor = torch.full_like(live, step)
            commit = select_commits(self.rule, confidence, masked, step_tensor, masks_at_start[live])
            work.write_block(torch.where(commit, candidates, block))
            has_masks_history.append(torch.zeros_like(masks_at_start, dtype=torch.bool).index_fill_(0, live, True))
            step += 1
        return CycleResult(block_tokens=blocks, has_masks=torch.stack(has_masks_history),
                           model_time_s=self._model_time)
