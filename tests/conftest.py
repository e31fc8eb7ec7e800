"""Shared test fixtures: one Ray cluster per test session, the tiny model, the demo data."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray instance for the whole session, with 2 fake GPUs for scheduling tests.

    Actors in tests must ask for fractional ``num_cpus`` (a 2-core CI machine deadlocks otherwise).
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=200 * 1024 * 1024,
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
    """Build engines on the shipped tiny model (float64 for exact comparisons unless told otherwise)."""
    from engine import BlockServeEngine, EngineConfig
    from engine.models import load_model

    cache = {}

    def make(dtype: str = "float64", **config):
        if dtype not in cache:
            cache[dtype] = load_model("tiny", dtype=dtype)
        return BlockServeEngine(cache[dtype], EngineConfig(**config))

    return make


@pytest.fixture(scope="session")
def heldout_rows():
    from tinylm.tasks import read_jsonl

    return read_jsonl(REPO_ROOT / "assets" / "data" / "heldout.jsonl")
