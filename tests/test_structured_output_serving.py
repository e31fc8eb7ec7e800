"""Structured output through the OpenAI door: ``response_format`` (OpenAI's) and ``structured_outputs`` (vLLM's)
on chat and completions, answered on the random LLaDA fixture, and every malformed constraint a 400 naming its field.

The real OpenAIServer over a real EngineLoop, without Ray (``tests.serve_helpers.openai_server_without_ray``).
"""
from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pytest
from pydantic import ValidationError

from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from tests.model_helpers import LLADA_DIR
from tests.serve_helpers import openai_server_without_ray

MODEL = "tiny-llada"
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
          "required": ["ok", "color"], "additionalProperties": False}


@pytest.fixture(scope="module")
def openai_server():
    yield from openai_server_without_ray(LLADA_DIR, MODEL, {"max_batch_size": 4, "block_length": 8},
                                         default_max_tokens=32)


def answer(server, **body) -> tuple[str, str]:
    """(text, finish_reason) of a chat body (with ``messages``) or a completion body."""
    if "messages" in body:
        response = asyncio.run(server.chat(ChatCompletionRequest.model_validate({"model": MODEL, **body})))
        return response.choices[0].message.content, response.choices[0].finish_reason
    response = asyncio.run(server.completions(CompletionRequest.model_validate({"model": MODEL, **body})))
    return response.choices[0].text, response.choices[0].finish_reason


def refusal(server, **body) -> OpenAIError:
    with pytest.raises(OpenAIError) as raised:
        answer(server, **body)
    assert raised.value.status == 400
    return raised.value


def test_chat_with_a_json_schema_response_format_answers_json_that_follows_it(openai_server):
    response_format = {"type": "json_schema", "json_schema": {"name": "flag", "schema": SCHEMA, "strict": True}}
    text, finish = answer(openai_server, messages=[{"role": "user", "content": "a flag"}],
                          response_format=response_format)
    assert finish == "stop"
    jsonschema.validate(json.loads(text), SCHEMA)


def test_completions_take_response_format_and_structured_outputs(openai_server):
    text, finish = answer(openai_server, prompt="an object", response_format={"type": "json_object"})
    assert finish == "stop" and isinstance(json.loads(text), dict)
    text, finish = answer(openai_server, prompt="a code", structured_outputs={"regex": r"[A-F][0-9]{2}"})
    assert finish == "stop" and re.fullmatch(r"[A-F][0-9]{2}", text)
    text, _ = answer(openai_server, messages=[{"role": "user", "content": "pick"}],
                     structured_outputs={"choice": ["left", "right"]})
    assert text in ("left", "right")


def test_a_text_response_format_asks_for_nothing(openai_server):
    free, _ = answer(openai_server, prompt="free", max_tokens=8)
    assert answer(openai_server, prompt="free", max_tokens=8, response_format={"type": "text"})[0] == free


def test_a_malformed_constraint_is_a_400_naming_its_field(openai_server):
    assert refusal(openai_server, prompt="x", structured_outputs={"regex": "a[b"}).param == "structured_outputs.regex"
    assert refusal(openai_server, prompt="x", structured_outputs={"xml": "a"}).param == "structured_outputs"
    bad_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nosuch"}}}
    error = refusal(openai_server, messages=[{"role": "user", "content": "x"}], response_format=bad_schema)
    assert error.param == "response_format" and "nosuch" in error.message
    both = refusal(openai_server, prompt="x", response_format={"type": "json_object"},
                   structured_outputs={"regex": "a"})
    assert both.param == "response_format"
    assert refusal(openai_server, prompt="x", response_format={"type": "json_schema"}).param == \
        "response_format.json_schema"
    with pytest.raises(ValidationError):
        CompletionRequest.model_validate({"model": MODEL, "prompt": "x", "response_format": {"type": "yaml"}})
