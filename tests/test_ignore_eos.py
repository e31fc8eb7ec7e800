"""A request that ignores stop tokens (``stop_at_eos=False``, vLLM's ``ignore_eos``) keeps every token up to
``max_new_tokens``, its stop tokens included, and finishes with "length"; one that honours them ends before its
first stop with "eos" (the OpenAI server's "stop"). This holds on every row kind, and the oracles agree.

Each fixture is a tiny random checkpoint; a logit bias on its stop ids makes its answer commit one early.
"""
from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from engine.oracle.reference import reference_generate
from engine.rules import rule_for
from tests.conftest import FIXTURES

CASES = {  # fixture -> (prompt, logit bias on its stop ids, max_new_tokens): an answer with an early stop
    "tiny-llada": ([20, 21, 22, 23, 24], 1.0, 24),  # bidirectional
    "tiny-sdar": ([20, 21, 22, 23, 24], 6.0, 12),  # block_causal
    "tiny-llada2": ([40] * 9, 12.0, 64),  # block_causal
    "tiny-diffusion_gemma": ([31, 32, 33], 6.0, 24),  # canvas
    "tiny-nemotron_labs_diffusion": ([31, 32, 33], 3.0, 24),  # anchored
}
ORACLE_KINDS = ("bidirectional", "block_causal")  # the row kinds engine.oracle.reference decodes


@pytest.mark.parametrize("fixture", CASES)
def test_an_early_stop_ends_the_answer_only_when_the_request_honours_stops(fixture):
    lm = load_model(FIXTURES / fixture, dtype="float64")
    prompt, bias, max_new_tokens = CASES[fixture]
    stops = lm.special_ids.stop_ids
    config = EngineConfig(block_length=lm.block_length or 8, max_batch_size=2)
    params = [SamplingParams(max_new_tokens=max_new_tokens, stop_at_eos=honours, seed=0,
                             logit_bias=dict.fromkeys(stops, bias)) for honours in (False, True)]
    ignoring, honouring = BlockServeEngine(lm, config).generate([prompt, prompt], params)
    first = next(index for index, token in enumerate(ignoring.token_ids) if token in stops)
    assert first < max_new_tokens - 1  # guard: the stop comes early, with tokens after it
    assert (len(ignoring.token_ids), ignoring.finish_reason) == (max_new_tokens, "length")
    assert ignoring.text == lm.tokenizer.decode(ignoring.token_ids, skip_special_tokens=True)
    assert (honouring.token_ids, honouring.finish_reason) == (ignoring.token_ids[:first], "eos")
    if lm.row_kind in ORACLE_KINDS:
        for output, p in zip((ignoring, honouring), params):
            alone = reference_generate(lm, prompt, max_new_tokens=max_new_tokens, block_length=config.block_length,
                                       rule=rule_for(config), stop_at_eos=p.stop_at_eos, logit_bias=p.logit_bias)
            assert (alone.token_ids, alone.finish_reason) == (output.token_ids, output.finish_reason)
