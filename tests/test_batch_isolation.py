"""A convicted batch's rows retried in smaller groups, in the death ledger (without Ray): the rows that
kill their actor are flagged, the others generated, and the deaths it costs are bounded. The real jobs
whose actors die are in tests/test_batch_deaths.py and tests/test_pipeline.py."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from actors.ray_data.actor_config import ActorConfig
from actors.ray_data.batch_deaths import UNREPORTED_CAUSE, DeathLedger, batch_identity
from actors.ray_data.batch_rows import rows_of_columns, take_rows, with_columns
from actors.ray_data.row_outputs import OUTPUT_SCHEMA, output_columns, output_row

CAUSE = "RuntimeError: CUDA error: an illegal memory access was encountered"


def convicted(ledger: DeathLedger, num_rows: int, deaths: int = 2):
    """A batch of ``num_rows`` rows charged with ``deaths`` deaths, the last reported with CAUSE."""
    batch = batch_identity([{"prompt": f"row {index}"} for index in range(num_rows)])
    for attempt in range(deaths):
        ledger.instance_started("actor-1", f"before-{attempt}", restarted=False)
        ledger.batch_started(f"before-{attempt}", batch)
        ledger.instance_died("actor-1", f"before-{attempt}", CAUSE)
    return batch


def isolate(ledger: DeathLedger, num_rows: int, kills, max_deaths: int = 8) -> tuple[dict, dict, list]:
    """Run the convicted batch's groups as a real actor would: a group for which ``kills(rows)`` is true
    ends the instance (a restarted one asks next); the others finish. Returns what the ledger settled
    and the groups run, in order."""
    batch, instance, runs = convicted(ledger, num_rows), "iso-0", []
    while (group := ledger.next_group(instance, batch, num_rows, max_deaths)) is not None:
        runs.append((group.start, group.end))
        if kills(set(range(group.start, group.end))):
            ledger.instance_died("actor-1", instance, CAUSE)
            instance = f"iso-{len(runs)}"
        else:
            ledger.group_finished(instance, batch.key, [{"row": index} for index in range(group.start, group.end)])
    generated, flagged = ledger.isolation_result(batch.key)
    ledger.batch_finished(instance, batch.key)
    return generated, flagged, runs


def test_one_poison_row_is_flagged_alone_and_its_fifteen_neighbours_are_generated_in_log2_deaths():
    ledger = DeathLedger()
    generated, flagged, runs = isolate(ledger, 16, lambda rows: 13 in rows)
    assert sorted(flagged) == [13] and sorted(generated) == [i for i in range(16) if i != 13]
    assert generated[7] == {"row": 7}
    assert runs == [(0, 8), (8, 16), (8, 12), (12, 16), (12, 14), (12, 13), (13, 14), (14, 16)]
    (report,) = ledger.isolated
    assert report["deaths"] == math.log2(16) and (report["rows_generated"], report["rows_flagged"]) == (15, 1)
    assert flagged[13].startswith("the actor's process died all 6 times this row was being generated, "
                                  "the last time with no other row (row 13 of batch ")
    assert flagged[13].endswith(f"last cause: {CAUSE}")
    assert [d["batches"] for d in ledger.death_reports()][2:] == [
        (f"rows {start}-{end - 1} of {report['batch']}",) if end - start > 1 else (f"row {start} of {report['batch']}",)
        for start, end in [(8, 16), (12, 16), (12, 14), (13, 14)]]
    assert ledger.isolations == {} and ledger.batches == {}


def test_two_poison_rows_are_both_flagged_and_the_rest_generated_in_log2_deaths_each():
    ledger = DeathLedger()
    generated, flagged, _ = isolate(ledger, 16, lambda rows: bool(rows & {2, 9}), max_deaths=9)
    assert sorted(flagged) == [2, 9] and len(generated) == 14
    assert ledger.isolated[0]["deaths"] == 2 * math.log2(16)


def test_a_death_that_needs_rows_together_flags_nothing_once_they_run_apart():
    """E.g. memory: the whole batch does not fit, each half does."""
    ledger = DeathLedger()
    generated, flagged, runs = isolate(ledger, 16, lambda rows: {3, 12} <= rows)
    assert flagged == {} and len(generated) == 16 and runs == [(0, 8), (8, 16)]
    assert ledger.isolated[0]["deaths"] == 0


def test_at_max_isolation_deaths_the_rows_not_generated_yet_are_flagged_and_no_more_deaths_follow():
    ledger = DeathLedger()
    generated, flagged, runs = isolate(ledger, 16, lambda rows: 13 in rows, max_deaths=2)
    assert sorted(flagged) == [12, 13, 14, 15] and len(generated) == 12
    assert runs == [(0, 8), (8, 16), (8, 12), (12, 16)] and ledger.isolated[0]["deaths"] == 2
    assert "died all 4 times this row was being generated, each time beside others of rows 12-15" in flagged[14]
    assert "their isolation stopped at max_isolation_deaths (2)" in flagged[14]


def test_a_silent_death_during_isolation_is_charged_to_the_group_that_was_running():
    ledger = DeathLedger()
    batch = convicted(ledger, 2)
    ledger.instance_started("actor-1", "iso-0", restarted=True)
    first = ledger.next_group("iso-0", batch, 2, max_deaths=6)
    ledger.instance_started("actor-1", "iso-1", restarted=True)  # iso-0 was killed without a word
    assert ledger.batch_record(batch).deaths == 2  # the batch is not charged again: its group is
    second = ledger.next_group("iso-1", batch, 2, max_deaths=6)
    assert (first.start, first.end, second.start) == (0, 1, 1)
    assert ledger.isolation_result(batch.key)[1][0].endswith(f"last cause: {UNREPORTED_CAUSE}")


def test_a_convicted_batch_of_one_row_is_flagged_without_running_again():
    ledger = DeathLedger()
    batch = convicted(ledger, 1)
    assert ledger.next_group("iso-0", batch, 1, max_deaths=6) is None
    assert "died all 2 times this row was being generated" in ledger.isolation_result(batch.key)[1][0]


def test_isolation_is_off_with_zero_deaths_or_when_a_failed_row_fails_its_batch_anyway():
    assert ActorConfig().isolates_rows
    assert not ActorConfig(max_isolation_deaths=0).isolates_rows
    assert not ActorConfig(should_continue_on_error=False).isolates_rows


@pytest.mark.parametrize("key", ["max_restarts", "max_task_retries"])
def test_ray_limits_below_what_one_poison_batch_may_cost_are_refused_naming_the_key(tmp_path, key):
    from actors.ray_data.processor import BlockServeProcessorConfig
    from pipeline.config import ConfigError, load_config

    path = tmp_path / "job.yaml"
    path.write_text(f"input: a.jsonl\noutput: o\nmax_isolation_deaths: 4\nactors: {{{key}: 5}}\n")
    with pytest.raises(ConfigError, match=rf"{path}: actors.{key}: 5 is fewer than the 6 deaths .* "
                                          r"set at least 6, or -1"):
        load_config(path)
    assert load_config(path, [f"actors.{key}=-1", "max_isolation_deaths=3"])
    with pytest.raises(ValueError, match=rf"{key}: 5 is fewer than the 10 deaths"):
        BlockServeProcessorConfig(model_source="tiny", actor={"stats_actor": "registry"},
                                  should_continue_on_error=True, **{key: 5})
    assert BlockServeProcessorConfig(model_source="tiny", should_continue_on_error=True, **{key: 5})  # no ledger


@pytest.mark.parametrize("make", [pa.Table.from_pylist, pd.DataFrame,
                                  lambda rows: {"prompt": np.array([row["prompt"] for row in rows])}])
def test_a_door_batch_in_any_format_splits_into_rows_and_gives_its_output_rows_back(make):
    batch = make([{"prompt": f"question {index}"} for index in range(5)])
    part = take_rows(batch, 2, 4)
    outputs = [output_row(f"error {index}", {"actor_id": "a", "node_id": "n", "device": "cpu"}) for index in (2, 3)]
    answered = with_columns(part, output_columns(outputs))
    assert rows_of_columns(answered, ["prompt"]) == [{"prompt": "question 2"}, {"prompt": "question 3"}]
    assert rows_of_columns(answered, OUTPUT_SCHEMA.names) == outputs
