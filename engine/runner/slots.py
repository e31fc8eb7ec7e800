"""The slots of a runner's preallocated state, and which running request holds each.

Every step kind keeps its rows' device state (tokens, keys and values, canvases) in ``[slots, ...]`` tensors
allocated once. A joining request takes the lowest free slot, so a small batch stays in the low slots and a
view of ``[0, n)`` covers it; a leaving one gives its slot back. The block rows' packing moves a request
between slots (:meth:`SlotAllocator.move`, :meth:`SlotAllocator.swap`).
"""
from __future__ import annotations

import heapq
from typing import Generic, TypeVar

Holder = TypeVar("Holder")


class SlotAllocator(Generic[Holder]):
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots))  # a heap: the lowest free slot first
        self._holders: dict[int, Holder] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, holder: Holder) -> int:
        """The lowest free slot, now ``holder``'s."""
        if not self._free:
            raise RuntimeError(f"no free slot: all {self.num_slots} are held (the scheduler admitted too many rows)")
        slot = heapq.heappop(self._free)
        self._holders[slot] = holder
        return slot

    def give_back(self, slot: int) -> None:
        del self._holders[slot]
        heapq.heappush(self._free, slot)

    def holder(self, slot: int) -> Holder | None:
        return self._holders.get(slot)

    def move(self, source: int, target: int) -> None:
        """The holder of ``source`` now holds the free slot ``target``; ``source`` is free."""
        self._free.remove(target)
        heapq.heapify(self._free)
        self._holders[target] = self._holders.pop(source)
        heapq.heappush(self._free, source)

    def swap(self, first: int, second: int) -> None:
        """The holders of two held slots trade them."""
        self._holders[first], self._holders[second] = self._holders[second], self._holders[first]
