"""The batch job on a simulated 2-node cluster: ``ray.cluster_utils.Cluster``, fake GPUs, real job.

A head node with 1 fake GPU and a worker node with 2 (1 CPU each, on this machine) run ``pipeline.run``
with ``actors.num_gpus=1`` and ``actors.num_actors=null``, so the job itself counts the cluster's GPUs and
starts one actor per GPU: 3 actors, 1 on the head and 2 on the worker. Input: 24 demo rows picked (with
the frozen model's own tokenizer) as 3 groups of 8 prompts whose lengths do not overlap, in demo order, so
the job's quantile edges (``bucketing.num_buckets=3``) split them into 3 buckets of exactly 2 batches of 4;
one 32-token block per row.

Why a subprocess: the suite shares one ``ray.init`` (``conftest.ray_cluster``) and a process can be
connected to only one Ray cluster, so the multi-node scenario runs in its own interpreter
(``python -m tests.test_multinode``: build the Cluster, ``ray.init(address=cluster.address)``, run
``pipeline.run.main``, shut down). It never touches the shared instance, whatever order tests run in.
The child writes ``nodes.json`` (the cluster's nodes and their GPUs) beside the job's output; the test
reads that and the job's own files (outputs/*.parquet, stats.json, stats.png).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.pipeline_helpers import REPO_ROOT, demo_rows, freeze_tiny_model, read_outputs

TINY_CONFIG = REPO_ROOT / "configs" / "tiny-cpu.yaml"
NODE_GPUS = (1, 2)  # head, worker
BATCH_SIZE, NUM_BUCKETS, BATCHES_PER_BUCKET = 4, 3, 2
ROWS = NUM_BUCKETS * BATCHES_PER_BUCKET * BATCH_SIZE
SCENARIO_TIMEOUT_S = 840  # a safety net, not a bar: the scenario's fixture took up to 188 s beside two busy
# loops on a 2-core machine (2026-12-02); it must stay under pytest-timeout's 900 s for the whole test


# --------------------------------------------------------------------------------------------------
# The child process: cluster up, the job, cluster down
# --------------------------------------------------------------------------------------------------

def job_args(model: str, input_path: Path, output: Path) -> list[str]:
    overrides = [f"model={model}", "sampling.max_new_tokens=32", "limit=null",
                 "actors.num_gpus=1", "actors.num_actors=null",  # null: one actor per GPU of the cluster
                 "actors.num_cpus=0.25", "torch_threads=1", f"actors.batch_size={BATCH_SIZE}",
                 "actors.max_concurrent_batches=2", "actors.startup_timeout_s=300",
                 f"bucketing.num_buckets={NUM_BUCKETS}"]
    return ["--config", str(TINY_CONFIG), "--input", str(input_path), "--output", str(output)] + [
        arg for override in overrides for arg in ("--set", override)]


def run_scenario(model: str, input_path: Path, output: Path) -> int:
    import ray
    from ray.cluster_utils import Cluster

    from pipeline.run import main

    node_args = {"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024, "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args={**node_args, "num_gpus": NODE_GPUS[0]})
    try:
        for gpus in NODE_GPUS[1:]:
            cluster.add_node(**node_args, num_gpus=gpus)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False,
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO_ROOT)}})
        nodes = [{"node_id": n["NodeID"], "gpus": n["Resources"].get("GPU", 0),
                  "head": "node:__internal_head__" in n["Resources"]} for n in ray.nodes() if n["Alive"]]
        output.mkdir(parents=True, exist_ok=True)
        (output / "nodes.json").write_text(json.dumps(nodes))
        return main(job_args(model, input_path, output))
    finally:
        ray.shutdown()
        cluster.shutdown()


# --------------------------------------------------------------------------------------------------
# The test
# --------------------------------------------------------------------------------------------------

def rows_in_length_groups(model: Path) -> tuple[list[dict], list[int]]:
    """ROWS demo rows: NUM_BUCKETS groups of equal size, every prompt of a group longer (in the tokens
    the job will measure: the config's chat template setting, this model's tokenizer) than any of the
    group before; returned in demo order, with each row's prompt length."""
    from pipeline.config import load_config
    from pipeline.data import load_tokenizer, prompt_tokens

    tokenizer, chat = load_tokenizer(str(model)), load_config(TINY_CONFIG).chat_template
    candidates = demo_rows(160)
    length = {r["id"]: len(prompt_tokens(tokenizer, r["prompt"], chat)) for r in candidates}
    by_length = sorted(candidates, key=lambda r: length[r["id"]])
    per_group, chosen, longest = ROWS // NUM_BUCKETS, set(), 0
    for start in np.linspace(0, len(by_length) - per_group, NUM_BUCKETS).astype(int):  # spread out
        group = [r for r in by_length[start:] if length[r["id"]] > longest][:per_group]
        assert len(group) == per_group, "not enough distinct prompt lengths among the demo rows"
        chosen |= {r["id"] for r in group}
        longest = max(length[r["id"]] for r in group)
    rows = [r for r in candidates if r["id"] in chosen]
    return rows, [length[r["id"]] for r in rows]


@pytest.fixture(scope="module")
def multinode_run(tmp_path_factory):
    model = freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny")
    work = tmp_path_factory.mktemp("multinode")
    source, lengths = rows_in_length_groups(model)
    input_path, output = work / "prompts.jsonl", work / "out"
    input_path.write_text("".join(json.dumps(r) + "\n" for r in source))
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
           "RAY_DATA_DISABLE_PROGRESS_BARS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("RAY_ADDRESS", None)  # the child must start its own cluster, not join another
    started = time.time()
    child = subprocess.run([sys.executable, "-m", "tests.test_multinode", "--model", str(model),
                            "--input", str(input_path), "--output", str(output)], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S)
    printed = child.stdout + child.stderr
    assert child.returncode == 0, f"scenario exited {child.returncode} after {time.time() - started:.0f}s:\n" \
                                  f"{printed[-6000:]}"
    nodes = json.loads((output / "nodes.json").read_text())
    stats = json.loads((output / "stats.json").read_text())
    measured = dict(zip((r["id"] for r in source), lengths))
    return nodes, stats, read_outputs(output), output, child.stdout, measured


def test_one_actor_per_gpu_on_both_nodes_and_rows_bucketed_by_length(multinode_run):
    nodes, stats, rows, output, printed, measured = multinode_run
    gpus = {n["node_id"]: n["gpus"] for n in nodes}
    assert sorted(gpus.values()) == sorted(NODE_GPUS) and sum(n["head"] for n in nodes) == 1

    # every row written once
    assert sorted(r["id"] for r in rows) == sorted(measured)
    assert all(r["finish_reason"] in ("eos", "length") for r in rows)  # an answer may be empty (EOS first)
    assert f"{ROWS} rows ({ROWS} unique ids)" in printed

    # one actor per GPU: actors.num_actors=null made the job count the cluster's GPUs; each actor holds
    # one whole GPU (actors.num_gpus=1) and every node runs as many actors as it has GPUs, so no two
    # actors share a GPU and both nodes do work
    assert stats["run"]["settings"]["actors"]["num_actors"] is None
    actor_node = {a["actor_id"]: a["node_id"] for a in stats["per_actor"]}
    assert len(actor_node) == sum(NODE_GPUS) == stats["totals"]["actors"]
    assert {r["actor_id"]: r["node_id"] for r in rows} == actor_node  # every actor got rows
    assert Counter(actor_node.values()) == Counter(gpus)
    assert stats["totals"]["restarts"] == 0 and {r["device"] for r in rows} == {"cpu"}  # fake GPUs

    # bucketed by prompt length: the job measured the lengths the test did, its quantile edges fall
    # between the length groups, and each row carries its bucket (length_bucket; edges in stats.json)
    assert {r["id"]: r["num_prompt_tokens"] for r in rows} == measured
    ordered = sorted(measured.values())
    group = ROWS // NUM_BUCKETS
    assert stats["run"]["bucket_edges"] == ordered[group::group]
    edges = stats["run"]["bucket_edges"]
    for row in rows:
        assert row["length_bucket"] == int(np.searchsorted(edges, row["num_prompt_tokens"], side="right"))
    assert Counter(r["length_bucket"] for r in rows) == {b: group for b in range(NUM_BUCKETS)}

    # as the design says (pipeline/data.py): the sort puts each bucket's rows, in length order, into
    # batch-sized blocks, and Ray Data hands each block whole to one free actor, on either node. Each
    # block comes back as one output file, so: a file is one batch from one actor, holds rows of one
    # bucket sorted by length, each bucket's rows are in exactly its BATCHES_PER_BUCKET batches, and the
    # files add up to the batches each actor counted.
    per_actor = {a["actor_id"]: a for a in stats["per_actor"]}
    batches_by_actor, batches_of_bucket = Counter(), Counter()
    buckets_by_node = defaultdict(set)
    for file in sorted((output / "outputs").glob("*.parquet")):
        batch = pq.read_table(file).to_pylist()
        assert len(batch) == BATCH_SIZE
        (actor_id,) = {r["actor_id"] for r in batch}
        (bucket,) = {r["length_bucket"] for r in batch}
        lengths = [r["num_prompt_tokens"] for r in batch]
        assert lengths == sorted(lengths)
        batches_by_actor[actor_id] += 1
        batches_of_bucket[bucket] += 1
        buckets_by_node[actor_node[actor_id]].add(bucket)
    assert batches_of_bucket == {b: BATCHES_PER_BUCKET for b in range(NUM_BUCKETS)}
    assert batches_by_actor == {actor_id: a["batches"] for actor_id, a in per_actor.items()}
    assert set(buckets_by_node) == set(gpus)  # both nodes generated, from whichever buckets came up


def test_stats_json_and_png_have_per_node_sections(multinode_run):
    nodes, stats, rows, output, printed, _ = multinode_run
    per_node = {n["node_id"]: n for n in stats["per_node"]}
    assert set(per_node) == {n["node_id"] for n in nodes}
    for node_id, node in per_node.items():
        mine = [r for r in rows if r["node_id"] == node_id]
        assert node["rows"] == len(mine) > 0
        assert node["generated_tokens"] == sum(r["num_generated_tokens"] for r in mine)
        assert node["actor_ids"] == sorted({r["actor_id"] for r in mine}) and node["actors"] == len(node["actor_ids"])
        actors = [a for a in stats["per_actor"] if a["node_id"] == node_id]
        assert node["busy_s"] == pytest.approx(sum(a["busy_s"] for a in actors)) and node["busy_s"] > 0
        assert 0 < node["busy_share_of_wall"] <= 1
        assert node["tokens_per_wall_s"] == pytest.approx(node["generated_tokens"] / stats["run"]["wall_s"])
    totals = stats["totals"]
    for key in ("rows", "generated_tokens", "actors", "batches"):
        assert sum(n[key] for n in per_node.values()) == totals[key]
    assert sum(n["busy_s"] for n in per_node.values()) == pytest.approx(totals["busy_s"])
    for node_id in per_node:
        assert f"node {node_id[:8]}:" in printed  # the printed table has a line per node
    png = (output / "stats.png").read_bytes()
    assert png[:4] == b"\x89PNG"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (1800, 900)  # the 2x3 layout: the per-node panel starts the second row


def test_per_node_stats_group_actors_and_their_restarts_by_node():
    """Without Ray: the per_node section of stats.json from hand-made actor snapshots."""
    from pipeline.stats import aggregate, format_table
    from pipeline.stats_plot import plot_png

    def snapshot(actor_id: str, node_id: str, rows: int, tokens: int, busy: float) -> dict:
        engine = {"generated_tokens": tokens, "denoise_steps": rows,
                  "effective_compute_ratio": 0.5, "useful_row_fraction": 1.0, "padding_fraction": 0.1}
        return {"actor_id": actor_id, "instance_id": f"{actor_id}-{rows}", "node_id": node_id,
                "device": "cpu", "rows": rows, "error_rows": 0, "batches": 1, "busy_s": busy,
                "active_s": busy + 1, "memory_peak_bytes": rows, "gpu_utilization": None, "engine": engine,
                "samples": {"num_generated_tokens": [32] * rows, "latency_s": [1.0] * rows}}

    snapshots = [snapshot("a", "n1", 4, 128, 2.0), snapshot("a", "n1", 4, 128, 3.0),  # a restarted
                 snapshot("b", "n2", 8, 256, 4.0), snapshot("c", "n2", 4, 128, 2.0)]
    stats = aggregate(snapshots, wall_s=10.0, bin_tokens=32)
    n1, n2 = stats["per_node"]
    assert (n1["node_id"], n1["actors"], n1["actor_ids"], n1["restarts"]) == ("n1", 1, ["a"], 1)
    assert (n1["rows"], n1["generated_tokens"], n1["busy_s"]) == (8, 256, 5.0)
    assert (n2["actors"], n2["actor_ids"], n2["rows"], n2["generated_tokens"]) == (2, ["b", "c"], 12, 384)
    assert n2["tokens_per_wall_s"] == pytest.approx(384 / 10.0)  # over the job's wall time
    assert n2["busy_share_of_wall"] == pytest.approx(6.0 / (2 * 10.0))  # over actors x wall
    table = format_table(stats)
    assert "node n1: 1 actor(s), 8 rows (0 errors), 256 tokens" in table and "node n2: 2 actor(s), 12 rows" in table
    assert plot_png(stats, {})[:4] == b"\x89PNG"


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="the multi-node scenario (run by the test above)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input", required=True, type=Path)
    parser.add_argument("--output", required=True, type=Path)
    arguments = parser.parse_args()
    sys.exit(run_scenario(arguments.model, arguments.input, arguments.output))
