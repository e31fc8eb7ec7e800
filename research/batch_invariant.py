"""What batch-invariant bf16 costs: CPU tokens/s of a model loaded with and without ``batch_invariant=True``,
measured side by side, and the cost on an H200 projected from the same runs' traces.

    python -m research batch-invariant --scale full      # HumanEval replay, 64 requests, 3 rounds

First, the cause at the kernel: random bf16 rows attended alone and left-padded into wider boxes
(pads 1-97 columns), the share of output elements that differ, with bf16 SDPA over the padded box
(the default) and, for the record, with its reductions widened to float32 and to float64 (an
alternative the mode does not take: it leaves no padded row off, but it no longer gives the tokens of
bf16 SDPA, so a peer's own bf16 decoding differs; the mode's per-row attention over the row's own keys
is the call the row makes alone, so it differs in nothing by construction). Then both modes run
the same HumanEval replay (``benchmarks.replay``: the tiny model in bf16, steered to
HumanEval's answer lengths, the ``continuous`` schedule), interleaved round by round; per round the ratio.

What the mode changes on a GPU is host work: a row's attention and its GEMMs are its own calls
(per row per layer: a few views, one SDPA, q/k/v, o and the MLP; per step: the logits). The
projection counts the operations of a step with and without the mode (``benchmarks.host_ops``, the
LLaDA fixture at 1 and 2 layers, 16 mixed prompts), gives each its own host model (this machine's
seconds per operation, as ``throughput`` does) and projects each mode's own trace for LLaDA-8B on an
H200 (``benchmarks.perfmodel.projection``): the GPU time is the same arithmetic, the host time grows with the
operations. A projection, not a measurement: the GPU script runs the real thing when a GPU is lent.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from benchmarks.host_ops import per_layer_ops
from benchmarks.perfmodel.host_model import HostModel
from benchmarks.perfmodel.projection import load_constants, project
from benchmarks.replay import replay
from benchmarks.results_io import write_results
from benchmarks.summary import median
from benchmarks.systems import interleaved

SCALES = {"smoke": {"requests": 6, "rounds": 1}, "quick": {"requests": 24, "rounds": 1},
          "full": {"requests": 64, "rounds": 3}}
MODES = {"bf16": False, "bf16 batch-invariant": True}


def widened_attention(q, keys, values, mask, dtype):
    """SDPA's arithmetic with q.k, softmax and the value sum in ``dtype``, rounded once to ``q``'s."""
    scores = q.to(dtype) @ keys.to(dtype).transpose(-1, -2) * q.shape[-1] ** -0.5 + mask.to(dtype)
    return (scores.softmax(dim=-1) @ values.to(dtype)).to(q.dtype)


def padded_row_mismatch(seed: int = 0) -> dict[str, float]:
    """Share of attention outputs of a row that change when it is left-padded into a wider box."""
    import torch
    import torch.nn.functional as F

    def attend(q, keys, values, mask, reduction_dtype):
        if reduction_dtype is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return widened_attention(q, keys, values, mask, reduction_dtype)

    generator = torch.Generator().manual_seed(seed)
    heads, head_dim, queries = 8, 64, 16
    reductions = {"bf16 SDPA": None, "float32 reductions": torch.float32, "float64 reductions": torch.float64}
    differing, total = dict.fromkeys(reductions, 0), 0
    for keys_alone in range(20, 300, 7):
        q = torch.randn(1, heads, queries, head_dim, generator=generator).bfloat16()
        keys, values = (torch.randn(1, heads, keys_alone, head_dim, generator=generator).bfloat16() for _ in range(2))
        unpadded = torch.zeros(1, 1, 1, keys_alone, dtype=torch.bfloat16)
        alone = {name: attend(q, keys, values, unpadded, reduction_dtype=dtype) for name, dtype in reductions.items()}
        for pad in (1, 5, 13, 40, 97):
            zeros = torch.zeros(1, heads, pad, head_dim, dtype=torch.bfloat16)
            padded = [torch.cat([zeros, t], 2) for t in (keys, values)]
            mask = torch.cat([torch.full((pad,), float("-inf")), torch.zeros(keys_alone)]).bfloat16().view(1, 1, 1, -1)
            for name, dtype in reductions.items():
                differing[name] += (attend(q, *padded, mask, reduction_dtype=dtype) != alone[name]).sum().item()
            total += alone["bf16 SDPA"].numel()
    return {name: count / total for name, count in differing.items()} | {"elements": total}


def host_models(host: HostModel) -> dict[str, HostModel]:
    """``host``'s seconds per operation with each mode's own operation counts per step kind."""
    models = {}
    for label, on in MODES.items():
        kinds = per_layer_ops("tiny-llada", options={"batch_invariant": on})["kinds"]
        models[label] = dataclasses.replace(host, fixed_ops={k: v["fixed"] for k, v in kinds.items()},
                                            ops_per_layer={k: v["per_layer"] for k, v in kinds.items()})
    return models


def projected(run, host: HostModel, model: str = "llada-8b", device: str = "h200") -> dict:
    trace, tokens = run.extra["trace"], run.stats["generated_tokens"]
    result = project(trace, tokens, model, device, load_constants(device), host=host)
    return {key: result[key] for key in ("total_s", "gpu_s", "host_s", "host_bound_calls", "calls", "tokens_per_s")}


def host_model_measure() -> HostModel:
    from benchmarks import measure_host

    return measure_host.measure(deep_layers=4, prompts=4, repeats=1)  # seconds per operation on this machine


def main(argv: list[str] | None = None) -> dict:
    from engine.models import load_model

    parser = argparse.ArgumentParser(prog="python -m research batch-invariant", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", default="full", choices=sorted(SCALES))
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--requests", type=int, default=None, help="overrides the scale's")
    parser.add_argument("--rounds", type=int, default=None, help="overrides the scale's")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/batch_invariant"))
    args = parser.parse_args(argv)
    mismatch = padded_row_mismatch()
    print("a padded row's attention outputs that differ from the row alone:",
          {name: f"{share:.2e}" for name, share in mismatch.items() if name != "elements"},
          f"of {mismatch['elements']:,}", flush=True)
    sizes = SCALES[args.scale] | {key: getattr(args, key) for key in ("requests", "rounds") if getattr(args, key)}
    models = {on: load_model(args.model, dtype="bfloat16", batch_invariant=on) for on in MODES.values()}
    workload = replay("humaneval", models[False], sizes["requests"])
    variants = {label: {"system": "continuous", "max_batch_size": args.batch_size, "lm": workload.steered(models[on])}
                for label, on in MODES.items()}
    runs = interleaved(models[False], variants, workload.workload, sizes["rounds"])
    result = {"requests": sizes["requests"], "rounds": sizes["rounds"], "batch_size": args.batch_size,
              "padded_row_mismatch": mismatch, "modes": {}}
    for label, results in runs.items():
        result["modes"][label] = {"cpu_tokens_per_s": median([r.tokens_per_s for r in results]),
                                  "outputs_digest": results[0].extra["outputs_digest"]}
    plain, invariant = (result["modes"][label]["cpu_tokens_per_s"] for label in MODES)
    result["cpu_ratio"] = invariant / plain
    result["round_ratios"] = [b.tokens_per_s / a.tokens_per_s for a, b in zip(*runs.values())]
    hosts = host_models(host_model_measure())
    result["ops"] = {label: {"per_layer": host.ops_per_layer, "fixed": host.fixed_ops} for label, host in hosts.items()}
    result["projection"] = {label: projected(runs[label][0], hosts[label]) for label in MODES}
    projected_ratio = result["projection"]["bf16 batch-invariant"]["total_s"] / result["projection"]["bf16"]["total_s"]
    result["projected_time_ratio"] = projected_ratio
    print(f"CPU tokens/s: bf16 {plain:.1f}, batch-invariant {invariant:.1f} ({result['cpu_ratio']:.2f}x; rounds "
          f"{', '.join(f'{r:.2f}' for r in result['round_ratios'])}); operations per layer "
          f"{result['ops']}; projected H200 (LLaDA-8B) time x{projected_ratio:.3f}", flush=True)
    write_results(args.out, "batch_invariant", result, ["batch-invariant", *(argv or [])], program="python -m research")
    return result


if __name__ == "__main__":
    main()
