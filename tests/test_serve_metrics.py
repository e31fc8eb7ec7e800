"""Metrics through Ray (issue 13, item 4): every replica of a 2-replica app shows up, tagged, in Ray's
metrics export (the node's metrics agent, Prometheus text at ``metrics_export_port``), and each
replica's own ``/metrics`` names the replica it comes from and shows only that replica's samples of
the export (the one place the metrics are written).

Runs one app (``blockserve-metrics``, route ``/metrics-test``) on the session's Ray cluster and Serve
instance, with the frozen copy of the tiny model of ``tests/serve_helpers.py`` (``model_dir``).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve_helpers import MODEL, start_serve

APP = "blockserve-metrics"
ROUTE = "/metrics-test"
DEPLOYMENT = "BlockServeOpenAI"
ENGINE = {"max_batch_size": 4, "steps_per_block": 4}
EXPORT_TIMEOUT_S = 45.0  # Ray's metrics agent exports every few seconds

pytestmark = pytest.mark.timeout(600)

GAUGES = ("blockserve_queue_depth", "blockserve_running_rows", "blockserve_bounding_box_tokens",
          "blockserve_effective_compute_ratio", "blockserve_tokens_per_second", "blockserve_tokens_per_forward",
          "blockserve_engine_loop_healthy")  # blockserve_rule_counter: only for a rule with counters
COUNTERS = ("blockserve_generated_tokens", "blockserve_steps", "blockserve_requests")
HISTOGRAMS = ("blockserve_request_latency_seconds", "blockserve_time_to_first_block_seconds",
              "blockserve_queue_seconds")


@pytest.fixture(scope="module")
def two_replicas(ray_cluster, model_dir) -> str:
    from ray import serve

    from actors.serving.serve_app import ServeAppConfig, build_deployment_app

    base = start_serve()
    config = ServeAppConfig(model=str(model_dir), served_model_name=MODEL, dtype="float32", device="cpu",
                            engine=ENGINE, max_pending=16, torch_threads=1)
    app = build_deployment_app(config, num_replicas=2, ray_actor_options={"num_cpus": 0.5})
    serve.run(app, name=APP, route_prefix=ROUTE)
    url = f"{base}{ROUTE}"
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    yield url
    serve.delete(APP)


def replica_metrics(url: str) -> tuple[str, dict[str, float]]:
    """One replica's /metrics (a random one): its id (header) and its finished-request count."""
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    replica = response.headers["x-blockserve-replica"]
    assert replica and f'# BlockServe metrics of ONE replica: replica="{replica}"' in response.text
    finished = 0.0
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            assert sample.labels.get("replica") == replica, sample  # never the whole deployment
            if sample.name == "ray_blockserve_requests_total":
                finished += sample.value
    return replica, {"finished": finished}


def ray_export() -> list:
    """Samples of every node's metrics agent (Prometheus text), as prometheus_client parses them."""
    import ray

    samples = []
    for node in ray.nodes():
        if not node["Alive"]:
            continue
        text = httpx.get(f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics",
                         timeout=10).text
        for family in text_string_to_metric_families(text):
            samples.extend(family.samples)
    return samples


def send_invalid(url: str, count: int) -> list[int]:
    """``count`` chat requests whose ``structured_outputs`` regex does not compile; their status codes."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "a code"}], "max_tokens": 8,
            "structured_outputs": {"regex": "a[b"}}
    return [httpx.post(f"{url}/v1/chat/completions", timeout=60, json=body).status_code for _ in range(count)]


def summed(samples: list, name: str, label: str) -> dict[str, float]:
    """The values of the samples called ``name``, summed by their ``label``."""
    totals: dict[str, float] = {}
    for sample in samples:
        if sample.name == name:
            totals[sample.labels[label]] = totals.get(sample.labels[label], 0) + sample.value
    return totals


def test_every_replica_is_in_rays_metrics_export_with_its_tags(two_replicas):
    from openai import OpenAI

    client = OpenAI(base_url=f"{two_replicas}/v1", api_key="x", max_retries=0, timeout=120)

    def ask(i: int) -> str:
        # a chat, as the tiny model was trained (raw prompts may get an empty answer, and a replica that
        # only gave empty answers would never export the generated-tokens counter)
        answer = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"count from {20 + i} to {29 + i}"}], max_tokens=32)
        return answer.choices[0].finish_reason

    served: dict[str, float] = {}  # replica id -> requests it finished (its own /metrics)
    sent = 0
    with ThreadPoolExecutor(4) as pool:
        for _ in range(10):
            assert all(reason in ("stop", "length") for reason in pool.map(ask, range(sent, sent + 4)))
            sent += 4
            deadline = time.time() + EXPORT_TIMEOUT_S  # /metrics shows Ray's export: a few seconds behind
            while time.time() < deadline:  # the load-balanced /metrics reaches a random replica each time
                replica, counts = replica_metrics(two_replicas)
                served[replica] = counts["finished"]
                if len(served) == 2 and sum(served.values()) == sent:
                    break
                time.sleep(0.2)
            if len(served) == 2 and all(served.values()):
                break
    assert len(served) == 2 and all(served.values()), f"both replicas should have served: {served}"
    assert send_invalid(two_replicas, 2) == [400, 400]

    deadline, found, refused = time.time() + EXPORT_TIMEOUT_S, {}, {}
    while time.time() < deadline:
        samples = [sample for sample in ray_export() if sample.name.startswith("ray_blockserve_")
                   and sample.labels.get("application") == APP]
        found = summed(samples, "ray_blockserve_requests_total", "replica")
        refused = summed(samples, "ray_blockserve_requests_invalid_total", "param")
        if set(found) == set(served) and sum(found.values()) == sent and refused == {"structured_outputs": 2}:
            break
        time.sleep(1)
    assert set(found) == set(served), f"replicas in Ray's export {found}, replicas that served {served}"
    assert all(found.values()) and sum(found.values()) == sent, (found, sent)
    assert refused == {"structured_outputs": 2}, refused  # the 400s of the engine's check, by body field

    names = {(sample.name, sample.labels["replica"]) for sample in samples}
    for replica in served:
        for name in GAUGES:
            assert (f"ray_{name}", replica) in names, (name, replica)
        for name in COUNTERS:
            assert (f"ray_{name}_total", replica) in names, (name, replica)
        for name in HISTOGRAMS:
            assert (f"ray_{name}_bucket", replica) in names and (f"ray_{name}_count", replica) in names
    for sample in samples:
        assert sample.labels["deployment"] == DEPLOYMENT and sample.labels["model"] == MODEL, sample
        assert sample.labels["replica"] in served, sample
        if sample.name == "ray_blockserve_requests_total":
            assert sample.labels["finish_reason"] in ("eos", "length"), sample
        if sample.name == "ray_blockserve_engine_loop_healthy":
            assert sample.value == 1.0, sample
