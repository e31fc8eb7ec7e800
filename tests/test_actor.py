"""BlockServeActor, specified: a Ray Data UDF class anyone can drop into ``ds.map_batches``.

The engine-equality checks build their own BlockServeEngine on the same frozen copy of the tiny model
(float32, CPU) and compare within one test run, so a background re-export of the model cannot matter.
"""
from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pyarrow as pa
import pytest

from actors import BlockServeActor
from engine import SamplingParams
from tests.pipeline_helpers import demo_rows, freeze_tiny_model

ENGINE = {"block_length": 32, "max_batch_size": 8}
SAMPLING = {"max_new_tokens": 32}


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny"))


@pytest.fixture(scope="module")
def engine(tiny_model):
    from engine import BlockServeEngine, EngineConfig

    return BlockServeEngine.from_pretrained(tiny_model, EngineConfig(**ENGINE), dtype="float32")


@pytest.fixture(scope="module")
def actor(tiny_model):
    return BlockServeActor(model=tiny_model, engine=ENGINE, sampling=SAMPLING, chat_template=True,
                           torch_threads=1)


def expected_outputs(engine, prompts: list, caps: list[int]) -> list:
    return engine.generate([chat(p) if isinstance(p, str) else p for p in prompts],
                           [SamplingParams(max_new_tokens=cap) for cap in caps])


def test_concurrent_batches_share_one_engine_and_each_returns_whole_in_input_order(actor, engine):
    rows = demo_rows(12, start=100)
    batches = [pa.table({"id": [r["id"] for r in rows[i:i + 4]],
                         "prompt": [r["prompt"] for r in rows[i:i + 4]]}) for i in range(0, 12, 4)]
    rows_per_step = []
    execute = actor.engine.runner.execute

    def recording_execute(scheduled):
        rows_per_step.append(scheduled.num_rows)
        return execute(scheduled)

    actor.engine.runner.execute = recording_execute

    async def run_all():
        return await asyncio.gather(*(actor(batch) for batch in batches))

    try:
        outputs = asyncio.run(run_all())
    finally:
        actor.engine.runner.execute = execute
    expected = expected_outputs(engine, [r["prompt"] for r in rows], [32] * 12)
    for batch, output in zip(batches, outputs):
        assert output.column("id").to_pylist() == batch.column("id").to_pylist()
        assert output.column_names[:2] == ["id", "prompt"]
    texts = [text for output in outputs for text in output.column("generated_text").to_pylist()]
    assert texts == [e.text for e in expected]
    # rows of different batches were decoded side by side (a batch holds 4 rows, the engine up to 8);
    # one batch at a time, with a drain-and-refill at each boundary, no step could exceed 4 rows. How many
    # more than 4 depends on when the engine's thread takes its first step, so only the bound is asserted
    assert 4 < max(rows_per_step) <= 8


def test_bad_rows_get_an_error_and_the_rest_of_the_batch_is_unaffected(actor, engine):
    good = demo_rows(1, start=7)[0]["prompt"]
    batch = {  # Ray's default numpy format, where a column may hold anything
        "prompt": np.array([good, "", None, 12345, "x" * 3000, good, chat(good), good], dtype=object),
        "sampling_params": np.array([None, None, None, None, None, {"max_tokens": 0}, None,
                                     {"presence_penalty": 0.5}], dtype=object),
    }
    output = asyncio.run(actor(batch))
    reasons = output["finish_reason"].to_pylist()
    errors = output["__inference_error__"].to_pylist()
    assert reasons[1:6] == ["error"] * 5 and reasons[7] == "error"
    assert "empty" in errors[1]
    assert "missing prompt" in errors[2]
    assert "prompt must be" in errors[3]
    assert "exceeds the model's maximum length" in errors[4]
    assert "max_new_tokens must be positive" in errors[5]
    assert "unsupported key(s) ['presence_penalty']" in errors[7]
    assert errors[0] == "" and errors[6] == ""
    alone = expected_outputs(engine, [good], [32])[0]
    assert output["generated_text"].to_pylist()[0] == alone.text
    assert output["generated_text"].to_pylist()[6] == alone.text  # chat messages work as they are


def test_per_row_sampling_params_take_vllm_names_and_override_the_defaults(actor):
    prompt = demo_rows(1, start=3)[0]["prompt"]
    batch = pa.table({"prompt": [prompt, prompt, prompt],  # Arrow fills a row's missing keys with null
                      "sampling_params": [{"max_tokens": 64, "ignore_eos": True}, {"seed": 5},
                                          {"max_new_tokens": 32, "temperature": 0.0}]})
    output = asyncio.run(actor(batch))
    assert output.column("__inference_error__").to_pylist() == ["", "", ""]
    # ignore_eos decodes every block up to the cap, keeps all 64 tokens (EOS included; the text skips
    # special tokens) and finishes with "length"
    assert output.column("num_blocks").to_pylist() == [2, 1, 1]  # SAMPLING's default cap is one block
    assert output.column("num_generated_tokens").to_pylist()[0] == 64
    assert output.column("finish_reason").to_pylist()[0] == "length"


def test_a_prompt_is_raw_text_and_messages_get_the_chat_template(tiny_model, engine):
    """As in Ray's processors and engine.generate: chat wrapping is never implicit for ``prompt``."""
    raw = BlockServeActor(model=tiny_model, engine=ENGINE, sampling=SAMPLING, torch_threads=1)
    text = demo_rows(1, start=5)[0]["prompt"]
    output = asyncio.run(raw({"prompt": np.array([text, None], dtype=object),
                              "messages": np.array([None, chat(text)], dtype=object)}))
    alone = engine.generate([text, chat(text)], [SamplingParams(max_new_tokens=32)] * 2)
    assert output["generated_text"].to_pylist() == [alone[0].text, alone[1].text]
    assert output["num_input_tokens"].to_pylist() == [len(o.prompt_token_ids) for o in alone]
    assert alone[0].prompt_token_ids != alone[1].prompt_token_ids


def test_with_should_continue_on_error_false_a_bad_row_fails_the_batch(tiny_model):
    from actors.ray_data.block_serve_actor import RowError

    strict = BlockServeActor(model=tiny_model, engine=ENGINE, sampling=SAMPLING, torch_threads=1,
                             should_continue_on_error=False)
    with pytest.raises(RowError, match="row 1 of the batch failed: prompt is empty"):
        asyncio.run(strict({"prompt": np.array(["count from 1 to 3", ""], dtype=object)}))


# --------------------------------------------------------------------------------------------------
# In a user's own Ray Data pipeline: 2 actors on the session cluster's 2 fake GPUs
# --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def users_pipeline(ray_cluster, tiny_model, engine):
    import ray

    from actors.ray_data.stats_registry import start_stats_registry

    rows = [{"key": r["id"], "question": r["prompt"], "sampling_params": {"max_tokens": 32 + 32 * (i % 2)}}
            for i, r in enumerate(demo_rows(16, start=40))]
    registry_name = f"stats-{uuid.uuid4().hex[:8]}"
    registry = start_stats_registry(registry_name)
    ds = ray.data.from_items(rows)
    ds = ds.map_batches(
        BlockServeActor, batch_size=4, num_gpus=1, num_cpus=0.25,
        compute=ray.data.ActorPoolStrategy(size=2, max_concurrent_calls_per_actor=2,
                                           max_tasks_in_flight_per_actor=2),
        fn_constructor_kwargs={"model": tiny_model, "engine": ENGINE, "sampling": SAMPLING,
                               "prompt_column": "question", "chat_template": True, "torch_threads": 1,
                               "stats_actor": registry_name})
    ds.context.execution_options.preserve_order = True
    ds.context.wait_for_min_actors_s = 300
    outputs = ds.take_all()
    snapshots = ray.get(registry.collect.remote())
    ray.kill(registry)
    expected = expected_outputs(engine, [r["question"] for r in rows],
                                [r["sampling_params"]["max_tokens"] for r in rows])
    return rows, outputs, snapshots, expected


def test_actor_in_a_users_pipeline_equals_engine_generate_on_the_same_prompts(users_pipeline):
    rows, outputs, _, expected = users_pipeline
    assert [o["key"] for o in outputs] == [r["key"] for r in rows]  # preserve_order: input order
    assert [o["generated_text"] for o in outputs] == [e.text for e in expected]
    assert [o["num_generated_tokens"] for o in outputs] == [len(e.token_ids) for e in expected]
    assert [o["finish_reason"] for o in outputs] == [e.finish_reason for e in expected]
    assert [o["num_blocks"] for o in outputs] == [e.num_blocks for e in expected]
    assert all(o["__inference_error__"] == "" and o["time_taken_llm"] >= o["queue_s"] >= 0 for o in outputs)
    assert set(outputs[0]) >= {"key", "question", "sampling_params", "actor_id", "node_id", "device"}


def test_one_actor_per_fake_gpu_each_reporting_stats_that_add_up(users_pipeline):
    from pipeline.stats import aggregate

    _, outputs, snapshots, _ = users_pipeline
    actor_ids = {o["actor_id"] for o in outputs}
    assert len(actor_ids) == 2 and {s["actor_id"] for s in snapshots} == actor_ids
    assert {o["device"] for o in outputs} == {"cpu"}  # fake GPUs: scheduled per GPU, run on CPU
    stats = aggregate(snapshots, wall_s=1.0, bin_tokens=32)
    assert stats["totals"]["rows"] == len(outputs)
    assert stats["totals"]["generated_tokens"] == sum(o["num_generated_tokens"] for o in outputs)
    for actor in stats["per_actor"]:
        assert actor["rows"] == sum(o["actor_id"] == actor["actor_id"] for o in outputs)
        assert actor["busy_s"] > 0 and actor["memory_peak_bytes"] > 0
        assert 0 < actor["useful_row_fraction"] <= 1 and actor["gpu_utilization"] is None


# --------------------------------------------------------------------------------------------------
# A step that raises (as a CUDA error does): in Ray, the actor's process ends and Ray retries
# --------------------------------------------------------------------------------------------------

CUDA_ERROR = "CUDA error: an illegal memory access was encountered (injected by the test)"


def raise_cuda_error(scheduled):
    raise RuntimeError(CUDA_ERROR)


class StepRaisesAtSecondBatch(BlockServeActor):
    """Test wrapper, not a production feature: in the actor's first incarnation, every engine step
    from its second batch on raises; a restarted incarnation runs as it is. Batches go one at a time
    (``max_tasks_in_flight_per_actor=1``), so the first one has been returned when the second starts."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._calls = 0

    async def __call__(self, batch):
        self._calls += 1
        if self._calls == 2 and not self.restarted:
            self.engine.runner.execute = raise_cuda_error  # the engine is idle between the batches
        return await super().__call__(batch)


def test_the_loop_reports_its_death_before_its_requests_fail(engine):
    from actors.engine_loop import EngineDeadError, EngineLoop
    from engine import BlockServeEngine, EngineConfig

    doomed = BlockServeEngine(engine.lm, EngineConfig(**ENGINE))  # its own: a dead engine is not reused
    doomed.runner.execute = raise_cuda_error
    deaths = []
    loop = EngineLoop(doomed, on_death=lambda error: deaths.append((error, result.done()))).start()
    try:
        result = loop.submit(chat("count from 1 to 3"), SamplingParams(max_new_tokens=32), stream=False).result
        with pytest.raises(EngineDeadError, match="illegal memory access"):
            result.result(120)
    finally:
        loop.stop()
    assert [(str(error), done) for error, done in deaths] == [(CUDA_ERROR, False)]


def test_outside_ray_a_step_that_raises_fails_the_batch_and_the_process_lives(tiny_model):
    from actors.engine_loop import EngineDeadError

    local = BlockServeActor(model=tiny_model, engine=ENGINE, sampling=SAMPLING, torch_threads=1)
    local.engine.runner.execute = raise_cuda_error
    with pytest.raises(EngineDeadError, match="illegal memory access"):
        asyncio.run(local({"prompt": np.array(["count from 1 to 3"], dtype=object)}))


def test_a_step_that_raises_in_a_ray_data_actor_restarts_it_and_every_row_is_written_once(
        ray_cluster, tiny_model, engine):
    import ray

    from actors.ray_data.stats_registry import start_stats_registry
    from pipeline.stats import aggregate

    rows = [{"key": r["id"], "question": r["prompt"]} for r in demo_rows(12, start=60)]
    registry_name = f"stats-{uuid.uuid4().hex[:8]}"
    registry = start_stats_registry(registry_name)
    ds = ray.data.from_items(rows).map_batches(
        StepRaisesAtSecondBatch, batch_size=4, num_cpus=0.25,
        compute=ray.data.ActorPoolStrategy(size=1, max_concurrent_calls_per_actor=1,
                                           max_tasks_in_flight_per_actor=1),
        fn_constructor_kwargs={"model": tiny_model, "engine": ENGINE, "sampling": SAMPLING,
                               "prompt_column": "question", "chat_template": True, "torch_threads": 1,
                               "stats_actor": registry_name})
    ds.context.wait_for_min_actors_s = 300
    outputs = ds.take_all()
    snapshots = ray.get(registry.collect.remote())
    ray.kill(registry)

    assert sorted(o["key"] for o in outputs) == sorted(r["key"] for r in rows)  # each once: a complete job
    alone = expected_outputs(engine, [r["question"] for r in rows], [32] * len(rows))
    expected = {row["key"]: output.text for row, output in zip(rows, alone)}
    assert all(o["__inference_error__"] == "" and o["generated_text"] == expected[o["key"]] for o in outputs)
    stats = aggregate(snapshots, wall_s=1.0, bin_tokens=32)
    assert stats["totals"]["restarts"] == 1 and stats["per_actor"][0]["incarnations"] == 2
    first, restarted = sorted(snapshots, key=lambda s: s["restarted"])
    assert (first["restarted"], first["rows"], restarted["restarted"], restarted["rows"]) == (False, 4, True, 8)
