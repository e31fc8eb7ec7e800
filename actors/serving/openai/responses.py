"""The OpenAI responses and stream chunks: the ``openai`` package's own types, built here, so what a client
parses is what we built. Every response carries a non-standard ``blockserve`` object with the request's
timing on the replica."""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from openai.types import Completion, CompletionChoice, CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice as ChatChoice, ChoiceLogprobs
from openai.types.chat.chat_completion_chunk import Choice as ChunkChoice, ChoiceDelta
from openai.types.completion_choice import Logprobs
from openai.types.completion_usage import PromptTokensDetails
from pydantic import BaseModel

FinishReason = Literal["stop", "length"]


class BlockServeInfo(BaseModel):
    """Per-request facts from the replica (seconds since the epoch on the replica's clock)."""

    request_id: str
    arrival_time: float  # accepted by the HTTP handler
    first_scheduled_time: float | None  # admitted into a row (None: never ran)
    first_block_time: float | None  # its first block was committed
    finish_time: float
    num_blocks: int
    num_steps: int | None  # None when the server cut the request short (a stop string)


class ModelList(BaseModel):
    """The /v1/models envelope: the openai package only has a client-side page type for it."""

    object: Literal["list"] = "list"
    data: list[Model]


def token_usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> CompletionUsage:
    """OpenAI's usage; ``cached_tokens``: prompt tokens read from the prefix cache (None: not known)."""
    details = PromptTokensDetails(cached_tokens=cached_tokens) if cached_tokens is not None else None
    return CompletionUsage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                           total_tokens=prompt_tokens + completion_tokens, prompt_tokens_details=details)


def completion(request_id: str, model: str, text: str | None, finish: FinishReason | None, *,
               usage: CompletionUsage | None = None, info: BlockServeInfo | None = None,
               logprobs: Logprobs | None = None) -> Completion:
    """A completion or one of its stream chunks (OpenAI streams legacy completions as Completions too);
    ``text=None`` is the usage-only chunk, with no choice."""
    if text is None:
        choices = []
    elif finish is None:  # a mid-stream chunk: the type wants a reason, OpenAI's own stream sends null
        choices = [CompletionChoice.model_construct(index=0, text=text, logprobs=None, finish_reason=None)]
    else:
        choices = [CompletionChoice(index=0, text=text, finish_reason=finish, logprobs=logprobs)]
    return Completion(id=request_id, object="text_completion", created=now_s(), model=model,
                      choices=choices, usage=usage, **_extra(info))


def chat_completion(request_id: str, model: str, text: str, finish: FinishReason, *,
                    usage: CompletionUsage, info: BlockServeInfo,
                    logprobs: ChoiceLogprobs | None = None) -> ChatCompletion:
    message = ChatCompletionMessage(role="assistant", content=text)
    return ChatCompletion(id=request_id, object="chat.completion", created=now_s(), model=model,
                          choices=[ChatChoice(index=0, message=message, finish_reason=finish,
                                              logprobs=logprobs)],
                          usage=usage, **_extra(info))


def chat_chunk(request_id: str, model: str, delta: ChoiceDelta | None, finish: FinishReason | None, *,
               usage: CompletionUsage | None = None,
               info: BlockServeInfo | None = None) -> ChatCompletionChunk:
    """One chat stream chunk; ``delta=None`` is the usage-only chunk, with no choice."""
    choices = [] if delta is None else [ChunkChoice(index=0, delta=delta, finish_reason=finish)]
    return ChatCompletionChunk(id=request_id, object="chat.completion.chunk", created=now_s(),
                               model=model, choices=choices, usage=usage, **_extra(info))


def _extra(info: BlockServeInfo | None) -> dict[str, BlockServeInfo]:
    """The non-standard ``blockserve`` object: openai's models keep unknown fields (extra="allow")."""
    return {} if info is None else {"blockserve": info}


def dump(response: BaseModel) -> dict[str, Any]:
    """A response as JSON-ready data: every field of the OpenAI type (unset ones as null), plus extras."""
    return response.model_dump(mode="json")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now_s() -> int:
    return int(time.time())
