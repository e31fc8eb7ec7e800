"""DiffusionGemma's per-request sampling settings, against transformers' seeded ``generate`` on the tiny
fixture (float32): a request's ``logit_bias`` gives the tokens of ``generate`` given a logits processor that
adds the same bias; its ``logprobs`` are each committed token's log-probability under the biased logits of
the step that committed its canvas, with no temperature; and what ``generate`` does not define for the
canvas sampler (``temperature``, ``top_k``, ``top_p``) is refused by name."""
from __future__ import annotations

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion, LogitsProcessor, LogitsProcessorList

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import load_model
from engine.scheduling.request import TokenLogprob
from tests.test_block_causal_engine import assert_logprobs_close
from tests.test_diffusion_gemma import ADAPTIVE, FIXTURE, PROMPTS, reference_tokens

STEPS = {"max_denoising_steps": 12}
# per prompt (its seed is its index): pull a few tokens in, push others out; one row in four has none
BIASES = ({30: 6.0, 71: 4.0}, {}, {12: -100.0, 86: 5.0, 103: -100.0}, {44: 3.5},
          {}, {2: -100.0, 9: 8.0}, {60: 4.0, 61: 4.0, 62: 4.0}, {})
MAX_NEW_TOKENS = 20  # three canvases of 8, the last one cut


class AddBias(LogitsProcessor):
    """OpenAI's ``logit_bias`` as a transformers logits processor: one dense bias added to every canvas
    position's logits. It also keeps, per canvas, the biased logits of the latest step it saw: at batch 1,
    those of the step that committed the canvas."""

    def __init__(self, bias: dict[int, float], vocab_size: int):
        self.bias = torch.zeros(vocab_size)
        if bias:
            self.bias[list(bias)] = torch.tensor(list(bias.values()))
        self.latest: dict[int, torch.Tensor] = {}  # the context length before the canvas -> [canvas, vocab]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores + self.bias
        self.latest[input_ids.shape[1]] = scores[0].clone()
        return scores


@pytest.fixture(scope="module")
def lm():
    return load_model(FIXTURE)


@pytest.fixture(scope="module")
def reference():
    """transformers' model, and the seeded runs made on it so far (``biased_reference``): both tests ask
    for the same (prompt, seed, bias, settings) runs, whose tokens and recorded logits do not change."""
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(FIXTURE, dtype=torch.float32).eval()
    return model, {}


def reference_run(reference, lm, prompt: str, seed: int, bias: dict[int, float],
                  settings: dict) -> tuple[list[int], torch.Tensor]:
    """transformers' generate at batch 1 after torch.manual_seed(seed) with ``logits_processor=[AddBias]``
    (a new list each call: generate appends its temperature schedule to the list it is given): its tokens,
    cut as ours are, and the log-probabilities of every canvas position, from the committing step's biased
    logits by ``torch.log_softmax``. transformers' generate returns no scores, so the processor records the
    logits. Made once per (prompt, seed, bias, settings) in this module."""
    model, runs = reference
    key = (prompt, seed, tuple(sorted(bias.items())), tuple(sorted(settings.items())))
    if key not in runs:
        processor = AddBias(bias, lm.vocab_size)
        tokens = reference_tokens(model, lm, prompt, seed, MAX_NEW_TOKENS,
                                  {**settings, "logits_processor": LogitsProcessorList([processor])})
        runs[key] = tokens, torch.cat([torch.log_softmax(processor.latest[context], dim=-1)
                                       for context in sorted(processor.latest)])
    return runs[key]


def biased_reference(reference, lm, prompt: str, seed: int, bias: dict[int, float], settings: dict,
                     num_top: int = 0) -> tuple[list[int], list[TokenLogprob]]:
    """``reference_run``'s tokens, and each one's log-probability with the ``num_top`` most likely."""
    tokens, logprobs = reference_run(reference, lm, prompt, seed, bias, settings)
    top = logprobs.topk(num_top, dim=-1)
    return tokens, [TokenLogprob(token, logprobs[j, token].item(), tuple(zip(top.indices[j].tolist(),
                                                                           top.values[j].tolist())))
                    for j, token in enumerate(tokens)]


@pytest.mark.parametrize("settings", [STEPS, {**STEPS, **ADAPTIVE}])
def test_a_seeded_request_with_logit_bias_equals_transformers_generate_with_that_bias_processor(lm, reference,
                                                                                                settings):
    params = [SamplingParams(max_new_tokens=MAX_NEW_TOKENS, seed=seed, logit_bias=bias or None)
              for seed, bias in enumerate(BIASES)]
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **settings))
    batched = engine.generate(list(PROMPTS), params)
    unbiased = engine.generate(list(PROMPTS), [SamplingParams(max_new_tokens=MAX_NEW_TOKENS, seed=seed)
                                               for seed in range(len(PROMPTS))])
    alone = BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings))
    for seed, (prompt, bias, output) in enumerate(zip(PROMPTS, BIASES, batched)):
        assert output.token_ids == biased_reference(reference, lm, prompt, seed, bias, settings)[0]
        assert output.token_ids == alone.generate([prompt], params[seed])[0].token_ids
        assert not {token for token, value in bias.items() if value == -100} & set(output.token_ids)
    changed = [output.token_ids != plain.token_ids for output, plain, bias in zip(batched, unbiased, BIASES) if bias]
    assert all(changed)  # every bias moved its answer: the test compares something


@pytest.mark.parametrize("settings", [STEPS, {**STEPS, **ADAPTIVE}])
def test_logprobs_are_each_committed_tokens_under_the_biased_logits_of_its_committing_step(lm, reference,
                                                                                           settings):
    """The reference is transformers' model logits at the step that committed each canvas, with the bias
    and without the temperature schedule, recorded by the logits processor. Tokens and alternatives are
    the same; values equal up to float32 rounding (the two implementations' logits, or the head's matmul
    over a batch of rows and over one)."""
    asks = (3, None, 0, 5, 20, 1, None, 2)  # None: no log-probabilities
    params = [SamplingParams(max_new_tokens=MAX_NEW_TOKENS, seed=seed, logit_bias=bias or None, logprobs=num_top)
              for seed, (bias, num_top) in enumerate(zip(BIASES, asks))]
    batched = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **settings)).generate(list(PROMPTS), params)
    alone = BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings))
    for seed, (prompt, bias, num_top, output) in enumerate(zip(PROMPTS, BIASES, asks, batched)):
        assert_logprobs_close(output.logprobs, alone.generate([prompt], params[seed])[0].logprobs)
        if num_top is None:
            assert output.logprobs is None
            continue
        tokens, expected = biased_reference(reference, lm, prompt, seed, bias, settings, num_top)
        assert output.token_ids == tokens and [lp.token_id for lp in output.logprobs] == tokens
        assert_logprobs_close(output.logprobs, expected)
        assert all(len(lp.top) == num_top for lp in output.logprobs)
        if num_top:  # a canvas commits its argmax: each token is its step's most likely one
            assert all(lp.top[0][0] == lp.token_id for lp in output.logprobs)


@pytest.mark.parametrize("field, value, why", [
    ("temperature", 0.7, "set EngineConfig t_min and t_max instead"),
    ("top_k", 5, "transformers' DiffusionGemma generate defines none"),
    ("top_p", 0.9, "transformers' DiffusionGemma generate defines none")])
def test_what_transformers_generate_does_not_define_is_refused_by_name_saying_why(lm, field, value, why):
    engine = BlockServeEngine(lm, EngineConfig(**STEPS))
    output = engine.generate(["hi"], SamplingParams(max_new_tokens=8, seed=0, **{field: value}))[0]
    assert output.finish_reason == "error"
    assert output.error.startswith(f"{field} is not offered for diffusion_gemma") and why in output.error
