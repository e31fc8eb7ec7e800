"""Compare the engine with a peer's own outputs (``sdar_ref.py`` / ``llada2_ref.py`` JSON): logits and tokens.

    python -m research.peers.compare runs/peers/out/sdar.json runs/peers/out/llada2.json \\
        --out benchmarks/results/peers_block_causal.json

For every forward the peer recorded, our logits of the same tokens: a full block-causal forward
(``forward_full``) and a cached block step (the prefix prefilled into a KV cache, then the block as a
window over it), max |diff| against the peer's float32 logits and the share of positions whose argmax
agrees. For every generation, our tokens for the same prompt and settings, twice: the single-request
oracle alone, and the engine with every prompt of that setting batched at once. The peers' greedy
loops are mapped onto our rules: SDAR's bd3 dynamic/static loop -> ``low_confidence_dynamic`` /
``low_confidence_static``, LLaDA2's ``generate`` -> ``low_confidence_dynamic`` with its
``min(steps, gen_length)`` steps, SGLang's LowConfidence -> ``low_confidence``. Stop tokens are the
peer's (SDAR: its stop ids; LLaDA2: its EOS only), and both sides are compared up to the first one.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer, models

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import DiffusionLM, load_model
from engine.oracle.reference import reference_generate
from engine.oracle.reference_block_causal import CachedBlockForward
from engine.rules import rule_for

RULES = {"bd3_dynamic": "low_confidence_dynamic", "bd3_static": "low_confidence_static",
         "l2hf_generate": "low_confidence_dynamic", "sglang_low_confidence": "low_confidence"}
MASK_TOKENS = {"sdar": "<|MASK|>", "llada2": "<|mask|>"}


def load_checkpoint(reference: dict) -> DiffusionLM:
    """The peer's checkpoint through our loader, with the peer's stop ids. A checkpoint the peer wrote
    without a tokenizer gets a word-level one naming the MASK token (ids are all that is compared)."""
    directory = Path(reference["checkpoint"])
    settings = reference["settings"]
    mask_id = settings["mask_token_id"]
    if not (directory / "tokenizer.json").is_file():
        copy = Path(tempfile.mkdtemp(prefix="peer-checkpoint-"))
        shutil.copytree(directory, copy, dirs_exist_ok=True)
        vocab = {f"<t{i}>": i for i in range(reference["config"]["vocab_size"])}
        vocab = {(MASK_TOKENS[reference["family"]] if i == mask_id else token): i for token, i in vocab.items()}
        Tokenizer(models.WordLevel(vocab, unk_token="<t0>")).save(str(copy / "tokenizer.json"))
        directory = copy
    lm = load_model(directory, dtype=reference["environment"]["dtype"])
    stops = tuple(settings.get("stop_ids") or [settings["eos_id"]])
    lm.special_ids = dataclasses.replace(lm.special_ids, mask_id=mask_id, stop_ids=stops)
    return lm


@torch.no_grad()
def our_logits(lm: DiffusionLM, forward: dict) -> torch.Tensor:
    block = forward["block_size"]
    tokens = torch.tensor([forward["tokens"]])
    if forward["kind"] == "full":
        positions = torch.arange(tokens.shape[1])[None]
        hidden = lm.model.forward_full(tokens, positions, torch.ones_like(tokens, dtype=torch.bool), block)
        return lm.model.logits(hidden)[0]
    prefix = forward["cache_tokens"]
    canvas = torch.tensor([prefix + forward["tokens"]])
    cached = CachedBlockForward(lm, canvas, block)
    cached.prefill(len(prefix))
    return lm.model.logits(cached.step(len(prefix), canvas.shape[1]))[0]


def compare_logits(lm: DiffusionLM, reference: dict, folder: Path) -> dict:
    theirs = load_file(folder / reference["logits_file"])  # named beside its JSON
    rows = defaultdict(lambda: {"forwards": 0, "max_abs_diff": 0.0, "positions": 0, "argmax_equal": 0})
    for forward in reference["forwards"]:
        ours, peer = our_logits(lm, forward), theirs[forward["key"]].to(lm.dtype)
        row = rows[forward["kind"]]
        row["forwards"] += 1
        row["max_abs_diff"] = max(row["max_abs_diff"], float((ours - peer).abs().max()))
        row["positions"] += peer.shape[0]
        row["argmax_equal"] += int((ours.argmax(-1) == peer.argmax(-1)).sum())
    return dict(rows)


def until_stop(tokens: list[int], stops: tuple[int, ...], limit: int) -> list[int]:
    cut = next((i for i, token in enumerate(tokens) if token in stops), len(tokens))
    return tokens[:min(cut, limit)]


def run_settings(generation: dict) -> tuple[EngineConfig, int]:
    steps = generation.get("effective_steps") or generation["steps"]
    decoding = RULES[generation["rule"]]
    config = EngineConfig(block_length=generation["block_length"], decoding=decoding, max_batch_size=16,
                          threshold=min(generation["threshold"], 1.0),
                          steps_per_block=None if decoding == "low_confidence" else steps)
    return config, generation["gen_length"]


def compare_tokens(lm: DiffusionLM, reference: dict) -> dict:
    groups = defaultdict(list)
    for generation in reference["generations"]:
        groups[json.dumps({k: generation.get(k) for k in ("rule", "block_length", "steps", "threshold",
                                                           "gen_length", "eos_early_stop")})].append(generation)
    table = {}
    stops = lm.special_ids.stop_ids
    for key, generations in groups.items():
        config, gen_length = run_settings(generations[0])
        rule = rule_for(config)
        params = SamplingParams(max_new_tokens=gen_length)
        prompts = [g["prompt_ids"] for g in generations]
        batched = BlockServeEngine(lm, config).generate(prompts, params)
        alone = [reference_generate(lm, p, max_new_tokens=gen_length, block_length=config.block_length, rule=rule)
                 for p in prompts]
        theirs = [until_stop(g["tokens"], stops, gen_length) for g in generations]
        table[key] = {"prompts": len(prompts),
                      "oracle_equal": sum(until_stop(a.token_ids, stops, gen_length) == t
                                          for a, t in zip(alone, theirs)),
                      "batched_equal": sum(until_stop(b.token_ids, stops, gen_length) == t
                                           for b, t in zip(batched, theirs))}
    return table


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("references", nargs="+", type=Path, help="JSON files written by sdar_ref.py / llada2_ref.py")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = {}
    for path in args.references:
        reference = json.loads(path.read_text())
        lm = load_checkpoint(reference)
        result[str(path)] = {"family": reference["family"], "peer": reference["peer"]["commit"],
                             "dtype": reference["environment"]["dtype"],
                             "logits": compare_logits(lm, reference, path.parent),
                             "tokens": compare_tokens(lm, reference)}
        print(json.dumps({str(path): result[str(path)]}, indent=1), flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
