"""DiffusionGemma's prefix cache: pages of prompt keys and values that later prompts starting alike reuse.

Its encoder stores a prompt causally, so a prompt position's keys and values depend only on the tokens up
to it: any request whose prompt starts with the same pages can read them. The pool keeps whole pages of
``PAGE_LENGTH`` prompt positions, every layer's (``PagePool``). A row joining the batch copies its longest
cached run of pages into its slot: a global layer's columns are positions, a sliding layer's ring takes the
run's last ``ring`` positions. Its first store then computes only the rest of its prompt. The prompt's
other whole pages are indexed at once, and that store writes them to the pool as every layer computes
them (``StorePart.pages``); a sliding layer's ring could not give them back afterwards. Only the rows that
join in the same step read a page before its store: all of them match before any indexes.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.models.diffusion_gemma.config import GemmaTextConfig
from engine.models.diffusion_gemma.kv_cache import CanvasKVCache, PagePool
from engine.scheduling.prefix_index import PrefixIndex
from engine.scheduling.request import Request

PAGE_LENGTH = 16  # prompt positions a page holds: a prompt reuses a cached run to within 15 tokens


def pool_pages(config: EngineConfig, max_row_width: int) -> int:
    """Pages the pool holds: ``prefix_cache_tokens`` of them, else one widest row's worth."""
    tokens = config.prefix_cache_tokens if config.prefix_cache_tokens is not None else max_row_width
    return tokens // PAGE_LENGTH


class CanvasPrefixCache:
    def __init__(self, model_config: GemmaTextConfig, cache: CanvasKVCache, pages: int):
        first = cache.layers[0]
        self.cache, self.kinds = cache, [shape.kind for shape in model_config.layers]
        self.pool = PagePool(model_config, pages, PAGE_LENGTH, first.dtype, first.device)
        self.index = PrefixIndex(pages, PAGE_LENGTH)

    @property
    def num_bytes(self) -> int:
        return self.pool.num_bytes

    def reuse(self, request: Request, slot: int) -> int:
        """Copy the cached run of ``request``'s whole prompt pages into ``slot``; returns the positions copied."""
        pages = self.index.match(request.prompt_token_ids, self._whole_pages(request))
        if not pages:
            return 0
        device = self.pool.layers[0].device
        width = len(pages) * PAGE_LENGTH
        entries = torch.tensor([page.entry for page in pages], device=device)
        ring = self.cache.ring
        tail = torch.arange(max(width - ring, 0), width, device=device)  # the positions a ring keeps
        for kind, pool_layer, layer in zip(self.kinds, self.pool.layers, self.cache.layers):
            if kind == "global":
                run = pool_layer[entries]  # [pages, 2, kv_heads, page, d]
                layer[slot, :, :, :width] = run.permute(1, 2, 0, 3, 4).flatten(2, 3)
            else:
                kept = pool_layer[entries[tail // PAGE_LENGTH], :, :, tail % PAGE_LENGTH]  # [positions, 2, kv, d]
                layer[slot, :, :, tail % ring] = kept.permute(1, 2, 0, 3)
        request.cached_prefix, request.cache_tail = width, pages[-1]
        return width

    def claim(self, requests: Sequence[Request]) -> list[tuple[int, ...]]:
        """Index the whole prompt pages ``requests`` lack (rows that joined now, after every one of them
        reused what was cached); returns each one's ``StorePart.pages``: per page of its uncached whole
        pages, the pool entry its store fills, or -1 where another row fills it (or a later claim of the
        same call evicted it)."""
        claimed = []
        for request in requests:
            if request.cached_prefix and not request.cache_tail.cached:  # another row's claim took its run's
                claimed.append([])  # last page: indexing it again would name a page nobody fills
                continue
            added, request.cache_tail = self.index.insert(request.prompt_token_ids, self._whole_pages(request),
                                                          request.cache_tail)
            claimed.append(added)
        pages = []
        for request, added in zip(requests, claimed):
            cached = request.cached_prefix // PAGE_LENGTH
            entries = [-1] * (self._whole_pages(request) - cached)
            for page in added:
                if page.cached:
                    entries[page.depth - cached] = page.entry
            pages.append(tuple(entries))
        return pages

    @staticmethod
    def _whole_pages(request: Request) -> int:
        return request.prompt_length // PAGE_LENGTH
