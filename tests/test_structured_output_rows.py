"""Structured output through the Ray Data doors: a row's ``sampling_params["structured_outputs"]`` read back from
Arrow (struct columns with nulls for keys other rows set), a bad constraint that row's ``__inference_error__``, the
job's default for every row, and ``build_processor`` on a real Ray cluster.
"""
from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import numpy as np
import pyarrow as pa
import pytest

from actors import BlockServeActor
from actors.ray_data.actor_config import ActorConfig
from tests.model_helpers import LLADA_DIR

ENGINE = {"block_length": 8, "max_batch_size": 8}
SAMPLING = {"max_new_tokens": 24}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}
COLOR = {"type": "object", "properties": {"color": {"enum": ["red", "blue"]}, "n": {"type": "integer", "minimum": 0,
                                                                                   "maximum": 9}},
         "required": ["color", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def actor():
    return BlockServeActor(model=str(LLADA_DIR), engine=ENGINE, sampling=SAMPLING, torch_threads=1)


def test_arrow_rows_with_different_constraints_each_get_theirs(actor):
    rows = [{"prompt": "flag", "sampling_params": {"structured_outputs": {"json": FLAG}}},
            {"prompt": "color", "sampling_params": {"structured_outputs": {"json": COLOR}, "max_tokens": 32}},
            {"prompt": "code", "sampling_params": {"structured_outputs": {"regex": "[a-c]{3}"}}},
            {"prompt": "pick", "sampling_params": {"structured_outputs": {"choice": ["yes", "no", "maybe"]}}},
            {"prompt": "free", "sampling_params": {"temperature": 0.0}},
            {"prompt": "bad", "sampling_params": {"structured_outputs": {"regex": "a[b"}}}]
    batch = pa.Table.from_pylist(rows)  # one struct column: every row holds every key, null where it set none
    first = batch.column("sampling_params").to_pylist()[0]["structured_outputs"]
    assert first["regex"] is None and first["json"]["properties"]["color"] is None
    output = asyncio.run(actor(batch))
    texts, errors = output.column("generated_text").to_pylist(), output.column("__inference_error__").to_pylist()
    reasons = output.column("finish_reason").to_pylist()
    assert errors[:5] == [""] * 5 and reasons[:4] == ["eos"] * 4
    jsonschema.validate(json.loads(texts[0]), FLAG)
    jsonschema.validate(json.loads(texts[1]), COLOR)
    assert re.fullmatch("[a-c]{3}", texts[2]) and texts[3] in ("yes", "no", "maybe")
    assert reasons[5] == "error" and errors[5].startswith("structured_outputs.regex does not compile")


def test_numpy_rows_give_their_choices_as_arrays_and_get_them_back_as_lists(actor):
    choices = np.array(["yes", "no"], dtype=object)  # Ray's numpy batches hold a row's lists as arrays
    batch = {"prompt": np.array(["pick"], dtype=object),
             "sampling_params": np.array([{"structured_outputs": {"choice": choices, "regex": None}}], dtype=object)}
    output = asyncio.run(actor(batch))
    assert output["generated_text"].to_pylist()[0] in ("yes", "no")
    assert json.loads(output["sampling_params"].to_pylist()[0]) == {"structured_outputs": {"choice": ["yes", "no"]}}


def test_the_jobs_sampling_section_constrains_every_row():
    config = ActorConfig(model=str(LLADA_DIR), engine=ENGINE, sampling={"max_new_tokens": 16,
                                                                        "structured_outputs": {"json_object": True}})
    assert dict(config.sampling.structured_outputs) == {"json_object": True}
    with pytest.raises(ValueError, match="structured_outputs has unsupported key"):
        ActorConfig(model=str(LLADA_DIR), sampling={"structured_outputs": {"yaml": True}})
    defaults = BlockServeActor(model=str(LLADA_DIR), engine=ENGINE, sampling=config.sampling, torch_threads=1)
    output = asyncio.run(defaults(pa.table({"prompt": ["one", "two"]})))
    assert all(isinstance(json.loads(text), dict) for text in output.column("generated_text").to_pylist())


def test_build_processor_rows_ask_for_json(ray_cluster):
    import ray
    from ray.data.llm import build_processor

    from actors.ray_data.processor import BlockServeProcessorConfig

    def preprocess(row):
        constraint = {"json": FLAG} if row["id"] % 2 else {"choice": ["left", "right"]}
        return {"prompt": row["question"], "sampling_params": {"structured_outputs": constraint}}

    config = BlockServeProcessorConfig(model_source=str(LLADA_DIR), engine_kwargs=ENGINE, actor={"torch_threads": 1},
                                       concurrency=1, batch_size=4, num_cpus_per_actor=0.5)
    processor = build_processor(config, preprocess=preprocess, preprocess_map_kwargs={"num_cpus": 0.25},
                                postprocess=lambda row: {"id": row["id"], "answer": row["generated_text"]},
                                postprocess_map_kwargs={"num_cpus": 0.25})
    rows = processor(ray.data.from_items([{"id": i, "question": f"q{i}"} for i in range(4)])).take_all()
    for row in sorted(rows, key=lambda row: row["id"]):
        if row["id"] % 2:
            jsonschema.validate(json.loads(row["answer"]), FLAG)
        else:
            assert row["answer"] in ("left", "right")
