"""Nemotron-Labs-Diffusion's prefix cache: pages of prompt keys and values that later prompts starting alike reuse.

With ``causal_context`` a prompt is stored causally, so a position's keys and values depend only on the tokens
up to it: any request whose prompt starts with the same pages can read them. The pool keeps whole pages of
``PAGE_LENGTH`` prompt positions, every layer's. A joining row copies its longest cached run into its slot and
stores only the rest of its prompt, at least its last token, whose logits seed its answer. The prompt's other
whole pages are indexed at once and copied from the row's slot into the pool after the step that stored them.
Only rows joining in that same step could read them before, and all of those match before any indexes.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.models.anchored.config import AnchoredConfig
from engine.models.anchored.model import AnchoredKVCache
from engine.runner.canvas_prefix_cache import PAGE_LENGTH
from engine.scheduling.prefix_index import PrefixIndex
from engine.scheduling.request import Request


class AnchoredPrefixCache:
    def __init__(self, config: AnchoredConfig, cache: AnchoredKVCache, pages: int):
        self.cache = cache
        keys = cache.keys
        self.pool = torch.zeros((pages, 2, config.num_layers, config.num_kv_heads, PAGE_LENGTH, config.head_dim),
                                dtype=keys.dtype, device=keys.device)
        self.index = PrefixIndex(pages, PAGE_LENGTH)
        self._fills: list[tuple[int, int, int]] = []  # (slot, page of the prompt, pool entry) after this step

    @staticmethod
    def bytes_per_token(config: AnchoredConfig, dtype: torch.dtype) -> int:
        element = torch.empty((), dtype=dtype).element_size()
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * element

    @property
    def num_bytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def reuse(self, request: Request, slot: int) -> int:
        """Copy the cached run of ``request``'s prompt pages into ``slot``, never its last token; returns the
        positions copied."""
        pages = self.index.match(request.prompt_token_ids, (request.prompt_length - 1) // PAGE_LENGTH)
        if not pages:
            return 0
        entries = torch.tensor([page.entry for page in pages], device=self.pool.device)
        run = self.pool[entries]  # [pages, 2, layers, kv_heads, page, d]
        width = len(pages) * PAGE_LENGTH
        self.cache.keys[:, slot, :, :width] = run[:, 0].permute(1, 2, 0, 3, 4).flatten(2, 3)
        self.cache.values[:, slot, :, :width] = run[:, 1].permute(1, 2, 0, 3, 4).flatten(2, 3)
        request.cached_prefix, request.cache_tail = width, pages[-1]
        return width

    def claim(self, requests: Sequence[Request], slots: Sequence[int]) -> None:
        """Index the whole prompt pages ``requests`` lack (rows that joined now, after every one of them
        reused what was cached); their slots fill them after this step's stores (:meth:`fill`)."""
        for request, slot in zip(requests, slots):
            if request.cached_prefix and not request.cache_tail.cached:  # another claim evicted its run's end
                continue
            added, request.cache_tail = self.index.insert(request.prompt_token_ids,
                                                          request.prompt_length // PAGE_LENGTH, request.cache_tail)
            self._fills += [(slot, page.depth, page.entry) for page in added if page.cached]

    def fill(self) -> None:
        """Copy the pages claimed this step from the slots that have just stored them."""
        for slot, depth, entry in self._fills:
            columns = slice(depth * PAGE_LENGTH, (depth + 1) * PAGE_LENGTH)
            self.pool[entry, 0] = self.cache.keys[:, slot, :, columns]
            self.pool[entry, 1] = self.cache.values[:, slot, :, columns]
        self._fills = []
