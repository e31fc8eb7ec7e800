"""The OpenAI routes on a block-causal family: the real OpenAIServer over a real EngineLoop on the tiny
SDAR fixture, without Ray. Answers equal ``engine.generate``; a stream sends one chunk per committed
block, the first block holding the prompt's last tokens included; stop strings and log-probabilities
work as for the full-attention families."""
from __future__ import annotations

import asyncio

import pytest

from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine import BlockServeEngine, EngineConfig, SamplingParams
from tests.conftest import FIXTURES
from tests.serve_helpers import openai_server_without_ray

MODEL = "tiny-sdar"
ENGINE = {"block_length": 4, "decoding": "low_confidence_dynamic", "steps_per_block": 4, "max_batch_size": 4}
PROMPT = "the quick brown fox"  # 19 characters: the first answer block holds 3 prompt tokens


@pytest.fixture(scope="module")
def server():
    yield from openai_server_without_ray(FIXTURES / MODEL, MODEL, ENGINE)


@pytest.fixture(scope="module")
def expected(server):
    engine = BlockServeEngine(server.loop.engine.lm, EngineConfig(**ENGINE))
    return engine.generate([PROMPT], SamplingParams(max_new_tokens=9, stop_at_eos=False, logprobs=2))[0]


def completion(server, **fields):
    return asyncio.run(server.completions(CompletionRequest.model_validate({"model": MODEL, "prompt": PROMPT,
                                                                            **fields})))


def test_a_completion_equals_engine_generate_with_its_logprobs(server, expected):
    answer = completion(server, max_tokens=9, ignore_eos=True, logprobs=2)
    assert answer.choices[0].text == expected.text
    assert answer.usage.completion_tokens == len(expected.token_ids) == 9  # 19 + 9 = 28: 7 blocks of 4
    assert answer.choices[0].logprobs.token_logprobs == pytest.approx([lp.logprob for lp in expected.logprobs])


def test_a_stream_sends_one_chunk_per_committed_block(server, expected):
    async def collect():
        request = CompletionRequest.model_validate({"model": MODEL, "prompt": PROMPT, "max_tokens": 9,
                                                    "ignore_eos": True, "stream": True})
        return [event async for event in await server.completions(request)]

    events = asyncio.run(collect())
    assert events[-1] == "data: [DONE]\n\n"
    assert len(events) - 1 == expected.num_blocks == 3  # 1 answer token, then 4, then 4
    assert expected.num_blocks * ENGINE["block_length"] - 3 == len(expected.token_ids)


def test_a_stop_string_cuts_the_answer(server, expected):
    stop = expected.text[4:6]
    if not stop or stop in expected.text[:4]:
        pytest.skip(f"no stop string that first occurs at character 4 of {expected.text!r}")
    answer = completion(server, max_tokens=9, ignore_eos=True, stop=[stop])
    assert answer.choices[0].text == expected.text[:4]
    assert answer.choices[0].finish_reason == "stop"


def test_a_chat_request_runs_through_the_checkpoints_chat_template(server):
    request = ChatCompletionRequest.model_validate({"model": MODEL, "max_tokens": 8,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    answer = asyncio.run(server.chat(request))
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > len("hi")  # the template's role markers were added


def test_a_repeated_prompt_reports_its_cached_tokens_in_usage(server):
    completion(server, max_tokens=4)  # the first time, its whole blocks (16 of 19 tokens) enter the cache
    again = completion(server, max_tokens=4)
    assert again.usage.prompt_tokens_details.cached_tokens == 16
    assert again.usage.prompt_tokens == 19
