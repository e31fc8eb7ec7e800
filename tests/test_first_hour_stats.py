"""The job's stats, specified for a reader: every share names its denominator, errors and the tensor-parallel
size are in the table, stats.json and stats.png, and the plot hides nothing behind its legends.

Snapshots are hand-made (no Ray), with busy and active times chosen so each share has one right value;
one test runs a real actor outside Ray to check that its snapshot carries the error messages.
"""
from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from actors.ray_data.actor_stats import ERROR_KINDS, OTHER_ERRORS, ActorStats
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
    assert measured == {"busy_share_of_active", "busy_share_of_wall", "error_share_of_rows",
                        "tokens_per_active_s", "tokens_per_wall_s"}
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


def test_error_rows_and_their_messages_are_counted_per_actor_and_for_the_job():
    stats = job_stats()
    a, b, c = stats["per_actor"]
    assert [g["error_rows"] for g in (a, b, c)] == [2, 0, 1]
    assert a["first_error"] == MISSING and a["common_errors"] == [{"message": MISSING, "rows": 2}]
    assert b["first_error"] is None and b["common_errors"] == []
    totals = stats["totals"]
    assert (totals["error_rows"], totals["rows"]) == (3, 16)
    assert totals["error_share_of_rows"] == pytest.approx(3 / 16)
    assert totals["first_error"] == MISSING  # a reported first
    assert totals["common_errors"] == [{"message": MISSING, "rows": 2}, {"message": "prompt is too long", "rows": 1}]
    assert [n["error_rows"] for n in stats["per_node"]] == [2, 1]


def test_the_table_says_how_many_rows_failed_and_why():
    from pipeline.stats import format_table

    table = format_table(job_stats())
    assert f"errors: 3 of 16 rows (19% of rows) failed; the first: {MISSING}" in table
    assert f"  2 rows: {MISSING}" in table and "  1 rows: prompt is too long" in table
    assert "(2 errors)" in table  # node n1's line


def test_a_job_without_errors_says_so():
    from pipeline.stats import aggregate, format_table

    stats = aggregate([snapshot("a", "n", 1.0, 2.0, [answered()] * 4)], wall_s=5.0, bin_tokens=8)
    assert stats["totals"]["first_error"] is None and "errors: none of 4 rows" in format_table(stats)


def test_an_actor_counts_a_bounded_number_of_distinct_messages_and_keeps_the_first():
    stats = ActorStats()
    stats.record([output_row(f"prompt of {n} tokens is too long", PLACEMENT) for n in range(ERROR_KINDS + 5)])
    shot = stats.snapshot({})
    assert shot["error_rows"] == ERROR_KINDS + 5
    assert len(shot["errors"]) == ERROR_KINDS + 1 and shot["errors"][OTHER_ERRORS] == 5
    assert sum(shot["errors"].values()) == shot["error_rows"]
    assert shot["first_error"]["message"] == "prompt of 0 tokens is too long"


def test_the_tensor_parallel_size_is_in_the_table_json_and_plot():
    from pipeline.stats import format_table
    from pipeline.stats_plot import stats_figure

    stats = job_stats()
    assert stats["totals"]["tensor_parallel_size"] == 2
    assert {g["tensor_parallel_size"] for g in (*stats["per_actor"], *stats["per_node"])} == {2}
    assert "3 actor(s) x tensor_parallel_size 2" in format_table(stats).splitlines()[0]
    assert "tensor_parallel_size 2" in figure_text(stats_figure(stats, {}))


def figure_text(fig) -> str:
    from matplotlib.text import Text

    return "\n".join(text.get_text() for text in fig.findobj(Text))


def test_the_plot_shows_the_error_rows_and_the_most_common_message():
    from pipeline.stats_plot import stats_figure

    fig = stats_figure(job_stats(), {})
    text = figure_text(fig)
    assert "error rows" in text and "8 (2 errors)" in text  # actor a's bar
    assert "errors: 3 of 16 rows" in text and "missing prompt" in text


def test_no_legend_of_the_plot_covers_a_bar_or_a_bar_label():
    from pipeline.stats_plot import stats_figure

    stats = job_stats()
    stats["per_actor"][0]["gpu_utilization"] = 100.0  # a full bar reaches the top of its panel
    fig = stats_figure(stats, {"1-8": np.array([0.5])})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legends = [ax for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 3  # rows, busy and per-node panels
    for ax in legends:
        box = ax.get_legend().get_window_extent(renderer)
        for artist in (*ax.patches, *ax.texts):
            assert not box.overlaps(artist.get_window_extent(renderer)), (ax.get_title(), artist)


@pytest.mark.parametrize(("latency_s", "unit"), [(0.1157, "ms"), (2.5, "s")])
def test_the_latency_axis_starts_at_zero_in_readable_units(latency_s, unit):
    """Equal latencies in every bin once zoomed the axis to microseconds around them, with an offset."""
    from pipeline.stats_plot import stats_figure

    stats = job_stats(latency_s=latency_s)
    fig = stats_figure(stats, {"1-8": np.full(5, latency_s), "9-16": np.full(3, latency_s)})
    fig.canvas.draw()
    ax = next(ax for ax in fig.axes if ax.get_title() == "latency by output length")
    bottom, top = ax.get_ylim()
    assert bottom == 0 and top >= (1000 if unit == "ms" else 1) * latency_s
    assert ax.get_ylabel() == f"latency ({unit})"
    assert ax.yaxis.get_offset_text().get_text() == ""


def test_an_actor_outside_ray_reports_its_error_messages_and_tensor_parallel_size(tmp_path):
    from actors import BlockServeActor
    from tests.pipeline_helpers import freeze_tiny_model

    model = str(freeze_tiny_model(tmp_path / "tiny"))
    actor = BlockServeActor(model=model, engine={"block_length": 8, "max_batch_size": 2},
                            sampling={"max_new_tokens": 8}, chat_template=True, torch_threads=1)
    outputs = asyncio.run(actor.generate_rows([{"prompt": None}, {"prompt": "count from 1 to 3"}]))
    assert [o["finish_reason"] == "error" for o in outputs] == [True, False]
    shot = actor.stats_snapshot()
    assert shot["error_rows"] == 1 and shot["tensor_parallel_size"] == 1
    assert shot["errors"] == {outputs[0]["__inference_error__"]: 1}
    assert shot["first_error"]["message"].startswith("missing prompt")
