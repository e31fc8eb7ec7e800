"""A benchmark-only model wrapper: each replayed request stops at its target length and commits at the
profile's pace, decided on the device with no host synchronisation.

Rows are recognised by their width, which the replay makes distinct per request (``benchmarks.replay``):
every replayed row is its prompt plus the same ``canvas_tokens``, so a refresh row's real-token count,
or a window row's cache column minus its position (where the row starts, right-aligned in a cache of
known width), gives its prompt length and so its request. Nothing is remembered per slot: the engine
may move rows between slots. In ``logits``:

* stop tokens other than EOS are forbidden; EOS is forbidden before the request's answer length and
  certain from it on (so EOS is committed inside the block where the answer ends, by the decoding rule);
* with a commit profile, the leftmost k still-masked content positions (k from the profile's table for
  this request, block and masked count) get a logit 30 above the rest (confidence ~1) and every other
  masked content position gets a rival token 0.01 below its best (confidence <= 0.503): any threshold
  above 0.503 then commits exactly those k.

A row of a width the replay does not know cannot raise mid-step without a sync; it sets a flag that
:meth:`SteeredModel.verify` (called once after a run) turns into an error. Every other attribute is the
base model's: the engine cannot tell the wrapper from a model.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from benchmarks.commit_profile import CommitProfile
from engine.models.kv_cache import KVCache
from engine.models.step_inputs import RefreshPart, WindowPart

LIFT, HOLD_GAP = 30.0, 0.01


class SteeredModel:
    def __init__(self, base, *, logit_shift: int, mask_id: int, eos_id: int, stop_ids: Sequence[int],
                 prompt_lengths: Sequence[int], answer_lengths: Sequence[int], canvas_tokens: int,
                 profile: CommitProfile | None, seed: int = 0):
        if len(set(prompt_lengths)) != len(prompt_lengths):
            raise ValueError("steering knows a request by its prompt length: every replayed prompt length must "
                             "be distinct")
        device = next(base.parameters()).device
        self._base, self._shift, self._mask_id, self._eos_id = base, logit_shift, mask_id, eos_id
        self._other_stops = [token for token in stop_ids if token != eos_id]
        self._profile, self._seed, self._canvas, self._device = profile, seed, canvas_tokens, device
        special = {mask_id, eos_id, *stop_ids}
        self._rivals = [token for token in range(len(special) + 2) if token not in special][:2]
        request_of_length = torch.full((max(prompt_lengths) + 2,), -1, dtype=torch.long)
        request_of_length[torch.tensor(list(prompt_lengths))] = torch.arange(len(prompt_lengths))
        self._request_of_length = request_of_length.to(device)
        self._prompt_length = torch.tensor(list(prompt_lengths), device=device)
        self._target = torch.tensor(list(answer_lengths), device=device)
        self._unknown = torch.zeros((), dtype=torch.bool, device=device)
        self._tables: dict[int, torch.Tensor] = {}  # block length -> k[request, block, masked left]
        self._pending: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # request, canvas, masked

    def __getattr__(self, name: str):
        return getattr(self._base, name)

    def forward_step(self, refresh: RefreshPart | None, window: WindowPart | None,
                     kv_cache: KVCache | None) -> torch.Tensor:
        self._pending = []
        if refresh is not None:
            self._pending.append(self._refresh_rows(refresh))
        if window is not None:
            self._pending.append(self._window_rows(window, kv_cache))
        return self._base.forward_step(refresh, window, kv_cache)

    def _request(self, prompt_lengths: torch.Tensor) -> torch.Tensor:
        index = prompt_lengths.clamp(0, self._request_of_length.shape[0] - 1)
        request = self._request_of_length[index]
        self._unknown |= ((request < 0) | (prompt_lengths != index)).any()
        return request.clamp(min=0)

    def _refresh_rows(self, part: RefreshPart):
        request = self._request(part.key_mask.sum(1) - self._canvas)
        columns = part.read_columns + self._shift
        return request, part.positions.gather(1, columns), part.tokens.gather(1, columns) == self._mask_id

    def _window_rows(self, part: WindowPart, kv_cache: KVCache):
        row_start = part.columns[:, 0] - part.positions[:, 0]  # the row's first column in the cache
        request = self._request(kv_cache.scratch_column - row_start - self._canvas)
        start = self._shift - part.read_shift
        positions = part.positions[:, start:start + part.num_read]
        return request, positions, part.tokens[:, start:start + part.num_read] == self._mask_id

    def logits(self, hidden: torch.Tensor, at: tuple[torch.Tensor, torch.Tensor] | None = None,
               row_spans: tuple[tuple[int, int], ...] | None = None) -> torch.Tensor:
        """The base model's logits (of the positions ``at``, when given), steered."""
        logits = self._base.logits(hidden, at, row_spans)
        request = torch.cat([rows for rows, _, _ in self._pending])
        canvas = torch.cat([positions for _, positions, _ in self._pending]) - self._prompt_length[request][:, None]
        masked = torch.cat([flags for _, _, flags in self._pending])
        answer_over = canvas >= self._target[request][:, None]
        lift = hold = None
        if self._profile is not None:
            lift, hold = self._profile_flags(request, canvas, masked & ~answer_over)
        if at is not None:  # the per-row flags of the positions computed
            answer_over = answer_over[at]
            lift, hold = (None, None) if lift is None else (lift[at], hold[at])
        if self._other_stops:
            logits[..., self._other_stops] = float("-inf")
        logits[..., self._mask_id] = float("-inf")  # never a candidate (the decoder does the same)
        top = logits.amax(-1)
        logits[..., self._eos_id] = torch.where(answer_over, top + LIFT, torch.full_like(top, float("-inf")))
        if lift is not None:
            self._apply_profile(logits, lift, hold)
        return logits

    def _profile_flags(self, request: torch.Tensor, canvas: torch.Tensor,
                       content: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(lift, hold) ``[rows, block]``: the leftmost k masked content positions, and the other ones."""
        block_length = content.shape[1]
        table = self._table(block_length)
        block = (canvas[:, 0] // block_length).clamp(0, table.shape[1] - 1)
        k = table[request, block, content.sum(1)]
        lift = content & (content.cumsum(1) <= k[:, None])
        return lift, content & ~lift

    def _apply_profile(self, logits: torch.Tensor, lift: torch.Tensor, hold: torch.Tensor) -> None:
        top, best = logits.max(-1)
        first, second = self._rivals
        rival = torch.where(best == first, second, first)[..., None]
        rival_logit = logits.gather(-1, rival).squeeze(-1)
        logits.scatter_(-1, best[..., None], torch.where(lift, top + LIFT, top)[..., None])
        logits.scatter_(-1, rival, torch.where(hold, top - HOLD_GAP, rival_logit)[..., None])

    def commit_counts(self, block_length: int) -> torch.Tensor:
        """k[request, block, masked content positions left]: what each step of that block commits."""
        return self._table(block_length)

    def _table(self, block_length: int) -> torch.Tensor:
        if block_length not in self._tables:
            shape = (self._target.shape[0], self._canvas // block_length + 1, block_length + 1)
            self._tables[block_length] = self._profile.draw(shape, self._seed + block_length).to(self._device)
        return self._tables[block_length]

    def verify(self) -> None:
        """Raise if any row had a width the replay does not know (one sync)."""
        if bool(self._unknown):
            raise KeyError("a steered row's prompt length matches no request of this replay")
