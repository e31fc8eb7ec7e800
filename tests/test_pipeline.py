"""The batch job on the session's local Ray cluster: small runs (8-12 rows, 32 new tokens) on the tiny model."""
from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pipeline.config import ConfigError, load_config
from tests.pipeline_helpers import REPO_ROOT, demo_rows, freeze_tiny_model, read_outputs, run_small_job

TINY_CONFIG = REPO_ROOT / "configs" / "tiny-cpu.yaml"
OUTPUT_COLUMNS = {"generated_text", "generated_tokens", "num_generated_tokens", "num_input_tokens",
                  "time_taken_llm", "__inference_error__", "finish_reason", "num_blocks", "queue_s",
                  "actor_id", "node_id", "device"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny"))


def fail_after_rows(rows: int, mode: str) -> tuple[str, ...]:
    """Overrides that run the job on the tests' fault-injecting actor (tests/fault_injection.py), one
    batch at a time, so the batches before the fault have been returned when it strikes."""
    return ("actors.actor_class=tests.fault_injection.FailAfterRows", "actors.max_concurrent_batches=1",
            f"actors.actor_options.fail_after_rows={rows}", f"actors.actor_options.fail_mode={mode}")


def stats_of(output: Path) -> dict:
    return json.loads((output / "stats.json").read_text())


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-cpu", "llada-8b-instruct", "dream-7b-instruct", "sdar-8b-chat",
                                  "llada2-mini", "nemotron-labs-diffusion-8b"])
def test_shipped_configs_validate(name):
    config = load_config(REPO_ROOT / "configs" / f"{name}.yaml")
    assert config.uses_gpus == (name != "tiny-cpu")
    if config.uses_gpus:
        assert config.dtype == "bfloat16" and config.actors.num_gpus == 1 and config.engine.token_budget


@pytest.mark.parametrize("text, key, words", [
    ("input: a.jsonl\noutput: o\nlimt: 3\n", "limt", "unknown key"),
    ("input: a.jsonl\noutput: o\nengine: {block_lenght: 16}\n", "engine.block_lenght", "unknown key"),
    ("input: a.jsonl\noutput: o\nactors: {num_gpu: 1}\n", "actors.num_gpu", "unknown key"),
    ("input: a.jsonl\noutput: o\nengine: {compile: true}\n", "engine", "compile: not an engine setting"),
    ("input: a.jsonl\noutput: o\ncompile: true\nbatch_invariant: true\n", "batch_invariant", "compile=True"),
    ("input: a.jsonl\noutput: o\nlimit: many\n", "limit", "valid integer"),
    ("input: a.jsonl\noutput: o\nengine: {max_batch_size: lots}\n", "engine", "max_batch_size: must be a positive"),
    ("input: a.jsonl\noutput: o\nsampling: {max_new_tokens: 0}\n", "sampling", "must be positive"),
    ("input: a.jsonl\nlimit: 3\n", "output", "required"),
])
def test_bad_config_names_the_key_and_the_file(tmp_path, text, key, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert str(path) in message and f": {key}" in message and words in message


def test_set_overrides_are_validated_like_the_file():
    config = load_config(TINY_CONFIG, ["engine.block_length=16", "limit=null", "actors.num_actors=3"])
    assert (config.engine.block_length, config.limit, config.actors.num_actors) == (16, None, 3)
    with pytest.raises(ConfigError, match="sampling.tempreture: unknown key"):
        load_config(TINY_CONFIG, ["sampling.tempreture=1"])


def test_gpu_mode_runs_one_actor_per_gpu_of_the_cluster(monkeypatch):
    import ray

    from pipeline.run import number_of_actors

    config = load_config(REPO_ROOT / "configs" / "llada-8b-instruct.yaml")
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 64.0, "GPU": 8.0})
    assert number_of_actors(config, num_blocks=100) == 8
    assert number_of_actors(config, num_blocks=3) == 3  # never more actors than blocks of work
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 64.0})
    with pytest.raises(ConfigError, match="no GPUs"):
        number_of_actors(config, num_blocks=100)


def snapshot(actor_id: str, rows: int, tokens: int, steps: int, useful: float, busy: float) -> dict:
    engine = {"generated_tokens": tokens, "denoise_steps": steps,
              "effective_compute_ratio": useful, "useful_row_fraction": useful, "padding_fraction": 0.1}
    return {"actor_id": actor_id, "instance_id": f"{actor_id}-{rows}", "node_id": "n", "device": "cpu",
            "rows": rows, "error_rows": 0, "batches": 1, "busy_s": busy, "active_s": busy + 1,
            "memory_peak_bytes": rows, "gpu_utilization": None, "engine": engine,
            "samples": {"num_generated_tokens": [32] * rows, "latency_s": [1.0] * rows}}


def test_stats_add_up_across_actors_and_the_incarnations_of_a_restarted_actor():
    from pipeline.stats import aggregate, format_table

    snapshots = [snapshot("a", 4, 100, 10, 1.0, 2.0), snapshot("a", 8, 300, 30, 0.5, 4.0),
                 snapshot("b", 6, 200, 20, 0.8, 3.0)]
    stats = aggregate(snapshots, wall_s=10.0, bin_tokens=32)
    a, b = stats["per_actor"]
    assert (a["incarnations"], a["rows"], a["generated_tokens"], a["busy_s"]) == (2, 12, 400, 6.0)
    assert a["useful_row_fraction"] == pytest.approx((10 * 1.0 + 30 * 0.5) / 40)  # weighted by steps
    assert a["tokens_per_active_s"] == pytest.approx(400 / 8.0)  # over the actor's own active time
    totals = stats["totals"]
    assert (totals["actors"], totals["restarts"], totals["rows"]) == (2, 1, 18)
    assert totals["tokens_per_wall_s"] == pytest.approx(600 / 10.0)  # over the job's wall time
    assert stats["latency_by_output_length"] == [
        {"output_tokens": "1-32", "rows": 18, "p50_s": 1.0, "p90_s": 1.0, "max_s": 1.0}]
    assert "TOTAL (2)" in format_table(stats)


def test_latency_bins_follow_the_block_the_actors_decoded_with():
    from pipeline.stats import decoded_block_length

    settled = [snapshot("a", 4, 100, 10, 1.0, 2.0) | {"block_length": 4}]
    assert decoded_block_length(settled, configured=None) == 4  # an SDAR checkpoint's trained block
    assert decoded_block_length(settled, configured=8) == 8
    assert decoded_block_length([snapshot("a", 4, 100, 10, 1.0, 2.0)], configured=None) == 32


# --------------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def finished_run(ray_cluster, tiny_model, tmp_path_factory):
    """12 demo rows on 2 actors scheduled on the session's 2 fake GPUs."""
    output = tmp_path_factory.mktemp("run") / "out"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = run_small_job(tiny_model, output, "limit=12", "actors.num_gpus=1", "actors.num_actors=2")
    return code, output, printed.getvalue()


def test_job_writes_every_row_once_with_outputs_and_stats(finished_run):
    code, output, printed = finished_run
    rows = read_outputs(output)
    ran = len({r["actor_id"] for r in rows})  # Ray Data hands batches to ready actors: one may take all three
    assert code == 0 and 1 <= ran <= 2
    assert f"TOTAL ({ran})" in printed and "12 rows (12 unique ids)" in printed
    assert sorted(r["id"] for r in rows) == [r["id"] for r in demo_rows(12)]
    assert OUTPUT_COLUMNS | {"id", "prompt", "answer", "num_prompt_tokens", "length_bucket"} <= set(rows[0])
    assert all(r["__inference_error__"] == "" and r["finish_reason"] in ("eos", "length") for r in rows)
    stats = stats_of(output)
    totals = stats["totals"]
    assert (totals["actors"], totals["rows"], totals["restarts"]) == (ran, 12, 0)
    assert totals["generated_tokens"] == sum(r["num_generated_tokens"] for r in rows)
    assert stats["run"]["output_rows"] == stats["run"]["output_unique_ids"] == 12
    assert {a["actor_id"] for a in stats["per_actor"]} == {r["actor_id"] for r in rows}
    for key in ("tokens_per_wall_s", "effective_compute_ratio", "useful_row_fraction", "padding_fraction",
                "busy_s", "idle_between_batches_s", "memory_peak_bytes", "gpu_utilization"):
        assert key in totals
    assert (output / "stats.png").read_bytes()[:4] == b"\x89PNG"


def test_the_demo_prints_a_few_rows_with_their_expected_answers_beside_them(finished_run):
    _, output, printed = finished_run
    rows = read_outputs(output)
    right = sum(r["generated_text"] == r["answer"] for r in rows)
    assert f"{right} of 12 outputs equal the input's expected answer" in printed
    first = min(rows, key=lambda r: r["id"])
    verdict = "right" if first["generated_text"] == first["answer"] else "wrong"
    assert printed.count("    expected: ") == 5
    assert f"  {first['prompt'][:57]}" in printed and f"[{verdict}]" in printed


def test_a_wrong_answer_is_shown_around_the_word_where_it_first_differs():
    from pipeline.output_report import around, first_difference

    expected = " ".join(str(n) for n in range(10, 40))
    skipped = expected.replace(" 31 ", " ")
    assert first_difference(expected, expected) is None
    assert first_difference(skipped, expected) == 21
    assert around(skipped, 21) == "... 25 26 27 28 29 30 32 33 34 35 36 37 ..."
    assert around(expected, 21) == "... 25 26 27 28 29 30 31 32 33 34 35 36 ..."
    assert first_difference("1 2 3", "1 2 3 4") == 3 and around("1 2 3", 3) == "1 2 3"


def test_rows_of_similar_prompt_length_travel_together(finished_run):
    _, output, _ = finished_run
    rows = read_outputs(output)
    edges = stats_of(output)["run"]["bucket_edges"]
    assert len(edges) == 1  # bucketing.num_buckets=2
    for row in rows:
        assert row["length_bucket"] == int(row["num_prompt_tokens"] >= edges[0])
    for file in (output / "outputs").glob("*.parquet"):  # each written block comes from one batch
        lengths = pq.read_table(file).column("num_prompt_tokens").to_pylist()
        assert lengths == sorted(lengths)


def test_an_engine_death_is_restarted_every_row_written_once_and_the_summary_says_why(
        ray_cluster, tiny_model, tmp_path, capsys):
    """Parquet input without an id column: ids are generated from the rows' content."""
    source = [{"prompt": r["prompt"], "task": r["task"]} for r in demo_rows(8, start=200)]
    input_path = tmp_path / "prompts.parquet"
    pq.write_table(pa.Table.from_pylist(source), input_path)
    output = tmp_path / "out"
    capsys.readouterr()
    code = run_small_job(tiny_model, output, *fail_after_rows(4, "engine"), input_path=input_path)
    assert code == 0
    rows = read_outputs(output)
    assert sorted(r["prompt"] for r in rows) == sorted(r["prompt"] for r in source)
    assert len({r["id"] for r in rows}) == 8
    stats = stats_of(output)
    assert stats["totals"]["restarts"] == 1 and stats["per_actor"][0]["incarnations"] == 2
    (death,) = stats["actor_deaths"]
    assert death["cause"] == "RuntimeError: injected engine fault after 4 rows (fail_after_rows)"
    assert (f"actor {death['actor_id'][:8]} died once (Ray restarted it and retried its batches); "
            f"last cause: {death['cause']}") in capsys.readouterr().out


def poison_job(tiny_model: str, tmp_path: Path, *overrides: str) -> tuple[int, list[dict], str]:
    """Nine demo rows, one of which kills its actor's process whenever its batch reaches the engine."""
    source = demo_rows(9, start=500)
    input_path = tmp_path / "prompts.jsonl"
    input_path.write_text("".join(json.dumps(row) + "\n" for row in source))
    output = tmp_path / "out"
    code = run_small_job(tiny_model, output, "actors.actor_class=tests.fault_injection.ExitOnPrompt",
                   f"actors.actor_options.exit_on_prompt={json.dumps(source[4]['prompt'])}", *overrides,
                   input_path=input_path)
    return code, source, str(output)


def test_a_row_whose_engine_step_fails_every_time_is_flagged_alone_and_the_rest_finish(
        ray_cluster, tiny_model, tmp_path):
    """The step raises, so each death reports its cause; its batch's other rows are generated."""
    code, source, output = poison_job(tiny_model, tmp_path, "actors.actor_options.exit_with=engine")
    assert code == 0
    rows = {r["id"]: r for r in read_outputs(Path(output))}
    assert sorted(rows) == sorted(r["id"] for r in source)
    (flagged,) = [r for r in rows.values() if r["__inference_error__"]]
    assert flagged["id"] == source[4]["id"]
    stats = stats_of(Path(output))
    deaths, isolation = stats["actor_deaths"], stats["batch_isolation"]
    assert len(deaths) == 2 + isolation["deaths"] and (isolation["batches"], isolation["rows_flagged"]) == (1, 1)
    cause = f"RuntimeError: injected engine fault on prompt {source[4]['prompt']!r}"
    assert all(death["cause"] == cause for death in deaths)
    assert f"died all {len(deaths)} times this row was being generated, the last time with no other row" in \
        flagged["__inference_error__"]
    assert flagged["__inference_error__"].endswith(f"last cause: {cause}")
    assert all(r["finish_reason"] in ("eos", "length") for r in rows.values() if not r["__inference_error__"])


def test_without_continue_on_error_a_batch_that_kills_its_actor_every_time_ends_the_job(
        ray_cluster, tiny_model, tmp_path, caplog):
    code, _, _ = poison_job(tiny_model, tmp_path, "should_continue_on_error=false")
    assert code == 1
    assert "was running in 2 engine deaths and is not run again" in caplog.text
    assert "died 2 times" in caplog.text


def test_job_that_fails_part_way_resumes_to_every_row_exactly_once(ray_cluster, tiny_model, tmp_path,
                                                                    capsys):
    """CSV input. The injected error fails the job after the actor's first batch; a rerun with the same
    output generates only the rows missing there (a file cut off mid-write is dropped and redone)."""
    source = demo_rows(8, start=300)
    input_path = tmp_path / "prompts.csv"
    pacsv.write_csv(pa.Table.from_pylist(source), input_path)
    output = tmp_path / "out"
    code = run_small_job(tiny_model, output, *fail_after_rows(4, "error"), input_path=input_path)
    assert code == 1
    written_before = len(read_outputs(output)) if (output / "outputs").exists() else 0
    assert written_before < 8
    (output / "outputs").mkdir(parents=True, exist_ok=True)
    (output / "outputs" / "torn.parquet").write_bytes(b"PAR1 cut off mid-write")

    assert run_small_job(tiny_model, output, input_path=input_path) == 0
    rows = read_outputs(output)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in source)
    run = stats_of(output)["run"]
    assert run["rows_already_done"] == written_before and run["rows_generated"] == 8 - written_before
    assert not (output / "outputs" / "torn.parquet").exists()

    capsys.readouterr()
    assert run_small_job(tiny_model, output, input_path=input_path) == 0
    assert "nothing to do" in capsys.readouterr().out and len(read_outputs(output)) == 8


def test_a_local_instance_the_job_starts_runs_its_workers_at_the_jobs_priority():
    """Not at Ray's default nice 15, which starves the actors beside any busy process."""
    code = ("import os, ray; from pipeline.ray_connect import connect_ray; connect_ray(); "
            "print('worker niceness', ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote()))")
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_worker_niceness", "RAY_ADDRESS")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert "worker niceness 0" in done.stdout, done.stdout + done.stderr

