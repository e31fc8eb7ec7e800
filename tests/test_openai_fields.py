"""Every OpenAI request field is honoured or refused with a 400 naming it; chat content parts work.

The real OpenAIServer over a real EngineLoop on a frozen copy of the tiny model, without Ray: a body is
validated as FastAPI does (pydantic, then ``validation_error``) and answered by the server.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from actors.serving.openai.fields import HONOURED_CHAT, HONOURED_COMPLETION, LABELS, REFUSED_CHAT, REFUSED_COMPLETION
from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, validation_error
from engine import BlockServeEngine, EngineConfig, SamplingParams
from tests.pipeline_helpers import freeze_tiny_model

MODEL = "blockserve-tiny"
ENGINE = {"max_batch_size": 4, "steps_per_block": 4}
# one value per refused field that asks for something BlockServe does not do
NON_NEUTRAL: dict[str, Any] = {
    "n": 2, "presence_penalty": 0.5, "frequency_penalty": -1.0, "top_p": 0.5, "top_k": 5,
    "logit_bias": {"7": 10}, "best_of": 2, "echo": True, "suffix": "tail", "logprobs": 2,
    "top_logprobs": 3, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
    "parallel_tool_calls": "yes", "functions": [{"name": "f"}], "function_call": "auto",
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "mp3"}, "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high", "verbosity": "low", "web_search_options": {}, "store": True,
    "service_tier": "flex", "moderation": {"enabled": True}, "prompt_cache_retention": "24h",
    "prompt_cache_options": {}, "stream_options.include_obfuscation": True,
}
CHAT_NON_NEUTRAL = NON_NEUTRAL | {"logprobs": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from actors.engine_loop import EngineLoop
    from actors.serving.openai.server import OpenAIServer

    model = freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny")
    engine = BlockServeEngine.from_pretrained(model, EngineConfig(**ENGINE), dtype="float32")
    loop = EngineLoop(engine).start()
    yield OpenAIServer(loop, model_name=MODEL, default_max_tokens=32)
    loop.stop()


@pytest.fixture(scope="module")
def reference(server) -> BlockServeEngine:
    """An engine of its own on the server's model (the server's engine belongs to its loop thread)."""
    return BlockServeEngine(server.loop.engine.lm, EngineConfig(**ENGINE))


def ask(server, body: dict[str, Any]):
    """The response to ``body`` (a chat body when it has messages), or the OpenAIError it gets."""
    chat = "messages" in body
    request_type = ChatCompletionRequest if chat else CompletionRequest
    try:
        request = request_type.model_validate({"model": MODEL, **body})
        return asyncio.run(server.chat(request) if chat else server.completions(request))
    except ValidationError as error:
        return validation_error([{**e, "loc": ("body", *e["loc"])} for e in error.errors()])
    except OpenAIError as error:
        return error


def body_with(name: str, value: Any, base: dict[str, Any]) -> dict[str, Any]:
    if name.startswith("stream_options."):
        return {**base, "stream_options": {name.split(".", 1)[1]: value}}
    return {**base, name: value}


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_every_field_of_the_openai_request_types_is_classified():
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_create_params

    completion = set(completion_create_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    chat = set(chat_create_params.CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert completion <= {*HONOURED_COMPLETION, *LABELS, *REFUSED_COMPLETION}
    assert chat <= {*HONOURED_CHAT, *LABELS, *REFUSED_CHAT}
    for request_type, known in ((CompletionRequest, completion), (ChatCompletionRequest, chat)):
        assert known <= set(request_type.model_fields)  # declared, so never "unrecognized"


@pytest.mark.parametrize("name", sorted(REFUSED_COMPLETION))
def test_a_refused_completion_field_is_a_400_naming_it_unless_neutral(server, name):
    base = {"prompt": "count from 1 to 5", "max_tokens": 32}
    error = ask(server, body_with(name, NON_NEUTRAL[name], base))
    assert isinstance(error, OpenAIError) and error.status == 400 and error.param == name, error
    assert name in error.message
    for neutral in (None, *REFUSED_COMPLETION[name].neutral):
        assert not isinstance(ask(server, body_with(name, neutral, base)), OpenAIError), (name, neutral)


@pytest.mark.parametrize("name", sorted(REFUSED_CHAT))
def test_a_refused_chat_field_is_a_400_naming_it_unless_neutral(server, name):
    base = {"messages": user("count from 1 to 5"), "max_tokens": 32}
    error = ask(server, body_with(name, CHAT_NON_NEUTRAL[name], base))
    assert isinstance(error, OpenAIError) and error.status == 400 and error.param == name, error
    for neutral in (None, *REFUSED_CHAT[name].neutral):
        assert not isinstance(ask(server, body_with(name, neutral, base)), OpenAIError), (name, neutral)


def test_an_unknown_field_is_a_400_naming_it(server):
    error = ask(server, {"prompt": "count from 1 to 5", "min_p": 0.1})
    assert isinstance(error, OpenAIError) and error.param == "min_p" and "unrecognized" in error.message
    error = ask(server, {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]})
    assert isinstance(error, OpenAIError) and error.param == "messages.0.tool_calls"


def test_labels_are_accepted_and_change_nothing(server):
    plain = ask(server, {"prompt": "count from 2 to 9", "max_tokens": 32})
    labelled = ask(server, {"prompt": "count from 2 to 9", "max_tokens": 32, "user": "u-1",
                            "safety_identifier": "s", "prompt_cache_key": "k", "metadata": {"a": "b"}})
    assert labelled.choices[0].text == plain.choices[0].text


def test_chat_content_parts_are_joined_with_newlines(server, reference):
    engine = reference
    parts = [{"type": "text", "text": "count from"}, {"type": "text", "text": "3 to 12"}]
    answer = ask(server, {"messages": [{"role": "user", "content": parts}], "max_tokens": 32})
    expected = engine.generate([user("count from\n3 to 12")], SamplingParams(max_new_tokens=32))[0]
    assert answer.choices[0].message.content == expected.text
    assert answer.usage.prompt_tokens == len(expected.prompt_token_ids)


def test_a_content_part_that_is_not_text_is_a_400_naming_its_type(server):
    parts = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://x"}}]
    error = ask(server, {"messages": [{"role": "user", "content": parts}]})
    assert isinstance(error, OpenAIError) and error.param == "messages.0.content.1.type"
    assert "'image_url'" in error.message
    error = ask(server, {"messages": [{"role": "user", "content": [{"type": "text"}]}]})
    assert isinstance(error, OpenAIError) and error.param == "messages.0.content.0.text"


def test_a_developer_message_is_a_system_message_and_a_name_is_refused(server):
    developer = ask(server, {"messages": [{"role": "developer", "content": "be brief"},
                                          *user("count from 1 to 4")], "max_tokens": 32})
    system = ask(server, {"messages": [{"role": "system", "content": "be brief"},
                                       *user("count from 1 to 4")], "max_tokens": 32})
    assert developer.choices[0].message.content == system.choices[0].message.content
    error = ask(server, {"messages": [{"role": "user", "content": "hi", "name": "ann"}]})
    assert isinstance(error, OpenAIError) and error.param == "messages.0.name"


def test_a_prompt_that_cannot_fit_is_refused_by_its_character_count(server):
    error = ask(server, {"prompt": "x" * 12_000})
    assert isinstance(error, OpenAIError) and error.param == "prompt"
    assert error.code == "context_length_exceeded" and "12000 characters" in error.message
    error = ask(server, {"messages": user("y" * 60_000)})
    assert isinstance(error, OpenAIError) and error.param == "messages" and "60000 characters" in error.message


def test_top_k_and_top_p_are_honoured_as_the_engine_honours_them(server, reference):
    sampled = {"temperature": 1.0, "seed": 11, "top_k": 3, "top_p": 0.8}
    answer = ask(server, {"prompt": "count from 2 to 9", "max_tokens": 32, **sampled})
    expected = reference.generate(["count from 2 to 9"], SamplingParams(max_new_tokens=32, **sampled))[0]
    assert answer.choices[0].text == expected.text
    off = ask(server, {"prompt": "count from 2 to 9", "max_tokens": 32, "temperature": 1.0, "seed": 11,
                       "top_k": -1, "top_p": 1})
    plain = reference.generate(["count from 2 to 9"], SamplingParams(max_new_tokens=32, temperature=1.0,
                                                                     seed=11))[0]
    assert off.choices[0].text == plain.text
    for bad in ({"top_p": 0}, {"top_p": 1.5}, {"top_k": -2}):
        error = ask(server, {"prompt": "count from 2 to 9", **bad})
        assert isinstance(error, OpenAIError) and error.param == next(iter(bad))


def test_logit_bias_is_honoured_and_bad_keys_are_a_400(server, reference):
    seven = reference.lm.tokenizer.convert_tokens_to_ids("7")
    answer = ask(server, {"messages": user("count from 1 to 5"), "max_tokens": 32, "ignore_eos": True,
                          "logit_bias": {str(seven): 100}})
    assert answer.choices[0].message.content == " ".join(["7"] * 32)
    for bad in ({"x": 1}, {str(seven): 101}, {str(reference.lm.vocab_size): 1}):
        error = ask(server, {"prompt": "count from 2 to 9", "logit_bias": bad})
        assert isinstance(error, OpenAIError) and error.param == "logit_bias", bad


def test_logprobs_return_each_tokens_number_at_its_commit_step(server, reference):
    answer = ask(server, {"prompt": "count from 2 to 9", "max_tokens": 32, "logprobs": 2})
    expected = reference.generate(["count from 2 to 9"], SamplingParams(max_new_tokens=32, logprobs=2))[0]
    logprobs = answer.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(expected.token_ids) == answer.usage.completion_tokens
    assert logprobs.token_logprobs == pytest.approx([entry.logprob for entry in expected.logprobs])
    assert all(value <= 0 for value in logprobs.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in logprobs.top_logprobs)
    assert "".join(logprobs.tokens).replace(" ", "") == answer.choices[0].text.replace(" ", "")

    chat = ask(server, {"messages": user("count from 2 to 9"), "max_tokens": 32, "logprobs": True,
                        "top_logprobs": 3})
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(item.logprob <= 0 and len(item.top_logprobs) == 3 for item in content)
    assert all(item.top_logprobs[0].logprob >= item.logprob for item in content)
    plain = ask(server, {"messages": user("count from 2 to 9"), "max_tokens": 32})
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == chat.choices[0].message.content


def test_logprobs_are_refused_when_streamed_or_out_of_range(server):
    cases = [({"prompt": "hi", "logprobs": 6}, "logprobs"),
             ({"prompt": "hi", "logprobs": 1, "stream": True}, "logprobs"),
             ({"messages": user("hi"), "top_logprobs": 2}, "top_logprobs"),
             ({"messages": user("hi"), "logprobs": True, "top_logprobs": 21}, "top_logprobs")]
    for body, param in cases:
        error = ask(server, body)
        assert isinstance(error, OpenAIError) and error.param == param, body
