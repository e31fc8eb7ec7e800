"""DiffusionGemma on the CPU against transformers' own ``generate``, and its H200 projection.

``python -m research diffusion-gemma [--scale smoke|quick|full] [--out DIR]``

Measured, side by side in one run (one thread, interleaved, best of ``--repeats``), on the tiny fixture:
our engine on every prompt at once, transformers' ``generate`` one prompt at a time after
``torch.manual_seed(seed)`` (the tokens ours must equal), and its batch-16 loop (left-padded, one seed):
tokens per second of each, and how many of our answers equal the batch-1 reference's.

``--workload spread``: the same comparison on prompts of 50 to 1,000 tokens (log-uniform, in a fixed
shuffled order; text cut from the demo prompts), ours on every prompt at once (16 rows at most,
continuous batching) against transformers' batches of 16 in arrival order, left-padded to each batch's
longest prompt and each seeded with 0, and (a control) the same batches after sorting the prompts by
length; the batch-1 reference only for the answers' equality, untimed. ``--compile`` runs ours on the
compiled model, after one untimed run that compiles its buckets.

Projected: 26B-A4B on one H200, GPU time only (``*``), priced per denoising step by the FLOPs of the
canvas tokens and the bytes of the weights they touch (experts touched: ``benchmarks.perfmodel.moe``),
the KV cache each layer reads (sliding layers: the window only) and the store pass once per canvas.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from benchmarks.perfmodel.hardware import H200_SXM, Device
from benchmarks.perfmodel.moe import expected_experts_touched
from research.diffusion_gemma_runs import (
    FIXTURE,
    SETTINGS,
    demo_prompts,
    run_ours,
    run_reference_alone,
    run_reference_batched,
)

SCALES = {"smoke": (4, 16, 1), "quick": (16, 32, 2), "full": (16, 64, 3)}  # prompts, new tokens, repeats


@dataclass(frozen=True)
class GemmaShape:
    """DiffusionGemma 26B-A4B as its model card describes it (assumed where the card is silent)."""

    layers: int = 30
    global_every: int = 6  # five sliding layers, then a global one
    hidden: int = 2816
    heads: int = 16
    sliding_kv_heads: int = 8
    sliding_head_dim: int = 256
    global_kv_heads: int = 2
    global_head_dim: int = 512
    sliding_window: int = 1024
    dense_intermediate: int = 2112
    experts: int = 128
    experts_per_token: int = 8
    expert_intermediate: int = 704
    vocab: int = 262_144
    canvas: int = 256

    def attention_params(self, is_global: bool) -> int:
        head_dim = self.global_head_dim if is_global else self.sliding_head_dim
        kv_heads = self.global_kv_heads if is_global else self.sliding_kv_heads
        values = 0 if is_global else kv_heads * head_dim  # global layers take values from keys
        return self.hidden * (2 * self.heads * head_dim + kv_heads * head_dim + values)

    def is_global(self, layer: int) -> bool:
        return (layer + 1) % self.global_every == 0 or layer == self.layers - 1

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate

    @property
    def shared_params(self) -> int:
        """Weights every token reads: attention, dense MLP, router, summed over layers."""
        return sum(self.attention_params(self.is_global(layer)) + 3 * self.hidden * self.dense_intermediate
                   + self.hidden * self.experts for layer in range(self.layers))


def step_cost(shape: GemmaShape, rows: int, context: int, head: bool) -> tuple[float, float]:
    """FLOPs and bytes (bf16) of one forward over ``rows`` canvases after ``context`` cached positions."""
    tokens = rows * shape.canvas
    touched = expected_experts_touched(tokens, shape.experts, shape.experts_per_token)
    flops = 2 * tokens * (shape.shared_params + shape.experts_per_token * shape.expert_params * shape.layers)
    weight_bytes = 2 * (shape.shared_params + touched * shape.expert_params * shape.layers)
    kv_bytes = 0.0
    for layer in range(shape.layers):
        is_global = shape.is_global(layer)
        keys = context if is_global else min(context, shape.sliding_window - 1)
        head_dim = shape.global_head_dim if is_global else shape.sliding_head_dim
        kv_heads = shape.global_kv_heads if is_global else shape.sliding_kv_heads
        kv_bytes += rows * keys * 2 * kv_heads * head_dim * 2
        flops += 4 * tokens * (keys + shape.canvas) * shape.heads * head_dim
    if head:
        flops += 2 * tokens * shape.hidden * shape.vocab
        weight_bytes += 2 * shape.hidden * shape.vocab
    return flops, weight_bytes + kv_bytes


def seconds(device: Device, flops: float, nbytes: float) -> float:
    compute = flops / (device.peak_flops * device.efficiency)
    return max(compute, nbytes / (device.bandwidth * device.bandwidth_efficiency))


def projection(rows: int, steps: int, prompt: int = 1024, answer: int = 512, device: Device = H200_SXM) -> dict:
    """Output tokens per second of ``rows`` rows decoding ``answer`` tokens after ``prompt``, every canvas
    taking ``steps`` denoising steps; GPU time only."""
    shape = GemmaShape()
    total = 0.0
    for canvas in range(answer // shape.canvas):
        context = prompt + canvas * shape.canvas
        total += steps * seconds(device, *step_cost(shape, rows, context, head=True))
        total += seconds(device, *step_cost(shape, rows, context, head=False))  # the store pass
    return {"rows": rows, "steps": steps, "tok_s": rows * answer / total, "step_ms": 1e3 * total / (
        steps + 1) / (answer // shape.canvas)}


def measure(scale: str, repeats: int | None = None) -> list[dict]:
    from transformers import DiffusionGemmaForBlockDiffusion

    from engine.models.loader import load_model

    torch.set_num_threads(1)
    count, new_tokens, scale_repeats = SCALES[scale]
    repeats = repeats or scale_repeats
    prompts = demo_prompts(count)
    lm = load_model(FIXTURE)
    reference = DiffusionGemmaForBlockDiffusion.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    rows = []
    for name, settings in SETTINGS.items():
        best = {"ours": float("inf"), "reference_b1": float("inf"), "reference_b16": float("inf")}
        for _ in range(repeats):  # interleaved: each system once per round
            ours_s, ours = run_ours(lm, prompts, new_tokens, settings)
            alone_s, alone = run_reference_alone(reference, lm, prompts, new_tokens, settings)
            batched_s, batched = run_reference_batched(reference, lm, prompts, new_tokens, settings)
            for key, value in (("ours", ours_s), ("reference_b1", alone_s), ("reference_b16", batched_s)):
                best[key] = min(best[key], value)
        tokens = {"ours": sum(map(len, ours)), "reference_b1": sum(map(len, alone)),
                  "reference_b16": sum(map(len, batched))}
        rows.append({"settings": name, "compiled": compile, "prompts": count, "max_new_tokens": new_tokens,
                     "equal_to_reference": sum(a == b for a, b in zip(ours, alone)),
                     **{f"{key}_tok_s": tokens[key] / best[key] for key in best}})
        rate = {key: tokens[key] / best[key] for key in best}
        rows[-1] |= {"ours_vs_b1": rate["ours"] / rate["reference_b1"],
                     "ours_vs_b16": rate["ours"] / rate["reference_b16"]}
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=tuple(SCALES), default="quick")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="rounds to take the best of (default: the scale's)")
    parser.add_argument("--workload", choices=("demo", "spread"), default="demo",
                        help="spread: prompts of 50 to 1,000 tokens against transformers' batches of 16")
    parser.add_argument("--compile", action="store_true", help="spread: our engine on the compiled model")
    args = parser.parse_args(argv)
    if args.workload == "spread":
        from research.diffusion_gemma_spread import spread

        spread(args.scale, args.repeats, args.out, args.compile)
        return
    measured = measure(args.scale, args.repeats)
    projected = [projection(rows, steps) for steps in (16, 48) for rows in (1, 16, 64)]
    for row in measured:
        print(f"{row['settings']:>8}: ours {row['ours_tok_s']:.0f} tok/s, "
              f"transformers b1 {row['reference_b1_tok_s']:.0f} "
              f"(x{row['ours_vs_b1']:.1f}), b16 {row['reference_b16_tok_s']:.0f} (x{row['ours_vs_b16']:.1f}); "
              f"equal to the reference {row['equal_to_reference']}/{row['prompts']}")
    for row in projected:
        print(f"H200* 26B-A4B, {row['steps']} steps/canvas, {row['rows']:>2} rows: {row['tok_s']:,.0f} tok/s "
              f"({row['step_ms']:.1f} ms/step)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "diffusion_gemma.json").write_text(json.dumps(
            {"measured": measured, "projected": projected, "shape": asdict(GemmaShape()),
             "device": asdict(H200_SXM)}, indent=2) + "\n")


if __name__ == "__main__":
    main()
