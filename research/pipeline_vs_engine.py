"""Does the Ray Data layer cost throughput? One BlockServeActor vs the bare engine, same prompts, one run.

    python -m research pipeline --rows 96 --caps 32,64,96,128 --repeats 3 [--with-sequential]

Both sides run the same frozen copy of the model with the same torch threads. The bare engine gets every
prompt at once (``engine.generate``). The pipeline feeds them through ``ray.data`` in batches to one
actor that keeps ``--concurrency`` batches in flight on its engine loop; its throughput is counted over
the actor's active time (first row queued to last row finished), so Ray Data's dispatch gaps between
batches count against it, while actor start-up and the read/write stages are reported separately.
``--with-sequential`` adds the same actor with one batch in flight, i.e. a drain-and-refill bubble at
every batch boundary, for contrast. Rows cycle through the ``--caps`` output caps (a per-row
``max_new_tokens`` column), so requests finish at different block boundaries as in real traffic: a
drained batch would show as a drop in the effective compute ratio. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.summary import median_item

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_prompts(rows: int, caps: list[int]) -> list[dict]:
    from tinylm.tasks import read_jsonl

    data = read_jsonl(REPO_ROOT / "assets" / "data" / "demo.jsonl")[:rows]
    rows = [{"id": row["id"], "prompt": row["prompt"], "max_new_tokens": caps[index % len(caps)]}
            for index, row in enumerate(data)]
    # in prompt-length order, as the pipeline's bucketing stage delivers them (the engine sorts anyway)
    return sorted(rows, key=lambda row: len(row["prompt"]))


def run_engine(model: str, engine_config: dict, rows: list[dict]) -> dict:
    from engine import BlockServeEngine, EngineConfig, SamplingParams

    engine = BlockServeEngine.from_pretrained(model, EngineConfig(**engine_config))
    prompts = [[{"role": "user", "content": row["prompt"]}] for row in rows]
    started = time.perf_counter()
    outputs = engine.generate(prompts, [SamplingParams(max_new_tokens=row["max_new_tokens"]) for row in rows])
    wall_s = time.perf_counter() - started
    stats = engine.stats()
    tokens = sum(len(output.token_ids) for output in outputs)
    return {"generated_tokens": tokens, "wall_s": wall_s, "tokens_per_s": tokens / wall_s,
            "useful_row_fraction": stats.useful_row_fraction,
            "effective_compute_ratio": stats.effective_compute_ratio,
            "padding_fraction": stats.padding_fraction, "denoise_steps": stats.denoise_steps}


def run_pipeline(model: str, engine_config: dict, rows: list[dict], batch_size: int, concurrency: int,
                 threads: int) -> dict:
    import ray

    from actors import BlockServeActor
    from actors.ray_data.stats_registry import start_stats_registry

    name = f"bench-stats-{uuid.uuid4().hex[:8]}"
    registry = start_stats_registry(name)
    ds = ray.data.from_items(rows).map_batches(
        BlockServeActor, batch_size=batch_size, batch_format="pyarrow", num_cpus=0.5,
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=concurrency,
                                           max_tasks_in_flight_per_actor=concurrency),
        fn_constructor_kwargs={"model": model, "engine": engine_config, "torch_threads": threads,
                               "stats_actor": name})
    ds.context.wait_for_min_actors_s = 600
    started = time.perf_counter()
    outputs = ds.take_all()
    e2e_s = time.perf_counter() - started
    [snapshot] = ray.get(registry.collect.remote())
    ray.kill(registry)
    tokens = sum(row["num_generated_tokens"] for row in outputs)
    engine_stats = snapshot["engine"]
    return {"generated_tokens": tokens, "active_s": snapshot["active_s"], "busy_s": snapshot["busy_s"],
            "tokens_per_s": tokens / snapshot["active_s"],
            "busy_fraction": snapshot["busy_s"] / snapshot["active_s"],
            "idle_between_batches_s": snapshot["idle_s"],
            "useful_row_fraction": engine_stats["useful_row_fraction"],
            "effective_compute_ratio": engine_stats["effective_compute_ratio"],
            "padding_fraction": engine_stats["padding_fraction"],
            "denoise_steps": engine_stats["denoise_steps"], "batches": snapshot["batches"],
            "end_to_end_s_incl_actor_startup": e2e_s}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--caps", default="32,64,96,128", help="per-row max_new_tokens, cycled")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=3, help="batches in flight on the actor")
    parser.add_argument("--max-batch-size", type=int, default=16, help="engine rows per step")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3, help="alternating engine/pipeline runs")
    parser.add_argument("--with-sequential", action="store_true")
    args = parser.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    import ray
    import torch

    torch.set_num_threads(args.threads)
    model = args.model
    if model == "tiny":  # a frozen copy: a training run may re-export assets/tiny meanwhile
        model = str(Path(tempfile.mkdtemp(prefix="bench-tiny-")) / "tiny")
        shutil.copytree(REPO_ROOT / "assets" / "tiny", model)
    engine_config = {"max_batch_size": args.max_batch_size}
    caps = [int(cap) for cap in args.caps.split(",")]
    rows = load_prompts(args.rows, caps)
    # Ray runs its workers at nice 15; on a shared machine that alone would slow the actor against a
    # bare engine running at nice 0 in this process, so both sides get the same priority here
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config={"worker_niceness": 0},
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO_ROOT), "RAY_AUTH_MODE": "disabled"}})
    result = {"rows": len(rows), "caps": caps, "batch_size": args.batch_size,
              "concurrency": args.concurrency, "engine_config": engine_config, "threads": args.threads}
    # alternate the two sides and keep the median of each, so load from other processes on the machine
    # (which varies over seconds) does not decide the comparison
    engine_runs, pipeline_runs = [], []
    for _ in range(args.repeats):
        engine_runs.append(run_engine(model, engine_config, rows))
        pipeline_runs.append(run_pipeline(model, engine_config, rows, args.batch_size, args.concurrency,
                                          args.threads))
    result["engine"] = median_item(engine_runs, key=lambda run: run["tokens_per_s"])
    result["pipeline"] = median_item(pipeline_runs, key=lambda run: run["tokens_per_s"])
    result["tokens_per_s_pairs"] = [[e["tokens_per_s"], p["tokens_per_s"]]
                                    for e, p in zip(engine_runs, pipeline_runs)]
    if args.with_sequential:
        result["pipeline_one_batch_in_flight"] = run_pipeline(model, engine_config, rows, args.batch_size,
                                                              1, args.threads)
    result["tokens_per_s_ratio"] = result["pipeline"]["tokens_per_s"] / result["engine"]["tokens_per_s"]
    for key in ("useful_row_fraction", "effective_compute_ratio"):
        result[f"{key}_delta"] = result["pipeline"][key] - result["engine"][key]
    result["load_average_1m"] = os.getloadavg()[0]  # other processes on the machine skew both sides
    print(json.dumps(result, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
