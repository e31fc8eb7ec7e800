"""Host cost of an engine step, counted: aten operations per step, per layer and fixed.

On a GPU every aten operation is at least one dispatch and usually one kernel launch, so the host time
of a step grows with the number of operations it issues, whatever the tensor sizes. This counts them
with a ``TorchDispatchMode`` over whole engine steps (views and in-place writes included: each is a
dispatch) and separates the part that grows with depth from the fixed part by running the same
workload on the same checkpoint family with 1 and with 2 layers.

    python -m benchmarks.host_ops                       # both test fixtures, engine defaults, 16 prompts
    python -m benchmarks.host_ops --compile             # the same on models loaded with compile=True
    python -m benchmarks.host_ops --fixtures tiny-llada,tiny-sdar    # other fixtures
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.summary import median
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import ModelOptions, load_model
from engine.models.loader import DiffusionLM, apply_model_options
from engine.models.transformer import BidirectionalTransformer
from engine.scheduling.trace import ForwardRecord

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"


class OpCounter(TorchDispatchMode):
    """Counts every aten operation dispatched while active, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def with_layers(lm: DiffusionLM, num_layers: int, seed: int = 0, device: str | None = None,
                **options: bool) -> DiffusionLM:
    """The same family, tokenizer and shapes with ``num_layers`` random layers (float32), on ``device``
    (default: ``lm``'s), run with ``options`` (:class:`ModelOptions` fields: ``compile``, ...)."""
    config = dataclasses.replace(lm.model.config, num_layers=num_layers)
    torch.manual_seed(seed)
    model = BidirectionalTransformer(config).to(device or lm.device)
    model.eval().requires_grad_(False)
    apply_model_options(model, ModelOptions(**options))
    return dataclasses.replace(lm, model=model)


def mixed_prompts(lm: DiffusionLM, count: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of different lengths and caps of 1-3 blocks: rows start blocks at different steps."""
    refused = (lm.special_ids.mask_id, *lm.special_ids.stop_ids, *lm.image_token_ids)
    vocab = [i for i in range(min(lm.vocab_size, 90)) if i not in refused]
    prompts = [[vocab[(7 * i + j) % len(vocab)] for j in range(5 + 11 * i % 40)] for i in range(count)]
    params = [SamplingParams(max_new_tokens=32 * (1 + i % 3), stop_at_eos=False) for i in range(count)]
    return prompts, params


def step_op_counts(engine: BlockServeEngine, prompts, params) -> list[tuple[str, int, ForwardRecord]]:
    """(forward kind, aten operations, its record) of every step that ran a forward, the workload run to
    the end."""
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    counts = []
    while engine.has_unfinished_requests():
        before = len(engine.stats_collector.trace)
        with OpCounter() as counter:
            engine.step()
        trace = engine.stats_collector.trace
        if len(trace) > before:
            counts.append((trace[-1].kind, counter.total, trace[-1]))
    return counts


def per_layer_ops(fixture: str, count: int = 16, options: dict[str, bool] | None = None, **config) -> dict:
    """Per forward kind (refresh, window, packed): the median operations of a step on 1- and 2-layer
    models run with ``options`` (:class:`ModelOptions` fields), engines with ``config``; per layer =
    their difference, fixed = the rest. Medians, because a step that admits requests also pays for
    writing their rows. Also per kind: the positions whose logits a step computes, and the positions of
    its rows' active blocks, summed over the workload."""
    options = options or {}
    lm = load_model(FIXTURES / fixture, dtype="float32")
    prompts, params = mixed_prompts(lm, count)
    medians: dict[str, dict[int, float]] = {}
    steps: dict[str, int] = {}
    positions: dict[str, dict[str, int]] = {}
    for layers in (1, 2):
        engine = BlockServeEngine(with_layers(lm, layers, **options), EngineConfig(**config))
        engine.generate(prompts[:2], params[:2])  # warm-up (first-call allocations, compilation)
        engine.reset_stats()
        by_kind: dict[str, list[int]] = {}
        for kind, total, record in step_op_counts(engine, prompts, params):
            by_kind.setdefault(kind, []).append(total)
            if layers == 1:
                counted = positions.setdefault(kind, {"logit_positions": 0, "block_positions": 0})
                counted["logit_positions"] += record.logit_positions
                counted["block_positions"] += record.rows * engine.config.block_length
        for kind, totals in by_kind.items():
            medians.setdefault(kind, {})[layers] = median(totals)
            steps[kind] = len(totals)
    kinds = {}
    for kind, by_layers in medians.items():
        if len(by_layers) == 2:
            per_layer = by_layers[2] - by_layers[1]
            kinds[kind] = {"steps": steps[kind], "per_layer": per_layer, "fixed": by_layers[1] - per_layer,
                           "at_32_layers": by_layers[1] + 31 * per_layer, **positions[kind]}
    return {"fixture": fixture, "config": config, "options": options, "kinds": kinds}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--cache", default="dual")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--fixtures", default="tiny-llada,tiny-dream", help="test fixtures, comma-separated")
    args = parser.parse_args(argv)
    options = {"compile": True} if args.compile else {}
    rows = [per_layer_ops(fixture, args.prompts, options, cache=args.cache) for fixture in args.fixtures.split(",")]
    for row in rows:
        print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()
