"""Project what a recorded forward trace would cost on a GPU with real model shapes (a roofline).

Benchmarks run a tiny model on a CPU, but every model call leaves an ``engine.scheduling.trace.ForwardRecord``
(rows, tokens, context, logit positions). Here each record is priced on a ``benchmarks.perfmodel.hardware.Device``
for a ``ModelShape`` (H = heads x head_dim, V = vocab, kv = KV-cache bytes per position):

    FLOPs = 2 x active_block_params x forward_tokens                     linear layers (MoE: k experts a token)
          + 4 x layers x H x (refresh_rows x refresh_width x refresh_width     QK^T and AV, each part
                              + window_rows x window_tokens x window_context)  at its own context
          + 2 x hidden x V x logit_positions                                 LM head
    bytes = block weights, once per call (a packed call streams them once for both parts);
            an MoE layer reads only the routed experts the call touched (``benchmarks.perfmodel.moe``)
          + LM head weights, once, when the call computes any logits
          + kv x window_rows x window_context                                window reads its cache
          + kv x refresh_rows x refresh_width                                refresh reads its own K/V once
          + kv x (refresh_rows x refresh_width + window_rows x window_tokens)  K/V written
          + 2 x V x logit_positions                                          bf16 logits written
    time  = max(FLOPs / (peak x efficiency), bytes / (bandwidth x bandwidth_efficiency))
            + launch_overhead

A block-causal family (``ModelShape.block_length`` set) is priced by the same formulas: its refresh
part is the admitted rows' one prefill, reported as ``prefill_s`` (its ``refresh_s`` is 0), and its
windows read the left-aligned context up to the furthest active block (``window_context``).

That is the **old projection** (``host=None``): GPU time plus a constant per forward. With a host
model (``benchmarks.perfmodel.host_model.HostModel``) a forward costs instead

    gpu_s  = max(FLOPs / (peak x efficiency), bytes / (bandwidth x bandwidth_efficiency))
             + traffic / (bandwidth x bandwidth_efficiency)
    traffic = forward_tokens x layers x hidden x elementwise_bytes_per_hidden   norms, RoPE, residuals
            + logit_positions x V x logit_bytes                                  the fp32 logits pass
    time  = max(gpu_s, host operations of its kind x seconds per operation) + host gap per step

(the elementwise kernels are memory-bound and run between the GEMMs, so their time adds; the host
issues a step's operations while the GPU runs them and waits once per step). Not counted either way:
the embedding gather. ``benchmarks.perfmodel.calibration_fit.fit_constants`` fits the efficiencies (and the old
model's overhead) to measured GPU seconds; ``load_constants`` reads the result.

Per-part time of a packed call: each part is costed as if it were its own call and the two figures are
scaled so they sum to the packed call's time (so refresh_s, or prefill_s, + window_s = total_s, and
packing's saving is shared in proportion to what each part would have cost alone).
"""
from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.perfmodel.hardware import (
    DEVICES,
    ELEMENTWISE_BYTES_PER_HIDDEN_PER_LAYER,
    LOGIT_BYTES,
    MODELS,
    Device,
    ModelShape,
)
from benchmarks.perfmodel.moe import expected_experts_touched

if TYPE_CHECKING:  # only the type: importing the engine package would pull in torch
    from benchmarks.perfmodel.host_model import HostModel
    from engine.scheduling.trace import ForwardRecord

CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "calibration"
DEFAULT_SOURCE = "default (uncalibrated assumptions, benchmarks/perfmodel/hardware.py)"


@dataclass(frozen=True, slots=True)
class Constants:
    """The three figures the roofline needs beyond the datasheet, and where they came from."""

    efficiency: float  # fraction of peak FLOP/s reached
    bandwidth_efficiency: float  # fraction of HBM bandwidth reached
    launch_overhead_s: float  # fixed seconds per forward (the old projection only)
    source: str = DEFAULT_SOURCE
    elementwise_bytes_per_hidden: float = ELEMENTWISE_BYTES_PER_HIDDEN_PER_LAYER  # host-model projection
    logit_bytes: float = LOGIT_BYTES

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class ForwardCost:
    flops: float
    bytes: float
    compute_s: float  # flops / (peak x efficiency)
    memory_s: float  # bytes / (bandwidth x bandwidth_efficiency)
    time_s: float  # old: max(compute_s, memory_s) + launch overhead; host model: see the module docstring
    bound: str  # "compute" | "memory" | "host"
    gpu_s: float = 0.0
    host_s: float = 0.0


def default_constants(device: Device) -> Constants:
    return Constants(device.efficiency, device.bandwidth_efficiency, device.launch_overhead_s)


def load_constants(device_name: str, directory: Path = CALIBRATION_DIR) -> Constants:
    """``<directory>/<device_name>.json`` when a GPU run wrote one, else the device's defaults."""
    path = Path(directory) / f"{device_name}.json"
    if not path.exists():
        return default_constants(DEVICES[device_name])
    data = json.loads(path.read_text())
    source = f"calibrated {data.get('date', '?')}: {path.name}"
    return Constants(float(data["efficiency"]), float(data["bandwidth_efficiency"]),
                     float(data["launch_overhead_s"]), source=source)


def save_constants(constants: Constants, device_name: str, measured_rows: Sequence[dict],
                   directory: Path = CALIBRATION_DIR) -> Path:
    """Write the fitted constants with today's date and the measured-vs-projected rows behind them."""
    path = Path(directory) / f"{device_name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"device": device_name, "date": datetime.date.today().isoformat(), **constants.to_dict(),
               "rows": list(measured_rows)}
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path


def forward_flops(record: ForwardRecord, model: ModelShape) -> float:
    attention_pairs = (record.refresh_rows * record.refresh_width * record.refresh_width
                       + record.window_rows * record.window_tokens * record.window_context)
    return float(model.block_flops_per_token * record.forward_tokens
                 + model.attention_flops_per_query_key * attention_pairs
                 + 2 * model.lm_head_params * record.logit_positions)


def experts_read(record: ForwardRecord, model: ModelShape, experts: float | None = None) -> float:
    """Routed experts each MoE layer of the call reads: ``experts`` when the replay recorded them, else
    the uniform-routing expectation over the call's forward tokens (0 for a dense model)."""
    if not model.experts:
        return 0.0
    if experts is not None:
        return float(experts)
    return expected_experts_touched(record.forward_tokens, model.experts, model.experts_per_token)


def forward_bytes(record: ForwardRecord, model: ModelShape, experts: float | None = None) -> float:
    if record.forward_tokens == 0:
        return 0.0
    blocks = model.streamed_block_params(experts_read(record, model, experts))
    weights = blocks + (model.lm_head_params if record.logit_positions else 0)
    refresh_positions = record.refresh_rows * record.refresh_width
    kv_positions = (record.window_rows * record.window_context  # window reads its cache
                    + refresh_positions  # refresh attention reads its own fresh K/V once
                    + refresh_positions + record.window_rows * record.window_tokens)  # K/V written
    logits = record.logit_positions * model.vocab
    return float((weights + logits) * model.bytes_per_param + kv_positions * model.kv_bytes_per_token)


def traffic_bytes(record: ForwardRecord, model: ModelShape, constants: Constants) -> float:
    """Elementwise activations and the logits pass: what the host-model projection adds to the bytes."""
    return (record.forward_tokens * model.layers * model.hidden * constants.elementwise_bytes_per_hidden
            + record.logit_positions * model.vocab * constants.logit_bytes)


def _roofline(flops: float, nbytes: float, device: Device, constants: Constants) -> ForwardCost:
    compute_s = flops / (device.peak_flops * constants.efficiency)
    memory_s = nbytes / (device.bandwidth * constants.bandwidth_efficiency)
    overhead = constants.launch_overhead_s if (flops or nbytes) else 0.0
    return ForwardCost(flops, nbytes, compute_s, memory_s, max(compute_s, memory_s) + overhead,
                       "compute" if compute_s >= memory_s else "memory")


def forward_cost(record: ForwardRecord, model: ModelShape, device: Device, constants: Constants | None = None,
                 host: HostModel | None = None, experts: float | None = None) -> ForwardCost:
    """The time of one model call: the old roofline, or with ``host`` the host-model projection.
    ``experts``: routed experts each MoE layer read (None: the uniform-routing expectation)."""
    constants = constants or default_constants(device)
    flops, nbytes = forward_flops(record, model), forward_bytes(record, model, experts)
    if host is None:
        return _roofline(flops, nbytes, device, constants)
    roof = _roofline(flops, nbytes, device, dataclasses.replace(constants, launch_overhead_s=0.0))
    traffic_s = traffic_bytes(record, model, constants) / (device.bandwidth * constants.bandwidth_efficiency)
    gpu_s = roof.time_s + traffic_s
    host_s = host.host_s(record.kind, model.layers) if record.forward_tokens else 0.0
    return ForwardCost(flops, nbytes + traffic_bytes(record, model, constants), roof.compute_s,
                       roof.memory_s + traffic_s, max(gpu_s, host_s) + host.gap_s,
                       "host" if host_s > gpu_s else roof.bound, gpu_s, host_s)


def split_two_forwards(record: ForwardRecord) -> tuple[ForwardRecord, ...]:
    """The call's parts as separate calls: (refresh-only, window-only) for a packed call, else (record,).

    The record does not say which part computed which logits, nor which real tokens: both are split in
    proportion to rows (every row computes logits for its block in either part).
    """
    if record.kind != "packed":
        return (record,)
    share = record.refresh_rows / record.rows
    refresh_logits = round(record.logit_positions * share)
    refresh_real = round(record.real_tokens * share)
    refresh = dataclasses.replace(record, window_rows=0, window_tokens=0, window_context=0,
                                  logit_positions=refresh_logits, real_tokens=refresh_real, window_pad_tokens=0)
    window = dataclasses.replace(record, refresh_rows=0, refresh_width=0, refresh_pad_tokens=0,
                                 logit_positions=record.logit_positions - refresh_logits,
                                 real_tokens=record.real_tokens - refresh_real)
    return refresh, window


def _resolve(model: ModelShape | str, device: Device | str) -> tuple[ModelShape, Device, str | None]:
    model = MODELS[model] if isinstance(model, str) else model
    if isinstance(device, str):
        return model, DEVICES[device], device
    key = next((name for name, known in DEVICES.items() if known == device), None)
    return model, device, key


def _priced(record: ForwardRecord, count: float | None, model: ModelShape, device: Device, constants: Constants,
            host: HostModel | None, packed: bool) -> tuple[list[tuple[ForwardRecord, ForwardCost]], list]:
    """The call's (unit, cost) as run, and (part, seconds) of each part. A packed call's parts share its
    time in proportion to what each would cost alone; with ``packed=False`` they run as two calls. A
    part of a packed call reads the experts uniform routing expects of its own tokens."""
    parts = split_two_forwards(record)
    alone = [forward_cost(part, model, device, constants, host, count if len(parts) == 1 else None)
             for part in parts]
    if len(parts) == 1 or not packed:
        units = list(zip(parts, alone))
    else:
        units = [(record, forward_cost(record, model, device, constants, host, count))]
    parts_s = sum(cost.time_s for cost in alone)
    scale = sum(cost.time_s for _, cost in units) / parts_s if parts_s else 0.0
    return units, [(part, cost.time_s * scale) for part, cost in zip(parts, alone)]


def project(trace: Sequence[ForwardRecord], generated_tokens: int, model: ModelShape | str,
            device: Device | str, constants: Constants | None = None, packed: bool = True,
            host: HostModel | None = None, experts: Sequence[float | None] | None = None) -> dict:
    """Projected seconds, tok/s and MFU of a whole trace.

    ``constants`` defaults to ``load_constants`` for a known device (a calibration file wins over the
    defaults; the result's ``constants.source`` says which). With ``packed=False`` every packed call is
    costed as its two parts run one after the other (what the engine would pay without packing).
    MFU = counted FLOPs (padding included) / (total seconds x peak). ``host``: the host-model
    projection (module docstring); None: the old one. ``experts``: per record, the routed experts each
    MoE layer read (None, or a None entry: the uniform-routing expectation). A block-causal model's
    refresh parts are prefills: ``prefill_s``, never ``refresh_s``.
    """
    model, device, key = _resolve(model, device)
    if constants is None:
        constants = load_constants(key) if key else default_constants(device)
    calls = {"refresh": 0, "window": 0, "packed": 0}
    sums = dict.fromkeys(("total_s", "refresh_s", "prefill_s", "window_s", "flops", "bytes", "gpu_s", "host_s",
                          "experts", "rows", "tokens", "compute_bound_calls", "host_bound_calls"), 0.0)
    refresh_key = "prefill_s" if model.block_length else "refresh_s"
    for index, record in enumerate(trace):
        count = experts[index] if experts is not None else None
        sums["experts"] += experts_read(record, model, count)
        units, shares = _priced(record, count, model, device, constants, host, packed)
        for unit, cost in units:
            calls[unit.kind] += 1
            for name, value in (("total_s", cost.time_s), ("flops", cost.flops), ("bytes", cost.bytes),
                                ("rows", unit.rows), ("tokens", unit.forward_tokens), ("gpu_s", cost.gpu_s),
                                ("host_s", cost.host_s), ("compute_bound_calls", cost.bound == "compute"),
                                ("host_bound_calls", cost.bound == "host")):
                sums[name] += value
        for part, seconds in shares:
            sums[refresh_key if part.refresh_rows else "window_s"] += seconds
    n_calls, total_s = sum(calls.values()), sums["total_s"]
    return {
        "model": model.name, "device": device.name, "packed": packed, "constants": constants.to_dict(),
        "calls": n_calls, "calls_by_kind": calls,
        **{name: sums[name] for name in ("total_s", "refresh_s", "prefill_s", "window_s")},
        "host_model": host.to_dict() if host else None,
        "launch_overhead_s": 0.0 if host else n_calls * constants.launch_overhead_s,
        **{name: int(sums[name]) for name in ("compute_bound_calls", "host_bound_calls")},
        "gpu_s": sums["gpu_s"], "host_s": sums["host_s"], "host_gap_s": n_calls * host.gap_s if host else 0.0,
        "flops": sums["flops"], "bytes": sums["bytes"],
        "experts_read_mean": sums["experts"] / len(trace) if model.experts and trace else 0.0,
        "generated_tokens": generated_tokens,
        "tokens_per_s": generated_tokens / total_s if total_s else 0.0,
        "mfu": sums["flops"] / (total_s * device.peak_flops) if total_s else 0.0,
        "mean_rows_per_forward": sums["rows"] / n_calls if n_calls else 0.0,
        "mean_tokens_per_forward": sums["tokens"] / n_calls if n_calls else 0.0,
    }
