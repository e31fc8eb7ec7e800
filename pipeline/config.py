"""The job's configuration: one pydantic model validates the YAML file and the ``--set`` overrides.

Every section forbids unknown keys, and every problem is reported with the key's dotted path and the
file it came from, e.g. ``configs/x.yaml: engine.block_lenght: unknown key``. The ``engine`` and
``sampling`` sections are the engine's own ``EngineConfig`` / ``SamplingParams`` dataclasses (pydantic
validates their fields and rejects unknown ones), so their checks live in one place.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine import EngineConfig, SamplingParams


class ConfigError(ValueError):
    """A config file (or override) that does not validate; the message names the keys and the file."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActorsConfig(_Section):
    num_actors: int | None = Field(None, ge=1)  # None: one per GPU in the cluster (GPU) or 1 (CPU)
    num_gpus: float = Field(0.0, ge=0)  # per actor; 0 means CPU actors
    num_cpus: float = Field(1.0, gt=0)  # per actor; keep below the node's cores so reads can run
    batch_size: int = Field(64, ge=1)  # rows per Ray Data batch handed to an actor
    max_concurrent_batches: int = Field(4, ge=1)  # batches one actor holds in flight (one engine)
    torch_threads: int | None = Field(None, ge=1)  # CPU actors: intra-op threads (None: Ray's default)
    startup_timeout_s: int = Field(600, ge=1)  # wait this long for every actor to load its model
    max_restarts: int = Field(8, ge=0)  # Ray restarts an actor whose process died this often, then fails
    max_task_retries: int = Field(4, ge=0)  # Ray retries a batch whose actor died this often
    actor_class: str | None = None  # import path of a BlockServeActor subclass; None: BlockServeActor
    actor_options: dict[str, Any] = Field(default_factory=dict)  # more constructor arguments of the actor


class BucketingConfig(_Section):
    enabled: bool = True
    edges: list[int] | None = None  # prompt-length boundaries (tokens); None: quantiles of the data
    num_buckets: int = Field(4, ge=1)  # used when edges is None

    @field_validator("edges")
    @classmethod
    def _increasing(cls, edges: list[int] | None) -> list[int] | None:
        if edges is not None and any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"must be strictly increasing, got {edges}")
        return edges


class PipelineConfig(_Section):
    model: str = "tiny"  # "tiny", a local checkpoint directory or a Hugging Face hub id
    dtype: str = "float32"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    input: str  # local path or pyarrow-filesystem URI (s3://, gs://, ...); file or directory
    input_format: Literal["auto", "jsonl", "parquet", "csv"] = "auto"
    output: str  # directory or URI; outputs/ (parquet), stats.json and stats.png go under it
    limit: int | None = Field(None, ge=1)  # first N input rows only
    prompt_column: str = "prompt"
    id_column: str = "id"  # resume key; generated from the row's content when the input lacks it
    chat_template: bool = False  # wrap a raw-text prompt as one user chat message (a chat always gets it)
    should_continue_on_error: bool = True  # a bad row gets __inference_error__; False: it fails the job
    overwrite: bool = False  # True: delete earlier outputs instead of resuming from them
    engine: EngineConfig = EngineConfig(sort_pending=False)
    sampling: SamplingParams = SamplingParams()
    actors: ActorsConfig = ActorsConfig()
    bucketing: BucketingConfig = BucketingConfig()

    @field_validator("engine", mode="before")
    @classmethod
    def _arrival_order_admission(cls, value: object) -> object:
        """Same default as BlockServeActor: batches arrive bucketed by length, and admitting them in
        arrival order lets them finish one by one (see actors/block_serve_actor.py)."""
        return {"sort_pending": False, **value} if isinstance(value, dict) else value

    @field_validator("sampling")
    @classmethod
    def _sampling_valid(cls, value: SamplingParams) -> SamplingParams:
        problem = value.validation_error()  # the engine reports these per request; a config must be right
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _device_matches_resources(self) -> PipelineConfig:
        if self.device == "cuda" and self.actors.num_gpus == 0:
            raise ValueError("device 'cuda' needs actors.num_gpus > 0")
        return self

    @property
    def uses_gpus(self) -> bool:
        return self.actors.num_gpus > 0


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """``["engine.block_length=16", "limit=8"]`` -> nested keys set, values parsed as YAML scalars."""
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {override!r}: expected key=value")
        node = raw
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {override!r}: {part!r} is not a section")
            node = child
        node[parts[-1]] = yaml.safe_load(text)
    return raw


def load_config(path: str | Path, overrides: list[str] = ()) -> PipelineConfig:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: cannot read config: {error}") from error
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    raw = apply_overrides(raw, list(overrides))
    try:
        return PipelineConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(format_errors(path, error)) from None


def format_errors(path: Path, error: ValidationError) -> str:
    lines = [f"{path}: invalid config ({error.error_count()} problem(s))"]
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"]) or "(top level)"
        if problem["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            lines.append(f"  {path}: {key}: unknown key")
        elif problem["type"] == "missing":
            lines.append(f"  {path}: {key}: required key is missing")
        else:
            message = problem["msg"].removeprefix("Value error, ")
            lines.append(f"  {path}: {key}: {message} (got {problem.get('input')!r})")
    return "\n".join(lines)
