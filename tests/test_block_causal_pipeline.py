"""The batch job on the block-causal, canvas and anchored families: each family's shipped GPU config, pointed
at its tiny fixture on the CPU, is validated and runs the job's rows through its actor. One family runs
``python -m pipeline.run`` end to end as its own process, joined to the session's Ray cluster
(``RAY_ADDRESS``), as ``ray job submit`` would run it; the job's Ray plumbing is the same for every family
(``tests/test_pipeline.py`` runs it on the tiny model), so the others run the same settings through the
job's own pieces without Ray: the driver's model check and prompt measurement, and a ``BlockServeActor``."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.pipeline_helpers import REPO_ROOT, demo_rows, read_outputs

FAMILIES = {
    "sdar-8b-chat": ("tiny-sdar", []), "llada2-mini": ("tiny-llada2", []),
    "diffusiongemma-26b-a4b": ("tiny-diffusion_gemma", ["engine.block_length=null", "engine.max_denoising_steps=4"]),
    "nemotron-labs-diffusion-8b": ("tiny-nemotron_labs_diffusion", ["engine.block_length=null"]),
}
ROWS = 6


def cpu_overrides(name: str) -> list[str]:
    """The family's GPU config pointed at its tiny fixture on the CPU: one small actor, short answers."""
    fixture, extra = FAMILIES[name]
    return [f"model={REPO_ROOT / 'tests' / 'fixtures' / fixture}", "device=cpu", "dtype=float32", f"limit={ROWS}",
            "sampling.max_new_tokens=8", "engine.max_batch_size=4", "engine.token_budget=null",
            "engine.max_model_len=256", "actors.num_gpus=0", "actors.num_actors=1", "actors.num_cpus=0.25",
            "actors.batch_size=3", "actors.startup_timeout_s=300", "bucketing.num_buckets=2", *extra]


def assert_every_row_once_without_errors(rows: list[dict]) -> None:
    assert sorted(r["id"] for r in rows) == sorted(r["id"] for r in demo_rows(ROWS))
    assert all(r["__inference_error__"] == "" and r["finish_reason"] in ("eos", "length") for r in rows)
    assert sum(r["num_generated_tokens"] for r in rows) > 0


@pytest.mark.parametrize("name", ["sdar-8b-chat"])
def test_a_block_familys_shipped_config_runs_end_to_end_on_the_cpu(ray_cluster, tmp_path, name):
    """The GPU config of a block-causal family, pointed at its tiny fixture on the CPU: every row once."""
    output = tmp_path / "out"
    command = [sys.executable, "-m", "pipeline.run", "--config", str(REPO_ROOT / "configs" / f"{name}.yaml"),
               "--output", str(output), *(item for override in cpu_overrides(name) for item in ("--set", override))]
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "RAY_ADDRESS": address})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert_every_row_once_without_errors(read_outputs(output))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_familys_shipped_config_runs_the_jobs_rows_through_its_actor_on_the_cpu(name):
    """Each family's GPU config with the job's CPU overrides: it validates, the driver's checks pass and
    measure every prompt, and an actor built from its settings generates every row once."""
    from actors import BlockServeActor
    from pipeline import data
    from pipeline.config import load_config

    config = load_config(REPO_ROOT / "configs" / f"{name}.yaml", cpu_overrides(name))
    data.check_model(config.model)
    rows = demo_rows(config.limit)
    tokenizer = data.load_tokenizer(config.model)
    assert all(data.prompt_tokens(tokenizer, r[config.prompt_column], config.chat_template) for r in rows)
    actor = BlockServeActor(config.actor_settings)
    try:
        outputs = asyncio.run(actor.generate_rows([{"prompt": r[config.prompt_column]} for r in rows]))
    finally:
        actor.loop.stop()
    assert_every_row_once_without_errors([{"id": r["id"], **o} for r, o in zip(rows, outputs)])
