"""Shared by the pipeline and actor tests: a frozen copy of the tiny model, small input files, a small job."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO = REPO_ROOT / "assets" / "data" / "demo.jsonl"
TINY_CONFIG = REPO_ROOT / "configs" / "tiny-cpu.yaml"


def freeze_tiny_model(destination: Path, gen_length: bool = True) -> Path:
    """Copy ``assets/tiny`` so that a background training run re-exporting it cannot change the model
    halfway through a test; an export caught mid-write shows up as a load failure and is retried.
    ``gen_length=False`` drops the checkpoint's gen_length, so each request's max_new_tokens sizes its canvas."""
    from engine.models import load_model

    for attempt in range(5):
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(REPO_ROOT / "assets" / "tiny", destination)
        if not gen_length:
            generation = json.loads((destination / "generation_config.json").read_text())
            generation.pop("gen_length", None)
            (destination / "generation_config.json").write_text(json.dumps(generation))
        try:
            load_model(destination)
            return destination
        except Exception:
            if attempt == 4:
                raise
            time.sleep(3)
    return destination


def demo_rows(count: int, start: int = 0) -> list[dict]:
    with DEMO.open() as f:
        rows = [json.loads(line) for line in f]
    return rows[start:start + count]


def read_outputs(output_dir: Path) -> list[dict]:
    files = sorted((output_dir / "outputs").glob("*.parquet"))
    return [row for file in files for row in pq.read_table(file).to_pylist()]


def run_small_job(model: str, output: Path, *overrides: str, input_path: Path | None = None) -> int:
    """``pipeline.run`` on the session's cluster: one CPU actor, batches of 4, two in flight, 32 new
    tokens, two length buckets; ``overrides`` are further ``--set`` values. Returns the exit code."""
    from pipeline.run import main

    args = ["--config", str(TINY_CONFIG), "--output", str(output),
            "--set", f"model={model}", "--set", "sampling.max_new_tokens=32",
            "--set", "actors.num_cpus=0.25", "--set", "actors.batch_size=4",
            "--set", "actors.max_concurrent_batches=2", "--set", "actors.num_actors=1",
            "--set", "actors.startup_timeout_s=300", "--set", "bucketing.num_buckets=2"]
    if input_path is not None:
        args += ["--input", str(input_path), "--set", "limit=null"]
    for override in overrides:
        args += ["--set", override]
    return main(args)
