"""Block rows' constrained rows: what one step proposes, keeps and rolls back under each row's grammar.

A grammar constrains text left to right, and a diffusion rule commits positions in any order. A constrained
row's block therefore holds its committed tokens first and its masks after them, and a step keeps that shape:

1. ``propose``: from the row's first mask, left to right, each position's logits are masked by the grammar
   state after the proposals before it (one bitmask per row and depth, applied to every live row at once),
   and its proposal is drawn as the row's rule would draw it; the matcher accepts it. Once the grammar has
   ended, a position may only hold EOS (one token, so its confidence is 1 and the rest of the block commits).
2. ``keep_runs``: the rule chooses positions as it always does; the row keeps the longest left-to-right run
   from its first mask of positions the rule chose, the first one always. Positions chosen out of order wait.
3. ``settle``: after the step's host copy, each matcher rolls back the proposals its row did not keep.

Unconstrained rows are never touched, and a constrained row's proposals depend on its own logits, grammar and
noise only, so batched decoding still equals solo decoding.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.rules.base import BlockUpdate, BlockView
from engine.rules.proposals import Sampling
from engine.runner.batch_inputs import StepBatch
from engine.runner.logit_positions import positions_of
from engine.runner.logit_processors import TokenFilters
from engine.runner.sampler import Sampler
from engine.scheduling.request import Request

if TYPE_CHECKING:
    import xgrammar


@dataclass
class Chain:
    """A constrained row's proposals this step: its logit positions from its first mask, left to right."""

    row: int  # its step row
    first: int  # block offset of its first mask
    positions: list[int]  # logit positions (indices among the step's) of the contiguous offsets from ``first``
    accepted: int = 0  # proposals its matcher accepted (none once the grammar has ended)
    length: int = 0  # proposals that keep its text valid: the accepted ones, then EOS


class ConstrainedRows:
    """The grammar matchers of the rows that asked for structured output, by request id."""

    def __init__(self, vocab_size: int, eos_id: int, sampler: Sampler):
        self.vocab_size, self.mask_id, self.eos_id, self.sampler = vocab_size, sampler.mask_id, eos_id, sampler
        self.matchers: dict[str, xgrammar.GrammarMatcher] = {}
        self.chains: list[Chain] = []  # this step's, from propose to settle

    def admit(self, request: Request) -> None:
        if request.grammar is not None:
            import xgrammar  # imported by the first constrained row: a free request never loads it

            self.matchers[request.request_id] = xgrammar.GrammarMatcher(request.grammar)

    def release(self, request: Request) -> None:
        self.matchers.pop(request.request_id, None)

    def propose(self, inputs: StepBatch, logits: torch.Tensor | None, candidates: torch.Tensor,
                confidence: torch.Tensor, offsets: Callable[[Request], list[int]]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``candidates`` and ``confidence`` ``[positions, 1]`` with the constrained rows' positions proposed
        under their grammars (new tensors; the same ones when no row of the step is constrained)."""
        self.chains = self._new_chains(inputs, offsets)
        if not self.chains:
            return candidates, confidence
        candidates, confidence = candidates.clone(), confidence.clone()
        sampled = _sampled_index(inputs)
        for depth in range(max(len(chain.positions) for chain in self.chains)):
            live = [chain for chain in self.chains if depth < len(chain.positions)]
            if not live:
                break
            drawn, scores = self._propose_at(inputs, live, depth, logits, sampled)
            at = torch.tensor([chain.positions[depth] for chain in live], device=candidates.device)
            candidates[at], confidence[at] = drawn, scores
            self._accept(inputs, live, drawn.view(-1).tolist())
        return candidates, confidence

    def keep_runs(self, view: BlockView, update: BlockUpdate) -> BlockUpdate:
        """``update`` with each constrained row keeping only the longest run of chosen positions from its
        first mask (the first always, none past its valid proposals)."""
        if not self.chains:
            return update
        device = update.tokens.device
        rows = torch.tensor([chain.row for chain in self.chains], device=device)
        first = torch.tensor([chain.first for chain in self.chains], device=device)[:, None]
        end = first + torch.tensor([chain.length for chain in self.chains], device=device)[:, None]
        columns = torch.arange(update.tokens.shape[-1], device=device)[None, :]
        before = columns < first
        chosen = (update.written[rows] | (columns == first)) & (columns < end)
        keep = (before | chosen).long().cumprod(dim=-1).bool() & ~before
        tokens, written = update.tokens.clone(), update.written.clone()
        tokens[rows] = torch.where(keep, view.candidates[rows], view.tokens[rows])
        written[rows] = keep
        return dataclasses.replace(update, tokens=tokens, written=written)

    def settle(self, inputs: StepBatch, blocks: list[list[int]]) -> None:
        """Roll each matcher back to its row's committed text, from the step's host copy of the blocks."""
        for chain in self.chains:
            block = blocks[chain.row]
            kept = next((offset for offset in range(chain.first, len(block)) if block[offset] == self.mask_id),
                        len(block)) - chain.first
            if chain.accepted > kept:
                self.matchers[inputs.rows[chain.row].request_id].rollback(chain.accepted - kept)
        self.chains = []

    def _new_chains(self, inputs: StepBatch, offsets: Callable[[Request], list[int]]) -> list[Chain]:
        chains = []
        for row, request in enumerate(inputs.rows):
            row_offsets = offsets(request) if request.request_id in self.matchers else []
            if not row_offsets:
                continue
            start, count = inputs.positions.spans[row]
            run = next((index for index, offset in enumerate(row_offsets) if offset != row_offsets[0] + index),
                       len(row_offsets))
            chains.append(Chain(row, row_offsets[0], list(range(start, start + run))))
        return chains

    def _propose_at(self, inputs: StepBatch, live: list[Chain], depth: int, logits: torch.Tensor,
                    sampled: dict[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The proposals ``[live, 1]`` and their confidences at each live chain's ``depth``-th position."""
        import xgrammar

        positions = [chain.positions[depth] for chain in live]
        matchers = [self.matchers[inputs.rows[chain.row].request_id] for chain in live]
        bitmask = xgrammar.allocate_token_bitmask(len(live), self.vocab_size)
        for index, matcher in enumerate(matchers):
            if not matcher.is_terminated():
                matcher.fill_next_token_bitmask(bitmask, index)
        allowed = self._allowed(bitmask.to(logits.device), logits.shape[-1])
        ended = torch.tensor([matcher.is_terminated() for matcher in matchers], device=logits.device)
        stuck = ~allowed.any(dim=-1)  # the grammar needs text the vocabulary cannot spell: the answer ends here
        eos = torch.zeros_like(allowed[0])
        eos[self.eos_id] = True
        allowed = torch.where((ended | stuck)[:, None], eos, allowed)
        at = torch.tensor(positions, device=logits.device)
        masked = logits[at].masked_fill(~allowed[:, None, :], float("-inf"))
        return self.sampler.propose(masked, _sampling(inputs, positions, sampled, logits.shape[-1]))

    def _allowed(self, bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
        """Bool ``[rows, vocab]`` from xgrammar's packed int32 bitmask (bit j of word i is token 32 i + j)."""
        shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
        bits = ((bitmask[:, :, None] >> shifts) & 1).bool().flatten(1)[:, :self.vocab_size]
        return torch.nn.functional.pad(bits, (0, vocab - bits.shape[-1]), value=False)

    def _accept(self, inputs: StepBatch, live: list[Chain], tokens: list[int]) -> None:
        for chain, token in zip(live, tokens):
            matcher = self.matchers[inputs.rows[chain.row].request_id]
            if not matcher.is_terminated() and matcher.accept_token(token):
                chain.accepted += 1
            chain.length += 1


def _sampled_index(inputs: StepBatch) -> dict[int, int]:
    """Each sampled logit position's index among the step's sampled positions (``StepBatch.sampled``)."""
    if inputs.sampled is None:
        return {}
    rows = [index for index, request in enumerate(inputs.rows) if request.params.temperature > 0]
    return {position: index for index, position in enumerate(positions_of(inputs.positions.spans, rows))}


def _sampling(inputs: StepBatch, positions: list[int], sampled: dict[int, int], vocab: int) -> Sampling | None:
    """The draws of those of ``positions`` that sample, with the noise they have in an unconstrained step."""
    picked = [(index, sampled[position]) for index, position in enumerate(positions) if position in sampled]
    if not picked:
        return None
    device = inputs.sampled.temperatures.device
    rows = torch.tensor([index for index, _ in picked], device=device)
    keys = torch.tensor([key for _, key in picked], device=device)
    seeds, steps, canvas = inputs.sampled.noise_keys
    filters = inputs.sampled.filters
    return Sampler.sampling(rows, inputs.sampled.temperatures[keys], (seeds[keys], steps[keys], canvas[keys]),
                            None if filters is None else TokenFilters(filters.top_k[keys], filters.top_p[keys]), vocab)
