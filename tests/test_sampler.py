"""The runners' one sampler (``engine.runner.sampler``): bias per span, MASK never proposed, and a canvas's
log-probabilities over every token."""
from __future__ import annotations

import math

import torch

from engine.config import SamplingParams
from engine.runner.sampler import Sampler, spans_bias

VOCAB = 6


def test_a_requests_bias_reaches_every_position_of_its_span_and_no_other():
    bias = spans_bias([{1: 2.0}, {3: 1.0}, None, {4: -5.0}], [2, 0, 1, 2], VOCAB, torch.device("cpu"))
    biased = Sampler(mask_id=0).biased(torch.zeros(5, 1, VOCAB), bias)[:, 0]
    expected = torch.zeros(5, VOCAB)
    expected[:2, 1], expected[3:, 4] = 2.0, -5.0
    assert torch.equal(biased, expected)
    assert Sampler(mask_id=0).biased(torch.zeros(5, 1, VOCAB), None).dtype == torch.float32


def test_bias_is_added_in_float32_unless_the_logits_are_float64():
    bias = spans_bias([{2: 0.1}], [1], VOCAB, torch.device("cpu"))
    sampler = Sampler(mask_id=0)
    assert sampler.biased(torch.zeros(1, 1, VOCAB, dtype=torch.bfloat16), bias).dtype == torch.float32
    assert sampler.biased(torch.zeros(1, 1, VOCAB, dtype=torch.float64), bias)[0, 0, 2].item() == 0.1


def test_mask_is_never_proposed_greedy_or_sampled():
    logits = torch.zeros(3, VOCAB)
    logits[:, 0] = 50.0  # MASK is by far the most likely
    sampler = Sampler(mask_id=0)
    assert (sampler.greedy_tokens(logits) != 0).all()
    drawn = sampler.sampled_tokens(logits, SamplingParams(temperature=1.0, top_k=2), seed=5,
                                   positions=torch.arange(3))
    assert (drawn != 0).all()
    candidates, _ = sampler.propose(logits[:, None], None)
    assert (candidates != 0).all()


def test_a_next_token_draw_is_the_same_alone_as_among_other_positions():
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    sampler, params = Sampler(mask_id=0), SamplingParams(temperature=0.7, top_p=0.9)
    together = sampler.sampled_tokens(logits, params, seed=9, positions=torch.arange(10, 14))
    alone = [sampler.sampled_tokens(logits[i:i + 1], params, seed=9, positions=torch.tensor([10 + i])).item()
             for i in range(4)]
    assert together.tolist() == alone


def test_a_canvas_log_probabilities_are_over_every_token_and_a_blocks_leave_mask_out():
    logits = torch.zeros(1, 1, VOCAB)
    tokens = torch.tensor([[1]])
    canvas, _, _ = Sampler(mask_id=None).logprobs(logits, tokens, num_top=0)
    block, top_values, top_ids = Sampler(mask_id=0).logprobs(logits, tokens, num_top=2)
    assert math.isclose(canvas.item(), -math.log(VOCAB), rel_tol=1e-6)
    assert math.isclose(block.item(), -math.log(VOCAB - 1), rel_tol=1e-6)
    assert 0 not in top_ids.view(-1).tolist() and top_values.shape == (1, 1, 2)
