"""What a training run carries across sessions: steps, time, the best validation, the curve, and the
state file that holds the model, optimizer, random streams and the moving average of the weights."""
from __future__ import annotations

import copy
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch


@dataclass
class Progress:
    """What accumulates across sessions: steps, wall and CPU time, the best validation, the curve."""
    step: int = 0
    elapsed: float = 0.0
    cpu_seconds: float = 0.0
    best: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    rewarm_from: int | None = None  # a resume with fresh optimizer moments ramps the lr up again


def save_state(path: Path, model, optimizer, rng, progress: Progress, averaged=None) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng.getstate(),
                "torch_rng": torch.get_rng_state(), **asdict(progress),
                **({"averaged": averaged.state_dict()} if averaged is not None else {})}, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def training_record(progress: Progress, args) -> dict:
    return {"steps": progress.step, "cpu_hours": round(progress.cpu_seconds / 3600, 3),
            "wall_hours": round(progress.elapsed / 3600, 3), "mixture": args.mixture,
            "batch_size": args.batch_size, "decoding": args.decoding, "validation": progress.best,
            "history": progress.history}


def resume(state_file: Path, model, optimizer, rng: random.Random) -> Progress:
    # Loaded on the CPU: the RNG state must stay a CPU tensor; model and optimizer copy to their device.
    state = torch.load(state_file, weights_only=False, map_location="cpu")
    model.load_state_dict(state["model"])
    try:
        optimizer.load_state_dict(state["optimizer"])
        fresh_optimizer = False
    except ValueError as error:  # the model's parameter layout changed (e.g. fused projections)
        print(f"optimizer state not reusable ({error}); fresh moments, lr re-warmed", flush=True)
        fresh_optimizer = True
    rng.setstate(state["rng"])
    torch.set_rng_state(state["torch_rng"])
    return Progress(state["step"], state["elapsed"], state.get("cpu_seconds", 0.0), state.get("best", {}),
                    state.get("history", []), rewarm_from=state["step"] if fresh_optimizer else None)


def continue_record(record_file: Path) -> Progress:
    """A warm start from a shipped checkpoint continues its curve: its steps, hours and best score are
    carried over, so the schedule resumes where it stopped and only a better model replaces it."""
    record = json.loads(record_file.read_text())
    return Progress(record["steps"], record["wall_hours"] * 3600, record["cpu_hours"] * 3600,
                    record["validation"], record["history"], rewarm_from=record["steps"])


def weight_average(model: torch.nn.Module, decay: float, state_file: Path) -> torch.nn.Module | None:
    """A copy of ``model`` that follows its weights as an exponential moving average (None: decay 0).
    Resumed from the state file when it holds one; the checkpoint's sharp minimum-to-minimum swings
    between validations average out."""
    if decay <= 0:
        return None
    averaged = copy.deepcopy(model).eval().requires_grad_(False)
    if state_file.is_file():
        state = torch.load(state_file, weights_only=False, map_location="cpu")
        if "averaged" in state:
            averaged.load_state_dict(state["averaged"])
    return averaged
