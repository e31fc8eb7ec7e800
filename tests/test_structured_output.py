"""Structured output through the engine: every answer a constrained row finishes is what it asked for, an answer
cut by its token cap is a valid prefix, and constrained rows change nothing for the rows beside them.

The random fixtures spell any ASCII text one character a token, and their random weights would write anything:
only the grammar makes their answers valid, so these tests see every mask the grammar sets.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import xgrammar

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from tests.model_helpers import FIXTURES, LLADA_DIR

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["ok", "color", "n"], "additionalProperties": False}
PATTERN = r"[0-9]{2,3}-[a-c]+"
CHOICES = ["red", "green", "blue"]
GRAMMAR = 'root ::= "(" [a-z] [a-z]? ")"'
CONSTRAINTS = [{"json": SCHEMA}, {"json": json.dumps(SCHEMA)}, {"regex": PATTERN}, {"choice": CHOICES},
               {"grammar": GRAMMAR}, {"json_object": True}]
PROMPTS = ["hello", "a longer prompt", "x", "json please", "(", "{"]


def satisfies(constraint: dict, text: str) -> bool:
    """The text is a whole sentence of the constraint (checked without the grammar library)."""
    kind, value = next(iter(constraint.items()))
    if kind == "json":
        jsonschema.validate(json.loads(text), json.loads(value) if isinstance(value, str) else value)
        return True
    if kind == "json_object":
        return isinstance(json.loads(text), dict)
    if kind == "regex":
        return re.fullmatch(value, text) is not None
    if kind == "choice":
        return text in value
    return re.fullmatch(r"\([a-z][a-z]?\)", text) is not None


def is_valid_prefix(engine: BlockServeEngine, params: SamplingParams, token_ids: list[int]) -> bool:
    matcher = xgrammar.GrammarMatcher(engine.grammars.compiled(params))
    return all(matcher.accept_token(token) for token in token_ids)


@pytest.fixture(scope="module")
def llada():
    return load_model(LLADA_DIR, dtype="float64")


def constrained(max_new_tokens: int = 24, **settings) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=max_new_tokens, structured_outputs=c, **settings) for c in CONSTRAINTS]


def check_answers(engine: BlockServeEngine, params: list[SamplingParams], outputs) -> None:
    for setting, output in zip(params, outputs):
        assert output.error is None
        if output.finish_reason == "eos":
            assert satisfies(dict(setting.structured_outputs), output.text), output.text
        else:
            assert output.finish_reason == "length"
            assert is_valid_prefix(engine, setting, output.token_ids), output.text


@pytest.mark.parametrize("config", [dict(block_length=8), dict(block_length=8, decoding="quota", steps_per_block=4),
                                    dict(block_length=8, decoding="low_confidence_dynamic", steps_per_block=4,
                                         threshold=0.05)],
                         ids=["threshold", "quota", "low_confidence_dynamic"])
def test_every_answer_that_ends_by_itself_satisfies_its_constraint(llada, config):
    engine = BlockServeEngine(llada, EngineConfig(max_batch_size=8, **config))
    params = constrained()
    outputs = engine.generate(PROMPTS, params)
    check_answers(engine, params, outputs)
    assert sum(output.finish_reason == "eos" for output in outputs) >= 4  # the bounded constraints do end
    assert engine.stats().counters["constrained_requests"] == len(params)


def test_sampled_constrained_rows_satisfy_their_constraint_too(llada):
    engine = BlockServeEngine(llada, EngineConfig(block_length=8, max_batch_size=8))
    params = constrained(temperature=1.0, seed=7, top_k=50)
    check_answers(engine, params, engine.generate(PROMPTS, params))


def test_a_schemas_properties_are_written_in_the_order_it_declares_them(llada):
    engine = BlockServeEngine(llada, EngineConfig(block_length=8))
    declared = {"type": "object", "properties": {"zeta": {"type": "boolean"}, "alpha": {"type": "boolean"}},
                "required": ["zeta", "alpha"], "additionalProperties": False}
    text = engine.generate(["order"], SamplingParams(max_new_tokens=32, structured_outputs={"json": declared}))[0].text
    assert list(json.loads(text)) == ["zeta", "alpha"]


def test_batched_equals_alone_and_free_rows_are_untouched(llada):
    engine = BlockServeEngine(llada, EngineConfig(block_length=8, max_batch_size=8))
    free = SamplingParams(max_new_tokens=24)
    params = [*constrained(), free, SamplingParams(max_new_tokens=24, temperature=0.8, seed=3)]
    prompts = [*PROMPTS, "free text", "sampled text"]
    batched = engine.generate(prompts, params)
    alone = [engine.generate([prompt], [setting])[0] for prompt, setting in zip(prompts, params)]
    assert [output.token_ids for output in batched] == [output.token_ids for output in alone]


def test_a_constraint_that_does_not_compile_fails_its_request_alone(llada):
    engine = BlockServeEngine(llada, EngineConfig(block_length=8))
    bad = [{"regex": "a[b"}, {"json": {"type": "nosuch"}}, {"grammar": 'root ::= "a" |'}, {"json": "{not json"},
           {"choice": []}, {"regex": "a", "choice": ["a"]}, {"xml": "<a/>"}]
    outputs = engine.generate(["hi"] * (len(bad) + 1), [SamplingParams(max_new_tokens=8, structured_outputs=b)
                                                        for b in bad] + [SamplingParams(max_new_tokens=8)])
    assert [output.finish_reason for output in outputs] == ["error"] * len(bad) + ["length"]
    assert all(output.error.startswith("structured_outputs") for output in outputs[:-1])
    assert "Unclosed '['" in outputs[0].error and "nosuch" in outputs[1].error
    assert engine.stats().counters == {"constraints_refused": len(bad)}


@pytest.mark.parametrize("family", ["tiny-dream", "tiny-sdar"])
def test_shifted_and_block_causal_families_keep_the_guarantees(family):
    lm = load_model(FIXTURES / family, dtype="float64")
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **({"block_length": 8} if family == "tiny-dream"
                                                                     else {})))
    params = constrained(max_new_tokens=16)
    check_answers(engine, params, engine.generate(PROMPTS, params))


def test_the_tiny_models_word_pieces_decode_to_text_the_constraint_allows(tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(dtype="float32", block_length=8, max_batch_size=8)
    rows = [row for row in heldout_rows if len(row["answer"].split()) <= 4][:2]  # answers within the cap
    chats = [[{"role": "user", "content": row["prompt"]}] for row in rows]
    constraints = [{"regex": r"[0-9]+( [0-9]+)*"}, {"choice": [row["answer"] for row in rows]},
                   {"json": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 99}},
                             "required": ["n"]}}]
    params = [SamplingParams(max_new_tokens=16, structured_outputs=c) for c in constraints for _ in rows]
    outputs = engine.generate(chats * len(constraints), params)
    check_answers(engine, params, outputs)
    assert all(output.finish_reason == "eos" for output in outputs)


def test_what_cannot_be_constrained_is_refused_by_name():
    editing = BlockServeEngine(load_model(FIXTURES / "tiny-llada2", dtype="float32"),
                               EngineConfig(decoding="joint_threshold"))
    refused = editing.generate(["hi"], SamplingParams(max_new_tokens=8, structured_outputs={"regex": "a"}))[0]
    assert refused.finish_reason == "error" and "decoding='joint_threshold'" in refused.error
    canvas = BlockServeEngine(load_model(FIXTURES / "tiny-diffusion_gemma", dtype="float32"))
    refused = canvas.generate(["hi"], SamplingParams(max_new_tokens=8, structured_outputs={"regex": "a"}))[0]
    assert refused.finish_reason == "error" and "not offered for" in refused.error
