"""The GPU run's last stage: batched == solo in bf16 on the device, default and batch-invariant
(``benchmarks.exactness`` on the LLaDA and Dream fixtures and the tiny model, every rule x cache).

Each mode runs in a child process: cuBLAS reads its workspace settings when its handle is created, so
the batch-invariant child starts with ``engine.models.batch_invariance.CUBLAS_ENVIRONMENT`` in its environment
and the default child without it, whatever the parent's GEMMs already did.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from engine.models.batch_invariance import CUBLAS_ENVIRONMENT

REPO_ROOT = Path(__file__).resolve().parents[1]
RESERVE_S = 120.0  # kept for this stage out of the run's time budget
MIN_CHILD_S = 20.0


def child_environment(batch_invariant: bool) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in CUBLAS_ENVIRONMENT}
    return env | CUBLAS_ENVIRONMENT if batch_invariant else env


def exactness_on_device(device: str, out: Path, stop_at: float, smoke: bool) -> dict:
    """Share of requests equal to the oracle per cell, per mode (or why a mode did not run)."""
    results: dict = {}
    for mode in ("batch-invariant",) if smoke else ("default", "batch-invariant"):
        remaining = stop_at - time.perf_counter()
        if remaining < MIN_CHILD_S:
            results[mode] = {"skipped": f"{remaining:.0f} s of the time budget left"}
            continue
        path = out / f"exactness-{mode}.json"
        argv = [sys.executable, "-m", "benchmarks.exactness", "--dtypes", "bfloat16", "--modes", mode,
                "--device", device, "--out", str(path), "--prompts", "1" if smoke else "16",
                *(["--families", "llada"] if smoke else [])]
        try:
            child = subprocess.run(argv, cwd=REPO_ROOT, env=child_environment(mode == "batch-invariant"),
                                   timeout=remaining, capture_output=True, text=True)
        except subprocess.TimeoutExpired:
            results[mode] = {"timed_out_after_s": round(remaining)}
            continue
        if child.returncode != 0:
            results[mode] = {"error": child.stderr[-2000:]}
            continue
        results[mode] = json.loads(path.read_text())["agreement"]
    return results
