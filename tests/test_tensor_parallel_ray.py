"""tensor_parallel_size through Ray's doors: a Ray Data actor, build_processor and a Serve replica run a split
engine with the tokens one device gives, reserve a device per rank, and a killed rank costs a restart, not rows."""
from __future__ import annotations

import os
import signal
import uuid

import httpx
import pytest

from actors.ray_data.block_serve_actor import BlockServeActor
from engine import BlockServeEngine, EngineConfig, SamplingParams
from tests.conftest import FIXTURES
from tests.serve_helpers import start_serve

MODEL = str(FIXTURES / "tiny-sdar")
ENGINE = {"max_batch_size": 4, "tensor_parallel_size": 2}
PROMPTS = [f"count {n} sheep" for n in range(8)]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def expected() -> dict[str, list[int]]:
    """Each prompt's tokens from one engine on one device (no stop: every answer has MAX_TOKENS tokens)."""
    engine = BlockServeEngine.from_pretrained(MODEL, EngineConfig(max_batch_size=4))
    outputs = engine.generate(PROMPTS, SamplingParams(max_new_tokens=MAX_TOKENS, stop_at_eos=False))
    return {prompt: output.token_ids for prompt, output in zip(PROMPTS, outputs)}


class KillsItsRankAtSecondBatch(BlockServeActor):
    """Test wrapper: in its first incarnation, the actor kills its engine's rank 1 as its second batch starts."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._calls = 0

    async def __call__(self, batch):
        self._calls += 1
        if self._calls == 2 and not self.restarted:
            os.kill(self.engine.executor.pids[0], signal.SIGKILL)
        return await super().__call__(batch)


def test_a_ray_data_actor_whose_rank_is_killed_restarts_and_writes_every_row_once(ray_cluster, expected):
    import ray

    from actors.ray_data.stats_registry import start_stats_registry
    from pipeline.stats import aggregate

    registry_name = f"stats-{uuid.uuid4().hex[:8]}"
    registry = start_stats_registry(registry_name)
    ds = ray.data.from_items([{"prompt": prompt} for prompt in PROMPTS]).map_batches(
        KillsItsRankAtSecondBatch, batch_size=4, num_cpus=0.5,
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=1, max_tasks_in_flight_per_actor=1),
        fn_constructor_kwargs={"model": MODEL, "engine": ENGINE, "torch_threads": 1, "stats_actor": registry_name,
                               "sampling": {"max_new_tokens": MAX_TOKENS, "stop_at_eos": False}})
    ds.context.wait_for_min_actors_s = 300
    outputs = ds.take_all()
    snapshots = ray.get(registry.collect.remote())
    ray.kill(registry)

    assert sorted(o["prompt"] for o in outputs) == sorted(PROMPTS)
    assert all(list(o["generated_tokens"]) == expected[o["prompt"]] for o in outputs)
    assert aggregate(snapshots, wall_s=1.0, bin_tokens=32)["totals"]["restarts"] == 1
    assert all(s["tensor_parallel_size"] == 2 and s["devices"] == ["cpu", "cpu"] for s in snapshots)


def test_build_processor_runs_a_split_engine_and_reserves_each_ranks_cpus(ray_cluster, expected):
    import ray
    from ray.data.llm import build_processor

    from actors.ray_data.processor import BlockServeProcessorConfig

    config = BlockServeProcessorConfig(
        model_source=MODEL, engine_kwargs=ENGINE, batch_size=8, concurrency=1, num_cpus_per_actor=0.5,
        actor={"torch_threads": 1, "sampling": {"max_new_tokens": MAX_TOKENS, "stop_at_eos": False}})
    assert config.actor_cpus == 1.0
    outputs = build_processor(config)(ray.data.from_items([{"prompt": prompt} for prompt in PROMPTS])).take_all()
    assert {o["prompt"]: list(o["generated_tokens"]) for o in outputs} == expected


def test_an_actor_with_fewer_gpus_than_ranks_is_refused_by_name():
    from actors.ray_data.processor import BlockServeProcessorConfig

    with pytest.raises(ValueError, match="num_gpus_per_actor=1 but engine tensor_parallel_size=2"):
        BlockServeProcessorConfig(model_source=MODEL, engine_kwargs=ENGINE, num_gpus_per_actor=1)


@pytest.mark.parametrize("name", ["diffusiongemma-26b-a4b-tp4", "llada2-flash"])
def test_the_shipped_split_configs_ask_one_gpu_per_rank(name):
    from pipeline.config import load_config

    config = load_config(FIXTURES.parents[1] / "configs" / f"{name}.yaml")
    assert config.dtype == "bfloat16" and config.engine.token_budget
    assert config.actors.num_gpus == config.engine.tensor_parallel_size == 4


def test_a_job_places_as_many_split_actors_as_the_nodes_hold_whole(monkeypatch):
    import ray

    from pipeline.config import load_config
    from pipeline.run import number_of_actors

    config = load_config(FIXTURES.parents[1] / "configs" / "llada2-flash.yaml")  # four GPUs an actor
    nodes = [{"Alive": True, "Resources": {"GPU": 6.0}}, {"Alive": True, "Resources": {"GPU": 2.0}},
             {"Alive": False, "Resources": {"GPU": 8.0}}]
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 8.0})
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert number_of_actors(config, num_blocks=100) == 1  # 8 GPUs, but no node holds a second actor's 4


def test_a_job_whose_actors_have_fewer_gpus_than_ranks_is_refused_by_name(tmp_path):
    from pipeline.config import ConfigError, load_config

    path = tmp_path / "split.yaml"
    path.write_text("input: a.jsonl\noutput: o\ndevice: cuda\nactors: {num_gpus: 1}\n"
                    "engine: {tensor_parallel_size: 4}\n")
    with pytest.raises(ConfigError, match="actors.num_gpus=1 but engine.tensor_parallel_size=4"):
        load_config(path)


def test_a_serve_replica_runs_a_split_engine_and_reserves_a_device_per_rank(ray_cluster, expected):
    from ray import serve

    from actors.serving.serve_app import ServeAppConfig, build_deployment_app, replica_resources

    config = ServeAppConfig(model=MODEL, served_model_name="split", engine=ENGINE, device="cpu")
    assert replica_resources(config) == {"num_cpus": 2}
    assert replica_resources(config.model_copy(update={"device": "cuda"})) == {"num_gpus": 2, "num_cpus": 1}
    base = start_serve()
    serve.run(build_deployment_app(config, ray_actor_options={"num_cpus": 0.5}), name="split", route_prefix="/split")
    try:
        body = {"model": "split", "prompt": PROMPTS[0], "max_tokens": MAX_TOKENS, "ignore_eos": True}
        answer = httpx.post(f"{base}/split/v1/completions", json=body, timeout=120).json()
    finally:
        serve.delete("split")
    reference = BlockServeEngine.from_pretrained(MODEL, EngineConfig(max_batch_size=4)).lm.tokenizer
    assert answer["choices"][0]["text"] == reference.decode(expected[PROMPTS[0]], skip_special_tokens=True)
