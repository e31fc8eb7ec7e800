"""The one results writer: every experiment's JSON carries the command, date, machine and versions."""
from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import sys
from pathlib import Path


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


def meta(argv: list[str]) -> dict:
    return {"command": "python -m benchmarks " + shlex.join(argv),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine_description(), "versions": versions(), "cwd": os.getcwd(),
            "argv0": sys.argv[0]}


def write_results(out: Path, name: str, payload: dict, argv: list[str]) -> Path:
    """``<out>/<name>.json``: ``{"meta": ..., **payload}``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps({"meta": meta(argv)} | payload, indent=1, default=str) + "\n")
    return path
