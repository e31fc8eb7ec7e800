"""A block-causal row (SDAR, LLaDA2, Fast-dLLM v2) that honours stops ends its active block once a stop token has
no mask before it: its answer is whole there, and it decodes no later block. Its tokens are those of the block
decoded whole (the oracle's), in fewer steps. A request that ignores stops, a rule that edits, and a layout that
decodes every block whole (``RowLayout.ends_blocks_at_stops``) read a block as the rule's ``read_row`` does.
"""
from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.layout import RowLayout
from engine.models.loader import load_model
from engine.oracle.reference import reference_generate
from engine.rules import rule_for
from tests.conftest import FIXTURES

MASK, STOP, WORD = 100, 97, 5


@pytest.mark.parametrize("settings", [{"decoding": "threshold"}, {"decoding": "quota", "steps_per_block": 2}])
def test_a_mask_only_rule_ends_a_block_at_a_stop_with_no_mask_before_it(settings):
    rule = rule_for(EngineConfig(block_length=4, **settings), mask_id=MASK)
    assert rule.read_block([WORD, STOP, MASK, MASK], 0, (STOP,)).final
    assert not rule.read_block([MASK, STOP, MASK, WORD], 0, (STOP,)).final  # a mask before it may still stop
    assert not rule.read_block([STOP, MASK, MASK, MASK], 1, (STOP,)).final  # a lead prompt token never stops
    assert not rule.read_block([WORD, STOP, MASK, MASK], 0, None).final  # the request ignores stops


def test_an_editing_rule_decodes_its_block_whole():
    rule = rule_for(EngineConfig(decoding="joint_threshold", block_length=4), mask_id=MASK)
    assert not rule.commits_once


def workload(lm, bias: float, block: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Sixteen prompts of ordinary tokens, and answers of three blocks that a logit bias on the stop ids makes
    stop early in about half the rows."""
    rng = random.Random(0)
    prompts = [[rng.randrange(10, 90) for _ in range(rng.randrange(1, 30))] for _ in range(16)]
    stop_bias = dict.fromkeys(lm.special_ids.stop_ids, bias)
    return prompts, [SamplingParams(max_new_tokens=3 * block, logit_bias=stop_bias) for _ in prompts]


@pytest.mark.parametrize("fixture, block, bias", [("tiny-sdar", 4, 8.0), ("tiny-llada2", 32, 16.0)])
def test_a_block_causal_row_ends_its_block_at_a_stop_with_the_same_tokens_in_fewer_steps(fixture, block, bias,
                                                                                          monkeypatch):
    lm = load_model(FIXTURES / fixture, dtype="float64")
    config = EngineConfig(block_length=block, max_batch_size=4)
    prompts, params = workload(lm, bias, block)
    ends = BlockServeEngine(lm, config).generate(prompts, params)
    monkeypatch.setattr(RowLayout, "ends_blocks_at_stops", property(lambda layout: False))
    whole = BlockServeEngine(lm, config).generate(prompts, params)
    assert [(o.token_ids, o.finish_reason) for o in ends] == [(o.token_ids, o.finish_reason) for o in whole]
    assert all(a.num_steps <= b.num_steps for a, b in zip(ends, whole))
    assert sum(o.num_steps for o in ends) < sum(o.num_steps for o in whole)
    for prompt, p, output in zip(prompts, params, ends):
        alone = reference_generate(lm, prompt, max_new_tokens=p.max_new_tokens, block_length=block,
                                   rule=rule_for(config), logit_bias=p.logit_bias)
        assert (alone.token_ids, alone.num_steps) == (output.token_ids, output.num_steps)
