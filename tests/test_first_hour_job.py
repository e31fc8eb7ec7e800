"""A new user's first hour with the batch job and ``build_processor``: what would hang or fail late fails
before any actor starts, with a message that says what to change; error rows are retried on resume; the
output path printed is where the outputs are."""
from __future__ import annotations

import json
import logging

import pytest

from actors.ray_data.cluster_fit import Cluster, ClusterFitError, Resources, fit_problem
from pipeline.config import load_config
from tests.pipeline_helpers import REPO_ROOT, TINY_CONFIG, demo_rows, read_outputs, run_small_job

TWO_CPUS = Cluster((Resources(cpus=2.0),))


def readme_processor_config(**settings):
    """The README's ``build_processor`` line, with ``settings`` added."""
    from actors import BlockServeProcessorConfig

    engine_kwargs = {"max_batch_size": 16, **settings.pop("engine_kwargs", {})}
    return BlockServeProcessorConfig(**{"model_source": "tiny", "engine_kwargs": engine_kwargs, "concurrency": 2,
                                        "batch_size": 16, **settings})


def readme_pool(**settings):
    from actors.ray_data.processor import TASK_CPUS

    return readme_processor_config(**settings).actor_pool(TASK_CPUS)


# -- the cluster holds the actors, or the message says what to change --------------------------------
def test_readme_build_processor_line_leaves_a_cpu_free_on_two_cpus():
    assert fit_problem(readme_pool(), TWO_CPUS) is None


def test_actors_that_take_every_cpu_are_refused_naming_concurrency_and_num_cpus_per_actor():
    problem = fit_problem(readme_pool(num_cpus_per_actor=1.0), TWO_CPUS)
    assert problem.startswith("2 actor(s) of 1 CPUs take 2 of the cluster's 2 CPUs and leave 0")
    assert "Set num_cpus_per_actor to at most 0.5, or set concurrency to at most 1" in problem


def test_a_cpu_engine_split_in_two_reserves_a_cpu_share_per_rank_and_is_refused_by_name():
    problem = fit_problem(readme_pool(engine_kwargs={"tensor_parallel_size": 2}), TWO_CPUS)
    assert "2 actor(s) of 1 CPUs (2 ranks of 0.5) take 2 of the cluster's 2 CPUs" in problem
    assert "Set num_cpus_per_actor to at most 0.25, or set concurrency to at most 1" in problem
    assert 'lower engine_kwargs["tensor_parallel_size"]' in problem


def test_an_actor_larger_than_every_node_is_refused_with_the_largest_node():
    from pipeline.run import actor_pool

    config = load_config(REPO_ROOT / "configs" / "nemotron-labs-diffusion-8b.yaml")  # 4 CPUs, 1 GPU an actor
    problem = fit_problem(actor_pool(config, 1), Cluster((Resources(cpus=2.0, gpus=1.0),)))
    assert problem == ("an actor asks for 4 CPUs but no node has more than 2; Ray would wait for one forever. "
                       "Set actors.num_cpus to at most 2")


def test_more_gpu_actors_than_a_fixed_cluster_holds_are_refused_and_an_autoscaler_may_add_nodes():
    from pipeline.run import actor_pool

    config = load_config(REPO_ROOT / "configs" / "llada-8b-instruct.yaml", ["actors.num_actors=4"])
    fixed = Cluster((Resources(cpus=8.0), Resources(cpus=64.0, gpus=2.0)))
    problem = fit_problem(actor_pool(config, 4), fixed)
    assert problem.startswith("the cluster's nodes hold 2 actor(s) of 4 CPUs and 1 GPUs, not the 4 asked for")
    assert problem.endswith("Set actors.num_actors to at most 2, or add GPU nodes")
    autoscaling = Cluster((Resources(cpus=8.0),), addable=(Resources(cpus=192.0, gpus=8.0),))
    assert fit_problem(actor_pool(config, 4), autoscaling) is None


def test_a_processor_that_cannot_start_raises_when_applied_before_any_actor_starts(ray_cluster):
    from ray.data.llm import build_processor

    config = readme_processor_config(concurrency=4, num_cpus_per_actor=1.0)  # the session cluster's 4 CPUs
    processor = build_processor(config, preprocess=lambda row: {"prompt": row["prompt"]})
    dataset = ray_cluster.data.from_items(demo_rows(4))
    with pytest.raises(ClusterFitError, match="take 4 of the cluster's 4 CPUs and leave 0, less than the 1"):
        processor(dataset)  # lazy: the dataset has not run, so no actor was created


def test_a_job_whose_actor_no_node_holds_exits_at_once_naming_actors_num_cpus(ray_cluster, tmp_path, capsys):
    output = tmp_path / "out"
    assert run_small_job("tiny", output, "actors.num_cpus=8") == 2
    assert "an actor asks for 8 CPUs but no node has more than 4" in capsys.readouterr().err
    assert not output.exists()  # refused before reading the input or starting an actor


# -- the input's columns and the model, before any actor starts ------------------------------------
def test_a_wrong_prompt_column_is_refused_listing_the_input_columns(ray_cluster, tmp_path, capsys):
    output = tmp_path / "out"
    assert run_small_job("tiny", output, "prompt_column=question") == 2
    err = capsys.readouterr().err
    assert "has no prompt column 'question' (nor a 'messages' column of chats)" in err
    assert "its columns: id, task, prompt, answer, start, stop. Set prompt_column" in err
    assert not output.exists()


def test_a_named_id_column_the_input_lacks_is_refused(ray_cluster, tmp_path, capsys):
    assert run_small_job("tiny", tmp_path / "out", "id_column=row_id") == 2
    assert "has no id column 'row_id'" in capsys.readouterr().err


@pytest.mark.parametrize("model, message", [
    ("/nonexistent/checkpoint", "unknown model '/nonexistent/checkpoint': not 'tiny', not a directory, not a hub id"),
    ("no-such-org/no-such-model", "could not be fetched from the Hugging Face hub"),
])
def test_a_model_no_actor_could_load_fails_in_the_driver_with_the_engines_message(
        ray_cluster, tmp_path, capsys, model, message):
    output = tmp_path / "out"
    assert run_small_job(model, output) == 2
    assert message in capsys.readouterr().err
    assert not output.exists()


def test_a_checkpoint_directory_without_config_is_refused_by_the_engines_rule(ray_cluster, tmp_path, capsys):
    assert run_small_job(str(tmp_path), tmp_path / "out") == 2
    assert f"model directory {tmp_path} has no config.json" in capsys.readouterr().err


# -- resume retries error rows; the printed output path is where the outputs are -----------------------
def write_jsonl(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_a_rerun_retries_rows_written_with_an_error_and_prints_the_absolute_output(
        ray_cluster, tmp_path, monkeypatch, capsys, caplog):
    monkeypatch.chdir(tmp_path)  # a relative --output resolves here, not in a worker's directory
    rows = demo_rows(3)
    broken = [{**row, "prompt": None} if index == 1 else row for index, row in enumerate(rows)]
    write_jsonl(tmp_path / "in.jsonl", broken)
    assert run_small_job("tiny", "out", input_path=tmp_path / "in.jsonl") == 0
    first = capsys.readouterr().out
    assert f"1 row(s) in {tmp_path / 'out' / 'outputs'} have an __inference_error__; rerun with --output" in first
    assert first.rstrip().splitlines()[-1].startswith(f"3 rows (3 unique ids) in {tmp_path / 'out' / 'outputs'};")

    write_jsonl(tmp_path / "in.jsonl", rows)  # the user fixes the row; the same --output resumes
    with caplog.at_level(logging.INFO, logger="pipeline"):
        assert run_small_job("tiny", "out", input_path=tmp_path / "in.jsonl") == 0
    assert "2 rows already in" in caplog.text
    assert "1 rows written with an __inference_error__ are generated again" in caplog.text
    written = read_outputs(tmp_path / "out")
    assert sorted(row["id"] for row in written) == sorted(row["id"] for row in rows)
    assert not any(row["__inference_error__"] for row in written)


def test_a_submitted_job_refuses_a_relative_output(monkeypatch, capsys):
    from pipeline.run import main

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")  # what `ray job submit` sets for its entrypoint
    assert main(["--config", str(TINY_CONFIG), "--output", "runs/mine"]) == 2
    err = capsys.readouterr().err
    assert "output 'runs/mine' is a relative path, and under `ray job submit` it would land in" in err
    assert "Pass an absolute path" in err and "s3://bucket/run1" in err


def test_a_local_instance_keeps_token_auth_and_drops_only_rays_notice_of_it():
    from ray._private.authentication import authentication_token_setup as ray_auth

    from pipeline.ray_connect import RAY_AUTH_LOGGER, without_token_auth_notice

    assert ray_auth.logger.name == RAY_AUTH_LOGGER
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    ray_auth.logger.addHandler(handler)
    ray_auth.logger.addFilter(without_token_auth_notice)  # as connect_ray does before it starts an instance
    try:
        ray_auth._warn_token_auth_enabled()  # what ray.init logs for a new local instance, RAY_AUTH_MODE unset
        ray_auth._warn_token_auth_disabled()  # another notice, which stays
    finally:
        ray_auth.logger.removeFilter(without_token_auth_notice)
        ray_auth.logger.removeHandler(handler)
    assert [record.getMessage().split(".")[0] for record in records] == [
        "Token authentication is disabled for this Ray cluster"]
