"""The prefix cache's keys and values: a pool of whole prompt blocks that later rows copy instead of
computing (block-causal layouts only, where a prompt block's keys and values depend on nothing after it).

A row placed in the batch copies the pool entries of its longest cached run of whole prompt blocks into
its slot and marks them as its ``cached_prefix``: its first step then computes only the rest of its prompt
and its first block. A block whose copy is made is no longer needed by the row, so eviction never takes a
block from under a reader. After a row's first step its whole prompt blocks are in its slot, final, and
the ones the pool lacks are copied in; so are a leaving row's stored answer blocks, under the prompt and
answer tokens before each, so that a conversation's next turn finds its history. The prompt's last,
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
        request.cached_prefix, request.cache_tail = width, blocks[-1]  # its inserts go on from there

    def keep_prompts(self, admitted: Sequence[Request]) -> None:
        """Cache the whole prompt blocks of rows whose first step has just run."""
        self._copy([pair for request in admitted
                    for pair in self._insert(request, request.prompt_token_ids, self._whole_prompt_blocks(request))])

    def keep_answers(self, finished: Sequence[Request]) -> None:
        """Cache the stored answer blocks of rows leaving now, under the prompt and answer tokens before each,
        so that a conversation's next turn finds its history. A row's last block was never stored, and a
        row whose output a stop token cut inside an earlier block has no tokens for it: neither is cached."""
        added = []
        for request in finished:
            blocks = self._whole_prompt_blocks(request) + max(request.block_index - 1, 0)
            tokens = request.prompt_token_ids + request.output_token_ids
            if request.slot is not None and len(tokens) >= blocks * self.block_length:
                added += self._insert(request, tokens, blocks)
        self._copy(added)

    def _copy(self, added: list[tuple[int, CachedBlock]]) -> None:
        """Copy the blocks added from their rows' slots into their pool entries, in one gather."""
        added = [(slot, block) for slot, block in added if block.cached]  # a later insert of the same call may
        if not added:  # have evicted an earlier one and taken its entry
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
