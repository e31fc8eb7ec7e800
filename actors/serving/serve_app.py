"""Ray Serve deployment: an OpenAI-compatible HTTP server over one BlockServe engine per replica.

    python -m actors.serving configs/serve-tiny.yaml   # import_path: actors.serving.serve_app:build_app

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``
(503 when the engine loop died or is stuck; ``check_health`` makes Serve replace such a replica) and
``GET /metrics`` (THIS replica's samples of Ray's metrics export; a deployment's metrics, every
replica tagged, are Ray's export itself: see ``serve_metrics``). Ray's part is this file only: the loop, the
protocol and the handlers are plain Python (``actors.engine_loop``, ``actors.serving.openai``).
"""
# No ``from __future__ import annotations`` here: Serve's ingress rebuilds the route methods, and FastAPI
# must see real classes (not strings) in their signatures to read the JSON body.
import asyncio
import logging
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from ray import serve
from ray.exceptions import TaskCancelledError
from ray.serve import Application
from ray.serve.exceptions import RequestCancelledError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from actors.engine_loop import EngineLoop
from actors.model_options import BATCH_INVARIANT_DESCRIPTION, COMPILE_DESCRIPTION, refuse_model_options_in_engine
from actors.serving.api_keys import authorize, check_exposure, resolve_api_key, serve_http_host
from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError, validation_error
from actors.serving.openai.server import OpenAIServer, dump
from actors.serving.serve_metrics import ServeMetrics
from engine import BlockServeEngine, EngineConfig
from engine.models.loader import check_checkpoint
from engine.models.options import ModelOptions

DEPLOYMENT_NAME = "BlockServeOpenAI"
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
# how a client that leaves mid-response surfaces: Serve cancels the replica's wait for its next message
CLIENT_GONE = (TaskCancelledError, RequestCancelledError, ClientDisconnect)
logger = logging.getLogger("ray.serve")


class ServeAppConfig(BaseModel):
    """The ``args`` of the Serve application; unknown keys are an error that names the key."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "tiny"  # "tiny", a checkpoint directory, or a Hugging Face hub id
    served_model_name: str | None = None  # None: "blockserve-tiny" for "tiny", else `model` itself
    device: str = "cpu"
    dtype: str = "float32"
    compile: bool = Field(False, description=COMPILE_DESCRIPTION)
    batch_invariant: bool = Field(False, description=BATCH_INVARIANT_DESCRIPTION)
    engine: dict[str, Any] = Field(default_factory=dict)  # EngineConfig fields
    max_pending: int = Field(64, ge=1)  # waiting requests per replica before 429
    max_tokens_limit: int | None = Field(None, ge=1)  # None: the longest canvas the model fits
    default_max_tokens: int = Field(128, ge=1)
    retry_after_s: int = Field(1, ge=1)
    stall_timeout_s: float = Field(120.0, gt=0)  # an engine step longer than this is a stuck loop
    torch_threads: int | None = Field(None, ge=1)
    api_key: str | None = None  # prefer api_key_env: a key in a config file ends up in version control
    api_key_env: str | None = "BLOCKSERVE_API_KEY"  # environment variable holding the key
    allow_unauthenticated: bool = False  # serve a non-loopback address with no key (explicit opt-out)

    @field_validator("engine")
    @classmethod
    def _engine_config_is_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        refuse_model_options_in_engine(value)
        EngineConfig.from_dict(value)  # raises ValueError naming the bad key or value
        return value

    @model_validator(mode="before")
    @classmethod
    def _static_batcher_is_an_engine_schedule(cls, values: Any) -> Any:
        moved = sorted({"batching", "static_batch_timeout_s"} & set(values if isinstance(values, dict) else ()))
        if moved:
            raise ValueError(f"{moved} are gone: the static batcher is engine.schedule: 'static' with "
                             "engine.static_batch_timeout_s")
        return values

    @field_validator("batch_invariant")
    @classmethod
    def _model_options_valid(cls, value: bool, info: ValidationInfo) -> bool:
        ModelOptions(compile=info.data.get("compile", False), batch_invariant=value)  # raises naming the option
        return value

    @property
    def name(self) -> str:
        return self.served_model_name or ("blockserve-tiny" if self.model == "tiny" else self.model)

    def engine_config(self) -> EngineConfig:
        return EngineConfig.from_dict(self.engine)


api = FastAPI(title="BlockServe", description="OpenAI-compatible serving of diffusion LLMs")


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


@api.exception_handler(RequestValidationError)
async def _invalid_body(request: Request, error: RequestValidationError) -> JSONResponse:
    return error_response(validation_error(list(error.errors())))  # 400, not FastAPI's 422


@api.exception_handler(OpenAIError)
async def _openai_error(request: Request, error: OpenAIError) -> JSONResponse:
    return error_response(error)


@api.exception_handler(Exception)
async def _server_bug(request: Request, error: Exception) -> JSONResponse:
    if isinstance(error, CLIENT_GONE):  # normal: the stream's own cleanup has aborted its request
        logger.info("client left before the response of %s %s ended", request.method, request.url.path)
        return error_response(OpenAIError("client disconnected", status=499, code="client_disconnected"))
    logger.exception("unhandled error in %s %s", request.method, request.url.path)
    return error_response(OpenAIError(f"internal server error: {type(error).__name__}", status=500,
                                      type="server_error", code="internal_error"))


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    return error_response(OpenAIError(str(error.detail), status=error.status_code,
                                      code=f"http_{error.status_code}"))


def _http(result: Any) -> Response:
    if isinstance(result, BaseModel):
        return JSONResponse(dump(result))
    return StreamingResponse(result, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@serve.deployment(name=DEPLOYMENT_NAME, max_ongoing_requests=1024, ray_actor_options={"num_cpus": 1},
                  health_check_period_s=10, health_check_timeout_s=30)
@serve.ingress(api)
class BlockServeOpenAI:
    """One replica: one engine, its loop thread, its metrics. Admission control is ours (429), so
    ``max_ongoing_requests`` is high: Serve's own queue would hide requests from the block scheduler."""

    def __init__(self, config: dict[str, Any]):
        self.config = ServeAppConfig.model_validate(config)
        self.api_key = resolve_api_key(self.config.api_key, self.config.api_key_env)
        check_exposure(serve_http_host(), self.api_key, self.config.allow_unauthenticated)
        if self.config.torch_threads:
            torch.set_num_threads(self.config.torch_threads)
        engine = BlockServeEngine.from_pretrained(self.config.model, self.config.engine_config(),
                                                  device=self.config.device, dtype=self.config.dtype,
                                                  compile=self.config.compile,
                                                  batch_invariant=self.config.batch_invariant)
        self.metrics = ServeMetrics(self.config.name)
        self.loop = EngineLoop(engine, max_pending=self.config.max_pending,
                               stall_timeout_s=self.config.stall_timeout_s,
                               on_step=self.metrics.record_step).start()
        self.metrics.watch(self.loop)  # live queue / health gauges between engine steps
        self.server = OpenAIServer(
            self.loop, model_name=self.config.name, metrics=self.metrics,
            max_tokens_limit=self.config.max_tokens_limit, default_max_tokens=self.config.default_max_tokens,
            retry_after_s=self.config.retry_after_s)

    @api.get("/v1/models")
    async def models(self, request: Request) -> JSONResponse:
        authorize(request.headers.get("authorization"), self.api_key)
        return JSONResponse(self.server.models().model_dump())

    @api.post("/v1/completions")
    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        authorize(request.headers.get("authorization"), self.api_key)
        return _http(await self.server.completions(body))

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatCompletionRequest, request: Request) -> Response:
        authorize(request.headers.get("authorization"), self.api_key)
        return _http(await self.server.chat(body))

    @api.get("/health")
    async def health(self) -> JSONResponse:
        problem = self.loop.health_problem()
        status = {"status": "ok" if problem is None else "unhealthy", "reason": problem,
                  "waiting": self.loop.num_waiting, "running": self.loop.num_running}
        return JSONResponse(status, status_code=200 if problem is None else 503)

    @api.get("/metrics")
    async def replica_metrics(self) -> Response:
        """This replica's samples of Ray's metrics export (load-balanced: a random replica); scrape
        Ray's export itself to monitor a deployment."""
        headers = {"X-BlockServe-Replica": self.metrics.identity["replica"]}
        try:
            text = await asyncio.to_thread(self.metrics.exported_text)
        except OSError as error:  # the node's metrics agent is not up (yet) or not reachable
            return Response(f"Ray's metrics export is not reachable from this replica: {error}\n",
                            status_code=503, media_type="text/plain", headers=headers)
        return Response(text, media_type=PROMETHEUS_TEXT, headers=headers)

    def check_health(self) -> None:
        """Serve's probe: raising marks the replica unhealthy, and the controller replaces it."""
        problem = self.loop.health_problem()
        if problem is not None:
            raise RuntimeError(problem)

    def __del__(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()


def replica_resources(config: ServeAppConfig) -> dict[str, float]:
    """What one replica reserves: a GPU per rank of its engine (tensor_parallel_size), or on the CPU a core per rank."""
    ranks = config.engine_config().tensor_parallel_size
    return {"num_gpus": ranks, "num_cpus": 1} if config.device.startswith("cuda") else {"num_cpus": ranks}


def build_deployment_app(config: ServeAppConfig, **deployment_options: Any) -> Application:
    """The application, with Serve deployment options (e.g. ``ray_actor_options``) set in code. A replica
    reserves :func:`replica_resources` unless ``ray_actor_options`` says otherwise."""
    deployment_options.setdefault("ray_actor_options", replica_resources(config))
    deployment = BlockServeOpenAI.options(**deployment_options)
    return deployment.bind(config.model_dump())


def config_problems(error: ValidationError) -> str:
    """A pydantic error as one line per problem, each naming its key (``engine.block_length: ...``)."""
    problems = []
    for problem in error.errors():
        key = ".".join(str(part) for part in problem["loc"])
        message = ("unknown key" if problem["type"] == "extra_forbidden"
                   else problem["msg"].removeprefix("Value error, "))
        problems.append(f"{key}: {message}" if key else message)
    return "\n".join(problems)


def check_app_args(args: dict[str, Any] | None) -> ServeAppConfig:
    """The application's ``args`` validated, and its model resolved, before anything is deployed.

    Raises ValueError naming each bad key, or with the loader's message for a model that does not resolve."""
    try:
        config = ServeAppConfig.model_validate(args or {})
    except ValidationError as error:
        raise ValueError(config_problems(error)) from None
    try:
        check_checkpoint(config.model)  # a hub id fetches its config and tokenizer, no weights
    except ValueError as error:
        raise ValueError(f"model: {error}") from None
    return config


def build_app(args: dict[str, Any]) -> Application:
    """Application builder for ``serve run`` / ``serve deploy``: ``args`` is a :class:`ServeAppConfig`,
    checked by :func:`check_app_args`, so a bad key or model fails the build instead of every replica.

    Deployment options (replicas, ``ray_actor_options``, autoscaling) go in the config file's
    ``deployments:`` section under the name ``BlockServeOpenAI``."""
    return build_deployment_app(check_app_args(args))
