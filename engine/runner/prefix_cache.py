"""The prefix cache's keys and values: a pool of whole prompt blocks that later rows copy instead of
computing (block-causal layouts only, where a prompt block's keys and values depend on nothing after it).

A row placed in the batch copies the pool entries of its longest cached run of whole prompt blocks into
its slot and marks them as its ``cached_prefix``: its first step then computes only the rest of its prompt
and its first block. A block whose copy is made is no longer needed by the row, so eviction never takes a
block from under a reader. After a row's first step its whole prompt blocks are in its slot, final, and
the ones the pool lacks are copied in; so is each answer block once the row stores it, under the prompt
and answer tokens before it, so that a conversation's next turn finds its history. The prompt's last,
partial block holds answer columns too: it is cached only as an answer block, with its answer tokens.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.models.kv_cache import KVCache
from engine.scheduling.prefix_index import CachedBlock, PrefixIndex
from engine.scheduling.request import Request


def prefix_cache_blocks(config: EngineConfig, max_row_width: int) -> int:
    """Whole blocks the pool holds: ``prefix_cache_tokens`` of them, else one widest row's worth."""
    tokens = config.prefix_cache_tokens if config.prefix_cache_tokens is not None else max_row_width
    return tokens // config.block_length


class PrefixCache:
    def __init__(self, kv_cache: KVCache, num_blocks: int, block_length: int):
        layers, _, pair, heads, _, head_dim = kv_cache.data.shape
        self.kv_cache, self.block_length = kv_cache, block_length
        self.pool = torch.zeros((layers, num_blocks, pair, heads, block_length, head_dim),
                                dtype=kv_cache.data.dtype, device=kv_cache.data.device)
        self.index = PrefixIndex(num_blocks, block_length)

    @property
    def num_bytes(self) -> int:
        return self.pool.numel() * self.pool.element_size()

    def reuse(self, request: Request) -> None:
        """Copy the cached run of ``request``'s whole prompt blocks into its slot (columns from 0)."""
        blocks = self.index.match(request.prompt_token_ids, self._whole_prompt_blocks(request))
        if not blocks:
            return
        entries = torch.tensor([block.entry for block in blocks], device=self.pool.device)
        width = len(blocks) * self.block_length
        run = self.pool[:, entries]  # [layers, blocks, 2, heads, block, head_dim]
        self.kv_cache.data[:, request.slot, :, :, :width] = run.permute(0, 2, 3, 1, 4, 5).flatten(3, 4)
        request.cached_prefix = width

    def keep(self, admitted: Sequence[Request], stored: Sequence[Request]) -> None:
        """Cache the whole prompt blocks of rows whose first step has just run, and every finished block of
        rows that have just stored one (a conversation's next turn then finds its answers too). The blocks
        added are copied into the pool in one gather."""
        added: list[tuple[int, CachedBlock]] = []  # (slot, block)
        for request in admitted:
            added += self._insert(request, request.prompt_token_ids, self._whole_prompt_blocks(request))
        for request in stored:
            blocks = self._whole_prompt_blocks(request) + request.block_index
            tokens = request.prompt_token_ids + request.output_token_ids
            if len(tokens) >= blocks * self.block_length:  # else a stop token or the cap cut its output
                added += self._insert(request, tokens, blocks)
        added = [(slot, block) for slot, block in added if block.cached]  # a later insert may evict an earlier
        if not added:  # one of this step, and reuse its entry
            return
        device = self.pool.device
        slots = torch.tensor([slot for slot, _ in added], device=device)
        starts = torch.tensor([block.depth * self.block_length for _, block in added], device=device)
        columns = starts[:, None] + torch.arange(self.block_length, device=device)
        entries = torch.tensor([block.entry for _, block in added], device=device)
        run = self.kv_cache.data[:, slots[:, None], :, :, columns]  # [blocks, block, layers, 2, heads, head_dim]
        self.pool[:, entries] = run.permute(2, 0, 3, 4, 1, 5)

    def _insert(self, request: Request, tokens: Sequence[int], num_blocks: int) -> list[tuple[int, CachedBlock]]:
        added, request.cache_tail = self.index.insert(tokens, num_blocks, request.cache_tail)
        return [(request.slot, block) for block in added]

    def _whole_prompt_blocks(self, request: Request) -> int:
        """Blocks of the prompt that hold no answer column (the one holding the lead is not one)."""
        return request.canvas_start // self.block_length
