"""DiffusionGemma 26B-A4B and LLaDA2.0-flash split over N GPUs (tensor parallel, issue 56), projected.

``python -m research tensor-parallel [--out DIR] [--canvas-steps 16] [--block-steps 32,8] [--max-rows 64]``

Per GPU (one rank): its weights, the room left for the KV arena, and the rows whose arena and a step fit
(``research.tensor_parallel_memory``: the engine's own memory model of one rank's share). Per step, GPU time
only, uncalibrated (``*``):

    roofline  = the step's FLOPs and bytes of one rank's share: DiffusionGemma's ``research.diffusion_gemma``
                step (canvas tokens, experts touched, the KV each layer reads), LLaDA2's ``benchmarks.perfmodel``
                forward (``forward_cost`` without its launch overhead)
    all-reduce = reductions x 2 (N - 1) / N x tokens x hidden x 2 bytes / link    (a ring, per rank)
    gather    = (N - 1) / N x positions x vocab x 2 bytes / link    (the bf16 logits rows the step reads)
    step      = roofline + all-reduce + gather    (no overlap: each collective sits between two layers)

Reductions per forward: one after the embedding; DiffusionGemma one after attention, its dense MLP and its
experts in every layer, and at a denoising step two more (the self-conditioning MLP, and the soft embeddings
``probs[:, shard] @ W_shard``); LLaDA2 one after attention and one after the MLP (routed and shared experts
summed first). The ``TP-local`` column replaces the logits gather by one of 4 float32 a position (max, argmax,
log-sum-exp and a drawn token per shard, as SGLang's ``dllm/tp_local_vocab_state.py`` merges them).

Workload: a 1,024-token prompt and 512 new tokens. DiffusionGemma: two canvases of 256, each ``--canvas-steps``
denoising steps and one store pass. LLaDA2: 16 blocks of 32, each ``--block-steps`` window steps with logits
at the masks left (the mean over the block's steps). Prefill, the host and per-collective latency are not
counted.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from benchmarks.perfmodel.hardware import H100_SXM, Device, ModelShape
from benchmarks.perfmodel.projection import default_constants, forward_cost
from benchmarks.results_io import write_results
from engine.scheduling.trace import ForwardRecord
from research.diffusion_gemma import GemmaShape, seconds, step_cost
from research.tensor_parallel_memory import gemma_lm, gemma_rank, llada2_lm, model_rank, rank_memory

# Assumed (datasheets; uncalibrated): dense bf16 FLOP/s, memory bandwidth, memory. The A10's datasheet gives
# 125 TFLOP/s bf16; AWS's A10G is reported near 70 dense, which is used. L40S: 362 dense (733 sparse).
L40S = Device("NVIDIA L40S", peak_flops=362e12, bandwidth=864e9, memory_bytes=48e9)
A10G = Device("NVIDIA A10G", peak_flops=70e12, bandwidth=600e9, memory_bytes=24e9)
# Assumed effective all-reduce bandwidth per rank: PCIe Gen4 x16 with no NVLink (L40S, A10G); H100 SXM's NVLink.
LINKS = {"PCIe Gen4": 25e9, "NVLink": 450e9}
# Source: inclusionAI/dFactory configs/model_configs/llada2_flash/config.json (num_hidden_layers 32, hidden_size
# 4096, num_attention_heads 32, num_key_value_heads 4, head_dim 128, intermediate_size 9216, first_k_dense_replace
# 1, num_experts 256, num_experts_per_tok 8, moe_intermediate_size 1024, num_shared_experts 1, vocab 157184).
LLADA2_FLASH = ModelShape("LLaDA2.0-flash", layers=32, hidden=4096, heads=32, kv_heads=4, head_dim=128,
                          intermediate=9216, vocab=157184, experts=256, experts_per_token=8, moe_intermediate=1024,
                          shared_experts=1, dense_layers=1, block_length=32)
PROMPT, ANSWER, BLOCK = 1024, 512, 32
LOCAL_FLOATS = 4  # float32 a position each rank sends instead of its logits (TP-local sampling)
# (model, device, ranks, link): DiffusionGemma on one H100 is the reference the splits are read against
SETUPS = (("diffusiongemma", H100_SXM, 1, None), ("diffusiongemma", L40S, 2, "PCIe Gen4"),
          ("diffusiongemma", L40S, 4, "PCIe Gen4"), ("diffusiongemma", A10G, 2, "PCIe Gen4"),
          ("diffusiongemma", A10G, 4, "PCIe Gen4"), ("llada2-flash", H100_SXM, 4, "NVLink"))
ENGINES = {"diffusiongemma": {"max_model_len": 4096, "block_length": 256},  # configs/diffusiongemma-26b-a4b*.yaml
           "llada2-flash": {"max_model_len": 2048, "block_length": 32}}  # configs/llada2-flash.yaml


def allreduce_bytes(buffer: float, ranks: int) -> float:
    """Bytes a ring all-reduce of ``buffer`` bytes sends from each rank."""
    return 2 * (ranks - 1) / ranks * buffer


def allgather_bytes(total: float, ranks: int) -> float:
    """Bytes a ring all-gather into ``total`` bytes sends from each rank."""
    return (ranks - 1) / ranks * total


def step_parts(roofline: float, ranks: int, link: float, tokens: int, hidden: int, reductions: int,
               positions: int, vocab: int) -> dict:
    """A step's seconds: its roofline, its all-reduces, its logits gather and the TP-local merge instead."""
    reduced = reductions * allreduce_bytes(2 * tokens * hidden, ranks)
    gathered = allgather_bytes(2 * positions * vocab, ranks)
    local = allgather_bytes(4 * LOCAL_FLOATS * positions * ranks, ranks)
    return {"roofline_s": roofline, "allreduce_s": reduced / link if ranks > 1 else 0.0,
            "gather_s": gathered / link if ranks > 1 else 0.0, "local_s": local / link if ranks > 1 else 0.0,
            "allreduce_bytes": reduced if ranks > 1 else 0.0, "gather_bytes": gathered if ranks > 1 else 0.0}


def gemma_step(ranks: int, device: Device, link: float, rows: int, context: int, head: bool) -> dict:
    whole = GemmaShape()
    tokens = rows * whole.canvas
    roofline = seconds(device, *step_cost(gemma_rank(whole, ranks), rows, context, head))
    return step_parts(roofline, ranks, link, tokens, whole.hidden, 3 * whole.layers + 1 + (2 if head else 0),
                      tokens if head else 0, whole.vocab)


def llada2_step(ranks: int, device: Device, link: float, rows: int, context: int, masks: float) -> dict:
    positions = round(rows * masks)
    record = ForwardRecord(window_rows=rows, window_tokens=BLOCK, window_context=context + BLOCK,
                           logit_positions=positions, real_tokens=rows * (context + BLOCK))
    constants = dataclasses.replace(default_constants(device), launch_overhead_s=0.0)  # GPU time only
    roofline = forward_cost(record, model_rank(LLADA2_FLASH, ranks), device, constants).time_s
    return step_parts(roofline, ranks, link, rows * BLOCK, LLADA2_FLASH.hidden, 2 * LLADA2_FLASH.layers + 1,
                      positions, LLADA2_FLASH.vocab)


def workload(model: str, ranks: int, device: Device, link: float, rows: int, steps: int) -> dict:
    """Every step of ``rows`` rows answering: mean seconds of a forward by part, tok/s with the logits
    gathered and with the TP-local merge instead."""
    forwards: list[dict] = []
    if model == "diffusiongemma":
        canvas = GemmaShape().canvas
        for index in range(ANSWER // canvas):
            context = PROMPT + index * canvas
            forwards += steps * [gemma_step(ranks, device, link, rows, context, head=True)]
            forwards.append(gemma_step(ranks, device, link, rows, context, head=False))  # the store pass
    else:
        masks = BLOCK - (BLOCK - BLOCK / steps) / 2  # the mean of BLOCK, BLOCK - BLOCK/steps, ... over the steps
        for index in range(ANSWER // BLOCK):
            forwards += steps * [llada2_step(ranks, device, link, rows, PROMPT + index * BLOCK, masks)]
    total = {key: sum(forward[key] for forward in forwards) for key in forwards[0]}
    gathered = total["roofline_s"] + total["allreduce_s"] + total["gather_s"]
    local = total["roofline_s"] + total["allreduce_s"] + total["local_s"]
    return {"rows": rows, "forwards": len(forwards), **{key.replace("_s", "_ms"): 1e3 * value / len(forwards)
                                                        for key, value in total.items() if key.endswith("_s")},
            "step_ms": 1e3 * gathered / len(forwards), "allreduce_gb_per_forward": total["allreduce_bytes"] / 1e9
            / len(forwards), "gather_gb_per_forward": total["gather_bytes"] / 1e9 / len(forwards),
            "tok_s": rows * ANSWER / gathered, "tok_s_tp_local": rows * ANSWER / local}


def memory_row(model: str, device: Device, ranks: int, max_rows: int) -> dict:
    if model == "diffusiongemma":
        rank, whole = gemma_lm(gemma_rank(GemmaShape(), ranks)), gemma_lm(GemmaShape())
    else:
        rank, whole = llada2_lm(model_rank(LLADA2_FLASH, ranks)), llada2_lm(LLADA2_FLASH)
    return rank_memory(rank, whole, ENGINES[model], device.memory_bytes, PROMPT + ANSWER, max_rows)


def projection(canvas_steps: int = 16, block_steps: tuple[int, ...] = (32, 8), max_rows: int = 64) -> list[dict]:
    """One entry per setup and steps: its memory per GPU, and its workload at 1 row and at the rows that fit."""
    rows = []
    for model, device, ranks, link_name in SETUPS:
        memory = memory_row(model, device, ranks, max_rows)
        link = LINKS[link_name] if link_name else float("inf")
        for steps in (canvas_steps,) if model == "diffusiongemma" else block_steps:
            entry = {"model": model, "device": device.name, "ranks": ranks, "link": link_name,
                     "link_gb_s": link / 1e9 if link_name else None, "steps": steps, **memory}
            if memory["rows_fit"]:
                entry["one_row"] = workload(model, ranks, device, link, 1, steps)
                entry["rows_fit_run"] = workload(model, ranks, device, link, memory["rows_fit"], steps)
            rows.append(entry)
    return rows


def describe(entry: dict) -> str:
    where = f"{entry['model']:<14} {entry['device']:<16} TP {entry['ranks']} {entry['steps']:>2} steps"
    memory = f"weights {entry['weights_gb']:5.2f} GB/GPU, KV room {entry['kv_room_gb']:5.2f} GB"
    if not entry["rows_fit"]:
        return f"{where}: {memory}: does not fit"
    one, many = entry["one_row"], entry["rows_fit_run"]
    return (f"{where}: {memory}, {entry['rows_fit']:>2} rows fit; 1 row {one['tok_s']:,.0f}* tok/s; "
            f"{many['rows']} rows {many['tok_s']:,.0f}* tok/s (TP-local {many['tok_s_tp_local']:,.0f}*), a forward "
            f"{many['step_ms']:.1f} ms = {many['roofline_ms']:.1f} roofline + {many['allreduce_ms']:.1f} all-reduce "
            f"+ {many['gather_ms']:.1f} logits gather")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m research tensor-parallel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--canvas-steps", type=int, default=16, help="DiffusionGemma's denoising steps a canvas")
    parser.add_argument("--block-steps", default="32,8", help="LLaDA2's steps a block of 32, comma-separated")
    parser.add_argument("--max-rows", type=int, default=64, help="the most rows a setup runs (max_batch_size)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    rows = projection(args.canvas_steps, tuple(int(s) for s in args.block_steps.split(",")), args.max_rows)
    for entry in rows:
        print(describe(entry), flush=True)
    if args.out is not None:
        assumed = {"devices": {d.name: dataclasses.asdict(d) for d in (L40S, A10G, H100_SXM)}, "links": LINKS,
                   "prompt": PROMPT, "answer": ANSWER, "local_floats": LOCAL_FLOATS}
        write_results(args.out, "tensor_parallel", {"assumed": assumed, "projected": rows},
                      ["tensor-parallel", *(argv or [])], program="python -m research")
    return rows


if __name__ == "__main__":
    main()
