"""Shared by the pipeline and actor tests: a frozen copy of the tiny model, small input files."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO = REPO_ROOT / "assets" / "data" / "demo.jsonl"


def freeze_tiny_model(destination: Path) -> Path:
    """Copy ``assets/tiny`` so that a background training run re-exporting it cannot change the model
    halfway through a test; an export caught mid-write shows up as a load failure and is retried."""
    from engine.models import load_model

    for attempt in range(5):
        shutil.rmtree(destination, ignore_errors=True)
        shutil.copytree(REPO_ROOT / "assets" / "tiny", destination)
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
