"""A request's state while it waits and runs, and the output it leaves behind."""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.config import SamplingParams

if TYPE_CHECKING:
    from engine.scheduling.prefix_index import CachedBlock


def first_stop(token_ids: list[int], stop_ids: tuple[int, ...]) -> int | None:
    """Index of the first stop token (EOS / end-of-turn) in ``token_ids``, None if there is none."""
    return next((index for index, token in enumerate(token_ids) if token in stop_ids), None)


class RequestStatus(enum.IntEnum):
    WAITING = 0
    RUNNING = 1
    FINISHED_EOS = 2
    FINISHED_LENGTH = 3
    FINISHED_ABORT = 4
    FINISHED_ERROR = 5

    @property
    def is_finished(self) -> bool:
        return self >= RequestStatus.FINISHED_EOS

    @property
    def finish_reason(self) -> str | None:
        return {RequestStatus.FINISHED_EOS: "eos", RequestStatus.FINISHED_LENGTH: "length",
                RequestStatus.FINISHED_ABORT: "abort", RequestStatus.FINISHED_ERROR: "error"}.get(self)


@dataclass(frozen=True)
class TokenLogprob:
    """An output token's log-probability at the step it was committed (see engine/runner/logit_processors.py),
    and the ``len(top)`` most likely tokens of that distribution."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated, at most max_new_tokens: up to its first stop token when it honours stops
    text: str
    finish_reason: str  # "eos" | "length" | "abort" | "error"
    error: str | None
    num_blocks: int  # blocks of its own output, through the one that committed its stop token
    num_steps: int  # denoising steps on its own output (not a static batch's steps past its EOS)
    arrival_time: float
    first_scheduled_time: float | None
    finish_time: float
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when params.logprobs is set
    num_cached_tokens: int = 0  # prompt tokens whose keys/values came from the prefix cache

    @property
    def queue_s(self) -> float:
        return (self.first_scheduled_time or self.finish_time) - self.arrival_time

    @property
    def latency_s(self) -> float:
        return self.finish_time - self.arrival_time

    def to_dict(self) -> dict:
        return dataclasses.asdict(self) | {"queue_s": self.queue_s, "latency_s": self.latency_s}


@dataclass(eq=False)
class Request:
    """One request. Its row is ``prompt + canvas``; only ``block_index``'s block is being decoded.

        row:  [ prompt (prompt_length) | block 0 | block 1 | ... | block canvas_blocks-1 ]
                                         ^ block_start = prompt_length + block_index * block_length

    A block-causal family's blocks sit at multiples of ``block_length`` from the prompt's start, so
    block 0 may begin inside the prompt: its first ``lead`` tokens are the prompt's last ones.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    block_length: int
    arrival_time: float
    seed: int = 0
    error: str | None = None
    status: RequestStatus = RequestStatus.WAITING
    lead: int = 0  # prompt tokens inside block 0 (block-causal families; 0: the answer starts a block)
    cap_blocks: int = 0  # the request's own block cap: the blocks max_new_tokens spans after the lead
    # (whole blocks are computed; the output keeps max_new_tokens of them)
    own_canvas_blocks: int = 0  # blocks of the canvas it decodes alone: its cap, or more for a whole-sequence
    # row whose gen_length exceeds max_new_tokens (it leaves once its cap's blocks are final)
    canvas_blocks: int = 0  # blocks on its canvas (its own, or the batch's largest for static/shrink)
    block_index: int = 0  # the block being decoded; once it is complete, the number of blocks done
    between_blocks: bool = False  # its last block is final and the next one has not started
    step_in_block: int = 0  # denoising steps taken in the current block (block_index's)
    slot: int | None = None  # its row of the runner's preallocated state while it runs (None: not running)
    cached_prefix: int = 0  # prompt columns from 0 whose keys/values came from the prefix cache
    cache_tail: CachedBlock | None = None  # the prefix cache's last block of its row
    grammar: object | None = None  # its structured_outputs compiled (engine.structured.grammars); None: free text
    output_token_ids: list[int] = field(default_factory=list)  # its own output so far (up to a stop it honours)
    output_logprobs: list[TokenLogprob] = field(default_factory=list)  # theirs, if asked for
    num_steps: int = 0
    stop_block: int | None = None  # first block that committed a stop token it honours (stop_at_eos)
    first_scheduled_time: float | None = None
    finish_time: float | None = None
    abort_requested: bool = False
    sequence_number: int = field(default=0)  # arrival order

    @property
    def prompt_length(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def canvas_start(self) -> int:
        """Row column of block 0's first token."""
        return self.prompt_length - self.lead

    @property
    def width(self) -> int:
        """Row width in the bounding box: prompt plus canvas."""
        return self.canvas_start + self.canvas_blocks * self.block_length


    @property
    def block_start(self) -> int:
        return self.canvas_start + self.block_index * self.block_length

    @property
    def block_lead(self) -> int:
        """Prompt tokens at the start of its current block (``lead`` in block 0, else 0)."""
        return self.lead if self.block_index == 0 else 0

    @property
    def is_finished(self) -> bool:
        """It has left the engine: its status is final."""
        return self.status.is_finished

    @property
    def stopped_at_eos(self) -> bool:
        """A completed block committed a stop token and the request honours it."""
        return self.stop_block is not None

    @property
    def adds_to_output(self) -> bool:
        """Its next block can still add to its own output: no stop token yet and under its block cap.

        False for a row a static batch keeps running past its EOS or cap (wasted work)."""
        return (not self.stopped_at_eos and self.block_index < self.cap_blocks
                and len(self.output_token_ids) < self.params.max_new_tokens)

    @property
    def needs_more_blocks(self) -> bool:
        """It adds to its output and nobody asked to abort it; otherwise it may leave."""
        return self.adds_to_output and not self.abort_requested

    @property
    def output_blocks(self) -> int:
        """Blocks of its own output: up to its stop block (a static batch may have run it further)."""
        if self.stopped_at_eos:
            return self.stop_block + 1
        return min(self.block_index, self.cap_blocks)

    def complete_block(self, token_ids: list[int], stop_index: int | None,
                       logprobs: list[TokenLogprob] | None = None) -> list[int]:
        """Record its completed block (``stop_index``: its first stop token, if any); return the part
        that joins its own output: up to that stop token and ``max_new_tokens``, nothing past an earlier
        stop or its block cap. A stop token past ``max_new_tokens`` does not count: the cap came first.
        A request that ignores stops (``stop_at_eos=False``, vLLM's ``ignore_eos``) keeps every token,
        stop tokens included, up to ``max_new_tokens``."""
        if not self.params.stop_at_eos:
            stop_index = None
        room = self.params.max_new_tokens - len(self.output_token_ids)
        adds = self.stop_block is None and self.block_index < self.cap_blocks
        added = token_ids[:stop_index][:room] if adds else []
        self.output_token_ids += added
        if logprobs is not None:
            self.output_logprobs += logprobs[:len(added)]
        if stop_index is not None and self.stop_block is None and (not adds or stop_index < room):
            self.stop_block = self.block_index
        self.block_index += 1
        self.between_blocks, self.step_in_block = True, 0
        return added
