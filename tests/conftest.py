"""Shared test fixtures: one Ray cluster per test session, the tiny model, the demo data, the random
LLaDA and Dream fixture checkpoints loaded, and the Serve tests' module-scoped fixtures (the frozen tiny
model, its reference engine, the Serve apps: ``tests/serve_helpers.py``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.serve_helpers import client, expect, model_dir, reference, server  # noqa: F401  (the Serve tests' fixtures)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every Ray cluster the suite starts (the session fixture's, and those of the subprocesses that inherit
# this environment: pipeline runs, `ray start`, the multinode scenario) runs its workers at the priority
# of the test process. Ray's default renices every worker (tasks, actors, Serve replicas) to 15, so on a
# busy machine, beside any normal-priority process, the workers get ~1/30 of a core each: an actor that
# loads the tiny model in seconds took 140-170 s to start beside two busy loops on a 2-core machine
# (tests/test_actor.py took 490 s, 160 s at equal priority; in a full CI run its Ray Data fixture, with
# a 300 s actor-startup wait, errored). Equal priority makes a busy machine merely slower.
os.environ.setdefault("RAY_worker_niceness", "0")
# A worker process that has not registered with its raylet after this long is killed and started again
# (Ray's default is 60 s); a starved machine must only be slow, never restart workers in a loop.
os.environ.setdefault("RAY_worker_register_timeout_seconds", "600")

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the whole session, with 2 fake GPUs for scheduling tests.

    Actors in tests must ask for fractional ``num_cpus`` (a 2-core CI machine deadlocks otherwise).

    Ray kills the idle workers beyond one per CPU (4 here) a second after their task, so each job started
    fresh task workers that imported pyarrow, torch and the tokenizer again (16-22 workers for two 6-row
    jobs). This cluster keeps ten warm from one job to the next: test_batch_deaths.py and
    test_first_hour_job.py took 145 s instead of 177 s, back to back on 2 cores at load 10-11. Clusters
    that tests start in subprocesses (multinode, ``ray job submit``) keep Ray's default.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=200 * 1024 * 1024, _system_config={"num_workers_soft_limit": 10},
                 runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO_ROOT)}})
    yield ray
    try:
        from ray import serve

        serve.shutdown()
    except Exception:
        pass
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_engine_factory():
    """Build engines on the shipped tiny model (float64 for exact comparisons unless told otherwise). They
    decode with the settings a test names and the engine's defaults, not the checkpoint's
    generation_config.json (its block, threshold and gen_length), so a test's canvas is its max_new_tokens."""
    import dataclasses

    from engine import BlockServeEngine, EngineConfig
    from engine.models import load_model

    cache = {}

    def make(dtype: str = "float64", **config):
        if dtype not in cache:
            cache[dtype] = dataclasses.replace(load_model("tiny", dtype=dtype), decoding_defaults={})
        return BlockServeEngine(cache[dtype], EngineConfig(**config))

    return make


@pytest.fixture(scope="session")
def heldout_rows():
    from tinylm.tasks import read_jsonl

    return read_jsonl(REPO_ROOT / "assets" / "data" / "heldout.jsonl")


@pytest.fixture(scope="session")
def loaded():
    """The random LLaDA and Dream fixtures in float32, by family (``tests/model_helpers.py``)."""
    from tests.model_helpers import load_families

    return load_families("float32")


@pytest.fixture(scope="session")
def loaded64():
    """The random LLaDA and Dream fixtures in float64, by family."""
    from tests.model_helpers import load_families

    return load_families("float64")


@pytest.fixture
def one_thread_per_rank():
    """Torch's intra-op threads at one in this process for the test, and so in the rank processes of a
    tensor-parallel engine it starts (each takes rank 0's count). At torch's default, two ranks on a 2-core
    machine ran four threads whose collectives wait on each other at every layer: tests/test_tensor_parallel.py
    took 153 s, 73 s with one thread each, back to back at load 3-4. Each rank still runs its share whole."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
