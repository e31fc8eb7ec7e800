"""The prefix cache: pages of prompt keys and values that later prompts starting alike copy instead of computing.

A page holds ``page_length`` positions of every layer of a :class:`~engine.models.kv_cache.KVCache`, in its
:class:`~engine.models.kv_cache.PagePool`; a :class:`~engine.scheduling.prefix_index.PrefixIndex` keyed by
the tokens up to each page finds a prompt's longest cached run. Only layouts that store a prompt causally
cache it, so a position's keys and values depend on nothing after it. Every step kind goes through four steps:

- **reuse**: a joining row copies its longest cached run into its slot (a full layer's columns are positions,
  a sliding layer's ring takes the run's last ``ring`` positions) and computes only the rest of its prompt;
- **claim**: the whole prompt pages it lacks are indexed once every joining row has reused its run, so only
  rows joining in the same step could read a page before it is written;
- **fill**: the claimed pages are copied from the row's slot after the step that stored them (:meth:`fill`),
  or written by that store itself where a sliding ring could not give them back (canvas rows:
  ``StorePart.pages``);
- **keep**: block rows also keep a leaving row's stored answer blocks, so a conversation's next turn finds its
  history.

Block rows' pages are their prompt blocks (``block_length``); the prompt's last, partial block holds answer
columns and is cached only as an answer block. Canvas and anchored rows use pages of :data:`PAGE_LENGTH`; an
anchored row never reuses its prompt's last token, whose logits seed its answer. A page whose copy is made is
no longer needed by the row, so eviction never takes a page from under a reader.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.models.kv_cache import KVCache, PagePool
from engine.scheduling.prefix_index import CachedBlock, PrefixIndex
from engine.scheduling.request import Request

PAGE_LENGTH = 16  # prompt positions a canvas or anchored page holds: a prompt reuses a run to within 15 tokens


def pool_pages(config: EngineConfig, max_row_width: int, page_length: int) -> int:
    """Pages the pool holds: ``prefix_cache_tokens`` positions of them, else one widest row's worth."""
    tokens = config.prefix_cache_tokens if config.prefix_cache_tokens is not None else max_row_width
    return tokens // page_length


class PrefixCache:
    def __init__(self, cache: KVCache, pages: int, page_length: int):
        first = cache.layers[0]
        self.cache, self.page_length = cache, page_length
        self.pool = PagePool(cache.spec, pages, page_length, first.dtype, first.device)
        self.index = PrefixIndex(pages, page_length)
        self._stacked = cache.data is not None and self.pool.data is not None and cache.ring is None
        self._fills: list[tuple[int, CachedBlock]] = []  # (slot, page) that :meth:`fill` copies

    @property
    def num_bytes(self) -> int:
        return self.pool.num_bytes

    def reuse(self, request: Request, slot: int, max_pages: int) -> int:
        """Copy the cached run of ``request``'s first ``max_pages`` prompt pages into ``slot`` (columns from 0);
        returns the positions copied, which the row marks as its ``cached_prefix``."""
        pages = self.index.match(request.prompt_token_ids, max_pages)
        if not pages:
            return 0
        width = len(pages) * self.page_length
        entries = torch.tensor([page.entry for page in pages], device=self.cache.layers[0].device)
        if self._stacked:
            run = self.pool.data[:, entries]  # [layers, pages, 2, kv_heads, page, head_dim]
            self.cache.data[:, slot, :, :, :width] = run.permute(0, 2, 3, 1, 4, 5).flatten(3, 4)
        else:
            self._reuse_layers(slot, entries, width)
        request.cached_prefix, request.cache_tail = width, pages[-1]  # its claims go on from there
        return width

    def _reuse_layers(self, slot: int, entries: torch.Tensor, width: int) -> None:
        """:meth:`reuse`'s copy layer by layer: a sliding layer's ring takes the run's last positions."""
        ring, length = self.cache.ring, self.page_length
        tail = (torch.arange(max(width - ring, 0), width, device=entries.device) if ring is not None
                else None)  # the positions a ring keeps
        for spec, pool_layer, layer in zip(self.cache.spec.layers, self.pool.layers, self.cache.layers):
            if spec.window is None:
                run = pool_layer[entries]  # [pages, 2, kv_heads, page, head_dim]
                layer[slot, :, :, :width] = run.permute(1, 2, 0, 3, 4).flatten(2, 3)
            else:
                kept = pool_layer[entries[tail // length], :, :, tail % length]  # [positions, 2, kv_heads, d]
                layer[slot, :, :, tail % ring] = kept.permute(1, 2, 0, 3)

    def claim(self, request: Request, tokens: Sequence[int], num_pages: int,
              slot: int | None = None) -> list[CachedBlock]:
        """Index ``tokens``' first ``num_pages`` whole pages after ``request``'s cached run; returns the pages
        added. With ``slot``, :meth:`fill` copies them from it; without, the store that computes them must."""
        added, request.cache_tail = self.index.insert(tokens, num_pages, request.cache_tail)
        if slot is not None:
            self._fills += [(slot, page) for page in added]
        return added

    def fill(self) -> None:
        """Copy the pages claimed with a slot from the slots that have stored them, in one gather."""
        fills = [(slot, page) for slot, page in self._fills if page.cached]  # a later claim may have evicted
        self._fills = []  # an earlier one and taken its entry
        if not fills:
            return
        device = self.cache.layers[0].device
        slots = torch.tensor([slot for slot, _ in fills], device=device)
        starts = torch.tensor([page.depth * self.page_length for _, page in fills], device=device)
        columns = starts[:, None] + torch.arange(self.page_length, device=device)
        entries = torch.tensor([page.entry for _, page in fills], device=device)
        if self._stacked:
            run = self.cache.data[:, slots[:, None], :, :, columns]  # [pages, page, layers, 2, kv_heads, d]
            self.pool.data[:, entries] = run.permute(2, 0, 3, 4, 1, 5)
            return
        if self.cache.ring is not None:
            raise ValueError("a sliding layer's ring cannot give pages back: its store fills them")
        for pool_layer, layer in zip(self.pool.layers, self.cache.layers):
            pool_layer[entries] = layer[slots[:, None], :, :, columns].permute(0, 2, 3, 1, 4)

    # -- what each step kind asks --------------------------------------------------------------------
    def claim_prompts(self, requests: Sequence[Request], slots: Sequence[int] | None) -> list[tuple[int, ...]]:
        """Claim the whole prompt pages that joining ``requests`` lack, after every one of them reused its
        run. With ``slots`` :meth:`fill` copies them after this step; without, returns each row's
        ``StorePart.pages``: per page past its cached run, the pool entry its store fills, or -1 where
        another row fills it (or a later claim evicted it)."""
        claimed = []
        for index, request in enumerate(requests):
            whole = request.prompt_length // self.page_length
            if slots is None and request.cached_prefix and not request.cache_tail.cached:  # a claim took its
                claimed.append([])  # run's last page: a page the store cannot compute would be indexed again
                continue
            slot = None if slots is None else slots[index]
            claimed.append(self.claim(request, request.prompt_token_ids, whole, slot))
        pages = []
        for request, added in zip(requests, claimed):
            cached = request.cached_prefix // self.page_length
            entries = [-1] * (request.prompt_length // self.page_length - cached)
            for page in added:
                if page.cached and slots is None:
                    entries[page.depth - cached] = page.entry
            pages.append(tuple(entries))
        return pages

    def keep_prompts(self, admitted: Sequence[Request]) -> None:
        """Block rows: cache the whole prompt blocks of rows whose first step has just run."""
        for request in admitted:
            self.claim(request, request.prompt_token_ids, whole_prompt_blocks(request, self.page_length), request.slot)
        self.fill()

    def keep_answers(self, finished: Sequence[Request]) -> None:
        """Block rows: cache the stored answer blocks of rows leaving now, under the prompt and answer tokens
        before each. A row's last block was never stored, and a row whose output a stop token cut inside an
        earlier block has no tokens for it: neither is cached."""
        for request in finished:
            blocks = whole_prompt_blocks(request, self.page_length) + max(request.block_index - 1, 0)
            tokens = request.prompt_token_ids + request.output_token_ids
            if request.slot is not None and len(tokens) >= blocks * self.page_length:
                self.claim(request, tokens, blocks, request.slot)
        self.fill()


def whole_prompt_blocks(request: Request, block_length: int) -> int:
    """A block row's prompt blocks that hold no answer column (the one holding the lead is not one)."""
    return request.canvas_start // block_length
