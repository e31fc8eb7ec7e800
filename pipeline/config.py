"""The job's configuration: one pydantic model validates the YAML file and the ``--set`` overrides.

Every section forbids unknown keys, and every problem is reported with the key's dotted path and the
file it came from, e.g. ``configs/x.yaml: engine.block_lenght: unknown key``. The top level holds the
actor's own settings (:class:`~actors.ray_data.actor_config.ActorConfig`: model, dtype, engine, sampling, ...),
so a job hands them to its actors unchanged; ``actors`` sizes the pool, ``bucketing`` groups prompts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from actors.ray_data.actor_config import ActorConfig, retries_problem


class ConfigError(ValueError):
    """A config file (or override) that does not validate; the message names the keys and the file."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ActorsConfig(_Section):
    num_actors: int | None = Field(None, ge=1, description="None: one per GPU of the cluster (GPU actors) "
                                   "or 1 (CPU actors)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs per actor, one per rank (engine.tensor_parallel_size); "
                            "0 means CPU actors")
    num_cpus: float = Field(1.0, gt=0, description="CPUs per actor (a CPU engine's: per rank); keep it below the "
                            "node's cores so reads can run")
    batch_size: int = Field(64, ge=1, description="rows per Ray Data batch handed to an actor")
    max_concurrent_batches: int = Field(4, ge=1, description="batches one actor holds in flight, sharing "
                                        "its engine")
    startup_timeout_s: int = Field(600, ge=1, description="how long the job waits for every actor to "
                                   "load its model")
    max_restarts: int = Field(16, ge=-1, description="how often Ray restarts an actor whose process died, "
                              "then its batches fail the job; at least max_batch_deaths + "
                              "max_isolation_deaths; -1: no limit")
    max_task_retries: int = Field(-1, ge=-1, description="how often Ray retries a batch whose actor died, "
                                  "including deaths it only waited through; -1: as often as the actor restarts")
    actor_class: str | None = Field(None, description="import path of a BlockServeActor subclass; None: "
                                    "BlockServeActor")
    actor_options: dict[str, Any] = Field(default_factory=dict, description="arguments of an actor_class "
                                          "subclass beyond the actor's settings")


class BucketingConfig(_Section):
    enabled: bool = Field(True, description="group rows of similar prompt length into the same batches")
    edges: list[int] | None = Field(None, description="prompt-length boundaries in tokens, strictly "
                                    "increasing; None: quantiles of the data")
    num_buckets: int = Field(4, ge=1, description="buckets when edges is None")
    group_prefixes: bool = Field(True, description="inside a bucket, route rows that share their first 64 "
                                 "prompt tokens together, so one actor's prefix cache serves them")

    @field_validator("edges")
    @classmethod
    def _increasing(cls, edges: list[int] | None) -> list[int] | None:
        if edges is not None and any(b <= a for a, b in zip(edges, edges[1:])):
            raise ValueError(f"must be strictly increasing, got {edges}")
        return edges


class PipelineConfig(ActorConfig):
    input: str = Field(description="a local path or pyarrow-filesystem URI (s3://, gs://, ...), file or "
                       "directory")
    input_format: Literal["auto", "jsonl", "parquet", "csv"] = Field("auto", description="auto: from the "
                                                                     "file name")
    output: str = Field(description="a directory or URI; outputs/ (parquet), stats.json and stats.png go "
                        "under it")
    limit: int | None = Field(None, ge=1, description="the first N input rows only")
    id_column: str = Field("id", description="the resume key; generated from the row's content when the "
                           "input lacks it")
    overwrite: bool = Field(False, description="delete earlier outputs instead of resuming from them")
    actors: ActorsConfig = ActorsConfig()
    bucketing: BucketingConfig = BucketingConfig()

    @property
    def actor_settings(self) -> ActorConfig:
        """The actor's settings, as the job's top level holds them."""
        return ActorConfig.model_validate({name: getattr(self, name) for name in ActorConfig.model_fields})

    @model_validator(mode="after")
    def _device_matches_resources(self) -> PipelineConfig:
        if self.device == "cuda" and self.actors.num_gpus == 0:
            raise ValueError("device 'cuda' needs actors.num_gpus > 0")
        ranks = self.engine.tensor_parallel_size
        if self.actors.num_gpus and self.actors.num_gpus != ranks:
            raise ValueError(f"actors.num_gpus={self.actors.num_gpus:g} but engine.tensor_parallel_size={ranks}: an "
                             f"actor's engine runs one rank per GPU, so set actors.num_gpus: {ranks}")
        return self

    @model_validator(mode="after")
    def _retries_outlast_the_ledger(self) -> PipelineConfig:
        problem = retries_problem(self.actor_settings, self.actors.max_restarts, self.actors.max_task_retries)
        if problem:
            raise ValueError(f"actors.{problem}")
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
        key = ".".join(str(part) for part in problem["loc"])
        if not key:  # a check across keys: its message names them
            lines.append(f"  {path}: {problem['msg'].removeprefix('Value error, ')}")
        elif problem["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            lines.append(f"  {path}: {key}: unknown key")
        elif problem["type"] == "missing":
            lines.append(f"  {path}: {key}: required key is missing")
        else:
            message = problem["msg"].removeprefix("Value error, ")
            lines.append(f"  {path}: {key}: {message} (got {problem.get('input')!r})")
    return "\n".join(lines)
