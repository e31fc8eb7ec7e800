"""The OpenAI-compatible requests: bodies (validated strictly) and errors. Responses and stream chunks are
the ``openai`` package's own types, built in the ``responses`` module.

Every field is honoured or refused (the ``fields`` module holds the table): greedy or sampled decoding
with a seed, ``stop`` strings (applied to the decoded text), ``ignore_eos`` (a vLLM extension, for
benchmarks that want exact lengths), chat content as a string or a list of text parts; a field
BlockServe cannot honour is a 400 naming it unless it has its neutral value, and an unknown field is
a 400. Types are strict, so ``"max_tokens": "8"`` is a 400, not an 8.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.models.prompts import CHAT_ROLES

MAX_STOP_STRINGS = 4  # OpenAI's own limit


class OpenAIError(Exception):
    """A client-facing error: rendered as ``{"error": {...}}`` with its HTTP status."""

    def __init__(self, message: str, *, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# -- requests --------------------------------------------------------------------------------------
class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # refused when true (fields.py): chunks are not padded


EXTENSIONS = ("gen_length", "editing_threshold", "max_post_steps", "structured_outputs")  # SamplingParams' names,
# honoured as such (structured_outputs: vLLM's, checked by the engine)


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")  # None: any JSON object
    strict: bool | None = None  # the answer always follows the schema, strict or not


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: free text, any JSON object, or JSON that follows a schema."""

    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    def structured_outputs(self) -> dict[str, Any] | None:
        """The engine's ``structured_outputs`` for this format (None: free text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"json_object": True}
        if self.json_schema is None:
            raise OpenAIError("response_format.json_schema: a json_schema format needs its json_schema",
                              param="response_format.json_schema", code="missing_required_parameter")
        schema = self.json_schema.json_schema
        return {"json": schema} if schema is not None else {"json_object": True}


class _Request(BaseModel):
    """Fields BlockServe honours are typed here; a field it refuses unless neutral is ``Any`` here and
    judged by the ``fields`` module; a field nobody defines is a 400 (OpenAI's "unrecognized argument")."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model: str | None = None  # None: the served model
    max_tokens: int | None = Field(None, ge=1)  # None: the server's default
    temperature: float = Field(0.0, ge=0.0, le=2.0)  # greedy by default: a diffusion LM's usual mode
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False  # vLLM's extension: run to max_tokens
    top_p: float | None = Field(None, gt=0.0, le=1.0)  # sampled rows: nucleus (1: off)
    top_k: int | None = Field(None, ge=-1)  # vLLM's extension, sampled rows (-1 or 0: off)
    logit_bias: dict[str, float] | None = None  # token id (as a JSON key) -> bias in [-100, 100]
    # BlockServe's extensions (EXTENSIONS); None: the server's. gen_length: a whole-sequence family's answer
    # length; editing_threshold and max_post_steps: the request settings of decoding="joint_threshold" and
    # "joint_threshold_indel"
    gen_length: int | None = Field(None, ge=1)
    editing_threshold: float | None = Field(None, ge=0.0, le=1.0)
    max_post_steps: int | None = Field(None, ge=0)
    structured_outputs: dict[str, Any] | None = None  # {"json" | "regex" | "choice" | "grammar" | "json_object": ...}
    response_format: ResponseFormat | None = None  # OpenAI's; vLLM takes it on completions too
    # the caller's labels: accepted, they cannot change an answer
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    metadata: dict[str, str] | None = None
    # judged by fields.py (null or the neutral value, else a 400 naming the field)
    n: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None

    def extensions(self) -> dict[str, Any]:
        """BlockServe's extension fields the body sets, by SamplingParams' names (``response_format`` as the
        ``structured_outputs`` it asks for)."""
        values = {name: getattr(self, name) for name in EXTENSIONS if getattr(self, name) is not None}
        wanted = self.response_format.structured_outputs() if self.response_format is not None else None
        if wanted is not None and "structured_outputs" in values:
            raise OpenAIError("response_format and structured_outputs both ask for the answer's form: send one",
                              param="response_format", code="invalid_value")
        return values | ({"structured_outputs": wanted} if wanted is not None else {})

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [stop for stop in stops if stop]

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def token_bias(self) -> dict[int, float] | None:
        """``logit_bias`` with int token ids; a 400 naming it for a key that is not one or a bias
        outside OpenAI's [-100, 100]."""
        if not self.logit_bias:
            return None
        bias = {}
        for key, value in self.logit_bias.items():
            if not key.isdigit() or not -100 <= value <= 100:
                raise OpenAIError(f"logit_bias: {key!r}: {value} needs a token id key and a bias in "
                                  "[-100, 100]", param="logit_bias", code="invalid_value")
            bias[int(key)] = value
        return bias

    def field_values(self) -> dict[str, Any]:
        """Every field as sent (unset ones as their defaults), for ``fields.check_refused``."""
        values = dict(self)
        if self.stream_options is not None and self.stream_options.include_obfuscation:
            values["stream_options.include_obfuscation"] = True
        return values


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)  # N: each token's and the N most likely (OpenAI's 5)
    best_of: Any = None
    echo: Any = None
    suffix: Any = None

    def prompt_input(self) -> str | list[int]:
        """The one prompt: a list of strings is OpenAI's batch form, and only one is served per call."""
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                raise OpenAIError(f"one prompt per request is supported, got {len(self.prompt)}",
                                  param="prompt", code="invalid_value")
            return self.prompt[0]
        return self.prompt


class ContentPart(BaseModel):
    """One part of a message's content; only ``{"type": "text", "text": ...}`` is served (checked in
    :meth:`ChatCompletionRequest.prompt_input`, so another type is a 400 naming that type)."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: Literal[CHAT_ROLES]  # the engine's roles (engine.models.prompts): it reads developer as system
    content: str | list[ContentPart]
    name: str | None = None  # refused when set: the chat template has no place for a name

    def text(self, index: int) -> str:
        """The content as one string: text parts joined with newlines (as vLLM joins them)."""
        if self.name is not None:
            raise OpenAIError(f"messages.{index}.name: participant names are not supported",
                              param=f"messages.{index}.name", code="unsupported_parameter")
        if isinstance(self.content, str):
            return self.content
        for number, part in enumerate(self.content):
            if part.type != "text":
                why = ": images are not served, this server runs its model text only" if "image" in part.type else ""
                raise OpenAIError(f"messages.{index}.content.{number}.type: content part type "
                                  f"{part.type!r} is not supported (only 'text'){why}",
                                  param=f"messages.{index}.content.{number}.type",
                                  code="unsupported_parameter")
            if part.text is None:
                raise OpenAIError(f"messages.{index}.content.{number}.text: a text part needs its text",
                                  param=f"messages.{index}.content.{number}.text",
                                  code="missing_required_parameter")
        return "\n".join(part.text for part in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)  # needs logprobs: true
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    functions: Any = None
    function_call: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    store: Any = None
    service_tier: Any = None
    moderation: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None

    def prompt_input(self) -> list[dict[str, str]]:
        return [{"role": message.role, "content": message.text(index)} for index, message in enumerate(self.messages)]


def validation_error(errors: list[dict[str, Any]]) -> OpenAIError:
    """Turn pydantic/FastAPI validation errors into one 400 that names the first offending field."""
    located = [([str(part) for part in error.get("loc", ()) if part != "body"], error) for error in errors]
    if not located or not located[0][0] or located[0][1].get("type") in ("json_invalid",
                                                                         "model_attributes_type"):
        detail = located[0][1].get("msg", "") if located else ""
        return OpenAIError(f"request body is not a valid JSON object: {detail}", code="invalid_json")
    location, error = located[0]
    if error.get("type") == "extra_forbidden":  # OpenAI: "Unrecognized request argument supplied"
        param = ".".join(location)
        return OpenAIError(f"{param}: unrecognized request field", param=param,
                           code="unrecognized_parameter")
    # a failed union member adds its type to the path (prompt.str, prompt.list[int].0): drop those
    param = ".".join(part for part in location if not _is_union_tag(part))
    members = [part for other, _ in located if other[:1] == location[:1] for part in other
               if _is_union_tag(part)]
    if members:  # "prompt: Input should be a valid string" would hide the other accepted types
        return OpenAIError(f"{param}: must be one of {', '.join(dict.fromkeys(members))}",
                           param=param, code="invalid_type")
    kind = error.get("type", "")
    code = ("missing_required_parameter" if kind == "missing"
            else "invalid_type" if kind.endswith("_type") else "invalid_value")
    return OpenAIError(f"{param}: {error.get('msg', 'invalid value')}", param=param, code=code)


def _is_union_tag(part: str) -> bool:
    return part in ("str", "int", "float", "bool", "none") or "[" in part or part.startswith("function-")
