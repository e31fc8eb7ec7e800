"""A step computes logits only where its decoding rule reads them: at the still-masked positions of each
row's active block, never at a first block's prompt tokens nor at positions committed earlier, and
the tokens, draws and log-probabilities stay those of the single-request oracle."""
from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from engine.oracle.reference import reference_generate
from engine.rules import rule_for
from engine.rules.unmasking import UnmaskingRule
from tests.conftest import FIXTURES

WORKLOADS = {  # fixture -> (block length, settings): SDAR's first blocks begin inside the prompt (a lead)
    "tiny-llada": (8, {"decoding": "threshold", "threshold": 0.05}),
    "tiny-dream": (8, {"decoding": "quota", "steps_per_block": 4}),
    "tiny-sdar": (4, {"decoding": "low_confidence_dynamic", "steps_per_block": 4, "threshold": 0.9}),
}


def ordinary_prompts(lm, count: int, seed: int = 0) -> list[list[int]]:
    special = set(lm.tokenizer.all_special_ids) | {lm.special_ids.mask_id, *lm.special_ids.stop_ids}
    ordinary = [token for token in range(min(lm.vocab_size, 90)) if token not in special]
    rng = random.Random(seed)
    return [[rng.choice(ordinary) for _ in range(rng.randint(3, 23))] for _ in range(count)]


def mixed_params(count: int, block_length: int) -> list[SamplingParams]:
    """Caps of one to three blocks (rows in different blocks), greedy and sampled rows, top-k, a logit
    bias and log-probabilities."""
    return [SamplingParams(max_new_tokens=block_length * (1 + index % 3) - index % 2, stop_at_eos=False,
                           temperature=(0.0, 0.7)[index % 2], seed=index, top_k=(0, 5)[index % 3 == 1],
                           logit_bias={7: 2.0} if index % 4 == 3 else None, logprobs=(None, 2)[index % 3 == 2])
            for index in range(count)]


class HeadRecorder:
    """Per step: the rows of the LM head's input and the masked positions the rule is given."""

    def __init__(self, lm, monkeypatch):
        self.head_rows: list[int] = []
        self.masked: list[int] = []
        self.block_positions: list[int] = []
        lm.model.lm_head.register_forward_hook(
            lambda module, args, output: self.head_rows.append(args[0].shape[:-1].numel()))
        select = UnmaskingRule.select

        def recording_select(rule, confidence, masked, step):
            self.masked.append(int(masked.sum()))
            self.block_positions.append(masked.numel())
            return select(rule, confidence, masked, step)

        monkeypatch.setattr(UnmaskingRule, "select", recording_select)


@pytest.mark.parametrize("fixture", ["tiny-llada", "tiny-sdar"])
def test_the_head_runs_on_exactly_the_masked_positions_of_the_active_blocks(fixture, monkeypatch):
    lm = load_model(FIXTURES / fixture)
    block_length, rule = WORKLOADS[fixture]
    engine = BlockServeEngine(lm, EngineConfig(block_length=block_length, max_batch_size=4, **rule))
    recorder = HeadRecorder(lm, monkeypatch)
    prompts = ordinary_prompts(lm, 10)
    engine.generate(prompts, mixed_params(len(prompts), block_length))
    assert recorder.head_rows == recorder.masked  # one head call a step, on the positions the rule reads
    assert sum(recorder.masked) < sum(recorder.block_positions)  # committed (and prompt) positions skipped
    assert [trace.logit_positions for trace in engine.stats_collector.trace] == recorder.masked


@pytest.mark.parametrize("fixture", sorted(WORKLOADS))
def test_tokens_draws_and_logprobs_equal_the_oracle_alone(fixture):
    lm = load_model(FIXTURES / fixture)
    block_length, rule = WORKLOADS[fixture]
    config = EngineConfig(block_length=block_length, max_batch_size=4, **rule)
    prompts = ordinary_prompts(lm, 10, seed=1)
    params = mixed_params(len(prompts), block_length)
    outputs = BlockServeEngine(lm, config).generate(prompts, params)
    decode = rule_for(config)
    for output, prompt, p in zip(outputs, prompts, params):
        alone = reference_generate(lm, prompt, max_new_tokens=p.max_new_tokens, block_length=block_length,
                                   rule=decode, temperature=p.temperature, seed=p.seed, stop_at_eos=False,
                                   top_k=p.top_k, logit_bias=p.logit_bias, logprobs=p.logprobs)
        assert output.token_ids == alone.token_ids
        if p.logprobs is not None:  # float32 rounding apart: a block-causal oracle stores a finished block
            # in a forward of its own, the engine with the next block's first step (other GEMM shapes)
            assert [entry.token_id for entry in output.logprobs] == [entry.token_id for entry in alone.logprobs]
            assert [entry.logprob for entry in output.logprobs] == pytest.approx(
                [entry.logprob for entry in alone.logprobs], abs=1e-4)
