"""The GPU run's model and calibration: random real-shaped weights, timed forwards, fitted constants."""
from __future__ import annotations

import time

import torch

from benchmarks import measure_host
from benchmarks.perfmodel.calibration_fit import calibration_rows, fit_constants
from benchmarks.perfmodel.hardware import DEVICES, MODELS
from benchmarks.perfmodel.projection import forward_cost, load_constants
from engine.models.config import TransformerConfig
from engine.models.kv_cache import KVCache
from engine.models.layout import RowLayout
from engine.models.loader import TINY_MODEL_DIR, DiffusionLM, SpecialTokenIds, load_tokenizer
from engine.models.step_inputs import RefreshPart, WindowPart
from engine.models.transformer import BidirectionalTransformer
from engine.scheduling.trace import ForwardRecord

BLOCK = 32
WIDTHS = (160, 400, 700)  # HumanEval rows: prompt (39-389 BPE tokens) + canvas (256)
SHAPES = [("refresh", rows, 0) for rows in (1, 4, 16)] + [("window", 0, rows) for rows in (1, 2, 4, 8, 16)] \
    + [("packed", 2, 6), ("packed", 4, 12)]
SMOKE = {"widths": (96,), "repeats": 1, "host": {"deep_layers": 2, "prompts": 2, "repeats": 1}}


def random_lm(name: str, config: TransformerConfig, mask_id: int, eos_id: int, logit_shift: int,
              device: torch.device, dtype: torch.dtype) -> DiffusionLM:
    """Cast on the meta device, allocate on ``device`` with no CPU copy, fill with random weights there."""
    with torch.device("meta"):
        model = BidirectionalTransformer(config).to(dtype)
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("norm.weight"):
                parameter.fill_(1.0)
            elif parameter_name.endswith("bias"):
                parameter.zero_()
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    model.eval().requires_grad_(False)
    special_ids = SpecialTokenIds(mask_id=mask_id, eos_id=eos_id, pad_id=eos_id, stop_ids=(eos_id,))
    layout = RowLayout("llada" if logit_shift == 0 else "dream", logit_shift=logit_shift)  # as those families load
    return DiffusionLM(name=name, family=layout.family, model=model, tokenizer=load_tokenizer(TINY_MODEL_DIR),
                       special_ids=special_ids, layout=layout, max_length=config.max_position_embeddings)


def _parts(lm: DiffusionLM, refresh_rows: int, window_rows: int, width: int):
    """A packed step's two parts over a cache whose slots hold rows of ``width`` (window rows in slots
    ``[0, window_rows)`` as the engine packs them, refresh rows after), and the trace record the engine
    would write for it."""
    device, rows = lm.device, refresh_rows + window_rows
    kv_cache = KVCache(lm.model.config.cache_spec(width), rows, lm.dtype, device)
    kv_cache.key_mask[:, :width] = True
    tokens = torch.randint(0, 100, (rows, width), device=device)
    positions = torch.arange(width, device=device).expand(rows, -1)
    refresh = window = None
    if refresh_rows:
        read = torch.arange(width - BLOCK, width, device=device).expand(refresh_rows, -1)
        refresh = RefreshPart(tokens[:refresh_rows], positions[:refresh_rows],
                              torch.ones(refresh_rows, width, dtype=torch.bool, device=device), read,
                              torch.arange(window_rows, rows, device=device))
    if window_rows:
        columns = torch.arange(width - BLOCK, width, device=device).expand(window_rows, -1)
        window = WindowPart(tokens[refresh_rows:, -BLOCK:], positions[refresh_rows:, -BLOCK:], columns,
                            context_start=0, num_read=BLOCK)
    record = ForwardRecord(refresh_rows=refresh_rows, refresh_width=width if refresh_rows else 0,
                           window_rows=window_rows, window_tokens=BLOCK if window_rows else 0,
                           window_context=width if window_rows else 0,
                           logit_positions=rows * BLOCK, real_tokens=rows * width)
    return refresh, window, kv_cache, record


def time_forward(lm: DiffusionLM, refresh_rows: int, window_rows: int, width: int, repeats: int) -> dict:
    """Median GPU seconds (CUDA events; wall time on the CPU) and host seconds (until the call returns)
    of one forward + logits of that shape, after a warm-up."""
    refresh, window, kv_cache, record = _parts(lm, refresh_rows, window_rows, width)
    cuda = lm.device.type == "cuda"
    gpu, host = [], []
    with torch.no_grad():
        for repeat in range(repeats + 1):
            if cuda:
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            began = time.perf_counter()
            lm.model.logits(lm.model.forward_step(refresh, window, kv_cache))
            returned = time.perf_counter() - began
            if cuda:
                end.record()
                torch.cuda.synchronize()
                elapsed = start.elapsed_time(end) / 1e3
            else:
                elapsed = returned
            if repeat:
                gpu.append(elapsed)
                host.append(returned)
    del kv_cache
    from benchmarks.summary import median

    return {"record": record, "gpu_s": median(gpu), "host_s": median(host)}


def device_key(name: str) -> str:
    return next((key for key in DEVICES if key in name.lower()), "h200")


def calibrate(lm: DiffusionLM, device: torch.device, smoke: bool, deadline: float) -> dict:
    """Host model and timed forwards on this device; constants fitted to the forwards' GPU seconds."""
    started = time.perf_counter()
    host = measure_host.measure(device=str(device), **(SMOKE["host"] if smoke else {}))
    widths, repeats = (SMOKE["widths"], SMOKE["repeats"]) if smoke else (WIDTHS, 3)
    samples = []
    for width in widths:
        for _, refresh_rows, window_rows in SHAPES:
            if time.perf_counter() > deadline - 240:  # leave the engine runs their share
                break
            samples.append(time_forward(lm, refresh_rows, window_rows, width, repeats))
    key = device_key(torch.cuda.get_device_name() if device.type == "cuda" else "")
    model, gpu = MODELS["llada-8b"], DEVICES[key]
    default = load_constants(key)
    fitted = fit_constants([(s["record"], s["gpu_s"]) for s in samples], model, gpu) if samples else default
    rows = calibration_rows([(s["record"], s["gpu_s"]) for s in samples], model, gpu, fitted)
    for row, sample in zip(rows, samples):
        row |= {"host_s": sample["host_s"],
                "projected_default_s": forward_cost(sample["record"], model, gpu, default).time_s,
                "projected_host_model_s": forward_cost(sample["record"], model, gpu, fitted, host).time_s}
    return {"device_key": key, "host_model": host.to_dict(), "default": default.to_dict(),
            "fitted": fitted.to_dict(), "rows": rows, "seconds": time.perf_counter() - started,
            "meaningful": not smoke}


def write_summary(results: dict, path) -> str:
    """A short text summary (what fits a remote output tail); the figures are in results.json."""
    lines = [f"{results['meta']['machine']} | {results['device']} {results['dtype']} | wall {results['wall_s']:.0f} s"
             + (" | SMOKE (tiny shapes on the CPU: figures meaningless)" if results["smoke"] else "")]
    for name, entry in results["models"].items():
        calibration, runs = entry["calibration"], entry["runs"]
        host, fitted = calibration["host_model"], calibration["fitted"]
        lines.append(f"{name}: host {host['seconds_per_op'] * 1e6:.1f} us/op, gap {host['gap_s'] * 1e3:.2f} ms; "
                     f"fitted eff {fitted['efficiency']:.3f} bw {fitted['bandwidth_efficiency']:.3f} "
                     f"overhead {fitted['launch_overhead_s'] * 1e3:.2f} ms ({fitted['source']})")
        for mode, systems in runs["modes"].items():
            if isinstance(systems, str):
                lines.append(f"  {mode}: {systems}")
                continue
            for system, run in systems.items():
                if isinstance(run, str):
                    lines.append(f"  {mode:>8} {system:>10}: {run}")
                    continue
                errors = " ".join(f"{label} {value:+.0%}" for label, value in run["projection_error"].items())
                lines.append(f"  {mode:>8} {system:>10}: {run['tokens_per_s']:8.1f} tok/s measured, MFU "
                             f"{run['mfu']:.1%}, steps/block {run['row_steps_per_block']:.1f}"
                             f"{' (TIMED OUT)' if run['timed_out'] else ''} | projection error {errors}")
    for mode, cells in results.get("exactness_bf16", {}).items():
        shares = [value for value in cells.values() if isinstance(value, float)]
        lines.append(f"bf16 batched == solo, {mode}: " + (f"lowest {min(shares):.0%} over {len(shares)} cells"
                                                          if len(shares) == len(cells) else str(cells)[:200]))
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text
