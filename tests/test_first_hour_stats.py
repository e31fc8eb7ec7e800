"""The job's stats, specified for a reader: every share names its denominator.

Snapshots are hand-made (no Ray), with busy and active times chosen so each share has one right value;
"""
from __future__ import annotations

import re

import pytest

from actors.ray_data.actor_stats import ActorStats
from actors.ray_data.row_outputs import output_row

PLACEMENT = {"actor_id": "a", "node_id": "n", "device": "cpu"}
MISSING = "missing prompt: neither 'messages' nor 'prompt' is present and non-null"


def answered(tokens: int = 8, latency_s: float = 0.5) -> dict:
    return {**output_row("", PLACEMENT), "finish_reason": "eos", "__inference_error__": "",
            "num_generated_tokens": tokens, "time_taken_llm": latency_s}


def snapshot(actor_id: str, node_id: str, busy: float, active: float, outputs: list[dict],
             tensor_parallel_size: int = 2, latency_s: float = 0.5) -> dict:
    """One actor instance's snapshot, its row counts and error messages made by :class:`ActorStats`."""
    stats = ActorStats()
    stats.record(outputs)
    engine = {"generated_tokens": 10 * len(outputs), "denoise_steps": 5, "effective_compute_ratio": 0.5,
              "useful_row_fraction": 1.0, "padding_fraction": 0.1}
    shot = stats.snapshot({"actor_id": actor_id, "instance_id": f"{actor_id}-{busy}", "node_id": node_id,
                           "device": "cpu", "tensor_parallel_size": tensor_parallel_size},
                          busy_s=busy, active_s=active, memory_peak_bytes=0, gpu_utilization=None, engine=engine)
    shot["samples"]["latency_s"] = [latency_s] * len(shot["samples"]["latency_s"])
    return shot


def job_stats(wall_s: float = 20.0, latency_s: float = 0.5) -> dict:
    """Actors a and b on node n1, c on n2; a's 2 and c's 1 error rows; a busy 4 s of 5 s active, b 1 of 2."""
    from pipeline.stats import aggregate

    snapshots = [snapshot("a", "n1", 4.0, 5.0, [answered()] * 6 + [output_row(MISSING, PLACEMENT)] * 2,
                          latency_s=latency_s),
                 snapshot("b", "n1", 1.0, 2.0, [answered()] * 4, latency_s=latency_s),
                 snapshot("c", "n2", 3.0, 10.0, [answered()] * 3 + [output_row("prompt is too long", PLACEMENT)],
                          latency_s=latency_s)]
    return aggregate(snapshots, wall_s=wall_s, bin_tokens=8)


def test_busy_shares_have_one_denominator_each_for_an_actor_a_node_and_the_total():
    stats = job_stats(wall_s=20.0)
    a, b, c = stats["per_actor"]
    n1, n2 = stats["per_node"]
    totals = stats["totals"]
    # over active time: the group's busy time / its actors' summed active time
    assert [g["busy_share_of_active"] for g in (a, b, c)] == pytest.approx([4 / 5, 1 / 2, 3 / 10])
    assert n1["busy_share_of_active"] == pytest.approx((4 + 1) / (5 + 2))
    assert totals["busy_share_of_active"] == pytest.approx(8 / 17)
    # over the job's wall: busy time / (actors x wall), whatever the group
    assert [g["busy_share_of_wall"] for g in (a, b, c)] == pytest.approx([4 / 20, 1 / 20, 3 / 20])
    assert (n1["busy_share_of_wall"], n2["busy_share_of_wall"]) == pytest.approx((5 / 40, 3 / 20))
    assert totals["busy_share_of_wall"] == pytest.approx(8 / 60)
    # rates: tokens over active time, or over the wall; never a bare tokens_per_s or busy_fraction
    assert a["tokens_per_active_s"] == pytest.approx(80 / 5) and a["tokens_per_wall_s"] == pytest.approx(80 / 20)
    assert totals["tokens_per_wall_s"] == pytest.approx(sum(g["tokens_per_wall_s"] for g in (a, b, c)))
    for group in (a, n1, totals):
        assert "busy_fraction" not in group and "tokens_per_s" not in group


def test_stats_json_defines_every_share_and_rate_it_holds():
    stats = job_stats()
    keys = {key for group in (*stats["per_actor"], *stats["per_node"], stats["totals"]) for key in group}
    measured = {key for key in keys if "_share_of_" in key or re.fullmatch(r"tokens_per_\w+_s", key)}
    assert measured == {"busy_share_of_active", "busy_share_of_wall", "tokens_per_active_s", "tokens_per_wall_s"}
    assert measured | {"active_s", "wall_s", "gpu_utilization"} <= set(stats["definitions"])
    assert stats["totals"]["wall_s"] == 20.0


def test_the_table_labels_each_share_with_its_denominator():
    from pipeline.stats import format_table

    table = format_table(job_stats(wall_s=20.0))
    header = next(line for line in table.splitlines() if line.startswith("actor "))
    assert "busy/active" in header.split() and "busy/wall" in header.split()
    assert "busy/active = engine busy time / active time" in table
    assert "busy/wall = engine busy time / (actors x job wall)" in table
    assert "busy 5.0 s: 71% of its actors' active time, 12% of 2 actor(s) x job wall" in table  # node n1
    assert "of its actors' time" not in table  # the old, unnamed denominator
