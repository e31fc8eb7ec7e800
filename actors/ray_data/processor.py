"""``build_processor`` for BlockServe: our engine as a stage of Ray's LLM batch processors.

    from ray.data.llm import build_processor
    from actors import BlockServeProcessorConfig  # loads actors.ray_data.processor, which registers it

    processor = build_processor(
        BlockServeProcessorConfig(model_source="tiny", engine_kwargs={"max_batch_size": 16},
                                  concurrency=2, batch_size=32, accelerator_type=None),
        preprocess=lambda row: {"messages": [{"role": "user", "content": row["question"]}],
                                "sampling_params": {"max_tokens": 128}},
        postprocess=lambda row: {"answer": row["generated_text"], **row})
    answers = processor(ds)

Importing this module registers the config with Ray's processor builder (``ProcessorBuilder.register``,
a DeveloperAPI, so the Ray versions are pinned: :data:`TESTED_RAY_VERSIONS`). The processor is
Ray's own ``Processor``: its preprocess / postprocess wrapping, ``__inference_error__`` column and
``should_continue_on_error`` handling are Ray's. Its one stage is a :class:`BlockServeActor` per
worker. Ray's chat-template and tokenize stages are not used, on purpose: the actor tokenizes with
the engine's own code (``engine.models.prompts``), the same call ``engine.generate`` makes, so a processor's
answers equal the engine's by construction, while Ray's stages render the template to text and
tokenize that text again (a second BOS for templates that write ``{{ bos_token }}``, and one more copy
of every prompt through the object store).
"""
from __future__ import annotations

import dataclasses
import importlib
from collections.abc import AsyncIterator
from typing import Any

import ray
from pydantic import Field, field_validator, model_validator

TESTED_RAY_VERSIONS = ("2.60",)  # major.minor of Ray this hook is tested with


def check_ray_version(version: str = ray.__version__) -> None:
    if ".".join(version.split(".")[:2]) not in TESTED_RAY_VERSIONS:
        raise RuntimeError(
            f"BlockServeProcessorConfig plugs into ray.llm's processor builder, a DeveloperAPI that "
            f"changes between Ray releases; it is tested with Ray {', '.join(TESTED_RAY_VERSIONS)}.x, "
            f"this is Ray {version}. Install a tested Ray (pip install 'ray[data,serve]==2.60.*') or "
            "use BlockServeActor with ds.map_batches directly.")


check_ray_version()

from ray.llm._internal.batch.processor.base import OfflineProcessorConfig, Processor, ProcessorBuilder  # noqa: E402  (after the version check)
from ray.llm._internal.batch.stages.base import StatefulStage, StatefulStageUDF  # noqa: E402

from actors.ray_data.actor_config import ActorConfig, offline_engine_config, retries_problem  # noqa: E402
from actors.ray_data.batch_rows import INPUT_COLUMNS, input_rows  # noqa: E402
from actors.ray_data.cluster_fit import PROCESSOR_SETTINGS, ActorPool, actor_resources, check_fit  # noqa: E402
from engine import EngineConfig  # noqa: E402

DEFAULT_ACTOR_CLASS = "actors.ray_data.block_serve_actor.BlockServeActor"
TASK_CPUS = 1.0  # what a Ray Data task (a preprocess, a postprocess) reserves unless its map kwargs say otherwise


class BlockServeProcessorConfig(OfflineProcessorConfig):
    """Ray's offline processor config, plus the actor's settings and the resources of its pool.

    Inherited from Ray: ``model_source`` ("tiny", a checkpoint directory or a hub id: the actor's
    model), ``batch_size``, ``concurrency`` (actors; an int is a fixed pool), ``accelerator_type``,
    ``runtime_env``, ``max_concurrent_batches``, ``should_continue_on_error`` (the actor's too).
    ``engine_kwargs`` is the name ``vLLMEngineProcessorConfig`` gives the engine's settings: here they
    are EngineConfig fields, merged into ``actor.engine``."""

    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="EngineConfig fields, as "
                                          "vLLMEngineProcessorConfig's engine_kwargs; merged into actor.engine, "
                                          "and a field given both ways is an error")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="the actor's settings "
                               "(actors/ray_data/actor_config.py); its model is model_source")
    num_gpus_per_actor: float = Field(0.0, ge=0.0, description="0 on CPU clusters; on GPUs, one per rank: "
                                      "the engine's tensor_parallel_size")
    num_cpus_per_actor: float = Field(0.5, gt=0.0, description="CPUs per actor (a CPU engine's: per rank); "
                                      "half a CPU, so that two actors on two CPUs leave one for the other tasks")
    max_restarts: int = Field(16, ge=-1, description="times Ray restarts an actor whose process died, then "
                              "its batches fail the job; with actor.stats_actor, at least max_batch_deaths + "
                              "max_isolation_deaths; -1: no limit")
    max_task_retries: int = Field(-1, ge=-1, description="times Ray retries a batch whose actor died, "
                                  "including deaths it only waited through; -1: as often as the actor restarts")
    actor_options: dict[str, Any] = Field(
        default_factory=dict, description="arguments of an actor_class subclass beyond ActorConfig's")
    actor_class: str = Field(DEFAULT_ACTOR_CLASS, description="import path of the stage's actor: "
                             "BlockServeActor or a subclass (the tests' fault-injecting wrappers are some)")

    @property
    def actor_settings(self) -> ActorConfig:
        """``actor`` with Ray's ``model_source`` and ``should_continue_on_error`` filled in."""
        return self.actor.model_copy(update={"model": self.model_source,
                                             "should_continue_on_error": self.should_continue_on_error})

    @model_validator(mode="before")
    @classmethod
    def _engine_kwargs_into_actor(cls, values: Any) -> Any:
        if not isinstance(values, dict) or not values.get("engine_kwargs"):
            return values
        return {**values, "actor": with_engine_kwargs(values.get("actor", {}), dict(values["engine_kwargs"]))}

    @model_validator(mode="after")
    def _retries_outlast_the_ledger(self) -> BlockServeProcessorConfig:
        if self.actor.stats_actor is not None:
            problem = retries_problem(self.actor_settings, self.max_restarts, self.max_task_retries)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _one_gpu_per_rank(self) -> BlockServeProcessorConfig:
        ranks = self.actor.engine.tensor_parallel_size
        if self.num_gpus_per_actor and self.num_gpus_per_actor != ranks:
            raise ValueError(f"num_gpus_per_actor={self.num_gpus_per_actor:g} but engine tensor_parallel_size={ranks}: "
                             f"an actor's engine runs one rank per GPU, so set num_gpus_per_actor={ranks}")
        return self

    @property
    def actor_cpus(self) -> float:
        """CPUs an actor reserves: ``num_cpus_per_actor`` for each rank of a CPU engine, else as given."""
        return actor_resources(self.num_cpus_per_actor, self.num_gpus_per_actor,
                               self.actor.engine.tensor_parallel_size).cpus

    def actor_pool(self, other_task_cpus: float) -> ActorPool:
        """The actors this processor starts (the least of a ``concurrency`` range), beside tasks of
        ``other_task_cpus``."""
        num_actors = self.concurrency if isinstance(self.concurrency, int) else self.concurrency[0]
        return ActorPool(num_actors, self.num_cpus_per_actor, self.num_gpus_per_actor,
                         self.actor.engine.tensor_parallel_size, other_task_cpus, PROCESSOR_SETTINGS)

    @field_validator("actor_class")
    @classmethod
    def _importable(cls, path: str) -> str:
        actor_class(path)  # a typo fails here, on the driver, not in every actor
        return path


def with_engine_kwargs(actor: ActorConfig | dict[str, Any], engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The actor's settings as a dict, its engine's given fields joined by ``engine_kwargs``; a field
    given both ways raises ValueError naming it."""
    settings = ({name: getattr(actor, name) for name in actor.model_fields_set}
                if isinstance(actor, ActorConfig) else dict(actor))
    engine = given_engine_fields(settings.get("engine", {}))
    both = sorted(set(engine) & set(engine_kwargs))
    if both:
        raise ValueError(f"engine_kwargs and actor.engine both set {both}: give each EngineConfig field once")
    return {**settings, "engine": {**engine, **engine_kwargs}}


def given_engine_fields(engine: EngineConfig | dict[str, Any]) -> dict[str, Any]:
    """The fields of ``engine`` that were given: a dict's keys, or an EngineConfig's fields that differ
    from the offline defaults."""
    if isinstance(engine, dict):
        return dict(engine)
    defaults = offline_engine_config()
    return {field.name: getattr(engine, field.name) for field in dataclasses.fields(engine)
            if getattr(engine, field.name) != getattr(defaults, field.name)}


def actor_class(path: str) -> type:
    """The BlockServeActor (sub)class at ``module.Name``."""
    from actors.ray_data.block_serve_actor import BlockServeActor

    module, _, name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name, None) if module else None
    except ImportError as error:
        raise ValueError(f"actor_class {path!r} is not an importable BlockServeActor class: {error}") from error
    if not (isinstance(found, type) and issubclass(found, BlockServeActor)):
        raise ValueError(f"actor_class {path!r} is not an importable BlockServeActor class")
    return found


class BlockServeStageUDF(StatefulStageUDF):
    """Rows in Ray's processor format through one BlockServeActor: the same ``generate_rows`` that
    its ``map_batches`` door (``__call__``) calls."""

    def __init__(self, data_column: str, expected_input_keys: list[str], actor_class_path: str,
                 config: ActorConfig, **actor_options: Any):
        super().__init__(data_column, expected_input_keys)
        self.actor = actor_class(actor_class_path)(config=config, **actor_options)

    async def udf(self, batch: list[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        outputs = await self.actor.generate_rows(input_rows(batch))
        for row, output in zip(batch, outputs):
            yield {**output, self.IDX_IN_BATCH_COLUMN: row[self.IDX_IN_BATCH_COLUMN]}


class BlockServeStage(StatefulStage):
    fn: type[StatefulStageUDF] = BlockServeStageUDF

    def get_optional_input_keys(self) -> dict[str, str]:
        return dict(INPUT_COLUMNS)


def build_blockserve_processor(config: BlockServeProcessorConfig, preprocess=None, postprocess=None,
                               preprocess_map_kwargs: dict | None = None,
                               postprocess_map_kwargs: dict | None = None) -> Processor:
    stage = BlockServeStage(
        fn_constructor_kwargs=dict(actor_class_path=config.actor_class, config=config.actor_settings,
                                   **config.actor_options),
        map_batches_kwargs=dict(
            zero_copy_batch=True,
            compute=ray.data.ActorPoolStrategy(
                **config.get_concurrency(autoscaling_enabled=False),
                max_tasks_in_flight_per_actor=(config.max_tasks_in_flight_per_actor
                                               or config.max_concurrent_batches)),
            max_concurrency=config.max_concurrent_batches, accelerator_type=config.accelerator_type,
            num_gpus=config.num_gpus_per_actor or None, num_cpus=config.actor_cpus,
            runtime_env=config.runtime_env, max_restarts=config.max_restarts,
            max_task_retries=config.max_task_retries))
    return BlockServeProcessor(config, [stage], preprocess=preprocess, postprocess=postprocess,
                               preprocess_map_kwargs=preprocess_map_kwargs,
                               postprocess_map_kwargs=postprocess_map_kwargs)


class BlockServeProcessor(Processor):
    """Ray's processor, which first checks that the connected cluster holds its actors beside its
    preprocess and postprocess tasks (``actors/ray_data/cluster_fit.py``): a pool that cannot start
    raises here, naming the setting to change, instead of waiting forever."""

    def __call__(self, dataset: ray.data.Dataset) -> ray.data.Dataset:
        check_fit(self.config.actor_pool(self.other_task_cpus))
        return super().__call__(dataset)

    @property
    def other_task_cpus(self) -> float:
        """The CPUs of the larger of its preprocess and postprocess tasks; without them, of a read or
        write task of the dataset."""
        maps = [kwargs for function, kwargs in ((self.preprocess, self.preprocess_map_kwargs),
                                                (self.postprocess, self.postprocess_map_kwargs)) if function]
        return max((kwargs.get("num_cpus", TASK_CPUS) for kwargs in maps), default=TASK_CPUS)


if BlockServeProcessorConfig.__name__ not in ProcessorBuilder._registry:
    ProcessorBuilder.register(BlockServeProcessorConfig, build_blockserve_processor)
