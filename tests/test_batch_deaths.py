"""The death ledger and the batch gate, without Ray: who is charged when an actor dies, and who runs alone."""
from __future__ import annotations

import asyncio

from actors.ray_data.batch_deaths import UNREPORTED_CAUSE, BatchGate, DeathLedger, batch_identity, refusal_message

ROWS_A = [{"prompt": "count from 1 to 5"}, {"prompt": "repeat ab 3 times"}]
ROWS_B = [{"messages": [{"role": "user", "content": "count from 7 to 9"}]}]


def test_a_batch_has_the_same_identity_on_every_retry_and_a_label_a_person_recognises():
    assert batch_identity(ROWS_A) == batch_identity([dict(row) for row in ROWS_A])
    assert batch_identity(ROWS_A).key != batch_identity(ROWS_B).key
    assert batch_identity(ROWS_A).label.endswith("(2 rows, the first 'count from 1 to 5')")
    assert "the first 'count from 7 to 9'" in batch_identity(ROWS_B).label


def test_a_reported_death_charges_the_batches_running_on_that_instance_only():
    ledger = DeathLedger()
    a, b = batch_identity(ROWS_A), batch_identity(ROWS_B)
    ledger.instance_started("actor-1", "one", restarted=False)
    ledger.instance_started("actor-2", "two", restarted=False)
    ledger.batch_started("one", a)
    ledger.batch_started("two", b)
    ledger.instance_died("actor-1", "one", "RuntimeError: CUDA error")
    assert ledger.batch_record(a).deaths == 1 and ledger.batch_record(a).last_cause == "RuntimeError: CUDA error"
    assert ledger.batch_record(b).deaths == 0
    assert [d["batches"] for d in ledger.death_reports()] == [(a.label,)]


def test_a_silent_death_is_charged_when_the_restarted_instance_starts_and_never_twice():
    ledger = DeathLedger()
    a = batch_identity(ROWS_A)
    ledger.instance_started("actor-1", "one", restarted=False)
    ledger.batch_started("one", a)
    ledger.instance_started("actor-1", "two", restarted=True)
    ledger.instance_started("actor-1", "three", restarted=True)
    record = ledger.batch_record(a)
    assert (record.deaths, record.last_cause) == (1, UNREPORTED_CAUSE)
    assert len(ledger.death_reports()) == 1
    assert refusal_message(record).startswith(f"{a.label} was running in 1 engine deaths")


def test_a_finished_batch_leaves_no_record_behind():
    ledger = DeathLedger()
    a = batch_identity(ROWS_A)
    ledger.batch_started("one", a)
    ledger.batch_finished("one", a.key)
    ledger.instance_died("actor-1", "one", "RuntimeError: later")
    assert ledger.batches == {} and ledger.batch_record(a).deaths == 0


def test_a_batch_that_runs_alone_waits_for_the_engine_to_empty_and_holds_back_the_next_ones():
    async def scenario() -> list[str]:
        gate, events = BatchGate(), []
        release = {name: asyncio.Event() for name in ("first", "suspect", "later")}

        async def batch(name: str, alone: bool) -> None:
            async with gate.enter(alone):
                events.append(f"{name} in")
                await release[name].wait()
            events.append(f"{name} out")

        async def settle() -> None:
            for _ in range(10):
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(batch("first", False))]
        await settle()
        tasks.append(asyncio.create_task(batch("suspect", True)))
        await settle()
        tasks.append(asyncio.create_task(batch("later", False)))
        await settle()
        assert events == ["first in"]  # the suspect waits for first; later waits behind the suspect
        for name in ("first", "suspect", "later"):
            release[name].set()
            await settle()
        await asyncio.gather(*tasks)
        return events

    assert asyncio.run(scenario()) == ["first in", "first out", "suspect in", "suspect out", "later in",
                                       "later out"]
