"""The batch job on the block-causal, canvas and anchored families: each family's shipped GPU config, pointed
at its tiny fixture on the CPU, runs ``python -m pipeline.run`` end to end as its own process, joined to the
session's Ray cluster (``RAY_ADDRESS``), as ``ray job submit`` would run it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.pipeline_helpers import REPO_ROOT, demo_rows, read_outputs


@pytest.mark.parametrize("name, fixture, extra", [
    ("sdar-8b-chat", "tiny-sdar", []), ("llada2-mini", "tiny-llada2", []),
    ("diffusiongemma-26b-a4b", "tiny-diffusion_gemma", ["engine.block_length=null", "engine.max_denoising_steps=4"]),
    ("nemotron-labs-diffusion-8b", "tiny-nemotron_labs_diffusion", ["engine.block_length=null"]),
])
def test_a_block_familys_shipped_config_runs_end_to_end_on_the_cpu(ray_cluster, tmp_path, name, fixture, extra):
    """The GPU config of each block-causal family, pointed at its tiny fixture on the CPU: every row once."""
    output = tmp_path / "out"
    overrides = [f"model={REPO_ROOT / 'tests' / 'fixtures' / fixture}", "device=cpu", "dtype=float32", "limit=6",
                 "sampling.max_new_tokens=8", "engine.max_batch_size=4", "engine.token_budget=null",
                 "engine.max_model_len=256", "actors.num_gpus=0", "actors.num_actors=1", "actors.num_cpus=0.25",
                 "actors.batch_size=3", "actors.startup_timeout_s=300", "bucketing.num_buckets=2", *extra]
    command = [sys.executable, "-m", "pipeline.run", "--config", str(REPO_ROOT / "configs" / f"{name}.yaml"),
               "--output", str(output), *(item for override in overrides for item in ("--set", override))]
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_ADDRESS": address})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = read_outputs(output)
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in demo_rows(6))
    assert all(r["__inference_error__"] == "" and r["finish_reason"] in ("eos", "length") for r in rows)
    assert sum(r["num_generated_tokens"] for r in rows) > 0
