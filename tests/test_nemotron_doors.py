"""Nemotron-Labs-Diffusion through the doors: the real OpenAIServer over a real EngineLoop (its self-speculative
mode batched), and ``map_batches(BlockServeActor)`` on the session's Ray cluster (its dLM mode). Answers equal
``engine.generate``; a stream sends one chunk per accepted run; a seeded sample repeats, a bad setting is a 400,
and log-probabilities come with every token. Its shipped batch-job config runs the job's rows through its actor
in ``tests/test_block_causal_pipeline.py``."""
from __future__ import annotations

import asyncio

import pytest

from actors.serving.openai.protocol import CompletionRequest, OpenAIError
from engine import BlockServeEngine, EngineConfig, SamplingParams
from tests.conftest import FIXTURES
from tests.serve_helpers import complete, openai_server_without_ray

MODEL = "tiny-nemotron_labs_diffusion"
SPECULATIVE = {"max_batch_size": 4, "decoding": "linear_spec", "threshold": 0.0}
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def server():
    yield from openai_server_without_ray(FIXTURES / MODEL, MODEL, SPECULATIVE)


def test_a_completion_equals_engine_generate_and_a_stream_sends_each_accepted_run(server):
    engine = BlockServeEngine(server.loop.engine.lm, EngineConfig(**SPECULATIVE))
    expected = engine.generate([PROMPT], SamplingParams(max_new_tokens=20, stop_at_eos=False))[0]
    answer = complete(server, PROMPT, max_tokens=20, ignore_eos=True)
    assert answer.choices[0].text == expected.text and answer.usage.completion_tokens == 20

    async def collect():
        request = CompletionRequest.model_validate({"model": MODEL, "prompt": PROMPT, "max_tokens": 20,
                                                    "ignore_eos": True, "stream": True})
        return [event async for event in await server.completions(request)]

    events = asyncio.run(collect())
    assert events[-1] == "data: [DONE]\n\n" and len(events) - 1 == expected.num_blocks  # the prompt's next token,
    # then one chunk per verified run


def test_a_seeded_sample_repeats_and_logprobs_come_with_each_token(server):
    first, again = (complete(server, PROMPT, max_tokens=8, ignore_eos=True, temperature=0.9, seed=3) for _ in range(2))
    assert first.choices[0].text == again.choices[0].text
    with pytest.raises(OpenAIError, match="outside the vocabulary") as refused:
        complete(server, PROMPT, max_tokens=4, logit_bias={"99999": 1.0})
    assert refused.value.status == 400 and refused.value.param == "logit_bias"
    answer = complete(server, PROMPT, max_tokens=6, ignore_eos=True, logprobs=2)
    assert len(answer.choices[0].logprobs.token_logprobs) == 6
    assert all(logprob <= 0.0 for logprob in answer.choices[0].logprobs.token_logprobs)


def test_map_batches_with_blockserve_actor_equals_engine_generate(ray_cluster):
    import ray

    from actors import BlockServeActor

    engine_settings = {"max_batch_size": 4, "decoding": "threshold", "threshold": 0.5}
    prompts = [f"{word} jumps over the lazy dog" for word in ("a", "one", "the brown", "every quick", "no")]
    ds = ray.data.from_items([{"key": i, "prompt": prompt} for i, prompt in enumerate(prompts)]).map_batches(
        BlockServeActor, batch_size=3, num_cpus=0.25, compute=ray.data.ActorPoolStrategy(size=1),
        fn_constructor_kwargs={"model": str(FIXTURES / MODEL), "engine": engine_settings,
                               "sampling": {"max_new_tokens": 24}, "torch_threads": 1})
    ds.context.execution_options.preserve_order = True
    rows = ds.take_all()
    expected = BlockServeEngine.from_pretrained(FIXTURES / MODEL, EngineConfig(**engine_settings)).generate(
        prompts, SamplingParams(max_new_tokens=24))
    assert [list(row["generated_tokens"]) for row in rows] == [output.token_ids for output in expected]
    assert all(row["__inference_error__"] == "" for row in rows)
