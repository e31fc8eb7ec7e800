"""Fast-dLLM v2 through the doors, on the tiny checkpoint ``scripts.make_fast_dllm_fixture`` writes: the real
OpenAIServer over a real EngineLoop (completions and chat, with the checkpoint's ChatML template), and
``map_batches(BlockServeActor)`` on the session's Ray cluster with the release's sub-blocks given as an engine
setting. Answers equal ``engine.generate``; a seeded sample repeats and log-probabilities come with every token."""
from __future__ import annotations

import asyncio

import pytest

from actors.serving.openai.protocol import ChatCompletionRequest
from engine import BlockServeEngine, EngineConfig, SamplingParams
from scripts.make_fast_dllm_fixture import write_fixture
from tests.serve_helpers import complete, openai_server_without_ray

MODEL = "tiny-fast_dllm_v2"
ENGINE = {"max_batch_size": 4, "decoding": "low_confidence", "threshold": 0.9, "sub_block_length": 8}
PROMPT = "the quick brown fox jumps over the lazy dog"  # 43 characters: the first answer block holds 11


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("doors") / MODEL)


@pytest.fixture(scope="module")
def server(model_dir):
    yield from openai_server_without_ray(model_dir, MODEL, ENGINE)


def test_a_completion_and_a_chat_equal_engine_generate(server):
    engine = BlockServeEngine(server.loop.engine.lm, EngineConfig(**ENGINE))
    messages = [{"role": "user", "content": PROMPT}]
    templated = server.loop.engine.lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                     tokenize=False)
    expected = engine.generate([PROMPT, templated], SamplingParams(max_new_tokens=12, stop_at_eos=False))
    answer = complete(server, PROMPT, max_tokens=12, ignore_eos=True)
    assert answer.choices[0].text == expected[0].text and answer.usage.completion_tokens == 12
    request = ChatCompletionRequest.model_validate({"model": MODEL, "max_tokens": 12, "ignore_eos": True,
                                                   "messages": messages})
    chat = asyncio.run(server.chat(request))
    assert chat.choices[0].message.content == expected[1].text
    markers = 2 * len("<|im_start|>") + len("<|im_end|>")
    assert chat.usage.prompt_tokens == len(templated) - markers + 3  # a marker is one token, a character another


def test_a_seeded_sample_repeats_and_logprobs_come_with_each_token(server):
    first, again = (complete(server, PROMPT, max_tokens=8, ignore_eos=True, temperature=0.9, seed=3) for _ in range(2))
    assert first.choices[0].text == again.choices[0].text
    answer = complete(server, PROMPT, max_tokens=6, ignore_eos=True, logprobs=2)
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.token_logprobs) == 6 and all(logprob <= 0.0 for logprob in logprobs.token_logprobs)


def test_map_batches_with_blockserve_actor_equals_engine_generate(ray_cluster, model_dir):
    import ray

    from actors import BlockServeActor

    prompts = [f"{word} jumps over the lazy dog" for word in ("a", "the brown", "every quick")]
    ds = ray.data.from_items([{"key": i, "prompt": prompt} for i, prompt in enumerate(prompts)]).map_batches(
        BlockServeActor, batch_size=3, num_cpus=0.25, compute=ray.data.ActorPoolStrategy(size=1),
        fn_constructor_kwargs={"model": str(model_dir), "engine": ENGINE, "sampling": {"max_new_tokens": 16},
                               "torch_threads": 1})
    ds.context.execution_options.preserve_order = True
    rows = ds.take_all()
    expected = BlockServeEngine.from_pretrained(model_dir, EngineConfig(**ENGINE)).generate(
        prompts, SamplingParams(max_new_tokens=16))
    assert [list(row["generated_tokens"]) for row in rows] == [output.token_ids for output in expected]
    assert all(row["__inference_error__"] == "" for row in rows)
