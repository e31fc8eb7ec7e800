"""The death ledger and the batch gate: who is charged when an actor dies, and who runs alone (without
Ray); then real jobs whose actor's process ends at the entry of its door, before the base class's code:
the poison row alone is flagged (tests/test_batch_isolation.py specifies how it is found)."""
from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from actors.ray_data.batch_deaths import UNREPORTED_CAUSE, BatchGate, DeathLedger, batch_identity, refusal_message
from tests.pipeline_helpers import demo_rows, freeze_tiny_model, read_outputs, run_small_job

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


# --------------------------------------------------------------------------------------------------
# A process that ends at the door: the batch was recorded before the door's own code ran
# --------------------------------------------------------------------------------------------------

POISON = {"id": "poison-0", "prompt": "count from 3 to 11, the row that ends its actor"}
ALONE = "this row was being generated, the last time with no other row"


def test_a_subclass_door_that_is_not_a_coroutine_is_refused_when_the_class_is_defined():
    from actors.ray_data.block_serve_actor import BlockServeActor

    with pytest.raises(TypeError, match="Blocking.generate_rows must be a coroutine function"):
        class Blocking(BlockServeActor):
            def generate_rows(self, rows):
                return rows


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny"))


def assert_only_the_poison_flagged(rows: list[dict], source: list[dict], deaths: list[dict],
                                   isolations: list[dict]) -> None:
    """Every id once; the poison row flagged alone, after the deaths of its batch and of its groups; at
    most log2(4) deaths to find it in a batch of 4 rows."""
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in source)
    (flagged,) = [r for r in rows if r["__inference_error__"]]
    assert flagged["id"] == POISON["id"] and flagged["finish_reason"] == "error"
    (isolation,) = isolations
    assert isolation["rows_flagged"] == 1 and isolation["rows_generated"] == isolation["rows"] - 1
    assert len(deaths) == 2 + isolation["deaths"] and isolation["deaths"] <= 2
    assert f"died all {len(deaths)} times {ALONE}" in flagged["__inference_error__"]
    assert flagged["__inference_error__"].endswith(f"last cause: {UNREPORTED_CAUSE}")
    assert all(r["finish_reason"] in ("eos", "length") for r in rows if r["id"] != POISON["id"])


def test_a_job_whose_actor_dies_at_generate_rows_entry_flags_the_poison_row_only_and_a_rerun_retries_it(
        ray_cluster, tiny_model, tmp_path, capsys):
    source = demo_rows(8, start=600) + [POISON]
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text("".join(json.dumps(row) + "\n" for row in source))
    output = tmp_path / "out"
    overrides = ("actors.actor_class=tests.fault_injection.ExitAtEntry",
                 f"actors.actor_options.exit_on_prompt={json.dumps(POISON['prompt'])}")
    capsys.readouterr()
    assert run_small_job(tiny_model, output, *overrides, input_path=input_path) == 0
    stats = json.loads((output / "stats.json").read_text())
    assert_only_the_poison_flagged(read_outputs(output), source, stats["actor_deaths"],
                                   stats["batch_isolation"]["per_batch"])
    assert "rows generated, 1 flagged, at the cost of" in capsys.readouterr().out
    assert run_small_job(tiny_model, output, *overrides, input_path=input_path) == 0  # retries the flagged row
    rows = read_outputs(output)  # it fails alone again: written once, still flagged, the others untouched
    assert len(rows) == len(source) and [r["id"] for r in rows if r["finish_reason"] == "error"] == [POISON["id"]]


def test_a_users_pipeline_whose_actor_is_killed_at_call_entry_flags_the_poison_row_only(ray_cluster, tiny_model):
    """SIGKILL, as the kernel's out-of-memory killer sends it; Ray's retries as docs/ray_data.md advises."""
    import ray

    from actors.ray_data.stats_registry import start_stats_registry
    from tests.fault_injection import ExitAtEntry

    source = [{"id": r["id"], "prompt": r["prompt"]} for r in demo_rows(8, start=620)] + [POISON]
    registry_name = f"stats-{uuid.uuid4().hex[:8]}"
    registry = start_stats_registry(registry_name)
    ds = ray.data.from_items(source).map_batches(
        ExitAtEntry, batch_size=4, num_cpus=0.25, max_restarts=16, max_task_retries=-1,
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=2),
        fn_constructor_kwargs={"model": tiny_model, "sampling": {"max_new_tokens": 32}, "chat_template": True,
                               "torch_threads": 1, "stats_actor": registry_name, "exit_on_prompt": POISON["prompt"],
                               "exit_at": "__call__", "exit_with": "kill"})
    ds.context.wait_for_min_actors_s = 300
    try:
        rows = ds.take_all()
        deaths, isolations = ray.get([registry.deaths.remote(), registry.isolations.remote()])
    finally:
        ray.kill(registry)
    assert_only_the_poison_flagged(rows, source, deaths, isolations)
