"""Engine-wide and per-request settings: frozen dataclasses, validated on construction."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.rules.flat_settings import flat_dict, owned_setting, pydantic_schema, set_fields
from engine.structured.spec import structured_outputs_problem

SCHEDULES = ("continuous", "block_sync", "static", "shrink")  # engine/scheduling/policies.py: one policy each
CACHE_MODES = ("dual", "prefix", "none")
SHIFTED_DECODINGS = ("fast-dllm", "lookback")
DEFAULT_MAX_MODEL_LEN = 4096  # widest row when max_model_len is unset: a model may advertise far more
# (Dream: 131,072 positions, a KV cache of ~112 GiB at 16 slots); LLaDA's own limit is 4096


def window_lookback(config: EngineConfig, logit_shift: int) -> int:
    """Columns a cached window starts before its block: Fast-dLLM's Dream windows start at the block."""
    return logit_shift if config.shifted_decoding == "lookback" else 0


def _fail(field: str, message: str) -> None:
    raise ValueError(f"EngineConfig.{field}: {message}")


@dataclass(frozen=True, slots=True, init=False)
class EngineConfig:
    block_length: int | None = None  # None: the block a block-causal model was trained with, else 32
    # "continuous": rows advance block by block on their own, admission at every step (our default);
    # "block_sync": BlockServe's block cycles; "static": Fast-dLLM; "shrink": Fast-dLLM v2 / dInfer
    schedule: str = "continuous"
    static_batch_timeout_s: float | None = None  # static: a batch starts when full or when its oldest
    # request has waited this long (None: at once, with whoever is pending)
    max_batch_size: int = 16
    token_budget: int | None = None  # bounding-box tokens (rows x widest row); None: derived, see below
    sort_pending: bool = True  # pending queue ordered by prompt length (else arrival order)
    max_wait_s: float | None = None  # aging: a request pending longer is admitted first (None: off;
    # an offline batch drains anyway, an online server should set it)
    cache: str = "dual"  # "dual" | "prefix" | "none"
    # the decoding rule, a key of engine.rules.RULES; each rule module says what it does, validates the shared
    # keys below that it reads and declares the settings it owns (see rule_settings)
    decoding: str | None = None  # None: the model's own rule (a canvas model's), else "threshold"
    threshold: float | None = None  # None: the checkpoint's generation_config.json, else 0.9 (DEFAULT_THRESHOLD);
    # linear_spec: the draft's threshold, 0.0 allowed (every mask from one forward)
    factor: float = 1.0
    steps_per_block: int | None = None  # cap on steps per block; the fixed step count in quota/dream mode
    # (Dream's `steps`: Dream decodes its whole canvas as one block, block_length = max_new_tokens)
    # families whose logits are shifted by one (Dream): "fast-dllm" decodes as Fast-dLLM's Dream block
    # decoding (a block's first step commits only its first position; cached windows start at the block);
    # "lookback": windows start one column before the block and every step applies the rule
    shifted_decoding: str = "fast-dllm"
    # tokens a whole-sequence family (LLaDA, Dream) decodes each answer in, its canvas; max_new_tokens then only
    # caps the answer. None: the checkpoint's generation_config.json, else each request's max_new_tokens.
    # Block-causal, canvas and anchored families decode block after block and never read it
    gen_length: int | None = None
    max_model_len: int | None = None  # widest admissible row (prompt + canvas), sizes the KV cache;
    # None: the model's maximum length up to DEFAULT_MAX_MODEL_LEN, capped by the token budget
    enable_prefix_caching: bool | None = None  # keep whole prompt blocks' keys/values for later requests
    # that start with the same tokens (vLLM's name); None: on where it is exact (block-causal families)
    prefix_cache_tokens: int | None = None  # tokens of keys/values the prefix cache holds (whole blocks);
    # None: max_model_len's worth
    # one model over this many devices (vLLM's name): the engine's process is rank 0 and starts the others
    # (engine.parallel); heads, MLPs, experts and the vocabulary are split across them
    tensor_parallel_size: int = 1
    tensor_parallel_timeout_s: float = 300.0  # a rank that waits this long on another ends the engine
    # "fp8" (vLLM's name): weights quantized at load to FP8-dynamic (e4m3, a scale per output channel, activations
    # per token); None: as the checkpoint stores them (an FP8-dynamic checkpoint loads FP8 either way)
    quantization: str | None = None
    # the settings one rule owns, given by their flat names (EngineConfig(<setting>=...), a YAML's engine
    # keys): each rule module declares its own (DecodingRule.own_settings) and validates them; read them as
    # attributes, config.<setting> (unset: the rule's default)
    rule_settings: tuple[tuple[str, Any], ...] = ()
    # the settings one family owns, given the same way (Family.own_settings: Nemotron-Labs-Diffusion's
    # causal_context); its module validates them, and a model of another family refuses them by name
    family_settings: tuple[tuple[str, Any], ...] = ()

    def __init__(self, **values: Any) -> None:
        set_fields(self, values, "EngineConfig")
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        return owned_setting(self, name, engine_default=True)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return pydantic_schema(cls)

    def __post_init__(self) -> None:
        if self.block_length is not None and (not isinstance(self.block_length, int) or self.block_length < 1):
            _fail("block_length", f"must be a positive int or None, got {self.block_length!r}")
        if self.schedule not in SCHEDULES:
            _fail("schedule", f"must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.static_batch_timeout_s is not None:
            if isinstance(self.static_batch_timeout_s, bool) or not isinstance(
                    self.static_batch_timeout_s, (int, float)) or self.static_batch_timeout_s < 0:
                _fail("static_batch_timeout_s", f"must be a non-negative number of seconds or None, "
                                                f"got {self.static_batch_timeout_s!r}")
            if self.schedule != "static":
                _fail("static_batch_timeout_s", f"collects a batch for schedule='static' only, got "
                                                f"schedule={self.schedule!r}")
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            _fail("max_batch_size", f"must be a positive int, got {self.max_batch_size!r}")
        if self.token_budget is not None and (not isinstance(self.token_budget, int) or self.token_budget < 1):
            _fail("token_budget", f"must be a positive int or None, got {self.token_budget!r}")
        if self.max_wait_s is not None and (isinstance(self.max_wait_s, bool)
                                            or not isinstance(self.max_wait_s, (int, float)) or self.max_wait_s < 0):
            _fail("max_wait_s", f"must be a non-negative number of seconds or None, got {self.max_wait_s!r}")
        if self.cache not in CACHE_MODES:
            _fail("cache", f"must be one of {CACHE_MODES}, got {self.cache!r}")
        if self.shifted_decoding not in SHIFTED_DECODINGS:
            _fail("shifted_decoding", f"must be one of {SHIFTED_DECODINGS}, got {self.shifted_decoding!r}")
        if self.gen_length is not None and (isinstance(self.gen_length, bool) or not isinstance(self.gen_length, int)
                                            or self.gen_length < 1):
            _fail("gen_length", f"must be a positive int or None, got {self.gen_length!r}")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 1):
            _fail("max_model_len", f"must be a positive int or None, got {self.max_model_len!r}")
        if self.enable_prefix_caching is not None and not isinstance(self.enable_prefix_caching, bool):
            _fail("enable_prefix_caching", f"must be True, False or None, got {self.enable_prefix_caching!r}")
        if self.prefix_cache_tokens is not None and (isinstance(self.prefix_cache_tokens, bool) or not isinstance(
                self.prefix_cache_tokens, int) or self.prefix_cache_tokens < 0):
            _fail("prefix_cache_tokens", f"must be an int >= 0 or None, got {self.prefix_cache_tokens!r}")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) or (
                self.tensor_parallel_size < 1):
            _fail("tensor_parallel_size", f"must be a positive int (1: one device), got {self.tensor_parallel_size!r}")
        if isinstance(self.tensor_parallel_timeout_s, bool) or not isinstance(
                self.tensor_parallel_timeout_s, (int, float)) or self.tensor_parallel_timeout_s <= 0:
            _fail("tensor_parallel_timeout_s", f"must be a positive number of seconds, "
                                               f"got {self.tensor_parallel_timeout_s!r}")
        if self.quantization not in (None, "fp8"):
            _fail("quantization", f"must be 'fp8' or None (the checkpoint's own weights), got {self.quantization!r}")
        from engine.models.families import family_settings  # loads the family modules (and torch)
        from engine.rules import DECODING_RULES, settings_problems  # loads the rule modules

        for name, value in self.family_settings:
            family, setting = family_settings()[name]
            if (problem := setting.problem(value)) is not None:
                _fail(name, f"{problem} (a setting of {family})")

        if self.decoding is not None and self.decoding not in DECODING_RULES:
            _fail("decoding", f"must be one of {DECODING_RULES} or None (the model's own), got {self.decoding!r}")
        for name, problem in settings_problems(self):
            _fail(name, problem)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EngineConfig:
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Its fields with the rule settings flat, as a YAML's engine section writes them."""
        return flat_dict(self)

    def resolved_token_budget(self, model_max_length: int) -> int:
        """The budget in force: the configured one, or ``max_batch_size`` widest admissible rows."""
        return self.token_budget or self.max_batch_size * self.resolved_max_model_len(model_max_length)

    def resolved_max_model_len(self, model_max_length: int) -> int:
        """The widest row a request may have: configured, else the model's up to DEFAULT_MAX_MODEL_LEN;
        never over the model's maximum nor the budget."""
        widest = min(self.max_model_len or DEFAULT_MAX_MODEL_LEN, model_max_length)
        return min(widest, self.token_budget) if self.token_budget else widest


@dataclass(frozen=True, slots=True, init=False)
class SamplingParams:
    """Per-request settings. Problems are reported per request (see :meth:`validation_error`), so one
    bad request in a batch fails alone instead of raising for everyone."""

    max_new_tokens: int = 256  # the answer holds at most this many tokens: a cap, never the length it is decoded at
    gen_length: int | None = None  # a whole-sequence family's canvas for this request (None: the engine's
    # EngineConfig.gen_length, else max_new_tokens); an answer under a smaller max_new_tokens is its prefix
    temperature: float = 0.0
    seed: int | None = None
    stop_at_eos: bool = True  # False: run to the block cap (benchmarks with length caps)
    # sampled rows only (engine/runner/logit_processors.py): keep the top_k tokens (0: all), then the smallest
    # set reaching probability top_p (1.0: all)
    top_k: int = 0
    top_p: float = 1.0
    logit_bias: Mapping[int, float] | None = None  # token id -> added to its logit, every row's step
    logprobs: int | None = None  # N: each output token's log-probability and N alternatives (None: off)
    # the text the answer must be (vLLM's names, engine.structured.spec): {"json": schema}, {"regex": ...},
    # {"choice": [...]}, {"grammar": EBNF} or {"json_object": True}; None: free text
    structured_outputs: Mapping[str, Any] | None = None
    # the settings the engine's rule lets a request carry (Setting.per_request), given by their flat names
    # (SamplingParams(<setting>=...)) and validated by the rule; unset: the engine's
    rule_settings: tuple[tuple[str, Any], ...] = ()

    def __init__(self, **values: Any) -> None:
        set_fields(self, values, "SamplingParams")

    def __getattr__(self, name: str) -> Any:
        return owned_setting(self, name, engine_default=False)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return pydantic_schema(cls)

    @property
    def filters_tokens(self) -> bool:
        """Top-k / top-p change this request's draws (greedy decoding never needs them)."""
        return self.temperature > 0 and (self.top_k > 0 or self.top_p < 1.0)

    def validation_error(self) -> str | None:
        """The first problem with these settings, as a message that starts with the field's name."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            return f"max_new_tokens must be an int, got {type(self.max_new_tokens).__name__}"
        if self.max_new_tokens <= 0:
            return f"max_new_tokens must be positive, got {self.max_new_tokens}"
        if self.gen_length is not None and (isinstance(self.gen_length, bool) or not isinstance(self.gen_length, int)
                                            or self.gen_length <= 0):
            return f"gen_length must be a positive int or None, got {self.gen_length!r}"
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            return f"temperature must be a number, got {type(self.temperature).__name__}"
        if not 0.0 <= self.temperature <= 100.0:
            return f"temperature must be in [0, 100], got {self.temperature}"
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            return f"seed must be an int or None, got {type(self.seed).__name__}"
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            return f"top_k must be an int >= 0 (0: off), got {self.top_k!r}"
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, Mapping) or not all(
                    isinstance(token, int) and not isinstance(token, bool) and token >= 0
                    and isinstance(bias, (int, float)) and not isinstance(bias, bool) and -100 <= bias <= 100
                    for token, bias in self.logit_bias.items()):
                return "logit_bias must map token ids (ints >= 0) to numbers in [-100, 100]"
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= 20):
            return f"logprobs must be None or an int in [0, 20], got {self.logprobs!r}"
        return structured_outputs_problem(self.structured_outputs)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SamplingParams:
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Its fields with the rule settings flat."""
        return flat_dict(self)

    @classmethod
    def from_openai(cls, values: Mapping[str, Any], defaults: SamplingParams | None = None,
                    refused: tuple[str, ...] = ()) -> SamplingParams:
        """``defaults`` with OpenAI / vLLM request settings applied (None: not set): ``max_tokens``,
        ``ignore_eos``, ``top_k`` (vLLM's -1 is off: 0 here), ``logit_bias`` (token ids as ints or
        digit strings), and every field of ours by its own name. A key outside those, or in
        ``refused``, raises ValueError naming it. Values are not validated (see validation_error)."""
        from engine.rules import owned_settings

        ours = {field.name for field in dataclasses.fields(cls)} - {"rule_settings"}
        request_settings = {name for name, (_, setting) in owned_settings().items() if setting.per_request}
        supported = sorted({*OPENAI_NAMES, *ours, *request_settings} - set(refused))
        given = {key: value for key, value in values.items() if value is not None}
        unknown = sorted(set(given) - set(supported))
        if unknown:
            raise ValueError(f"unsupported key(s) {unknown}; supported: {supported}")
        changes: dict[str, Any] = {}
        for key, value in given.items():
            if key == "ignore_eos":
                changes["stop_at_eos"] = not bool(value)
            elif key == "top_k":
                changes["top_k"] = 0 if value == -1 else value
            elif key == "logit_bias":
                changes["logit_bias"] = _token_bias(value)
            else:
                changes[OPENAI_NAMES.get(key, key)] = value
        return dataclasses.replace(defaults if defaults is not None else cls(), **changes)


OPENAI_NAMES = {"max_tokens": "max_new_tokens", "ignore_eos": "stop_at_eos"}  # OpenAI / vLLM -> ours


def _token_bias(value: Any) -> dict[int, float]:
    """{token id: bias} from ids as ints or digit strings (JSON and Arrow keys are strings); a None
    bias is not set."""
    if not isinstance(value, Mapping):
        raise ValueError(f"logit_bias must be a dict of token id -> bias, got {type(value).__name__}")
    bias = {}
    for key, number in value.items():
        if number is None:
            continue
        if isinstance(key, str) and key.isdigit():
            key = int(key)
        if not isinstance(key, int) or isinstance(key, bool):
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        bias[key] = number
    return bias
