"""A new user's first hour with the OpenAI server (issue 64, item 8): the server and the engine accept the
same chat roles, a request may leave out ``model`` as the docs say, and a client leaving mid-stream is one
info line, not an error with a traceback.

The real OpenAIServer over a real EngineLoop on a frozen copy of the tiny model, without Ray; the disconnect
goes through the Serve app's own FastAPI error handler with the exception Serve raises.
"""
from __future__ import annotations

import asyncio
import logging
import re
import typing

import pytest
from pydantic import ValidationError

from actors.serving.openai.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest
from engine.models.prompts import CHAT_ROLES, encode_prompt
from tests.pipeline_helpers import freeze_tiny_model
from tests.serve_helpers import REPO_ROOT, openai_server_without_ray

MODEL = "blockserve-tiny"
ENGINE = {"max_batch_size": 4, "steps_per_block": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from openai_server_without_ray(freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny"), MODEL, ENGINE)


def test_the_engine_refuses_a_chat_role_the_server_refuses_naming_the_roles(server):
    tokenizer, vocab_size = server.lm.tokenizer, server.lm.vocab_size
    robot = [{"role": "robot", "content": "count from 1 to 5"}]
    with pytest.raises(ValueError, match="chat message 0 has role 'robot': the roles are system, developer, "
                                         "user, assistant"):
        encode_prompt(tokenizer, robot, vocab_size)
    with pytest.raises(ValidationError, match="role"):
        ChatMessage.model_validate(robot[0])
    assert typing.get_args(ChatMessage.model_fields["role"].annotation) == CHAT_ROLES  # one definition


def test_a_developer_message_is_a_system_message_in_the_engine_too(server):
    tokenizer, vocab_size = server.lm.tokenizer, server.lm.vocab_size
    asked = [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "count from 1 to 5"}]
    as_system = [{"role": "system", "content": "be brief"}, asked[1]]
    assert encode_prompt(tokenizer, asked, vocab_size) == encode_prompt(tokenizer, as_system, vocab_size)
    body = ChatCompletionRequest.model_validate({"messages": asked})
    assert encode_prompt(tokenizer, body.prompt_input(), vocab_size) == encode_prompt(tokenizer, as_system,
                                                                                     vocab_size)


def test_a_request_without_model_is_answered_by_the_served_model_as_the_docs_say(server):
    row = next(line for line in (REPO_ROOT / "docs" / "serving.md").read_text().splitlines()
               if line.startswith("| `model` |"))
    assert "absent means the served model" in row and "400 `model_not_found`" in row
    without = asyncio.run(server.completions(CompletionRequest.model_validate({"prompt": "count from 1 to 5"})))
    named = asyncio.run(server.completions(CompletionRequest.model_validate({"model": MODEL,
                                                                             "prompt": "count from 1 to 5"})))
    assert without.model == MODEL and without.choices[0].text == named.choices[0].text


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("gone", ["TaskCancelledError", "RequestCancelledError", "ClientDisconnect"])
def test_a_client_that_leaves_mid_stream_is_one_info_line_not_an_error(gone):
    """Serve raises TaskCancelledError into the streaming response when the proxy sees the client leave."""
    from ray.exceptions import TaskCancelledError
    from ray.serve.exceptions import RequestCancelledError
    from starlette.requests import ClientDisconnect, Request

    from actors.serving.serve_app import _server_bug, logger

    error = {"TaskCancelledError": TaskCancelledError, "RequestCancelledError": RequestCancelledError,
             "ClientDisconnect": ClientDisconnect}[gone]()
    request = Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": [],
                       "query_string": b"", "server": ("127.0.0.1", 8000), "scheme": "http"})
    handler = Records()
    logger.addHandler(handler)
    try:
        asyncio.run(_server_bug(request, error))
    finally:
        logger.removeHandler(handler)
    (record,) = handler.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert re.fullmatch(r"client left before the response of POST /v1/completions ended", record.getMessage())


def test_a_server_bug_is_still_an_error_with_its_traceback():
    from starlette.requests import Request

    from actors.serving.serve_app import _server_bug, logger

    request = Request({"type": "http", "method": "POST", "path": "/v1/completions", "headers": [],
                       "query_string": b"", "server": ("127.0.0.1", 8000), "scheme": "http"})
    handler = Records()
    logger.addHandler(handler)
    try:
        try:
            raise KeyError("bug")
        except KeyError as error:
            response = asyncio.run(_server_bug(request, error))
    finally:
        logger.removeHandler(handler)
    (record,) = handler.records
    assert record.levelno == logging.ERROR and record.exc_info is not None and response.status_code == 500
