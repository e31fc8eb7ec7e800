"""CPU factories for the scheduling specs: requests with no tokenizer, a scheduler with no model, and the
runner's part played by hand, so a policy's decisions are stated as steps and events, never by the clock.

    requests = make_requests(prompt_lengths=[2, 6], caps=8)        # ids r0, r1; 8 new tokens = 2 blocks of 4
    scheduler = make_scheduler(schedule="block_sync", requests=requests)
    scheduled = scheduler.schedule(now=0.0)
    scheduler.update(runner_output(scheduled, complete={"r0": True}, stops={"r1": 2}))
    trace = drive(scheduler, completes_after={"r0": 3}, stops={"r1": 0})   # play the runner to the end

Nothing here imports torch: ``engine.scheduling.scheduler`` does not (tests/test_import_boundaries.py), and neither
does this module (tests/test_scheduler.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from engine.config import EngineConfig, SamplingParams
from engine.models.layout import blocks_needed
from engine.scheduling.outputs import RowResult, RunnerOutput, SchedulerOutput
from engine.scheduling.request import Request, first_stop
from engine.scheduling.scheduler import Scheduler

BLOCK = 4  # the specs' block length: small enough to spell a block out
EOS = 9  # the specs' one stop token
FILLER = 5  # what a hand-made block holds where a spec does not care
STOP_AT = 1  # where ``drive`` puts a block's stop token: its output keeps the block's first token


def _each(value, count: int) -> list:
    return list(value) if isinstance(value, Sequence) else [value] * count


def make_requests(count: int | None = None, *, prompt_lengths: int | Sequence[int] = 2,
                  caps: int | Sequence[int] = 8, arrivals: float | Sequence[float] = 0.0,
                  block_length: int = BLOCK, stop_at_eos: bool = True, first: int = 0,
                  prefix: str = "r") -> list[Request]:
    """Waiting requests sized as the engine sizes them (no lead, canvas = own cap), with no tokenizer.

    Each of ``prompt_lengths`` (tokens), ``caps`` (``max_new_tokens``) and ``arrivals`` (arrival times)
    is one value for all or one per request; ``count`` defaults to the longest list (1 if none). Request
    ``n`` is ``f"{prefix}{first + n}"`` with sequence number ``first + n`` (its arrival order)."""
    lists = [value for value in (prompt_lengths, caps, arrivals) if isinstance(value, Sequence)]
    count = count if count is not None else max((len(value) for value in lists), default=1)
    requests = []
    for offset, (length, cap, arrival) in enumerate(zip(_each(prompt_lengths, count), _each(caps, count),
                                                        _each(arrivals, count))):
        number = first + offset
        request = Request(request_id=f"{prefix}{number}", prompt_token_ids=[1] * length, block_length=block_length,
                          params=SamplingParams(max_new_tokens=cap, stop_at_eos=stop_at_eos),
                          arrival_time=arrival, sequence_number=number)
        request.cap_blocks = request.own_canvas_blocks = request.canvas_blocks = blocks_needed(cap, block_length)
        requests.append(request)
    return requests


def make_scheduler(config: EngineConfig | None = None, *, token_budget: int = 1000, max_row_width: int | None = None,
                   requests: Iterable[Request] = (), **settings) -> Scheduler:
    """A scheduler with no model: ``config`` (default: blocks of ``BLOCK``, 4 rows) with ``settings``
    replaced, a budget of ``token_budget`` bounding-box tokens, rows of at most ``max_row_width``
    (default: the budget), and ``requests`` queued in order."""
    config = replace(config or EngineConfig(block_length=BLOCK, max_batch_size=4), **settings)
    scheduler = Scheduler(config, token_budget, max_row_width if max_row_width is not None else token_budget)
    for request in requests:
        assert request.block_length == config.block_length, "requests and config disagree on the block length"
        scheduler.add(request)
    return scheduler


def block_of(request: Request, stop_at: int | None = None) -> list[int]:
    """A hand-made block for ``request``: ``FILLER`` tokens, with ``EOS`` at ``stop_at`` if given."""
    tokens = [FILLER] * request.block_length
    if stop_at is not None:
        tokens[stop_at] = EOS
    return tokens


def runner_output(scheduled: SchedulerOutput, complete: Mapping[str, list[int] | bool] | Iterable[str] = (),
                  stops: Mapping[str, int] | None = None) -> RunnerOutput:
    """What the runner would return for ``scheduled``: one result per row it ran. A row in ``complete``
    finished its block (with the given tokens, or ``block_of`` it for ``True`` / a bare id; ``False``:
    not yet; its first ``EOS`` is the stop token); a row in ``stops`` finished its block with ``EOS`` at
    the given index. Every other row still has masks left."""
    rows = {request.request_id: request for request in (*scheduled.starting, *scheduled.continuing)}
    complete = dict(complete) if isinstance(complete, Mapping) else dict.fromkeys(complete, True)
    stops = stops or {}
    unknown = (set(complete) | set(stops)) - set(rows)
    assert not unknown, f"the runner returns results only for the rows it ran, not {sorted(unknown)}"
    blocks = {request_id: block_of(rows[request_id], at) for request_id, at in stops.items()}
    blocks.update({request_id: list(tokens) if isinstance(tokens, list) else block_of(rows[request_id])
                   for request_id, tokens in complete.items() if tokens is not False})
    results = {request_id: RowResult(True, first_stop(blocks[request_id], (EOS,)), blocks[request_id])
               if request_id in blocks else RowResult(False, None, None) for request_id in rows}
    return RunnerOutput(rows=results, model_time_s=0.0)


@dataclass(frozen=True)
class Step:
    """What one step did, by request id: the scheduler's decisions and the update's events."""

    number: int  # 0-based, within its ``drive``
    now: float
    admitted: tuple[str, ...]  # joined at this step
    starting: tuple[str, ...]  # started a block (admitted ones too)
    continuing: tuple[str, ...]  # continued their block
    waiting: tuple[str, ...]  # running, but computed nothing: held between blocks
    pending: tuple[str, ...]  # still queued after admission
    box: int  # rows x widest row: the bounding box the step computes
    real_tokens: int  # the rows' own widths (prompt + canvas), padding excluded
    completed: tuple[str, ...]  # completed a block
    finished: tuple[str, ...]  # left at the end of the step
    new_token_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def rows(self) -> tuple[str, ...]:
        return self.starting + self.continuing


class Trace(list):
    """The ``Step``s of a ``drive``, with the step at which a request first did something."""

    def first(self, what: str, request_id: str) -> int | None:
        """The number of the first step whose ``what`` (e.g. "admitted", "finished") holds it, or None."""
        return next((step.number for step in self if request_id in getattr(step, what)), None)


def _ids(requests: Iterable[Request]) -> tuple[str, ...]:
    return tuple(request.request_id for request in requests)


def drive(scheduler: Scheduler, steps: int | None = None, *, completes_after: int | Mapping[str, int] = 1,
          stops: Mapping[str, int] | None = None, now: float = 0.0, tick: float = 1.0,
          arrivals: Mapping[int, list[Request]] | None = None,
          until: Callable[[Step], bool] | None = None) -> Trace:
    """Play the runner for ``steps`` steps (None: until nothing is left), stopping early once ``until``
    holds for a step.

    Step ``k`` runs at ``now + k * tick`` after queueing ``arrivals[k]``. A row's block completes at its
    ``completes_after``-th step in that block (one value, or per request id; 1 for ids not listed), and
    the block of index ``stops[request_id]`` commits ``EOS`` at position ``STOP_AT``."""
    arrivals = arrivals or {}
    trace = Trace()
    while steps is None or len(trace) < steps:
        number = len(trace)
        for request in arrivals.get(number, ()):
            scheduler.add(request)
        if steps is None and not scheduler.has_work() and number > max(arrivals, default=-1):
            break
        assert number < 10_000, "drive() went on for 10,000 steps: a request never leaves"
        clock = now + number * tick
        scheduled = scheduler.schedule(clock)
        ran = (*scheduled.starting, *scheduled.continuing)
        held = _ids(request for request in scheduler.running if request not in ran)
        update = scheduler.update(_played_output(scheduled, completes_after, stops or {}))
        trace.append(Step(
            number=number, now=clock, admitted=_ids(scheduled.admitted), starting=_ids(scheduled.starting),
            continuing=_ids(scheduled.continuing), waiting=held,
            pending=_ids(request for _, request in scheduler.pending),
            box=len(ran) * max((request.width for request in ran), default=0),
            real_tokens=sum(request.width for request in ran), completed=tuple(update.new_token_ids),
            finished=_ids(update.finished), new_token_ids=update.new_token_ids))
        if until is not None and until(trace[-1]):
            break
    return trace


def _played_output(scheduled: SchedulerOutput, completes_after: int | Mapping[str, int],
                   stops: Mapping[str, int]) -> RunnerOutput:
    """The runner's part in ``drive``: which rows complete their block at this step, and with a stop."""
    done = [request for request in (*scheduled.starting, *scheduled.continuing) if request.step_in_block + 1 >= (
        completes_after if isinstance(completes_after, int) else completes_after.get(request.request_id, 1))]
    stopping = {request.request_id: STOP_AT for request in done if stops.get(request.request_id) == request.block_index}
    return runner_output(scheduled, complete=[r.request_id for r in done if r.request_id not in stopping],
                         stops=stopping)
