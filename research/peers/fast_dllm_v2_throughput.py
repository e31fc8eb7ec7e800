"""Fast-dLLM v2: the engine against the model's own batched loop (NVlabs' ``batch_sample``, as its eval runs it),
tokens per forward and tok/s, in interleaved rounds on the CPU.

    python -m scripts.make_fast_dllm_fixture runs/fast-dllm-v2/deep12 12
    .venv/bin/python -m research.peers.fast_dllm_v2_throughput --checkpoint runs/fast-dllm-v2/deep12 \\
        --out runs/fast-dllm-v2/out \\
        --peer-python REF_VENV/bin/python --peer-dir PEER_DIR --loop generation_functions.py

``--prompts`` prompts of ordinary ids (lengths uniform in 8..100, seed 0) are written to ``--out``. Each round
runs the peer's loop in its own environment (``fast_dllm_v2_batch.py`` beside this file: sorted by length, batches
of ``--batch``) and then the engine on the same sorted prompts (``max_batch_size=--batch``, continuous admission,
``low_confidence`` at threshold 0.9 with sub-blocks of 8, the release's strict comparison), both greedy float32
with ``--threads`` torch threads, each timing its loop alone after a warm-up. A row's budget is the peer's: up to
its batch's last block. Tokens are the answers cut before the first stop; a forward is one call of the decoder
stack (a batch's, whatever its rows). The ratio of a round is peer seconds / engine seconds.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import time
from pathlib import Path

import torch

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model

PEER = Path(__file__).resolve().parent / "fast_dllm_v2_batch.py"


def budgets(prompts: list[list[int]], batch: int, new_tokens: int, block: int) -> list[int]:
    """Each sorted prompt's answer length in the peer's loop: up to its batch's last block."""
    out = []
    for first in range(0, len(prompts), batch):
        lengths = [len(p) for p in prompts[first:first + batch]]
        end = (new_tokens // block + max(lengths) // block) * block
        out += [end - length for length in lengths]
    return out


def ours(engine: BlockServeEngine, prompts: list[list[int]], params: list[SamplingParams]) -> dict:
    """The engine's answers, loop seconds and forwards (calls of ``forward_step``)."""
    forwards, inside, model = [0], [0.0], engine.lm.model
    step = model.forward_step  # one pass over the layers, whatever its rows

    def counted(*args, **kwargs):
        forwards[0] += 1
        start = time.perf_counter()
        try:
            return step(*args, **kwargs)
        finally:
            inside[0] += time.perf_counter() - start

    model.forward_step = counted
    start = time.perf_counter()
    answers = [output.token_ids for output in engine.generate(prompts, params)]
    seconds = time.perf_counter() - start
    del model.forward_step
    return {"answers": answers, "seconds": seconds, "forwards": forwards[0], "forward_seconds": inside[0]}


def summary(rounds: list[dict], batch1: list[list[int]] | None) -> dict:
    """Tokens, forwards and tok/s of each side, the per-round ratios and how far the answers agree."""
    ratios = [r["peer"]["seconds"] / r["ours"]["seconds"] for r in rounds]
    last = rounds[-1]
    side = {name: {"tokens": sum(map(len, last[name]["answers"])), "forwards": last[name]["forwards"],
                   "forward_share": [round(r[name]["forward_seconds"] / r[name]["seconds"], 2) for r in rounds],
                   "tok_s": [round(sum(map(len, r[name]["answers"])) / r[name]["seconds"], 1) for r in rounds]}
            for name in ("peer", "ours")}
    for values in side.values():
        values["tokens_per_forward"] = round(values["tokens"] / values["forwards"], 2)
    same = [a == b for a, b in zip(last["peer"]["answers"], last["ours"]["answers"])]
    alone = None if batch1 is None else [agree(a, b) for a, b in zip(batch1, last["ours"]["answers"])]
    return {**side, "ratios": [round(r, 2) for r in ratios], "median_ratio": round(statistics.median(ratios), 2),
            "same_answers_batched": f"{sum(same)}/{len(same)}",
            "first_difference_batched": [first_difference(a, b) for a, b in zip(last["peer"]["answers"],
                                                                                  last["ours"]["answers"]) if a != b],
            "agree_with_peer_batch_1": None if alone is None else f"{sum(alone)}/{len(alone)}"}


def agree(short: list[int], long: list[int]) -> bool:
    """One answer is the other's beginning (a row alone ends at its own last block, a batch's at the batch's)."""
    short, long = sorted((short, long), key=len)
    return long[:len(short)] == short


def first_difference(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """(position of the first differing token, length of each answer) of two answers that differ."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))), len(a), len(b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("--checkpoint", "--out", "--peer-python", "--peer-dir", "--loop"):
        parser.add_argument(name, required=True, type=Path)
    for name, default in (("--prompts", 32), ("--batch", 32), ("--new-tokens", 128), ("--rounds", 3),
                          ("--threads", 1)):
        parser.add_argument(name, type=int, default=default)
    parser.add_argument("--peer-batch-1", action="store_true", help="also run the peer once at batch 1 (tokens)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lm = load_model(args.checkpoint, dtype="float32")
    vocab = min(lm.special_ids.mask_id, *lm.special_ids.stop_ids) - 2  # ordinary ids, below the fixture's specials
    prompts = sorted(([rng.randrange(0, vocab) for _ in range(rng.randint(8, 100))] for _ in range(args.prompts)),
                     key=len)
    (args.out / "prompts.json").write_text(json.dumps(prompts) + "\n")
    params = [SamplingParams(max_new_tokens=n) for n in budgets(prompts, args.batch, args.new_tokens, lm.block_length)]
    engine = BlockServeEngine(lm, EngineConfig(decoding="low_confidence", threshold=0.9, sub_block_length=8,
                                               max_batch_size=args.batch))
    engine.generate(prompts[:4], params[:4])  # warm-up
    peer = [str(args.peer_python), str(PEER), "--peer-dir", str(args.peer_dir), "--loop", str(args.loop),
            "--checkpoint", str(args.checkpoint), "--prompts", str(args.out / "prompts.json"), "--max-new-tokens",
            str(args.new_tokens), "--pad-id", str(lm.tokenizer.pad_token_id), "--threads", str(args.threads)]
    rounds = []
    for index in range(args.rounds):
        subprocess.run([*peer, "--batch", str(args.batch), "--out", str(args.out / "peer.json")], check=True)
        rounds.append({"peer": json.loads((args.out / "peer.json").read_text()), "ours": ours(engine, prompts, params)})
        print(f"round {index}: peer {rounds[-1]['peer']['seconds']:.2f} s, ours {rounds[-1]['ours']['seconds']:.2f} s")
    batch1 = None
    if args.peer_batch_1:
        subprocess.run([*peer, "--batch", "1", "--out", str(args.out / "peer_batch1.json")], check=True)
        batch1 = json.loads((args.out / "peer_batch1.json").read_text())["answers"]
    result = summary(rounds, batch1)
    (args.out / "ours.json").write_text(json.dumps(rounds[-1]["ours"]["answers"]) + "\n")
    (args.out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
