"""The engine loop on its own (no Serve, no Ray), specified by steps and events, never by the clock.

A :class:`SteppingGate` wraps the real engine's ``step`` so the test decides when each step may run:
"the late request was admitted at the first step after it arrived and finished before the early ones"
is then a fact about step numbers, the same on a quiet machine and on a busy one.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from concurrent.futures import Future

import pytest

from actors.engine_loop import EngineDeadError, EngineLoop
from engine import BlockServeEngine, EngineConfig, SamplingParams
from tests.pipeline_helpers import freeze_tiny_model

ENGINE = {"max_batch_size": 4, "steps_per_block": 4, "block_length": 32}
WAIT_S = 120.0  # generous: only a broken loop ever gets near it


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from engine.models import load_model

    return load_model(freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny", gen_length=False),
                      dtype="float32")  # a request's max_new_tokens sizes its canvas of blocks of 32


class SteppingGate:
    """The engine's step runs only when the test grants it; ``steps`` counts completed steps.

    Between grants the loop thread waits at the gate, inside the next step: that step is "under way",
    so a request submitted meanwhile joins at the step after it, exactly as one arriving mid-step."""

    def __init__(self, engine: BlockServeEngine):
        self._step, self._permits = engine.step, threading.Semaphore(0)
        self._changed = threading.Condition()
        self.steps, self.at_gate = 0, False
        self.admitted_at: dict[str, int] = {}  # request id -> the step (1-based) that admitted it
        engine.step = self._gated_step
        self.engine = engine

    def _gated_step(self):
        with self._changed:
            self.at_gate = True
            self._changed.notify_all()
        self._permits.acquire()
        with self._changed:
            self.at_gate = False
        report = self._step()
        with self._changed:
            self.steps += 1
            for request_id in report.admitted:
                self.admitted_at[request_id] = self.steps
            self._changed.notify_all()
        return report

    def run(self, count: int = 1) -> None:
        """Let ``count`` more steps run; return once they have and the loop waits at the gate again
        (or has nothing left to step)."""
        with self._changed:
            target = self.steps + count
            self._permits.release(count)

            def settled() -> bool:
                return self.steps >= target and (self.at_gate or not self.engine.has_unfinished_requests())

            if not self._changed.wait_for(settled, WAIT_S):
                pytest.fail(f"the loop did not run step {target}")

    def open(self) -> None:
        """Let every later step run freely."""
        self._permits.release(1_000_000)


def wait_for(condition, what: str) -> None:
    event = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if condition():
            return
        event.wait(0.01)
    pytest.fail(f"timed out waiting for {what}")


def submit(loop: EngineLoop, prompt, max_tokens: int, request_id: str, **params) -> Future:
    return loop.submit(prompt, SamplingParams(max_new_tokens=max_tokens, **params), request_id,
                       stream=False).result


def test_a_late_arrival_joins_at_the_next_step_and_leaves_before_the_earlier_requests(lm):
    engine = BlockServeEngine(lm, EngineConfig(**ENGINE))
    gate = SteppingGate(engine)
    loop = EngineLoop(engine).start()
    try:
        early = [submit(loop, chat(f"count from {n} to 99"), 192, f"early-{n}", stop_at_eos=False)
                 for n in (10, 20)]  # 6 blocks each
        while engine.num_running < 2:
            gate.run()
        arrived_after = gate.steps  # the loop now waits inside step arrived_after + 1
        late = submit(loop, chat("count from 1 to 5"), 32, "late")  # one block
        while not late.done():
            gate.run()
        admitted_at, finished_at = gate.admitted_at["late"], gate.steps
        assert admitted_at == arrived_after + 2  # right after the step under way, next to running rows
        assert not any(future.done() for future in early)  # it left while both were still running
        assert late.result().num_blocks == 1
        assert finished_at - admitted_at + 1 <= ENGINE["steps_per_block"]  # one block's steps at most
        gate.open()
        outputs = [future.result(WAIT_S) for future in early]
        assert [output.num_blocks for output in outputs] == [6, 6]
    finally:
        gate.open()
        loop.stop()


def test_a_dead_engine_loop_fails_its_callers_and_reports_unhealthy(lm):
    engine = BlockServeEngine(lm, EngineConfig(**ENGINE))

    def broken_step():
        raise RuntimeError("device lost")

    engine.step = broken_step
    loop = EngineLoop(engine).start()
    result = submit(loop, chat("count from 1 to 3"), 32, "r0")
    with pytest.raises(EngineDeadError, match="device lost"):
        result.result(WAIT_S)
    assert "device lost" in loop.health_problem()
    loop.stop()


def test_a_stuck_engine_loop_reports_unhealthy_and_recovers_when_the_step_ends(lm):
    engine = BlockServeEngine(lm, EngineConfig(**ENGINE))
    gate = SteppingGate(engine)
    loop = EngineLoop(engine, stall_timeout_s=0.3).start()
    try:
        result = submit(loop, chat("count from 1 to 3"), 32, "r0")
        wait_for(lambda: loop.health_problem() is not None, "the stuck step to be reported")
        assert "has not completed an engine step" in loop.health_problem()
        gate.open()
        assert result.result(WAIT_S).finish_reason in ("eos", "length")
        wait_for(lambda: loop.health_problem() is None, "the loop to report healthy again")
    finally:
        gate.open()
        loop.stop()


def test_static_batching_holds_a_lone_request_until_the_batch_is_full_or_the_timeout(lm):
    config = EngineConfig(**ENGINE, schedule="static", static_batch_timeout_s=3600.0)
    engine = BlockServeEngine(lm, config)
    loop = EngineLoop(engine).start()
    try:
        first = loop.submit(chat("count from 1 to 3"), SamplingParams(max_new_tokens=32), "a", stream=False)
        wait_for(lambda: engine.num_pending == 1, "the first request to reach the engine")
        rest = [loop.submit(chat(f"count from 2 to {n}"), SamplingParams(max_new_tokens=32), f"b{n}",
                            stream=False) for n in range(5, 5 + config.max_batch_size - 1)]
        outputs = [stream.result.result(WAIT_S) for stream in (first, *rest)]
        # a lone request never started on its own (an hour-long timeout): the full batch went at once
        assert len({stream.first_scheduled_time for stream in (first, *rest)}) == 1
        assert all(output.finish_reason in ("eos", "length") for output in outputs)
    finally:
        loop.stop()
    engine = BlockServeEngine(lm, dataclasses.replace(config, static_batch_timeout_s=0.05))
    loop = EngineLoop(engine).start()
    try:  # ... and a lone request still runs once its timeout passes
        assert submit(loop, chat("count from 1 to 3"), 32, "alone").result(WAIT_S).num_blocks >= 1
    finally:
        loop.stop()


def test_streamed_events_arrive_one_per_committed_block(lm):
    engine = BlockServeEngine(lm, EngineConfig(**ENGINE))

    async def scenario():
        loop = EngineLoop(engine).start()
        stream = loop.submit(chat("count from 5 to 40"), SamplingParams(max_new_tokens=96, stop_at_eos=False),
                             "s")
        events = [event async for event in stream]
        loop.stop()
        return events

    events = asyncio.run(scenario())
    assert len(events) == 3 and events[-1].output is not None
    assert [token for event in events for token in event.token_ids] == events[-1].output.token_ids
