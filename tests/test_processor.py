"""``build_processor(BlockServeProcessorConfig(...))``, specified: Ray's processor API over our engine."""
from __future__ import annotations

import pytest

from tests.pipeline_helpers import demo_rows, freeze_tiny_model

ENGINE = {"block_length": 32, "max_batch_size": 8}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny"))


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_processor_rows_carry_rays_columns_and_equal_engine_generate(ray_cluster, tiny_model):
    """One processor run (actors are slow to start): six good rows, and a bad one that gets its
    ``__inference_error__`` while the rest are served (should_continue_on_error=True; False fails the
    batch, see test_actor.py)."""
    import ray
    from ray.data.llm import build_processor

    from actors.ray_data.processor import BlockServeProcessorConfig
    from engine import BlockServeEngine, EngineConfig, SamplingParams

    questions = [row["prompt"] for row in demo_rows(6, start=40)]

    def preprocess(row):
        if row["id"] == 6:  # a sampling key we cannot honour: that row's error, never ignored
            return {"messages": chat(questions[0]), "sampling_params": {"presence_penalty": 0.5}}
        return {"messages": chat(row["question"]), "question": row["question"],
                "sampling_params": {"max_tokens": 32 if row["id"] % 2 else 64}}

    config = BlockServeProcessorConfig(model_source=tiny_model, engine_kwargs=ENGINE, actor={"torch_threads": 1},
                                       concurrency=1, batch_size=4, num_cpus_per_actor=0.5,
                                       should_continue_on_error=True)
    processor = build_processor(
        config, preprocess=preprocess,
        postprocess=lambda row: {"id": row["id"], "answer": row["generated_text"], **row},
        preprocess_map_kwargs={"num_cpus": 0.25}, postprocess_map_kwargs={"num_cpus": 0.25})
    ds = ray.data.from_items([{"id": i, "question": q} for i, q in enumerate(questions)] + [{"id": 6,
                                                                                           "question": ""}])
    rows = processor(ds).take_all()
    failed = [row for row in rows if row["__inference_error__"]]
    assert len(failed) == 1 and "unsupported key(s) ['presence_penalty']" in failed[0]["__inference_error__"]
    rows = sorted((row for row in rows if not row["__inference_error__"]), key=lambda row: row["id"])

    engine = BlockServeEngine.from_pretrained(tiny_model, EngineConfig(**ENGINE), dtype="float32")
    expected = engine.generate([chat(q) for q in questions],
                               [SamplingParams(max_new_tokens=32 if i % 2 else 64) for i in range(6)])
    assert [r["answer"] for r in rows] == [o.text for o in expected]
    for row, output in zip(rows, expected):
        assert list(row["generated_tokens"]) == output.token_ids
        assert row["num_generated_tokens"] == len(output.token_ids)
        assert row["num_input_tokens"] == len(output.prompt_token_ids)
        assert row["time_taken_llm"] >= row["queue_s"] >= 0
        assert row["finish_reason"] in ("eos", "length") and row["num_blocks"] >= 1


def test_an_untested_ray_version_is_refused_with_the_reason():
    from actors.ray_data.processor import check_ray_version

    check_ray_version("2.60.0")
    with pytest.raises(RuntimeError, match="tested with Ray 2.60"):
        check_ray_version("2.61.1")


def test_the_stage_runs_blockserve_actor_or_a_subclass_named_by_import_path():
    from pydantic import ValidationError

    from actors.ray_data.processor import BlockServeProcessorConfig, actor_class
    from tests.fault_injection import FailAfterRows

    assert actor_class("tests.fault_injection.FailAfterRows") is FailAfterRows
    config = BlockServeProcessorConfig(model_source="tiny", actor_class="tests.fault_injection.FailAfterRows")
    assert config.actor_class == "tests.fault_injection.FailAfterRows"
    for wrong in ("pipeline.run.main", "actors.ray_data.block_serve_actor.NoSuchActor", "no_such_module.Actor",
                  "BlockServeActor"):
        with pytest.raises(ValidationError, match="is not an importable BlockServeActor class"):
            BlockServeProcessorConfig(model_source="tiny", actor_class=wrong)


def test_engine_kwargs_give_the_stage_the_same_actor_as_actor_engine():
    from actors.ray_data.actor_config import ActorConfig
    from actors.ray_data.processor import BlockServeProcessorConfig

    by_ray_name = BlockServeProcessorConfig(model_source="tiny", engine_kwargs={"max_batch_size": 8},
                                            actor={"torch_threads": 1}, concurrency=1, batch_size=4)
    by_ours = BlockServeProcessorConfig(model_source="tiny", actor={"engine": {"max_batch_size": 8},
                                                                    "torch_threads": 1}, concurrency=1, batch_size=4)
    assert by_ray_name.actor_settings == by_ours.actor_settings
    assert by_ray_name.actor_settings.engine.max_batch_size == 8
    as_object = BlockServeProcessorConfig(model_source="tiny", engine_kwargs={"max_batch_size": 8},
                                          actor=ActorConfig(engine={"threshold": 0.8}))
    assert (as_object.actor.engine.max_batch_size, as_object.actor.engine.threshold) == (8, 0.8)


def test_an_engine_field_given_both_ways_or_unknown_is_refused_by_name():
    from pydantic import ValidationError

    from actors.ray_data.processor import BlockServeProcessorConfig

    with pytest.raises(ValidationError, match=r"engine_kwargs and actor.engine both set \['max_batch_size'\]"):
        BlockServeProcessorConfig(model_source="tiny", engine_kwargs={"max_batch_size": 8},
                                  actor={"engine": {"max_batch_size": 4}})
    with pytest.raises(ValidationError, match=r"engine.max_num_seqs\s+Extra inputs are not permitted"):
        BlockServeProcessorConfig(model_source="tiny", engine_kwargs={"max_num_seqs": 8})
