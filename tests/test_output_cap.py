"""An answer holds at most ``max_new_tokens`` tokens: the engine computes whole blocks and cuts the output.

The reference for each cap is the same prompt with its cap rounded up to the canvas the engine computes
anyway (the blocks and the tokens in them are the same): the capped answer is its first tokens, and the
finish reason says whether a stop token came within the cap.
"""
from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from tests.conftest import FIXTURES
from tests.engine_helpers import chat, ordinary_prompts

CAPS = (1, 5, 33, 40)
MODELS = {"tiny": ("tiny", {}), "sdar": (FIXTURES / "tiny-sdar", {"decoding": "low_confidence"}),
          "llada2": (FIXTURES / "tiny-llada2", {"decoding": "low_confidence"}),
          "dream": (FIXTURES / "tiny-dream", {})}


@pytest.fixture(scope="module", params=sorted(MODELS))
def engine(request) -> BlockServeEngine:
    path, settings = MODELS[request.param]
    return BlockServeEngine(load_model(path, dtype="float32"), EngineConfig(max_batch_size=8, **settings))


def whole_block_cap(engine: BlockServeEngine, prompt: list[int], cap: int) -> int:
    """The largest cap with the same canvas as ``cap``: every answer column of its blocks."""
    block = engine.config.block_length
    lead, blocks = engine.lm.layout.answer_blocks(len(prompt), cap, block)
    return blocks * block - lead


@pytest.mark.parametrize("stop_at_eos", [True, False])
def test_every_answer_is_at_most_its_cap_and_equals_the_whole_blocks_up_to_it(engine, stop_at_eos):
    prompts = ordinary_prompts(engine.lm, (3, 7))
    pairs = [(prompt, cap) for prompt in prompts for cap in CAPS]
    capped = [SamplingParams(max_new_tokens=cap, stop_at_eos=stop_at_eos) for _, cap in pairs]
    batched = engine.generate([prompt for prompt, _ in pairs], capped)
    for (prompt, cap), params, output in zip(pairs, capped, batched):
        alone = engine.generate([prompt], params)[0]
        whole = engine.generate([prompt], SamplingParams(max_new_tokens=whole_block_cap(engine, prompt, cap),
                                                         stop_at_eos=stop_at_eos))[0]
        assert len(output.token_ids) <= cap
        assert output.token_ids == alone.token_ids == whole.token_ids[:cap]
        stopped_within_cap = whole.finish_reason == "eos" and len(whole.token_ids) < cap
        assert output.finish_reason == alone.finish_reason == ("eos" if stopped_within_cap else "length")


@pytest.fixture(scope="module")
def counting():
    """The tiny model in blocks of 8, on a canvas of 4 blocks (caps 25 to 32): its count ends with an EOS
    inside the last block. Every cap of that canvas computes the same tokens."""
    engine = BlockServeEngine(load_model("tiny", dtype="float32"), EngineConfig(block_length=8))
    prompt = chat("count from 1 to 30")
    whole = engine.generate([prompt], SamplingParams(max_new_tokens=32))[0]
    assert whole.finish_reason == "eos" and 24 < len(whole.token_ids) < 31, whole.text
    return engine, prompt, whole


@pytest.mark.parametrize("past_the_eos, reason", [(1, "eos"), (0, "length"), (-1, "length")])
def test_an_eos_in_the_last_block_stops_the_answer_only_when_it_comes_within_the_cap(counting, past_the_eos,
                                                                                      reason):
    engine, prompt, whole = counting
    cap = len(whole.token_ids) + past_the_eos  # the EOS is token cap + 1 - past_the_eos of the answer
    output = engine.generate([prompt], SamplingParams(max_new_tokens=cap))[0]
    assert output.finish_reason == reason
    assert output.token_ids == whole.token_ids[:cap]
    assert output.num_blocks == 4


def test_a_stream_of_blocks_never_carries_a_token_past_the_cap(counting):
    engine, prompt, whole = counting
    cap = len(whole.token_ids) - 2
    request_id = engine.add_request(prompt, SamplingParams(max_new_tokens=cap))
    streamed, output = [], None
    while output is None:
        report = engine.step()
        streamed += report.new_token_ids.get(request_id, [])
        output = next((o for o in report.finished if o.request_id == request_id), None)
    assert streamed == output.token_ids == whole.token_ids[:cap]
    assert output.finish_reason == "length"
