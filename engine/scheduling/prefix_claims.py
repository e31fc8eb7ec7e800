"""Which prompt blocks the rows joining in one step will compute, so that a request sharing a long run
of them can wait a step and read them from the prefix cache instead (host data, no torch)."""
from __future__ import annotations

from engine.scheduling.prefix_index import PrefixIndex, chain_keys
from engine.scheduling.request import Request


class PrefixClaims:
    """The prompt blocks that the rows admitted in one step compute because the cache lacks them.

    Those blocks enter the cache after that step. A request that would compute a long run of them too
    waits one step and reads them instead: on a shared instruction, one row prefills it, not a batch.
    """

    def __init__(self, index: PrefixIndex, min_shared_tokens: int):
        self.index, self.min_shared_tokens = index, min_shared_tokens
        self._claimed: set[int] = set()
        self._last: tuple[Request | None, tuple[int, ...]] = (None, ())

    def must_wait(self, request: Request) -> bool:
        """Whether a row admitted in this step computes at least ``min_shared_tokens`` of the prompt
        blocks ``request`` would compute."""
        computed = self._computed(request)
        shared = next((i for i, key in enumerate(computed) if key not in self._claimed), len(computed))
        return shared > 0 and shared * self.index.block_length >= self.min_shared_tokens

    def claim(self, request: Request) -> None:
        """``request`` joins in this step: the blocks it computes are its."""
        self._claimed.update(self._computed(request))

    def _computed(self, request: Request) -> tuple[int, ...]:
        """Keys of the whole prompt blocks ``request`` computes: those after its cached run."""
        if self._last[0] is not request:
            whole_blocks = request.canvas_start // self.index.block_length
            cached = self.index.num_cached(request.prompt_token_ids, whole_blocks)
            self._last = (request, chain_keys(request.prompt_token_ids, whole_blocks, self.index.block_length)[cached:])
        return self._last[1]
