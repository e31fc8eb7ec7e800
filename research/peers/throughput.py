"""CPU throughput: the engine at batch 16 against a block-causal family's own generate loop at batch 1.

    .venv/bin/python -m research.peers.throughput --family sdar --peer-dir runs/peers/ref/sdar \\
        --transformers runs/peers/tf452 --checkpoint runs/peers/ckpt/sdar-bench \\
        --out runs/peers/out/throughput-sdar.json

The prompts (``--num-prompts`` of lengths drawn in ``--min-length``..``--max-length``, or from HumanEval's prompt
lengths with ``--humaneval-lengths``) go to a file beside
``--out``; then ``--rounds`` rounds alternate two subprocesses on the same checkpoint and prompts: the peer's
loop (``sdar_ref.py`` / ``llada2_ref.py --time``, under its pinned transformers) and the engine
(``engine_timed.py``, under the venv's), both float32 with ``--threads`` torch threads. Each times its loop
alone, model load and a one-prompt warm-up excluded. A round's ratio is peer seconds / our seconds (our
speedup); tokens are compared per prompt up to the first stop id and ``gen_length``, as ``compare.py`` does.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from research.peers import peer_common as pc
from research.peers.compare import until_stop

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DRIVERS = {"sdar": "sdar_ref.py", "llada2": "llada2_ref.py"}
HUMANEVAL_LENGTHS = ROOT / "benchmarks" / "data" / "humaneval_lengths.json"
BAR = 5.0  # the bar: our speedup at batch 16 over the peer's loop at batch 1
SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "num_experts", "num_experts_per_tok", "num_shared_experts",
               "moe_intermediate_size", "first_k_dense_replace", "n_group", "topk_group", "block_size")


def make_prompts(args: argparse.Namespace) -> list[list[int]]:
    """``--num-prompts`` prompts of ordinary ids (no special or MASK id), lengths uniform in the given range."""
    config = pc.read_json(args.checkpoint / "config.json")
    generation = pc.read_json(args.checkpoint / "generation_config.json")
    avoid = pc.special_ids(str(args.checkpoint), config, generation)
    avoid |= set() if args.mask_id is None else {args.mask_id}
    generator = torch.Generator().manual_seed(args.seed)
    if args.humaneval_lengths:
        known = json.loads(HUMANEVAL_LENGTHS.read_text())["prompt_tokens"]
        lengths = [known[i] for i in torch.randperm(len(known), generator=generator)[:args.num_prompts].tolist()]
    else:
        lengths = torch.randint(args.min_length, args.max_length + 1, (args.num_prompts,), generator=generator).tolist()
    return pc.default_prompts(lengths, config["vocab_size"], avoid, seed=args.seed)


def commands(args: argparse.Namespace, prompts: Path, peer: Path, ours: Path) -> tuple[list[str], list[str]]:
    peer_command = [sys.executable, str(HERE / DRIVERS[args.family]), "--peer-dir", args.peer_dir,
                    "--transformers", args.transformers, "--checkpoint", str(args.checkpoint), "--time",
                    "--prompts", str(prompts), "--gen-length", str(args.gen_length), "--threads", str(args.threads),
                    "--out", str(peer)]
    if args.mask_id is not None:
        peer_command += ["--mask-id", str(args.mask_id)]
    ours_command = [sys.executable, "-m", "research.peers.engine_timed", "--reference", str(peer),
                    "--threads", str(args.threads), "--max-batch-size", str(args.max_batch_size), "--out", str(ours)]
    return peer_command, ours_command


def run(command: list[str], threads: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    subprocess.run(command, check=True, cwd=ROOT, env=env)
    return json.loads(Path(command[command.index("--out") + 1]).read_text())


def compare_round(index: int, peer: dict, ours: dict) -> dict:
    settings = peer["settings"]
    stops = tuple(settings.get("stop_ids") or [settings["eos_id"]])
    gen_length = settings["gen_length"]
    theirs = [until_stop(r["tokens"], stops, gen_length) for r in peer["results"]]
    mine = [until_stop(r["tokens"], stops, gen_length) for r in ours["results"]]
    equal = [a == b for a, b in zip(theirs, mine)]
    peer_tokens, our_tokens = sum(map(len, theirs)), sum(map(len, mine))
    return {"round": index, "peer_s": peer["seconds"], "ours_s": ours["seconds"],
            "ratio": peer["seconds"] / ours["seconds"], "peer_tokens": peer_tokens, "our_tokens": our_tokens,
            "peer_tokens_per_s": peer_tokens / peer["seconds"], "our_tokens_per_s": our_tokens / ours["seconds"],
            "prompts": len(equal), "prompts_equal": sum(equal),
            "unequal_prompts": [i for i, same in enumerate(equal) if not same],
            "peer_forwards": sum(r.get("num_forwards", 0) for r in peer["results"]),
            "our_denoise_steps": ours["stats"]["denoise_steps"], "peer_threads": peer["threads"],
            "our_threads": ours["threads"], "peer_warmup_s": peer["warmup_seconds"],
            "our_warmup_s": ours["warmup_seconds"]}


def summarize(args: argparse.Namespace, prompts: list[list[int]], rounds: list[dict], last: tuple[dict, dict],
              peer_command: list[str], ours_command: list[str]) -> dict:
    peer, ours = last
    ratios = [r["ratio"] for r in rounds]
    median = statistics.median(ratios)
    return {"family": args.family, "checkpoint": str(args.checkpoint),
            "model": {k: peer["config"][k] for k in SIZE_FIELDS if k in peer["config"]},
            "settings": peer["settings"], "engine_config": ours["engine_config"], "threads": args.threads,
            "batch_size": {"peer": peer["batch_size"], "ours": ours["batch_size"]}, "dtype": "float32",
            "environment": {"peer": peer["environment"], "ours": {"torch": ours["torch"]}},
            "num_prompts": len(prompts), "prompt_lengths": [len(p) for p in prompts], "rounds": rounds,
            "ratios": ratios, "median_ratio": median, "min_ratio": min(ratios), "bar": BAR, "meets_bar": median >= BAR,
            "median_peer_tokens_per_s": statistics.median(r["peer_tokens_per_s"] for r in rounds),
            "median_our_tokens_per_s": statistics.median(r["our_tokens_per_s"] for r in rounds),
            "tokens_identical": all(r["prompts_equal"] == r["prompts"] for r in rounds),
            "our_stats_last_round": ours["stats"],
            "commands": {"peer": portable_command(peer_command), "ours": portable_command(ours_command)}}


def portable_command(command: list[str]) -> list[str]:
    return [pc.portable_path(part) if part.startswith("/") else part for part in command]


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", required=True, choices=sorted(DRIVERS))
    parser.add_argument("--peer-dir", required=True, help="the peer's extracted files (README.md, Setup)")
    parser.add_argument("--transformers", required=True, help="the peer's pinned transformers folder")
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--mask-id", type=int, help="MASK id when config.json has none (LLaDA2)")
    parser.add_argument("--out", required=True, type=Path, help="the summary JSON; per-round reports go beside it")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--min-length", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--humaneval-lengths", action="store_true",
                        help="prompt lengths drawn from HumanEval's (benchmarks/data/humaneval_lengths.json), not "
                             "uniform in --min-length..--max-length")
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234, help="seed of the prompts")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    work = args.out.with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    prompts = make_prompts(args)
    prompts_file = work / "prompts.json"
    prompts_file.write_text(json.dumps(prompts) + "\n")
    rounds, last, peer_command, ours_command = [], None, [], []
    for index in range(args.rounds):
        peer_command, ours_command = commands(args, prompts_file, work / f"peer-{index}.json",
                                              work / f"ours-{index}.json")
        last = run(peer_command, args.threads), run(ours_command, args.threads)
        rounds.append(compare_round(index, *last))
        print(json.dumps({k: rounds[-1][k] for k in ("round", "peer_s", "ours_s", "ratio", "prompts_equal")}),
              flush=True)
    result = summarize(args, prompts, rounds, last, peer_command, ours_command)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("family", "ratios", "median_ratio", "median_peer_tokens_per_s",
                                             "median_our_tokens_per_s", "tokens_identical")}, indent=1))
    return result


if __name__ == "__main__":
    main()
