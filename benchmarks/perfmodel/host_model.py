"""The host side of a step: aten operations per kind of forward x seconds per operation.

On a GPU the host issues every operation of a step (dispatch + launch) while the GPU runs the ones
already issued, and waits once per step (the sync that reads the step's result back). So a forward
costs max(GPU time, host time) and every step adds the host's own gap (scheduler, batch building):

    step_s = max(gpu_s, (fixed_ops[kind] + layers x ops_per_layer[kind]) x seconds_per_op) + gap_s

Nothing here is a constant: every figure of a :class:`HostModel` is measured. The experiment
``benchmarks.measure_host`` counts and times the engine's own steps and fits the line with
:func:`fit_seconds_per_op`; :func:`save` and :func:`load` keep the result in
``benchmarks/calibration/host-<device>.json``.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass
from pathlib import Path

CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "calibration"
KINDS = ("refresh", "window", "packed")


@dataclass(frozen=True)
class HostModel:
    fixed_ops: dict[str, float]  # per kind: operations of a step that do not grow with depth
    ops_per_layer: dict[str, float]
    seconds_per_op: float
    gap_s: float  # host seconds per step beyond its operations
    source: str

    def ops(self, kind: str, layers: int) -> float:
        known = kind if kind in self.fixed_ops else max(self.fixed_ops, key=lambda k: self.fixed_ops[k])
        return self.fixed_ops[known] + layers * self.ops_per_layer[known]

    def host_s(self, kind: str, layers: int) -> float:
        return self.ops(kind, layers) * self.seconds_per_op

    def scaled(self, seconds_per_op: float = 1.0, gap: float = 1.0) -> HostModel:
        return dataclasses.replace(self, seconds_per_op=self.seconds_per_op * seconds_per_op,
                                   gap_s=self.gap_s * gap)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HostModel:
        return cls(dict(data["fixed_ops"]), dict(data["ops_per_layer"]), float(data["seconds_per_op"]),
                   float(data["gap_s"]), str(data["source"]))


def fit_seconds_per_op(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares seconds = ops x slope + intercept over (operations, seconds) points: (seconds per
    operation, gap). A negative intercept is clipped to 0, and the slope is then the mean ratio."""
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else mean_y / mean_x
    intercept = mean_y - slope * mean_x
    if intercept < 0:
        return sum(y for _, y in points) / sum(x for x, _ in points), 0.0
    return slope, intercept


def save(model: HostModel, name: str, directory: Path = CALIBRATION_DIR) -> Path:
    path = Path(directory) / f"host-{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(model.to_dict(), indent=1) + "\n")
    return path


def load(name: str, directory: Path = CALIBRATION_DIR) -> HostModel | None:
    path = Path(directory) / f"host-{name}.json"
    return HostModel.from_dict(json.loads(path.read_text())) if path.exists() else None
