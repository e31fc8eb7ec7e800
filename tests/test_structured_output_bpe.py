"""Structured output on a byte-level BPE vocabulary: tokens such as ``":"``, ``","`` and `` 12`` span a grammar's
boundaries, and the guarantees hold as they do one character a token.

The fixture (``scripts.make_bpe_fixture``) is a random LLaDA-layout model whose BPE is trained on the demo rows as
JSON, written into a temporary folder. Under each rule, at batch 1 and batched, every answer that ends by itself
satisfies its constraint, every answer cut by its cap is a valid prefix, and rows without a constraint decode
exactly as they do beside other free rows. The OpenAI server, the Ray Data actor (the stage of
``map_batches(BlockServeActor)``) and ``build_processor`` on a real Ray cluster answer on it too.
"""
from __future__ import annotations

import asyncio
import json
import re

import jsonschema
import pyarrow as pa
import pytest
import xgrammar

from actors import BlockServeActor
from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from engine.structured.vocabulary import vocabulary
from scripts.make_bpe_fixture import write_fixture
from tests.serve_helpers import openai_server_without_ray

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "color", "n"], "additionalProperties": False}
NUMBERS = r"[0-9]{1,2}( [0-9]{1,2}){1,3}"  # " 12" is one token of this vocabulary
CHOICES = ["count from 12 to 9", "count down", "red"]
GRAMMAR = 'root ::= "{\\"n\\":" [0-9] [0-9]? "}"'  # '{"' and '":' are tokens
CONSTRAINTS = [{"json": SCHEMA}, {"regex": NUMBERS}, {"choice": CHOICES}, {"grammar": GRAMMAR},
               {"json_object": True}]
PROMPTS = ["count from 12 to 9", '{"ok":', "a colour", "numbers", "{"]
RULES = [dict(block_length=8), dict(block_length=8, decoding="quota", steps_per_block=4),
         dict(block_length=8, decoding="low_confidence_dynamic", steps_per_block=4, threshold=0.05)]
FULL, CAPPED = 32, 5  # max_new_tokens: room to finish, and a cap that cuts JSON mid-way


def satisfies(constraint: dict, text: str) -> bool:
    """The text is a whole sentence of the constraint (checked without the grammar library)."""
    kind, value = next(iter(constraint.items()))
    if kind == "json":
        jsonschema.validate(json.loads(text), value)
        return True
    if kind == "json_object":
        return isinstance(json.loads(text), dict)
    if kind == "regex":
        return re.fullmatch(value, text) is not None
    if kind == "choice":
        return text in value
    return re.fullmatch(r'\{"n":[0-9][0-9]?\}', text) is not None


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("tiny-llada-bpe"))


@pytest.fixture(scope="module")
def bpe(bpe_dir):
    return load_model(bpe_dir, dtype="float64")


def check_answers(engine: BlockServeEngine, params: list[SamplingParams], outputs) -> None:
    for setting, output in zip(params, outputs):
        assert output.error is None
        if setting.structured_outputs is None:
            continue
        if output.finish_reason == "eos":
            assert satisfies(dict(setting.structured_outputs), output.text), output.text
        else:
            assert output.finish_reason == "length"
            matcher = xgrammar.GrammarMatcher(engine.grammars.compiled(setting))
            assert all(matcher.accept_token(token) for token in output.token_ids), output.text


def test_the_fixture_is_byte_level_bpe_with_tokens_that_span_json_boundaries(bpe):
    read = vocabulary(bpe.tokenizer, bpe.vocab_size, list(bpe.special_ids.stop_ids))
    assert read.info.vocab_type == xgrammar.VocabType.BYTE_LEVEL and read.answer_prefix == ""
    spelled = bpe.tokenizer.convert_ids_to_tokens(bpe.tokenizer('{"ok":true,"n":12} 12')["input_ids"])
    assert spelled[0] == '{"' and {'":', ',"', "Ġ12"} <= set(spelled), spelled


@pytest.mark.parametrize("rule", RULES, ids=["threshold", "quota", "low_confidence_dynamic"])
def test_batched_and_alone_every_answer_is_valid_and_free_rows_are_untouched(bpe, rule):
    engine = BlockServeEngine(bpe, EngineConfig(max_batch_size=16, **rule))
    free = [SamplingParams(max_new_tokens=FULL), SamplingParams(max_new_tokens=FULL, temperature=0.8, seed=3)]
    unbounded = [CONSTRAINTS[0], CONSTRAINTS[3], CONSTRAINTS[4]]  # JSON and the grammar: CAPPED cuts them
    params = [SamplingParams(max_new_tokens=FULL, structured_outputs=c) for c in CONSTRAINTS] + [
        SamplingParams(max_new_tokens=CAPPED, structured_outputs=c) for c in unbounded] + free
    prompts = PROMPTS + [PROMPTS[0], PROMPTS[3], PROMPTS[4]] + ["free text", "sampled text"]
    batched = engine.generate(prompts, params)
    alone = [engine.generate([prompt], [setting])[0] for prompt, setting in zip(prompts, params)]
    check_answers(engine, params, batched)
    check_answers(engine, params, alone)
    assert [output.token_ids for output in batched] == [output.token_ids for output in alone]
    free_beside_free = engine.generate(prompts[-2:], free)
    assert [output.token_ids for output in batched[-2:]] == [output.token_ids for output in free_beside_free]
    reasons = [output.finish_reason for output in batched]
    assert reasons[:len(CONSTRAINTS)] == ["eos"] * len(CONSTRAINTS)
    assert reasons[len(CONSTRAINTS):-2] == ["length"] * len(unbounded)


def test_answers_commit_tokens_that_cross_the_grammars_boundaries(bpe):
    engine = BlockServeEngine(bpe, EngineConfig(block_length=8, max_batch_size=8))
    params = [SamplingParams(max_new_tokens=FULL, structured_outputs=c) for c in CONSTRAINTS]
    outputs = engine.generate(PROMPTS, params)
    check_answers(engine, params, outputs)
    committed = {text for output in outputs for text in bpe.tokenizer.convert_ids_to_tokens(output.token_ids)}
    spanning = {text for text in committed if len(text) > 1 and re.search(r'["{}:,]', text)}
    assert spanning, committed  # e.g. '","' in a json_object answer: the grammar took a token over a boundary


@pytest.fixture(scope="module")
def server(bpe_dir):
    yield from openai_server_without_ray(bpe_dir, "tiny-llada-bpe", {"max_batch_size": 4, "block_length": 8},
                                         default_max_tokens=FULL)


def test_the_openai_door_answers_json_and_a_regex_on_the_bpe_fixture(server):
    response_format = {"type": "json_schema", "json_schema": {"name": "flag", "schema": SCHEMA, "strict": True}}
    chat = asyncio.run(server.chat(ChatCompletionRequest.model_validate(
        {"model": "tiny-llada-bpe", "messages": [{"role": "user", "content": "a flag"}],
         "response_format": response_format})))
    jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)
    completion = asyncio.run(server.completions(CompletionRequest.model_validate(
        {"model": "tiny-llada-bpe", "prompt": "numbers", "structured_outputs": {"regex": NUMBERS}})))
    assert re.fullmatch(NUMBERS, completion.choices[0].text)


def test_the_ray_data_actor_serves_arrow_rows_with_each_constraint_on_the_bpe_fixture(bpe_dir):
    actor = BlockServeActor(model=str(bpe_dir), engine={"block_length": 8, "max_batch_size": 8},
                            sampling={"max_new_tokens": FULL}, torch_threads=1)
    rows = [{"prompt": prompt, "sampling_params": {"structured_outputs": constraint}}
            for prompt, constraint in zip(PROMPTS, CONSTRAINTS)] + [{"prompt": "free", "sampling_params": {}}]
    output = asyncio.run(actor(pa.Table.from_pylist(rows)))  # a struct column: nulls for the keys others set
    texts, reasons = output.column("generated_text").to_pylist(), output.column("finish_reason").to_pylist()
    assert output.column("__inference_error__").to_pylist() == [""] * len(rows)
    assert reasons[:len(CONSTRAINTS)] == ["eos"] * len(CONSTRAINTS)
    assert all(satisfies(constraint, text) for constraint, text in zip(CONSTRAINTS, texts))


def test_build_processor_rows_get_their_constraints_on_the_bpe_fixture(ray_cluster, bpe_dir):
    import ray
    from ray.data.llm import build_processor

    from actors.ray_data.processor import BlockServeProcessorConfig

    as_rows = [{"json": json.dumps(SCHEMA)}, *CONSTRAINTS[1:]]  # a schema as JSON text keeps its own key order
    config = BlockServeProcessorConfig(model_source=str(bpe_dir), engine_kwargs={"block_length": 8},
                                       actor={"torch_threads": 1}, concurrency=1, batch_size=8,
                                       num_cpus_per_actor=0.5)
    processor = build_processor(
        config, preprocess=lambda row: {"prompt": PROMPTS[row["id"]], "sampling_params": {
            "max_tokens": FULL, "structured_outputs": as_rows[row["id"]]}}, preprocess_map_kwargs={"num_cpus": 0.25},
        postprocess=lambda row: {"id": row["id"], "answer": row["generated_text"], "finish": row["finish_reason"]},
        postprocess_map_kwargs={"num_cpus": 0.25})
    rows = sorted(processor(ray.data.from_items([{"id": i} for i in range(len(CONSTRAINTS))])).take_all(),
                  key=lambda row: row["id"])
    assert [row["finish"] for row in rows] == ["eos"] * len(CONSTRAINTS)
    assert all(satisfies(constraint, row["answer"]) for constraint, row in zip(CONSTRAINTS, rows))
