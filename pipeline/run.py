"""The batch job: ``python -m pipeline.run --config configs/<name>.yaml [--input PATH_OR_URI]
[--output DIR] [--set key=value ...]``.

    read ─> ids ─> skip rows already in DIR/outputs ─> prompt lengths (CPU) ─> length buckets
         ─> build_processor(BlockServeProcessorConfig): one BlockServeActor per GPU (or N CPU actors)
         ─> DIR/outputs/*.parquet
    driver: actor stats ─> DIR/stats.json, a table on stdout, DIR/stats.png

Resume: outputs are keyed by the id column, and a rerun with the same ``--output`` generates only the
rows whose id is not yet in ``DIR/outputs`` (Ray Data writes each output file whole, from finished
blocks only; a file cut off by a crash is deleted and its rows redone). Rows written with an
``__inference_error__`` are removed first, so a rerun retries them. Within a run, an actor that dies
is restarted by Ray and its unfinished blocks are retried, so every row is still written exactly once.

Before it reads the input in full or starts an actor, the job checks what fails in seconds: the model
resolves (the engine's own message otherwise), the input has the prompt column, and the cluster holds the
actors beside the dataset's other tasks (``actors/ray_data/cluster_fit.py``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import uuid

import numpy as np
import ray

from actors.ray_data.cluster_fit import JOB_SETTINGS, ActorPool, ClusterFitError, check_fit
from pipeline import data, output_report, stats as job_stats, stats_plot, storage
from pipeline.config import ConfigError, PipelineConfig, load_config
from pipeline.failures import JobFailedError
from pipeline.output_report import ERROR_COLUMN
from pipeline.ray_connect import connect_ray
from pipeline.stderr_filter import benign_ray_lines_dropped

logger = logging.getLogger("pipeline")
LIGHT_TASK_CPUS = 0.25  # row reshaping and writes: a full CPU each would starve the actors on small nodes
SUBMITTED_JOB_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # set by `ray job submit` for its entrypoint


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pipeline.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="YAML file, e.g. configs/tiny-cpu.yaml")
    parser.add_argument("--input", help="overrides the config's input (path or URI)")
    parser.add_argument("--output", help="overrides the config's output directory (path or URI)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key, e.g. --set limit=32 --set engine.block_length=16")
    return parser.parse_args(argv)


def number_of_actors(config: PipelineConfig, num_blocks: int | None = None) -> int:
    """Configured, else as many as the cluster's nodes hold (GPU mode: each node's GPUs over an actor's, which
    is one per rank) or one (CPU); never more than ``num_blocks`` blocks of work."""
    wanted = config.actors.num_actors
    if wanted is None and config.uses_gpus:
        per_actor = config.actors.num_gpus
        wanted = int(ray.cluster_resources().get("GPU", 0) // per_actor)
        if per_actor > 1:  # a split engine's GPUs sit on one node: count each node's whole actors
            wanted = min(wanted, sum(int(node["Resources"].get("GPU", 0) // per_actor)
                                     for node in ray.nodes() if node.get("Alive")))
        if wanted == 0:
            raise ConfigError("the cluster has no GPUs yet: set actors.num_actors (the autoscaler adds "
                              "GPU nodes for them) or run CPU actors with actors.num_gpus: 0")
    wanted = wanted or 1
    return wanted if num_blocks is None else max(1, min(wanted, num_blocks))


def actor_pool(config: PipelineConfig, num_actors: int) -> ActorPool:
    """The job's actors, beside its light preprocess, postprocess and write tasks."""
    return ActorPool(num_actors, config.actors.num_cpus, config.actors.num_gpus, config.engine.tensor_parallel_size,
                     LIGHT_TASK_CPUS, JOB_SETTINGS)


def check_before_start(config: PipelineConfig) -> None:
    """What fails in seconds, checked before the input is read in full or an actor starts: the model, the
    input's columns and whether the cluster holds the actors. Raises ConfigError saying what to change."""
    try:
        data.check_model(config.model)
    except (ValueError, OSError) as error:
        raise ConfigError(f"model {config.model!r}: {error}") from None
    data.check_columns(config)
    try:
        check_fit(actor_pool(config, number_of_actors(config)))
    except ClusterFitError as error:
        raise ConfigError(str(error)) from None


def prepare(config: PipelineConfig, done_ids) -> ray.data.Dataset:
    """Rows still to generate, with ids and prompt lengths, materialized (the sort needs all anyway)."""
    options = ray.data.DataContext.get_current().execution_options
    keep_order = options.preserve_order
    options.preserve_order = config.limit is not None  # so a rerun's ``limit`` picks the same rows
    try:
        ds = data.read_input(config)
        ds = data.with_ids_not_done(ds, config.id_column, done_ids)
        return data.measure_prompts(ds, config).materialize()
    finally:
        options.preserve_order = keep_order


def bucket_edges(config: PipelineConfig, prepared) -> tuple[list[int], list[int]]:
    """The length buckets' edges, and the prompt prefixes more than one row shares."""
    columns = [data.LENGTH_COLUMN, data.PREFIX_COLUMN]
    batches = list(prepared.select_columns(columns).iter_batches(batch_format="numpy"))
    lengths, prefixes = (np.concatenate([b[column] for b in batches] or [np.zeros(0, int)]) for column in columns)
    edges = config.bucketing.edges
    shared = data.shared_prefixes(prefixes) if config.bucketing.group_prefixes else []
    return edges if edges is not None else data.quantile_edges(lengths, config.bucketing.num_buckets), shared


def processor_config(config: PipelineConfig, num_actors: int, registry_name: str):
    """The job's settings as the one way this project builds its Ray Data stage (README shows it)."""
    from actors.ray_data.processor import BlockServeProcessorConfig

    return BlockServeProcessorConfig(
        model_source=config.model, actor=config.actor_settings.model_copy(update={"stats_actor": registry_name}),
        should_continue_on_error=config.should_continue_on_error, concurrency=num_actors,
        batch_size=config.actors.batch_size, max_concurrent_batches=config.actors.max_concurrent_batches,
        num_gpus_per_actor=config.actors.num_gpus, num_cpus_per_actor=config.actors.num_cpus,
        max_restarts=config.actors.max_restarts, max_task_retries=config.actors.max_task_retries,
        actor_options=config.actors.actor_options,
        **({"actor_class": config.actors.actor_class} if config.actors.actor_class else {}))


def generate(ds: ray.data.Dataset, config: PipelineConfig, num_actors: int,
             registry_name: str) -> ray.data.Dataset:
    """``ds`` through one BlockServeActor per GPU (or ``num_actors`` CPU actors); every input column
    is kept next to the outputs."""
    from ray.data.llm import build_processor

    prompt_column = config.prompt_column
    light = {"num_cpus": LIGHT_TASK_CPUS}
    processor = build_processor(
        processor_config(config, num_actors, registry_name),
        preprocess=lambda row: row if prompt_column == "prompt" else {**row, "prompt": row[prompt_column]},
        postprocess=lambda row: row, preprocess_map_kwargs=light, postprocess_map_kwargs=light)
    ds = processor(ds)
    ds.context.execution_options.preserve_order = False  # inherited from ``prepare``; not needed here
    # dispatch only once every engine is loaded: otherwise the first actor up takes the first blocks
    # while the rest still load, and a short job ends up on one actor
    ds.context.wait_for_min_actors_s = config.actors.startup_timeout_s
    return ds


def generate_and_write(ds: ray.data.Dataset, config: PipelineConfig, num_actors: int,
                       outputs_dir: str) -> tuple[float, list[dict], list[dict], list[dict]]:
    """Generate and write every row; returns the wall time, the actors' stats snapshots, their deaths
    and the isolations of convicted batches."""
    from actors.ray_data.stats_registry import start_stats_registry

    registry_name = f"blockserve-stats-{uuid.uuid4().hex[:12]}"
    registry = start_stats_registry(registry_name)
    try:
        started = time.time()
        try:
            # writes are light: a full CPU each would starve them on small nodes, and then Ray Data
            # holds back the actors whose outputs pile up unwritten
            generate(ds, config, num_actors, registry_name).write_parquet(
                outputs_dir, ray_remote_args={"num_cpus": LIGHT_TASK_CPUS})
        except Exception as error:
            raise JobFailedError(error, ray.get(registry.deaths.remote())) from error
        wall_s = time.time() - started
        snapshots, deaths, isolations = ray.get([registry.collect.remote(), registry.deaths.remote(),
                                                 registry.isolations.remote()])
    finally:
        ray.kill(registry)
    return wall_s, snapshots, deaths, isolations


def run(config: PipelineConfig, config_path: str = "") -> dict | None:
    """Run the job on the connected Ray cluster; returns the stats written to stats.json (None if
    every row was already done)."""
    outputs_dir = storage.join(storage.absolute(config.output), "outputs")
    if not storage.is_uri(config.output) and len([n for n in ray.nodes() if n["Alive"]]) > 1:
        logger.warning("output %s is a local path on a multi-node cluster: each node would hold part of "
                       "the outputs; use a URI (s3://...) or a shared filesystem", config.output)
    check_before_start(config)
    if config.overwrite:
        storage.delete_dir(outputs_dir)
    failed = storage.drop_rows_with_value(outputs_dir, ERROR_COLUMN)
    done_ids = storage.read_column(outputs_dir, config.id_column)
    if len(done_ids) or failed:
        logger.info("resuming: %d rows already in %s are skipped; %d rows written with an %s are generated "
                    "again", len(done_ids), outputs_dir, failed, ERROR_COLUMN)
    logger.info("reading %s and measuring prompts with %s's tokenizer", config.input, config.model)
    prepared = prepare(config, done_ids)
    rows_todo = prepared.count()
    if rows_todo == 0:
        return None
    edges, shared = bucket_edges(config, prepared) if config.bucketing.enabled else ([], [])
    if config.bucketing.enabled:
        ds = data.route_by_length(prepared, edges, config.actors.batch_size, shared)
    else:
        ds = prepared.repartition(target_num_rows_per_block=config.actors.batch_size, strict=True)
    # the sort is a barrier anyway; finishing it first puts every batch in the object store before the
    # actors start, instead of sort tasks competing with them for CPU and feeding them in bursts. In
    # order: a bucket's short last block is then topped up from the next bucket, not from any bucket.
    options = ray.data.DataContext.get_current().execution_options
    keep_order, options.preserve_order = options.preserve_order, True
    try:
        ds = ds.materialize()
    finally:
        options.preserve_order = keep_order
    num_actors = number_of_actors(config, -(-rows_todo // config.actors.batch_size))
    logger.info("%d rows to generate, length buckets at %s tokens, %d shared prompt prefix(es), %d actor(s)",
                rows_todo, edges, len(shared), num_actors)

    wall_s, snapshots, deaths, isolations = generate_and_write(ds, config, num_actors, outputs_dir)
    written = storage.read_column(outputs_dir, config.id_column)
    block_length = job_stats.decoded_block_length(snapshots, config.engine.block_length)
    result = job_stats.aggregate(snapshots, wall_s, bin_tokens=block_length, deaths=deaths,
                                 isolations=isolations)
    result["run"] = {
        "config": config_path, "input": config.input, "output": config.output, "model": config.model,
        "rows_already_done": len(done_ids), "rows_generated": rows_todo, "bucket_edges": edges,
        "shared_prefixes": len(shared),
        "output_rows": len(written), "output_unique_ids": len(set(written.to_pylist())),
        "wall_s": wall_s, "finished_at": time.time(), "settings": config.model_dump(mode="json")}
    storage.write_bytes(storage.join(config.output, "stats.json"), json.dumps(result, indent=2).encode())
    latency_bins = job_stats.latency_samples_by_bin(snapshots, block_length)
    storage.write_bytes(storage.join(config.output, "stats.png"), stats_plot.plot_png(result, latency_bins))
    return result


def absolute_output(config: PipelineConfig) -> PipelineConfig:
    """``config`` with its output made absolute (a URI stays as it is). Under ``ray job submit`` a relative
    path is refused: it would resolve inside Ray's temporary copy of the working directory, not where
    the user looks."""
    if os.environ.get(SUBMITTED_JOB_ENV) and not storage.is_uri(config.output) and not os.path.isabs(config.output):
        raise ConfigError(f"output {config.output!r} is a relative path, and under `ray job submit` it would land "
                          f"in {os.getcwd()}, Ray's temporary copy of the working directory. Pass an absolute "
                          "path on a filesystem every node shares (--output /data/run1) or a storage URI "
                          "(--output s3://bucket/run1)")
    return config.model_copy(update={"output": storage.absolute(config.output)})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    overrides = list(args.overrides)
    overrides += [f"input={json.dumps(args.input)}"] if args.input else []
    overrides += [f"output={json.dumps(args.output)}"] if args.output else []
    try:
        config = absolute_output(load_config(args.config, overrides))
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    logger.info("writing to %s", config.output)
    connect_ray()
    try:
        with benign_ray_lines_dropped():
            result = run(config, args.config)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except Exception as error:  # the job failed part-way: what was written stays, a rerun resumes
        failure = error if isinstance(error, JobFailedError) else JobFailedError(error, [])
        logger.error("job failed: %s", failure)
        for line in job_stats.describe_deaths(failure.deaths):
            logger.error("%s", line)
        print(f"job failed; rerun with --output {config.output} to resume", file=sys.stderr)
        return 1
    outputs_dir = storage.join(config.output, "outputs")
    if result is None:
        print(f"nothing to do: every row is already in {outputs_dir} (--set overwrite=true starts over)")
        return 0
    run_info = result["run"]
    print(f"\n{job_stats.format_table(result)}")
    for note in (output_report.expected_answers(config), output_report.retry_hint(config)):
        if note:
            print(f"\n{note}")
    print(f"\n{run_info['output_rows']} rows ({run_info['output_unique_ids']} unique ids) in {outputs_dir}; "
          f"stats in {storage.join(config.output, 'stats.json')} and stats.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
