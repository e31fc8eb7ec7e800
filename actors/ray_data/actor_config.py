"""The settings of one BlockServeActor, defined once.

The three ways to build actors read this one type: ``BlockServeActor(**fields)`` in ``map_batches``,
``BlockServeProcessorConfig.actor`` in ``build_processor``, and the top level of the pipeline's YAML
(``PipelineConfig`` extends it). A new actor setting is a field here and its use in the actor.
"""
from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from actors.model_options import BATCH_INVARIANT_DESCRIPTION, COMPILE_DESCRIPTION, refuse_model_options_in_engine
from engine import EngineConfig, SamplingParams
from engine.models.options import ModelOptions


def offline_engine_config(**fields: object) -> EngineConfig:
    """An engine for batches: admission in arrival order (``sort_pending=False``) unless told otherwise.

    Length-sorted admission interleaves the rows of every batch in flight, so those batches all finish
    together and the engine runs dry while Ray Data hands over the next ones. In arrival order
    batches finish one by one; the pipeline's batches already hold rows of similar length."""
    return EngineConfig.from_dict({"sort_pending": False, **fields})


class ActorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("tiny", description='"tiny", a local checkpoint directory or a Hugging Face hub id')
    dtype: str = Field("float32", description="weights and activations: float32, bfloat16, float16")
    device: str = Field("auto", description="auto: CUDA when the actor has a GPU, else the CPU; or a torch "
                        "device such as cpu, cuda, cuda:1")
    compile: bool = Field(False, description=COMPILE_DESCRIPTION)
    batch_invariant: bool = Field(False, description=BATCH_INVARIANT_DESCRIPTION)
    engine: EngineConfig = Field(default_factory=offline_engine_config,
                                 description="EngineConfig fields; sort_pending defaults to False here")
    sampling: SamplingParams = Field(default_factory=SamplingParams,
                                     description="default SamplingParams; a row's sampling_params override them")
    chat_template: bool = Field(False, description="wrap a raw-text prompt as one user message "
                                "(a messages column always gets the template)")
    should_continue_on_error: bool = Field(True, description="a bad row gets `__inference_error__`; "
                                           "False: it fails its batch")
    prompt_column: str = Field("prompt", description="the column of raw text or token ids")
    messages_column: str = Field("messages", description="the column of chats")
    torch_threads: int | None = Field(None, ge=1, description="CPU actors: intra-op threads (None: torch's)")
    stall_timeout_s: float = Field(600.0, gt=0, description="an engine without a completed step for this "
                                   "long ends the actor's process (Ray restarts it)")
    stats_actor: str | None = Field(None, description="name of the job's StatsRegistry to report to")
    max_batch_deaths: int = Field(2, ge=1, description="with stats_actor: a batch running in this many "
                                  "deaths of its actor's process is convicted (actors/ray_data/batch_deaths.py)")
    max_isolation_deaths: int = Field(8, ge=0, description="with stats_actor: the most deaths a convicted "
                                      "batch may cost while its rows are retried in halves, so that only rows "
                                      "that kill are flagged (about log2(rows) each); 0: flag the whole batch")

    @property
    def isolates_rows(self) -> bool:
        """A convicted batch's rows are retried in smaller groups (a failed row fails the batch anyway
        when ``should_continue_on_error`` is False)."""
        return self.max_isolation_deaths > 0 and self.should_continue_on_error

    @field_validator("device", mode="before")
    @classmethod
    def _torch_device(cls, value: object) -> object:
        if value is None or value == "auto":
            return "auto"
        try:
            torch.device(value)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"not 'auto' nor a torch device: {error}") from None
        return value

    @field_validator("engine", mode="before")
    @classmethod
    def _offline_defaults(cls, value: object) -> object:
        refuse_model_options_in_engine(value)
        return {"sort_pending": False, **value} if isinstance(value, dict) else value

    @field_validator("batch_invariant")
    @classmethod
    def _model_options_valid(cls, value: bool, info: ValidationInfo) -> bool:
        ModelOptions(compile=info.data.get("compile", False), batch_invariant=value)  # raises naming the option
        return value

    @field_validator("sampling")
    @classmethod
    def _sampling_valid(cls, value: SamplingParams) -> SamplingParams:
        problem = value.validation_error()  # the engine reports these per request; a config must be right
        if problem:
            raise ValueError(problem)
        return value


def retries_problem(config: ActorConfig, max_restarts: int, max_task_retries: int) -> str | None:
    """Which of Ray's two limits (-1: none) would fail the job before the death ledger settles a batch
    that kills its actor every time, in words that name it; None when both outlast it."""
    needed = config.max_batch_deaths + (config.max_isolation_deaths if config.isolates_rows else 0)
    for name, value in (("max_restarts", max_restarts), ("max_task_retries", max_task_retries)):
        if value != -1 and value < needed:
            return (f"{name}: {value} is fewer than the {needed} deaths one batch that kills its actor may "
                    f"cost (max_batch_deaths {config.max_batch_deaths} + max_isolation_deaths "
                    f"{config.max_isolation_deaths}); set at least {needed}, or -1")
    return None
