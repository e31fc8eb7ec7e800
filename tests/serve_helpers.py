"""Shared by the Serve tests: the frozen copy of the tiny model, the reference engine on it, and the two
Serve apps of the HTTP tests; helpers to read /metrics, wait, and read a stream's events.

The fixtures are module-scoped and registered in ``tests/conftest.py``: each module that asks for
``server`` starts the two apps once (``main``, 16 rows, route ``/``; ``small``, 2 rows, 2 waiting,
route ``/small``, behind an API key) and deletes them when it ends.
"""
from __future__ import annotations

import json
import re
import shutil
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

if TYPE_CHECKING:
    from engine import BlockServeEngine

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_DIR = REPO_ROOT / "assets" / "tiny"
MODEL = "blockserve-tiny"
ENGINE = {"max_batch_size": 16, "steps_per_block": 4}  # a step cap keeps CPU blocks short
SMALL_ENGINE = {"max_batch_size": 2, "steps_per_block": 4}
TIMEOUT_S = 120.0
SMALL_KEY = "small-secret"
SMALL_AUTH = {"Authorization": f"Bearer {SMALL_KEY}"}


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_serve() -> str:
    """Start Serve's proxy on a free port, or find the one an earlier module left running (``serve.start``
    then keeps its port): the proxy's base URL, whichever module runs first."""
    from ray import serve
    from ray.serve.context import _get_global_client

    serve.start(http_options={"host": "127.0.0.1", "port": free_port()})
    http = _get_global_client().http_config
    host = "127.0.0.1" if http.host in ("0.0.0.0", "::", "") else http.host
    return f"http://{host}:{http.port}"


def fingerprint(directory: Path) -> list[tuple[str, int, int]]:
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A frozen copy of assets/tiny, taken while no export is being written."""
    target = tmp_path_factory.mktemp("tiny-snapshot")
    for _ in range(10):
        before = fingerprint(TINY_DIR)
        shutil.copytree(TINY_DIR, target, dirs_exist_ok=True)
        if fingerprint(TINY_DIR) == before and (target / "model.safetensors").is_file():
            return target
        time.sleep(3)
    pytest.fail("assets/tiny kept changing while it was copied")


@pytest.fixture(scope="module")
def reference(model_dir) -> BlockServeEngine:
    from engine import BlockServeEngine, EngineConfig

    return BlockServeEngine.from_pretrained(model_dir, EngineConfig(**ENGINE), dtype="float32")


@pytest.fixture(scope="module")
def expect(reference):
    """engine.generate for one prompt, computed once per module."""
    from engine import SamplingParams

    cache = {}

    def generate(prompt, max_tokens: int, stop_at_eos: bool = True):
        key = (json.dumps(prompt), max_tokens, stop_at_eos)
        if key not in cache:
            params = SamplingParams(max_new_tokens=max_tokens, stop_at_eos=stop_at_eos)
            cache[key] = reference.generate([prompt], params)[0]
        return cache[key]

    return generate


@pytest.fixture(scope="module")
def server(ray_cluster, model_dir) -> str:
    from ray import serve

    from actors.serving.serve_app import ServeAppConfig, build_deployment_app

    base = start_serve()
    common = {"model": str(model_dir), "served_model_name": MODEL, "dtype": "float32", "device": "cpu"}
    apps = {"blockserve-main": ("/", ServeAppConfig(**common, engine=ENGINE, max_pending=32)),
            "blockserve-small": ("/small", ServeAppConfig(**common, engine=SMALL_ENGINE, max_pending=2,
                                                          retry_after_s=2, api_key=SMALL_KEY))}
    serve.run_many([serve.RunTarget(build_deployment_app(config, ray_actor_options={"num_cpus": 0.5}),
                                    name=name, route_prefix=route)
                    for name, (route, config) in apps.items()])  # both replicas start at once
    assert httpx.get(f"{base}/health", timeout=10).status_code == 200
    yield base
    for name in apps:
        serve.delete(name)


@pytest.fixture()
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key="x", max_retries=0, timeout=TIMEOUT_S)


def metric(base_url: str, name: str, **labels: str) -> float:
    """A sample of the replica's /metrics: its samples of Ray's export, a few seconds behind."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        if line.startswith(name) and all(label in line for label in wanted):
            if re.match(rf"{re.escape(name)}(\{{|\s)", line):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def wait_until(condition, timeout_s: float = 60.0, what: str = "condition") -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def sse_events(response: httpx.Response) -> list:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


def complete(server, prompt: str, **fields):
    """One ``/v1/completions`` answer of an OpenAIServer without HTTP: its own model, ``prompt``, ``fields``."""
    import asyncio

    from actors.serving.openai.protocol import CompletionRequest

    request = CompletionRequest.model_validate({"model": server.model_name, "prompt": prompt, **fields})
    return asyncio.run(server.completions(request))


def openai_server_without_ray(model_dir: Path, model_name: str, engine: dict, default_max_tokens: int = 16):
    """The real OpenAIServer over a real EngineLoop on ``model_dir``, without Ray: yields the server and
    stops its loop after (for a module-scoped fixture)."""
    from actors.engine_loop import EngineLoop
    from actors.serving.openai.server import OpenAIServer
    from engine import BlockServeEngine, EngineConfig

    loop = EngineLoop(BlockServeEngine.from_pretrained(model_dir, EngineConfig(**engine))).start()
    yield OpenAIServer(loop, model_name=model_name, default_max_tokens=default_max_tokens)
    loop.stop()
