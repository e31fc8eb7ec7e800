"""The OpenAI endpoints over one engine loop, independent of FastAPI and Ray: validated bodies in,
openai-typed responses or Server-Sent-Event lines out, :class:`OpenAIError` for anything the client must fix.

Requests are checked and tokenized here by the engine's own admission check (``engine.tokenize`` in a
worker thread, never on the event loop, then ``engine.check``), before they reach the engine loop, so a
bad one is a 400 naming its field, with the message the engine would give, and never occupies the loop.
A streamed response sends one chunk per committed block (a diffusion model finalizes text block by
block), the last one carrying ``finish_reason``, then ``data: [DONE]``.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from openai.types import Completion, CompletionUsage, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import ChoiceDelta
from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from actors.engine_loop import EngineDeadError, EngineLoop, QueueFullError, RequestStream
from actors.serving.openai.fields import REFUSED_CHAT, REFUSED_COMPLETION, check_refused
from actors.serving.openai.logprobs import chat_logprobs, completion_logprobs, within_text
from actors.serving.openai.protocol import MAX_STOP_STRINGS, ChatCompletionRequest, CompletionRequest, OpenAIError
from actors.serving.openai.responses import (
    BlockServeInfo,
    FinishReason,
    ModelList,
    chat_chunk,
    chat_completion,
    completion,
    dump,
    new_id,
    now_s,
    token_usage,
)
from engine import RequestOutput, SamplingParams
from engine.models.prompts import Prompt
from engine.scheduling.admission import AdmissionError

if TYPE_CHECKING:  # Ray Serve's metrics: only the Serve deployment hands one in
    from actors.serving.serve_metrics import ServeMetrics

FINISH_REASONS: dict[str, FinishReason] = {"eos": "stop", "length": "length"}


class TextStream:
    """The decoded text of a growing token list, released in deltas, cut at the first stop string.

    A tail that could still become a stop string is held back until the next block settles it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.token_ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of self.text already released
        self.stopped = False  # a stop string was found; self.text ends just before it
        self.counted_tokens = 0  # tokens the answer used: through the one that completes a stop string

    def add(self, token_ids: list[int]) -> str:
        if self.stopped:
            return ""
        earlier = len(self.token_ids)
        self.token_ids += token_ids
        self.text = self._decode(len(self.token_ids))
        hits = [index for index in (self.text.find(stop) for stop in self.stops) if index >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True
            self.counted_tokens = next(count for count in range(earlier + 1, len(self.token_ids) + 1)
                                       if self._holds_stop(count))
            return self.flush()
        self.counted_tokens = len(self.token_ids)
        held = max((size for stop in self.stops for size in range(1, len(stop))
                    if self.text.endswith(stop[:size])), default=0)
        if self.text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for its rest
            held = max(held, 1)
        end = max(self.sent, len(self.text) - held)
        delta, self.sent = self.text[self.sent:end], end
        return delta

    def _decode(self, count: int) -> str:
        return self.tokenizer.decode(self.token_ids[:count], skip_special_tokens=True)

    def _holds_stop(self, count: int) -> bool:
        """The first ``count`` tokens already spell a stop string."""
        text = self._decode(count)
        return any(stop in text for stop in self.stops)

    def flush(self) -> str:
        delta, self.sent = self.text[self.sent:], len(self.text)
        return delta


@dataclass(frozen=True)
class Job:
    """A submitted request and what its response needs."""

    stream: RequestStream
    text: TextStream
    prompt_tokens: int
    chat: bool
    include_usage: bool
    logprobs: bool = False  # the response carries them (so a stop string does not end it early)


class OpenAIServer:
    def __init__(self, loop: EngineLoop, *, model_name: str, max_tokens_limit: int | None = None,
                 default_max_tokens: int = 128, retry_after_s: int = 1,
                 metrics: ServeMetrics | None = None):
        self.loop, self.model_name, self.metrics = loop, model_name, metrics
        self.lm, self.block_length = loop.engine.lm, loop.engine.config.block_length
        # None: the longest whole-block canvas that fits the model next to a one-token prompt
        self.max_tokens_limit = max_tokens_limit or (
            (self.lm.max_length - 1) // self.block_length * self.block_length)
        self.default_max_tokens, self.retry_after_s = default_max_tokens, retry_after_s
        self.created = now_s()

    def models(self) -> ModelList:
        return ModelList(data=[Model(id=self.model_name, object="model", created=self.created,
                                     owned_by="blockserve", max_model_len=self.lm.max_length)])

    async def completions(self, body: CompletionRequest) -> Completion | AsyncIterator[str]:
        job = await self._submit(body, body.prompt_input(), "prompt",
                                 (body.max_tokens, "max_tokens"), chat=False, logprobs=body.logprobs)
        return self._stream_events(job) if body.stream else await self._collect(job)

    async def chat(self, body: ChatCompletionRequest) -> ChatCompletion | AsyncIterator[str]:
        max_tokens = ((body.max_tokens, "max_tokens") if body.max_tokens is not None
                      else (body.max_completion_tokens, "max_completion_tokens"))
        if body.top_logprobs is not None and not body.logprobs:
            raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        job = await self._submit(body, body.prompt_input(), "messages", max_tokens, chat=True,
                                 logprobs=logprobs)
        return self._stream_events(job) if body.stream else await self._collect(job)

    # -- admission ---------------------------------------------------------------------------------
    async def _submit(self, body: CompletionRequest | ChatCompletionRequest, prompt: Prompt,
                      prompt_param: str, max_tokens: tuple[int | None, str], chat: bool,
                      logprobs: int | None) -> Job:
        """Check, tokenize and queue a request; every problem is an OpenAIError naming its field.

        Tokenizing runs in a worker thread (Hugging Face tokenizers release the GIL), so a long prompt
        delays only its own request; one that cannot fit is refused before it is tokenized."""
        if body.model is not None and body.model != self.model_name:
            raise OpenAIError(f"model {body.model!r} is not served here (this server serves "
                              f"{self.model_name!r})", param="model", code="model_not_found")
        check_refused(body.field_values(), REFUSED_CHAT if chat else REFUSED_COMPLETION)
        if logprobs is not None and body.stream:
            raise OpenAIError("logprobs are not streamed (yet): ask without stream", param="logprobs",
                              code="unsupported_parameter")
        stops = body.stop_strings()
        if len(stops) > MAX_STOP_STRINGS:
            raise OpenAIError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}",
                              param="stop", code="invalid_value")
        max_tokens, param = max_tokens
        max_tokens = self.default_max_tokens if max_tokens is None else max_tokens
        if max_tokens > self.max_tokens_limit:
            raise OpenAIError(f"{param} must be at most {self.max_tokens_limit}, got {max_tokens}",
                              param=param, code="invalid_value")
        params = SamplingParams.from_openai({
            "max_tokens": max_tokens, "temperature": body.temperature, "seed": body.seed,
            "ignore_eos": body.ignore_eos, "top_k": body.top_k, "top_p": body.top_p,
            "logit_bias": body.token_bias(), "logprobs": logprobs, **body.extensions()})
        names = {"prompt": prompt_param, "max_new_tokens": param, "stop_at_eos": "ignore_eos",
                 "logprobs": "top_logprobs" if chat else "logprobs", "params": None}  # ours -> the body's
        try:  # the engine's own admission check, tokenizing in a worker thread
            prompt_ids = await asyncio.to_thread(self.loop.engine.tokenize, prompt, params)
            self.loop.engine.check(prompt_ids, params)
        except AdmissionError as error:
            if error.param.startswith("structured_outputs") and body.response_format is not None:
                error.param = "response_format"  # the body asked in OpenAI's words
            field = names.get(error.param, error.param)
            if self.metrics is not None:
                self.metrics.invalid.inc(tags={"param": (field or "body").split(".")[0]})
            raise OpenAIError(str(error), param=field,
                              code="context_length_exceeded" if error.too_long else "invalid_value") from None
        request_id = new_id("chatcmpl" if chat else "cmpl")
        try:
            stream = self.loop.submit(prompt_ids, params, request_id)
        except QueueFullError as error:
            if self.metrics is not None:
                self.metrics.rejected.inc()
            raise OpenAIError(f"server is at capacity: {error}; retry after {self.retry_after_s} s",
                              status=429, type="rate_limit_error", code="rate_limit_exceeded",
                              headers={"Retry-After": str(self.retry_after_s)}) from None
        except EngineDeadError as error:
            raise OpenAIError(str(error), status=503, type="server_error", code="engine_unavailable") from None
        return Job(stream, TextStream(self.lm.tokenizer, stops), len(prompt_ids), chat,
                   body.include_usage, logprobs is not None)

    # -- responses ---------------------------------------------------------------------------------
    async def _collect(self, job: Job) -> Completion | ChatCompletion:
        finish, output = None, None
        try:
            async for event in job.stream:
                job.text.add(event.token_ids)
                output = event.output
                if job.text.stopped:
                    finish = "stop"
                    if not job.logprobs:  # else run on: the last event carries the log-probabilities
                        break
                elif output is not None:
                    finish = self._finish_reason(output)
        except EngineDeadError as error:
            raise OpenAIError(str(error), status=503, type="server_error", code="engine_unavailable") from None
        finally:
            if finish is None or job.text.stopped:  # cancelled (client gone) or cut at a stop string
                self.loop.abort(job.stream.request_id)
        job.text.flush()
        build = chat_completion if job.chat else completion
        return build(job.stream.request_id, self.model_name, job.text.text, finish,
                     usage=self._usage(job, output), info=self._info(job, output),
                     logprobs=self._logprobs(job, output))

    def _logprobs(self, job: Job, output: RequestOutput | None):
        if not job.logprobs or output is None or output.logprobs is None:
            return None
        entries = within_text(self.lm.tokenizer, output.logprobs, job.text.text)
        return (chat_logprobs if job.chat else completion_logprobs)(self.lm.tokenizer, entries)

    async def _stream_events(self, job: Job) -> AsyncIterator[str]:
        finish, first, output = None, True, None
        try:
            async for event in job.stream:
                output = event.output or output
                delta = job.text.add(event.token_ids)
                if job.text.stopped:
                    finish = "stop"
                elif event.output is not None:
                    finish = self._finish_reason(event.output)
                    delta += job.text.flush()
                info = self._info(job, event.output) if finish else None
                yield _sse(self._chunk(job, delta, finish, info, role=first))
                first = False
                if finish:
                    break
            if job.include_usage:
                yield _sse(self._chunk(job, None, None, None, role=False, usage=self._usage(job, output)))
        except OpenAIError as error:  # the request failed after the stream had started
            yield _sse(error.body())
        except EngineDeadError as error:
            yield _sse(OpenAIError(str(error), status=503, type="server_error",
                                   code="engine_unavailable").body())
        finally:
            if finish is None or job.text.stopped:  # client gone, failure, or cut at a stop string
                self.loop.abort(job.stream.request_id)
        yield "data: [DONE]\n\n"

    def _chunk(self, job: Job, delta: str | None, finish: FinishReason | None,
               info: BlockServeInfo | None, role: bool,
               usage: CompletionUsage | None = None) -> Completion | ChatCompletionChunk:
        """One stream chunk; ``delta=None`` is the closing usage-only chunk."""
        request_id = job.stream.request_id
        if not job.chat:
            return completion(request_id, self.model_name, delta, finish, usage=usage, info=info)
        choice_delta = None if delta is None else ChoiceDelta(role="assistant" if role else None,
                                                              content=delta)
        return chat_chunk(request_id, self.model_name, choice_delta, finish, usage=usage, info=info)

    @staticmethod
    def _finish_reason(output: RequestOutput) -> FinishReason:
        if output.finish_reason == "error":  # checked at admission, so this is the engine's own verdict
            raise OpenAIError(output.error or "request failed", param=None, code="invalid_value")
        if output.finish_reason == "abort":  # only this server aborts, once nobody waits: not expected
            raise OpenAIError("request was aborted by the server", status=503, type="server_error",
                              code="request_aborted")
        return FINISH_REASONS[output.finish_reason]

    @staticmethod
    def _usage(job: Job, output: RequestOutput | None) -> CompletionUsage:
        cached = output.num_cached_tokens if output is not None else None
        return token_usage(job.prompt_tokens, job.text.counted_tokens, cached)

    @staticmethod
    def _info(job: Job, output: RequestOutput | None) -> BlockServeInfo:
        stream = job.stream
        return BlockServeInfo(
            request_id=stream.request_id, arrival_time=stream.arrival_time,
            first_scheduled_time=stream.first_scheduled_time, first_block_time=stream.first_block_time,
            finish_time=output.finish_time if output is not None else time.time(),
            num_blocks=stream.num_blocks, num_steps=output.num_steps if output is not None else None)


def _sse(payload: BaseModel | dict) -> str:
    if isinstance(payload, BaseModel):
        payload = dump(payload)
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
