"""The OpenAI routes on DiffusionGemma: the real OpenAIServer over a real EngineLoop on the tiny fixture,
without Ray. A seeded answer equals ``engine.generate``; a stream sends one chunk per committed canvas;
an image, or a sampling setting its canvas sampler does not take, is a 400 that says why; prompt tokens read
from the prefix cache are counted in the usage."""
from __future__ import annotations

import asyncio

import pytest

from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from engine import BlockServeEngine, EngineConfig, SamplingParams
from tests.conftest import FIXTURES
from tests.serve_helpers import complete, openai_server_without_ray

MODEL = "tiny-diffusion_gemma"
ENGINE = {"max_batch_size": 4, "max_denoising_steps": 6}
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def server():
    yield from openai_server_without_ray(FIXTURES / MODEL, MODEL, ENGINE)


def test_a_seeded_completion_equals_engine_generate_and_a_stream_sends_each_canvas(server):
    engine = BlockServeEngine(server.loop.engine.lm, EngineConfig(**ENGINE))
    expected = engine.generate([PROMPT], SamplingParams(max_new_tokens=13, seed=7, stop_at_eos=False))[0]
    answer = complete(server, PROMPT, max_tokens=13, seed=7, ignore_eos=True)
    assert answer.choices[0].text == expected.text and answer.usage.completion_tokens == 13

    async def collect():
        request = CompletionRequest.model_validate({"model": MODEL, "prompt": PROMPT, "max_tokens": 13, "seed": 7,
                                                    "ignore_eos": True, "stream": True})
        return [event async for event in await server.completions(request)]

    events = asyncio.run(collect())
    assert events[-1] == "data: [DONE]\n\n" and len(events) - 1 == expected.num_blocks == 2  # 8 + 5 tokens


def test_an_image_part_or_a_temperature_is_a_400_saying_why(server):
    request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]}]})
    with pytest.raises(OpenAIError, match="images are not served") as refused:
        asyncio.run(server.chat(request))
    assert refused.value.status == 400
    with pytest.raises(OpenAIError, match="temperature is not offered for diffusion_gemma") as refused:
        complete(server, PROMPT, max_tokens=4, temperature=0.7)
    assert refused.value.status == 400 and refused.value.param == "temperature"


def test_a_prompt_read_from_the_prefix_cache_is_counted_in_the_usage(server):
    prompt = "a lazy dog sleeps under a tree, far from any fox " * 2  # 98 tokens: 6 whole pages of 16
    first = complete(server, prompt, max_tokens=4, seed=1)
    again = complete(server, prompt, max_tokens=4, seed=1)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == 6 * 16 and again.choices[0].text == first.choices[0].text
