"""Every OpenAI request field, classified: honoured, accepted as a label, or refused unless neutral.

No field is silently dropped. A field BlockServe cannot honour is accepted only at its neutral value
(the value that asks for nothing: ``presence_penalty: 0``, ``n: 1``, ``tools: []``) or left out; any other
value is a 400 naming the field. A field that is not OpenAI's (nor one of the vLLM extensions listed
here) is a 400 too, as OpenAI answers "Unrecognized request argument". ``tests/test_openai_fields.py``
checks that every field of the ``openai`` package's request types is in one of these tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.serving.openai.protocol import EXTENSIONS, OpenAIError

# fields whose meaning BlockServe implements (README: "OpenAI request fields")
HONOURED_COMMON = ("model", "max_tokens", "temperature", "seed", "stop", "stream", "stream_options",
                   "ignore_eos", "top_p", "top_k", "logit_bias", "response_format", *EXTENSIONS)
HONOURED_COMPLETION = HONOURED_COMMON + ("prompt", "logprobs")
HONOURED_CHAT = HONOURED_COMMON + ("messages", "max_completion_tokens", "logprobs", "top_logprobs")
# labels for the caller's own bookkeeping: accepted, and they cannot change an answer
LABELS = ("user", "safety_identifier", "prompt_cache_key", "metadata")


@dataclass(frozen=True)
class Refused:
    neutral: tuple[Any, ...]  # values that ask for nothing (null, i.e. absent, is always accepted)
    reason: str


_NO_PENALTIES = "the diffusion decoder commits many tokens per step, so a repetition penalty has no order"
REFUSED_COMMON: dict[str, Refused] = {
    "n": Refused((1,), "one choice per request"),
    "presence_penalty": Refused((0, 0.0), _NO_PENALTIES),
    "frequency_penalty": Refused((0, 0.0), _NO_PENALTIES),
    "stream_options.include_obfuscation": Refused((False,), "stream chunks are not padded"),
}
REFUSED_COMPLETION: dict[str, Refused] = REFUSED_COMMON | {
    "best_of": Refused((1,), "one candidate per request"),
    "echo": Refused((False,), "the prompt is not echoed"),
    "suffix": Refused(("",), "insertion (text after the completion) is not supported"),
}
REFUSED_CHAT: dict[str, Refused] = REFUSED_COMMON | {
    "tools": Refused(([],), "tool calling is not supported"),
    "tool_choice": Refused(("none",), "tool calling is not supported"),
    "parallel_tool_calls": Refused((True, False), "tool calling is not supported"),
    "functions": Refused(([],), "function calling is not supported"),
    "function_call": Refused(("none",), "function calling is not supported"),
    "modalities": Refused((["text"],), "text is the only output modality"),
    "audio": Refused((), "audio output is not supported"),
    "prediction": Refused((), "predicted outputs are not supported"),
    "reasoning_effort": Refused((), "the model has no reasoning mode"),
    "verbosity": Refused((), "the model has no verbosity setting"),
    "web_search_options": Refused((), "web search is not supported"),
    "store": Refused((False,), "completions are not stored"),
    "service_tier": Refused(("auto", "default"), "there is one service tier"),
    "moderation": Refused((), "moderation is not supported"),
    "prompt_cache_retention": Refused((), "there is no prompt cache to retain"),
    "prompt_cache_options": Refused((), "there is no prompt cache to configure"),
}


def is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    """``value`` is null or one of ``neutral`` (type-exact, so ``echo: 0`` is not ``false``; 1 == 1.0)."""
    if value is None:
        return True
    return any(value == candidate and (type(value) is type(candidate)
                                       or {type(value), type(candidate)} == {int, float})
               for candidate in neutral)


def check_refused(values: dict[str, Any], refused: dict[str, Refused]) -> None:
    """Raise a 400 naming the first field set to a value BlockServe cannot honour."""
    for name, rule in refused.items():
        value = values.get(name)
        if not is_neutral(value, rule.neutral):
            accepted = " or ".join(repr(neutral) for neutral in (None, *rule.neutral))
            raise OpenAIError(f"{name}: {value!r} is not supported ({rule.reason}); send {accepted}, "
                              f"or leave it out", param=name, code="unsupported_parameter")
