"""Fit the projection's constants (efficiencies, per-forward overhead) to measured GPU seconds.

The experiment ``benchmarks.calibrate_gpu`` measures (record, seconds) samples on a GPU.
:func:`fit_constants` finds the :class:`~benchmarks.perfmodel.projection.Constants` that price them
best, and :func:`calibration_rows` is the measured-vs-projected table ``save_constants`` keeps beside them.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from benchmarks.perfmodel.hardware import Device, ModelShape
from benchmarks.perfmodel.projection import Constants, forward_bytes, forward_cost, forward_flops

if TYPE_CHECKING:  # only the type: importing the engine package would pull in torch
    from engine.scheduling.trace import ForwardRecord


def _fit_grid(flops: np.ndarray, nbytes: np.ndarray, seconds: np.ndarray, device: Device,
              efficiencies: np.ndarray, bandwidths: np.ndarray,
              prior: tuple[float, float]) -> tuple[float, float, float, float]:
    """Best (efficiency, bandwidth_efficiency, overhead, loss) on a grid; overhead in closed form.

    Residuals are relative (weight 1/t^2) so millisecond window steps count as much as long refreshes.
    For fixed efficiencies the roofline part r_i is known and the weighted least-squares overhead is
    o = sum w_i (t_i - r_i) / sum w_i, clipped at 0. Ties (a parameter no sample is bound by) go to the
    grid point nearest ``prior``.
    """
    weights = 1.0 / seconds**2
    memory = nbytes[None, :] / (device.bandwidth * bandwidths[:, None])  # [nb, n]
    best: list[tuple[float, float, float, float]] = []
    for efficiency in efficiencies:
        roof = np.maximum(flops / (device.peak_flops * efficiency), memory)  # [nb, n]
        overhead = np.clip(((seconds - roof) * weights).sum(1) / weights.sum(), 0.0, None)
        loss = (((seconds - roof - overhead[:, None]) ** 2) * weights).sum(1)
        best.extend(zip([float(efficiency)] * len(bandwidths), bandwidths.tolist(), overhead.tolist(),
                        loss.tolist()))
    lowest = min(entry[3] for entry in best)
    ties = [entry for entry in best if entry[3] <= lowest * (1 + 1e-9) + 1e-15]
    return min(ties, key=lambda e: (e[0] - prior[0]) ** 2 + (e[1] - prior[1]) ** 2)


def fit_constants(samples: Sequence[tuple[ForwardRecord, float]], model: ModelShape,
                  device: Device) -> Constants:
    """Least-squares fit of (efficiency, bandwidth_efficiency, launch_overhead_s) to measured seconds.

    A coarse grid (step 0.005), then finer grids (steps 5e-4, 5e-5, 5e-6) around the best point; numpy
    only. Each efficiency is only identified by samples bound by it: include small window steps (memory-bound)
    and large refreshes (compute-bound). An unidentified one stays at the device default.
    """
    if not samples:
        raise ValueError("fit_constants needs at least one (record, seconds) sample")
    flops = np.array([forward_flops(record, model) for record, _ in samples])
    nbytes = np.array([forward_bytes(record, model) for record, _ in samples])
    seconds = np.array([float(s) for _, s in samples])
    prior = (device.efficiency, device.bandwidth_efficiency)
    grid = np.arange(1, 201) * 0.005
    e, b, overhead, loss = _fit_grid(flops, nbytes, seconds, device, grid, grid, prior)
    for step in (5e-4, 5e-5, 5e-6):  # zoom: +-8 previous steps, recentred at an edge
        for _ in range(10):
            offsets = np.arange(-80, 81) * step
            axes = [np.unique(np.clip(centre + offsets, step, 1.0)) for centre in (e, b)]
            e, b, overhead, loss = _fit_grid(flops, nbytes, seconds, device, *axes, prior)
            if all(axis[0] < value < axis[-1] or value in (step, 1.0) for axis, value in zip(axes, (e, b))):
                break
    rms = math.sqrt(loss / len(samples))
    return Constants(e, b, overhead,
                     source=f"fit to {len(samples)} samples on {device.name} (rms relative error {rms:.1%})")


def calibration_rows(samples: Sequence[tuple[ForwardRecord, float]], model: ModelShape, device: Device,
                     constants: Constants) -> list[dict]:
    """The measured-vs-projected table ``save_constants`` stores next to the constants."""
    rows = []
    for record, seconds in samples:
        cost = forward_cost(record, model, device, constants)
        rows.append(record.to_dict() | {"measured_s": seconds, "projected_s": cost.time_s,
                                        "bound": cost.bound})
    return rows
