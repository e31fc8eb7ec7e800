"""Which whole blocks the prefix cache holds: a hash chain of block-sized token runs.

A block-causal model's keys and values of a block depend only on the tokens up to the end of that block.
So every request whose prompt starts with the same blocks can read the same keys and values. A
:class:`CachedBlock` names one such block by its parent and its own tokens, and owns one entry of the
runner's pool (``engine.runner.prefix_cache``). The pool has a fixed number of entries; when it is full,
the least recently used block that no other block extends is evicted (a heap of such leaves, its stale
entries skipped). This module is host data only: it imports no torch.
"""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

_numbers = itertools.count()


@dataclass(eq=False)
class CachedBlock:
    parent: CachedBlock | None
    tokens: tuple[int, ...]
    entry: int  # its entry in the pool
    depth: int  # its block number from the prompt's start
    children: int = 0
    last_used: int = 0
    cached: bool = True  # False once evicted
    number: int = field(default_factory=_numbers.__next__)  # identity in the chain's keys and the heap


def chain_keys(tokens: Sequence[int], num_blocks: int, block_length: int) -> tuple[int, ...]:
    """A key for each of ``tokens``' first ``num_blocks`` blocks that names the block and every block
    before it. Equal keys almost surely mean an equal run; a collision may only delay a request."""
    keys, key = [], 0
    for start in range(0, num_blocks * block_length, block_length):
        key = hash((key, tuple(tokens[start:start + block_length])))
        keys.append(key)
    return tuple(keys)


class PrefixIndex:
    def __init__(self, capacity: int, block_length: int):
        self.capacity, self.block_length = capacity, block_length
        self._blocks: dict[tuple[int, tuple[int, ...]], CachedBlock] = {}  # (parent number, tokens) -> block
        self._leaves: list[tuple[int, int, CachedBlock]] = []  # heap of (last_used, number, block)
        self._free = list(range(capacity - 1, -1, -1))
        self._clock = itertools.count(1)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def match(self, tokens: Sequence[int], max_blocks: int) -> list[CachedBlock]:
        """The cached blocks that ``tokens`` start with, at most ``max_blocks``; each counts as used now."""
        found = self._longest_run(tokens, max_blocks)
        for block in found:
            self._touch(block)
        return found

    def num_cached(self, tokens: Sequence[int], max_blocks: int) -> int:
        """How many of ``tokens``' first ``max_blocks`` blocks are cached, without using them."""
        return len(self._longest_run(tokens, max_blocks))

    def _longest_run(self, tokens: Sequence[int], max_blocks: int) -> list[CachedBlock]:
        found: list[CachedBlock] = []
        parent = None
        for depth in range(max_blocks):
            block = self._blocks.get((self._key(parent), self._run(tokens, depth)))
            if block is None:
                break
            found.append(block)
            parent = block
        return found

    def insert(self, tokens: Sequence[int], num_blocks: int,
               tail: CachedBlock | None = None) -> tuple[list[CachedBlock], CachedBlock | None]:
        """Cache ``tokens``' first ``num_blocks`` whole blocks; returns the blocks added, whose pool entries
        the caller fills, and the chain's last block. ``tail``: that last block from an earlier insert of
        the same tokens, to go on from (while it is cached). It stops early when every entry holds a block
        of this chain."""
        added: list[CachedBlock] = []
        start = tail.depth + 1 if tail is not None and tail.cached else 0
        parent = tail if start else None
        chain: set[CachedBlock] = {parent} if parent is not None else set()
        for depth in range(start, num_blocks):
            run = self._run(tokens, depth)
            block = self._blocks.get((self._key(parent), run))
            if block is None:
                entry = self._take_entry(chain)
                if entry is None:
                    break
                block = CachedBlock(parent, run, entry, depth)
                self._blocks[(self._key(parent), run)] = block
                if parent is not None:
                    parent.children += 1
                added.append(block)
            self._touch(block)
            chain.add(block)
            parent = block
        return added, parent

    def _touch(self, block: CachedBlock) -> None:
        block.last_used = next(self._clock)
        if block.children == 0:
            self._push_leaf(block)

    def _push_leaf(self, block: CachedBlock) -> None:
        heapq.heappush(self._leaves, (block.last_used, block.number, block))
        if len(self._leaves) > 4 * self.capacity + 64:  # drop the stale entries that touches leave behind
            self._leaves = [(b.last_used, b.number, b) for b in self._blocks.values() if b.children == 0]
            heapq.heapify(self._leaves)

    def _take_entry(self, keep: set[CachedBlock]) -> int | None:
        if self._free:
            return self._free.pop()
        kept = []
        victim = None
        while self._leaves:
            stamp, number, block = heapq.heappop(self._leaves)
            if not block.cached or block.children or stamp != block.last_used:
                continue  # stale: evicted, extended since, or used again since
            if block in keep:
                kept.append((stamp, number, block))
                continue
            victim = block
            break
        for item in kept:
            heapq.heappush(self._leaves, item)
        if victim is None:
            return None
        victim.cached = False
        del self._blocks[(self._key(victim.parent), victim.tokens)]
        if victim.parent is not None:
            victim.parent.children -= 1
            if victim.parent.children == 0:
                self._push_leaf(victim.parent)
        self.evictions += 1
        return victim.entry

    def _run(self, tokens: Sequence[int], depth: int) -> tuple[int, ...]:
        return tuple(tokens[depth * self.block_length:(depth + 1) * self.block_length])

    @staticmethod
    def _key(parent: CachedBlock | None) -> int:
        return -1 if parent is None else parent.number

