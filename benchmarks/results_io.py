"""The one results writer and reader: every experiment's JSON carries the command, date, machine and
versions, and a stored file reads back under today's system labels."""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
OLD_LABELS = {"step": "continuous", "block": "block_sync", "blockserve": "block_sync"}
"""System labels of results stored before the systems took their engine schedules' names."""
OLD_KEYS = {"speedup_of_block": "speedup_of_block_sync"}
OLD_RATIO = re.compile(r"^(step|block|blockserve)_over_(step|block|blockserve|static|shrink)(?=_|$)")


def machine_description() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{os.cpu_count()} CPUs ({cpu}){gpu}, torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads, Python {platform.python_version()}")


def versions() -> dict[str, str]:
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__,
             "cuda": str(torch.version.cuda), "platform": platform.platform()}
    for package in ("ray", "numpy", "transformers"):
        try:
            found[package] = __import__(package).__version__
        except ImportError:
            continue
    return found


def meta(argv: list[str], program: str = "python -m benchmarks") -> dict:
    """The record's provenance: ``program`` and ``argv`` make its command."""
    return {"command": f"{program} {shlex.join(argv)}",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_description(), "versions": versions(), "cwd": portable_path(os.getcwd()),
            "argv0": portable_path(sys.argv[0])}


def portable_path(path: str) -> str:
    """``path`` relative to this repository when it lies inside it: a record names no machine's folders."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else path


def write_results(out: Path, name: str, payload: dict, argv: list[str],
                  program: str = "python -m benchmarks") -> Path:
    """``<out>/<name>.json``: ``{"meta": ..., **payload}``; ``program`` is the CLI that ran it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"meta": meta(argv, program)} | payload, indent=1, default=str) + "\n")
    return path


def current_key(key: str) -> str:
    """A figure's key with any old system label in a ratio's name (``step_over_block_...``) renamed."""
    key = OLD_KEYS.get(key, key)
    return OLD_RATIO.sub(lambda m: f"{OLD_LABELS.get(m[1], m[1])}_over_{OLD_LABELS.get(m[2], m[2])}", key)


def upgrade_labels(value):
    """``value`` with every old system label replaced by its schedule's name, wherever a label sits: the
    value of a ``system`` or ``label`` field, a key of a mapping by system (one that holds ``static``),
    or a ratio's key. Keys that carry a label any other way (files of the removed ``engine_throughput``
    module, such as ``step_padding_fraction``) stay as stored."""
    if isinstance(value, list):
        return [upgrade_labels(item) for item in value]
    if not isinstance(value, dict):
        return value
    by_system = "static" in value
    upgraded = {}
    for key, item in value.items():
        key = OLD_LABELS[key] if by_system and key in OLD_LABELS else current_key(key)
        if key in ("system", "label") and isinstance(item, str):
            item = OLD_LABELS.get(item, item)
        upgraded[key] = upgrade_labels(item)
    return upgraded


def read_results(path: Path) -> dict:
    """A stored results file, its system labels the current ones whenever it was written."""
    return upgrade_labels(json.loads(Path(path).read_text()))
