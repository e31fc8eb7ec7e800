"""``ray job submit`` end to end: a separate local head, the tiny job submitted to it, its outputs.

The head runs on free ports with its own --temp-dir, as a child ``ray start --head --block`` process,
so it never meets the session's ``ray_cluster`` (this module does not use it) nor anyone else's Ray on
the machine. It is stopped by terminating that child rather than with ``ray stop``, which would stop
every Ray instance on the machine.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from tests.pipeline_helpers import REPO_ROOT, read_outputs

BIN = Path(sys.executable).parent


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def ray_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    # the head, stopped with SIGTERM, shuts down at once instead of draining its node for Ray's default 30 s
    # (the fixture's 15 s wait then ran out before the SIGKILL)
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def kill_leftovers(marker: str) -> None:
    """Processes of this head that outlived it (found by its unique temp dir in their command line)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and int(pid) != os.getpid():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass


@pytest.fixture
def local_head():
    temp_dir = tempfile.mkdtemp(prefix="rj", dir="/tmp")  # short: Ray's socket paths must be short
    gcs, dashboard, agent, agent_grpc, metrics, runtime_env, client, node, objects, low = free_ports(10)
    command = [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
               "--num-gpus=0", f"--temp-dir={temp_dir}", "--include-dashboard=true",
               "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
               f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
               f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={runtime_env}",
               f"--ray-client-server-port={client}", f"--node-manager-port={node}",
               f"--object-manager-port={objects}", "--object-store-memory=200000000",
               "--disable-usage-stats"]
    head = subprocess.Popen(command, env=ray_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        yield address, head
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=15)
        except subprocess.TimeoutExpired:
            head.kill()
        kill_leftovers(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def submit(address: str, *entrypoint: str) -> subprocess.CompletedProcess:
    command = [str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", str(REPO_ROOT),
               "--runtime-env-json", json.dumps({"env_vars": {"RAY_AUTH_MODE": "disabled"}}),
               "--", *entrypoint]
    return subprocess.run(command, env=ray_env(), cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=600)


def wait_for_dashboard(address: str, head: subprocess.Popen, deadline: float) -> None:
    """Until the head's dashboard answers (or the head exits, or ``deadline``): a ``ray job submit`` sent
    before then fails to connect, after seconds of its own start-up, and is retried only after a pause."""
    while time.time() < deadline and head.poll() is None:
        try:
            if httpx.get(f"{address}/api/version", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def test_ray_job_submit_runs_the_tiny_job_on_a_separate_head(local_head, tmp_path):
    address, head = local_head
    output = tmp_path / "out"
    entrypoint = ["python", "-m", "pipeline.run", "--config", "configs/tiny-cpu.yaml",
                  "--output", str(output), "--set", "limit=6", "--set", "sampling.max_new_tokens=32",
                  "--set", "actors.num_actors=1", "--set", "actors.batch_size=3"]
    deadline = time.time() + 240
    wait_for_dashboard(address, head, deadline)
    while True:  # a fresh head answers "No available agent to submit job" for its first seconds
        result = submit(address, *entrypoint)
        retry = result.returncode != 0 and ("agent" in result.stdout + result.stderr
                                            or "Connection" in result.stdout + result.stderr)
        if not retry or time.time() > deadline or head.poll() is not None:
            break
        time.sleep(5)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "TOTAL" in result.stdout and "succeeded" in result.stdout
    rows = read_outputs(output)
    assert len(rows) == len({r["id"] for r in rows}) == 6
    assert json.loads((output / "stats.json").read_text())["totals"]["rows"] == 6
