"""The schedules on LLaDA-8B- and Dream-7B-shaped models (bf16, RANDOM weights) on one GPU, and the
calibration of the GPU projection.

    python -m benchmarks.gpu            # one H200: both shapes, < 8 min, prints ONE JSON object
    python -m benchmarks.gpu --smoke    # tiny shapes on the CPU in seconds (CI keeps it from rotting)

Calibration (first, about a minute): the forward shapes the engine's trace records (refresh parts of
1-16 rows, window parts of 1-16 rows of a block, packed calls) are timed on the real shapes with CUDA
events; ``benchmarks.projection.fit_constants`` fits efficiency, bandwidth efficiency and launch
overhead to them and ``save_constants`` writes ``benchmarks/calibration/<device>.json``, which every
later projection reads. Measured beside projected is printed for each shape.

Real checkpoints cannot be downloaded where this runs, so the weights are random (normal, std 0.02,
built directly on the device). Consequences, stated in the output:
* Random weights have no meaningful EOS, so every request runs to a length cap taken from the token
  length of its HumanEval canonical solution (``stop_at_eos=False``). The real tokenizers are not at
  hand either: lengths are estimated as byte-level BPE *pre-tokenizer* pieces (a lower bound of BPE
  tokens); prompt token ids are the tiny char tokenizer's ids of the prompt's last characters.
* Random weights are never confident (top softmax probability ~1e-3 over a 126k vocabulary), so
  threshold decoding (tau = 0.9, or any tau a random model could reach) commits one token per step:
  steps per block = block length. A lower threshold changes nothing for such a model, so the figures
  are also reported with LLaDA's fixed-quota rule at 8 steps per block (4 tokens per step, about what
  real weights reach with threshold decoding), the honest proxy for parallel decoding's cost.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time

import torch

from benchmarks.replay import bpe_pieces
from benchmarks.simulate import simulate_schedule
from benchmarks.systems import SYSTEMS, run_system
from benchmarks.workloads import Workload, humaneval
from engine import EngineConfig, SamplingParams
from engine.models.loader import TINY_MODEL_DIR, DiffusionLM, SpecialTokens, load_tokenizer
from engine.models.transformer import BidirectionalTransformer, TransformerConfig

GIB = 1024**3
SHAPES = {  # (config, mask id, eos id, logit shift): the published configs' shapes and special ids
    "llada-8b": (TransformerConfig(vocab_size=126464, hidden_size=4096, num_layers=32, num_heads=32,
                                   num_kv_heads=32, intermediate_size=12288, rope_theta=500000.0,
                                   max_position_embeddings=4096), 126336, 126081, 0),
    "dream-7b": (TransformerConfig(vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28,
                                   num_kv_heads=4, intermediate_size=18944, rope_theta=1000000.0,
                                   rms_norm_eps=1e-6, qkv_bias=True, max_position_embeddings=32768),
                 151666, 151643, 1),
}
SMOKE_SHAPES = {
    "llada-tiny": (TransformerConfig(vocab_size=1024, hidden_size=64, num_layers=2, num_heads=4,
                                     num_kv_heads=4, intermediate_size=128, max_position_embeddings=1024),
                   1000, 1001, 0),
    "dream-tiny": (TransformerConfig(vocab_size=1024, hidden_size=64, num_layers=2, num_heads=4,
                                     num_kv_heads=2, intermediate_size=96, qkv_bias=True,
                                     max_position_embeddings=1024), 1000, 1001, 1),
}
DECODINGS = {"threshold-0.9": {"decoding": "threshold", "threshold": 0.9},
             "quota-8-steps": {"decoding": "quota", "steps_per_block": 8}}


def random_lm(name: str, config: TransformerConfig, mask_id: int, eos_id: int, logit_shift: int,
              device: torch.device, dtype: torch.dtype) -> DiffusionLM:
    """Allocate on ``device`` without a CPU copy and fill with random weights there."""
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
    model.tie_weights()
    model.eval().requires_grad_(False)
    tokens = SpecialTokens(mask_id=mask_id, eos_id=eos_id, pad_id=eos_id, stop_ids=(eos_id,))
    return DiffusionLM(name=name, family="llada" if logit_shift == 0 else "dream", model=model,
                       tokenizer=load_tokenizer(TINY_MODEL_DIR), tokens=tokens, logit_shift=logit_shift,
                       max_length=config.max_position_embeddings)


def humaneval_workload(lm: DiffusionLM, count: int, max_new_tokens: int) -> Workload:
    """HumanEval with BPE-estimated prompt lengths and caps, as token ids inside the tiny vocabulary."""
    tokenizer = lm.tokenizer

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    workload = humaneval(encode, tokenizer.unk_token_id, lm.max_length, count, max_new_tokens,
                         measure=bpe_pieces)
    workload.notes["length_unit"] = "byte-level BPE pre-tokenizer pieces (a lower bound of BPE tokens)"
    return workload


class Memory:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        return torch.cuda.max_memory_allocated() / GIB if self.cuda else None


def widest_row(workload: Workload, block_length: int = 32) -> int:
    """The arena width a workload needs: its longest prompt plus its longest canvas."""
    return max(len(p) for p in workload.prompts) + block_length * math.ceil(
        max(p.max_new_tokens for p in workload.params) / block_length)


def run_decoding(lm, workload, memory: Memory, batch_size: int, decoding: dict) -> dict:
    rows = {}
    for system in SYSTEMS:
        memory.reset()
        result = run_system(lm, system, workload, max_batch_size=batch_size, cache="dual",
                            max_model_len=widest_row(workload), **decoding)
        s = result.stats
        rows[system] = {"tokens_per_s": s["tokens_per_s"], "elapsed_s": s["elapsed_s"],
                        "peak_memory_gib": memory.peak_gib(), "effective_compute_ratio": s["effective_compute_ratio"],
                        "useful_row_fraction": s["useful_row_fraction"], "padding_fraction": s["padding_fraction"],
                        "scheduler_overhead_fraction": s["scheduler_overhead_fraction"],
                        "tokens_per_step": s["generated_tokens"] / max(s["denoise_steps"], 1) / max(s["mean_rows"], 1e-9),
                        "forward_passes": s["forward_passes"], "window_forwards": s["window_forwards"],
                        "rows_per_forward": s["rows_per_forward"],
                        "peak_rows": result.peak_rows, "generated_tokens": s["generated_tokens"]}
    block, step = rows["block"]["tokens_per_s"], rows["step"]["tokens_per_s"]
    return {"systems": rows, "speedup_vs_static": block / rows["static"]["tokens_per_s"],
            "speedup_vs_shrink": block / rows["shrink"]["tokens_per_s"], "step_over_block": step / block}


def _probe_peak_gib(lm, memory: Memory, rows: int, width: int, token_id: int) -> float | None:
    """Peak memory of one block cycle (a full forward: the cycle's largest pass) on a rows x width box."""
    memory.reset()
    params = SamplingParams(max_new_tokens=32, stop_at_eos=False)
    probe = Workload("probe", [[token_id] * (width - 32)] * rows, [params] * rows)
    run_system(lm, "static", probe, max_batch_size=rows, decoding="quota", steps_per_block=1, max_model_len=width)
    return memory.peak_gib()


def capacity(lm, workload: Workload, memory: Memory, memory_budget_gib: float | None,
             fallback_budget: int) -> dict:
    """The token budget a memory budget allows (two probes, linear fit), then each system's largest batch.

    ``static``/``shrink`` fix a batch size up front that must fit the workload's widest row (longest
    prompt + longest canvas) in every row; ``block`` admits by the budget at each boundary, so what
    it sustains is replayed with the engine's scheduler on the (repeated) workload.
    """
    lengths = [len(p) for p in workload.prompts]
    caps = [p.max_new_tokens for p in workload.params]
    widest = max(lengths) + 32 * math.ceil(max(caps) / 32)
    token_id = workload.prompts[0][0]
    result: dict = {"memory_budget_gib": memory_budget_gib}
    if memory.cuda and memory_budget_gib:
        points = [(rows * widest, _probe_peak_gib(lm, memory, rows, widest, token_id)) for rows in (8, 16)]
        (t1, m1), (t2, m2) = points
        per_token = (m2 - m1) / (t2 - t1)
        token_budget = int((memory_budget_gib - (m1 - per_token * t1)) / per_token * 0.95)
        result |= {"probes_box_tokens_peak_gib": points, "gib_per_box_token": per_token}
    else:
        token_budget = fallback_budget
    static_batch = token_budget // widest
    repeats = max(1, math.ceil(8 * max(static_batch, 1) / len(lengths)))  # enough queue for steady state
    config = EngineConfig(schedule="block", max_batch_size=100_000)
    block = simulate_schedule(lengths * repeats, caps * repeats, config, token_budget)
    fixed = simulate_schedule(lengths * repeats, [max(caps)] * len(caps) * repeats, config, token_budget)
    if memory.cuda and memory_budget_gib and static_batch:
        result["static_largest_batch_measured_peak_gib"] = _probe_peak_gib(lm, memory, static_batch, widest, token_id)
    return result | {
        "token_budget": token_budget, "widest_row": widest, "static_largest_batch": static_batch,
        "shrink_largest_batch": static_batch, "block_peak_rows": block["peak_rows"],
        "block_mean_rows": block["mean_rows"], "block_mean_rows_over_static": block["mean_rows"] / max(static_batch, 1),
        "block_mean_rows_if_every_cap_were_the_longest": fixed["mean_rows"]}


CALIBRATION_SHAPES = {  # (refresh rows, window rows): HumanEval-like rows of ~416 columns, blocks of 32
    "refresh": [(1, 0), (4, 0), (16, 0)],
    "window": [(0, 1), (0, 2), (0, 4), (0, 8), (0, 16)],
    "packed": [(2, 6), (4, 12)],
}
PROJECTION_MODELS = {"llada-8b": "llada-8b", "dream-7b": "dream-7b"}


def device_key(name: str) -> str | None:
    for key in ("h200", "h100", "a100"):
        if key in name.lower():
            return key
    return None


def time_forward(lm: DiffusionLM, refresh_rows: int, window_rows: int, width: int, repeats: int):
    """Seconds of one packed forward (+ its logits) of that shape, median of ``repeats``; and its record."""
    from engine.models.step_inputs import KVArena, RefreshPart, WindowPart
    from engine.trace import ForwardRecord

    device, block = lm.device, 32
    slots = refresh_rows + window_rows
    arena = KVArena(lm.model.config, slots, width, lm.dtype, device)
    arena.key_mask[:, :width] = True
    tokens = torch.randint(0, 100, (slots, width), device=device)
    positions = torch.arange(width, device=device).expand(slots, -1)
    read = torch.arange(width - block, width, device=device).expand(max(refresh_rows, 1), -1)
    refresh = window = None
    if refresh_rows:
        refresh = RefreshPart(tokens[:refresh_rows], positions[:refresh_rows],
                              torch.ones(refresh_rows, width, dtype=torch.bool, device=device),
                              read[:refresh_rows], torch.arange(refresh_rows, device=device))
    if window_rows:
        columns = torch.arange(width - block, width, device=device).expand(window_rows, -1)
        window = WindowPart(tokens[refresh_rows:, -block:], positions[refresh_rows:, -block:], columns,
                            torch.arange(refresh_rows, slots, device=device), context_start=0, num_read=block,
                            slot_runs=((refresh_rows, window_rows),))
    record = ForwardRecord(refresh_rows=refresh_rows, refresh_width=width if refresh_rows else 0,
                           window_rows=window_rows, window_tokens=block if window_rows else 0,
                           window_context=width if window_rows else 0, logit_positions=slots * block,
                           real_tokens=slots * width)
    samples = []
    with torch.no_grad():
        for repeat in range(repeats + 1):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                lm.model.logits(lm.model.forward_step(refresh, window, arena))
                end.record()
                torch.cuda.synchronize()
                seconds = start.elapsed_time(end) / 1e3
            else:
                started = time.perf_counter()
                lm.model.logits(lm.model.forward_step(refresh, window, arena))
                seconds = time.perf_counter() - started
            if repeat:  # the first run warms up
                samples.append(seconds)
    del arena
    return record, sorted(samples)[len(samples) // 2]


def calibrate(lm: DiffusionLM, shape_name: str, device_name: str, smoke: bool) -> dict:
    """Time the trace's forward shapes; fit and (on a known GPU) save the projection's constants."""
    from benchmarks.hardware import DEVICES, MODELS
    from benchmarks.projection import calibration_rows, fit_constants, forward_cost, load_constants, save_constants

    width, repeats = (96, 2) if smoke else (416, 5)
    samples = [time_forward(lm, refresh_rows, window_rows, width, repeats)
               for shapes in CALIBRATION_SHAPES.values() for refresh_rows, window_rows in shapes]
    key, model_key = device_key(device_name), PROJECTION_MODELS.get(shape_name)
    if key is None or model_key is None:  # a CPU smoke run: the timing path only
        return {"samples": [record.to_dict() | {"measured_s": seconds} for record, seconds in samples],
                "fitted": None}
    model, device = MODELS[model_key], DEVICES[key]
    before = load_constants(key)
    fitted = fit_constants(samples, model, device)
    rows = calibration_rows(samples, model, device, fitted)
    for row, (record, _) in zip(rows, samples):
        row["projected_before_s"] = forward_cost(record, model, device, before).time_s
    path = save_constants(fitted, key, rows) if model_key == "llada-8b" else None
    return {"fitted": fitted.to_dict(), "previous": before.to_dict(), "rows": rows,
            "written": str(path) if path else None}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, seconds")
    parser.add_argument("--requests", type=int, default=64, help="HumanEval problems per run")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=512)
    parser.add_argument("--memory-budget-gib", type=float, default=40.0)
    parser.add_argument("--time-budget-s", type=float, default=360.0, help="skip what would run past it")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.perf_counter()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    requests, batch_size = (4, 2) if args.smoke else (args.requests, args.batch_size)
    max_new_tokens = 64 if args.smoke else args.max_new_tokens
    memory = Memory(device)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "dtype": str(dtype), "weights": "random (normal std 0.02)",
           "batch_size": batch_size, "cache": "dual", "command": " ".join(["python -m benchmarks.gpu", *(argv or sys.argv[1:])]),
           "models": {}}
    for name, (config, mask_id, eos_id, shift) in shapes.items():
        entry = out["models"][name] = {}
        build_started = time.perf_counter()
        lm = random_lm(name, config, mask_id, eos_id, shift, device, dtype)
        entry["parameters_b"] = sum(p.numel() for p in lm.model.parameters()) / 1e9
        entry["weights_gib"] = torch.cuda.memory_allocated() / GIB if memory.cuda else None
        workload = humaneval_workload(lm, requests, max_new_tokens)
        entry["workload"] = workload.notes
        run_system(lm, "block", workload.head(2), max_batch_size=2, decoding="quota", steps_per_block=2,
                   max_model_len=widest_row(workload))  # warm-up
        entry["build_and_warmup_s"] = time.perf_counter() - build_started
        entry["calibration"] = calibrate(lm, name, out["device"], args.smoke)
        for row in (entry["calibration"].get("rows") or []):
            print(f"  {name} {row['kind']:>7} rows {row['refresh_rows']}+{row['window_rows']}: measured "
                  f"{row['measured_s'] * 1e3:.2f} ms, projected {row['projected_s'] * 1e3:.2f} ms "
                  f"(before calibration {row['projected_before_s'] * 1e3:.2f} ms)", file=sys.stderr)
        for label, decoding in DECODINGS.items():
            if time.perf_counter() - started > args.time_budget_s:
                entry[label] = "skipped: time budget"
                continue
            entry[label] = run_decoding(lm, workload, memory, batch_size, decoding)
        if time.perf_counter() - started <= args.time_budget_s:
            every_problem = humaneval_workload(lm, None, max_new_tokens)
            entry["capacity"] = capacity(lm, every_problem, memory, None if args.smoke else args.memory_budget_gib,
                                         fallback_budget=8 * lm.max_length)
        else:
            entry["capacity"] = "skipped: time budget"
        del lm
        if device.type == "cuda":
            torch.cuda.empty_cache()
    out["wall_s"] = time.perf_counter() - started
    print(json.dumps(out, default=float))
    return out


if __name__ == "__main__":
    main()
