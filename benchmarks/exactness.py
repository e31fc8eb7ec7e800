"""Batched == solo, measured: the share of requests whose batched tokens equal the single-request oracle.

    python -m benchmarks exactness                     # random LLaDA and Dream fixtures, float32 and bf16
    python -m benchmarks exactness --prompts 16        # quicker
    python -m benchmarks exactness --dtypes bfloat16 --modes default,batch-invariant   # issue 23
    python -m benchmarks exactness --dtypes float32 --compile   # compiled batched vs eager solo
    python -m benchmarks exactness --families sdar,llada2 --modes default,batch-invariant  # issue 29

For each family x dtype x decoding rule x cache mode (block-causal families: their own rules, one
cache mode), ``--prompts`` mixed prompts (lengths 3-40 tokens,
caps of 1-3 blocks) run through the engine at batch 8 on the ``continuous`` schedule, so rows sit at
different blocks and start blocks at different steps; each output is compared with
``engine.oracle.reference.reference_generate`` on the same prompt alone. ``--modes batch-invariant`` loads
the model with ``batch_invariant=True`` (the oracle then runs on the same model object, so in the
same mode); ``--compile`` loads it compiled and the oracle on an eager copy. A random model is never
confident,
so tau and the factor are set where several tokens commit per step (printed with the table).
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import DiffusionLM, load_model
from engine.oracle.reference import reference_generate
from engine.rules import rule_for
from engine.rules.base import BlockRule

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
FAMILIES = {"llada": FIXTURES / "tiny-llada", "dream": FIXTURES / "tiny-dream",
            "tiny": Path(__file__).resolve().parents[1] / "assets" / "tiny",  # the demo's trained model
            "sdar": FIXTURES / "tiny-sdar", "llada2": FIXTURES / "tiny-llada2"}
MODES = {"default": False, "batch-invariant": True}
RULES = {"threshold": {"decoding": "threshold", "threshold": 0.03},
         "quota": {"decoding": "quota", "steps_per_block": 8},
         "factor": {"decoding": "factor", "factor": 20.0}}
# the block-causal fixtures' heads are sharpened, so their own thresholds fire as on real checkpoints
BLOCK_CAUSAL_RULES = {"low_confidence_dynamic": {"decoding": "low_confidence_dynamic", "steps_per_block": 8,
                                                 "threshold": 0.9},
                      "low_confidence": {"decoding": "low_confidence", "threshold": 0.95},
                      "low_confidence_static": {"decoding": "low_confidence_static", "steps_per_block": 8},
                      "threshold": {"decoding": "threshold", "threshold": 0.9}}
CACHES = ("dual", "prefix", "none")
BLOCK = 16


def cells(lm: DiffusionLM) -> tuple[dict, tuple[str, ...]]:
    """The rules and cache modes a family is measured in (a block-causal family has one cache mode)."""
    return (BLOCK_CAUSAL_RULES, ("dual",)) if lm.layout.block_causal else (RULES, CACHES)


def mixed_prompts(count: int, vocab: int, mask_id: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    tokens = [t for t in range(4, vocab) if t != mask_id]
    prompts = [[rng.choice(tokens) for _ in range(rng.randint(3, 40))] for _ in range(count)]
    return prompts, [BLOCK * rng.randint(1, 3) for _ in range(count)]


def agreement(lm: DiffusionLM, rule: dict, cache: str, prompts: list[list[int]], caps: list[int],
              oracle: DiffusionLM | None = None) -> float:
    """The share of ``prompts`` whose tokens batched on ``lm`` equal the oracle's alone on ``oracle``
    (default: ``lm`` itself; an eager copy judges a compiled ``lm``)."""
    config = EngineConfig(block_length=BLOCK, cache=cache, max_batch_size=8, **rule)
    outputs = BlockServeEngine(lm, config).generate(prompts, [SamplingParams(max_new_tokens=c) for c in caps])
    decode = rule_for(config)
    same = sum(output.token_ids == solo_tokens(oracle or lm, config, decode, prompt, cap)
               for output, prompt, cap in zip(outputs, prompts, caps))
    return same / len(prompts)


def solo_tokens(lm: DiffusionLM, config: EngineConfig, rule: BlockRule, prompt: list[int], cap: int) -> list[int]:
    """The prompt's tokens alone: the oracle's, or for a block-causal family the engine's with no other
    row (its oracle stores a finished block in a forward of its own, the engine in the next block's
    first step: other shapes, so bf16 rounding may differ)."""
    if lm.layout.block_causal and lm.dtype != torch.float32:
        return BlockServeEngine(lm, config).generate([prompt], SamplingParams(max_new_tokens=cap))[0].token_ids
    return reference_generate(lm, prompt, max_new_tokens=cap, block_length=BLOCK, rule=rule,
                              cache=config.cache).token_ids


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"any of {', '.join(FAMILIES)}")
    parser.add_argument("--modes", default="default", help=f"any of {', '.join(MODES)}")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="the batched engine on a model loaded with compile=True")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/exactness.json"))
    args = parser.parse_args(argv)
    table = {}
    for family in args.families.split(","):
        for dtype in args.dtypes.split(","):
            for mode in args.modes.split(","):
                load = dict(device=args.device, dtype=dtype, batch_invariant=MODES[mode])
                lm = load_model(FAMILIES[family], compile=args.compile, **load)
                oracle = load_model(FAMILIES[family], **load) if args.compile else lm
                prompts, caps = mixed_prompts(args.prompts, lm.vocab_size, lm.special_ids.mask_id)
                rules, caches = cells(lm)
                for rule_name, rule in rules.items():
                    for cache in caches:
                        share = agreement(lm, rule, cache, prompts, caps, oracle)
                        table[f"{family} {dtype} {mode} {rule_name} {cache}"] = share
                        print(f"{family:>6} {dtype:>9} {mode:>15} {rule_name:>22} {cache:>6}: {share:.1%} same",
                              flush=True)
    result = {"prompts": args.prompts, "rules": RULES | BLOCK_CAUSAL_RULES, "block_length": BLOCK, "batch": 8,
              "modes": args.modes, "compile": args.compile, "agreement": table}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
