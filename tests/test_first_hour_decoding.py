"""A model decodes with its own defaults, and ``max_new_tokens`` only caps its answer.

A checkpoint's generation_config.json names the block, threshold and answer length (``gen_length``) it was
made for; they apply unless the user sets them. An answer under ``max_new_tokens=k`` is the first k
tokens of the answer the model gives at its own length, for every family, through the engine and the
OpenAI server: whole-sequence families decode their whole ``gen_length`` canvas and leave once the capped
blocks are final; the others decode block after block, so later blocks never change earlier ones.
"""
from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import TINY_MODEL_DIR, load_model
from tests.conftest import FIXTURES
from tests.engine_helpers import chat, ordinary_prompts

CAPS = (1, 5, 13, 33)
OWN_LENGTH = 48  # the answer length of a family whose checkpoint names none
FAMILIES = {  # the model, and the settings that give it an answer length of its own
    "tiny (LLaDA layout, its generation_config)": ("tiny", {}),
    "llada": (FIXTURES / "tiny-llada", {"gen_length": OWN_LENGTH, "block_length": 8}),
    "dream": (FIXTURES / "tiny-dream", {"gen_length": OWN_LENGTH, "block_length": 8}),
    "sdar": (FIXTURES / "tiny-sdar", {"decoding": "low_confidence"}),
    "llada2": (FIXTURES / "tiny-llada2", {"decoding": "low_confidence"}),
    "nemotron": (FIXTURES / "tiny-nemotron_labs_diffusion", {"threshold": 0.5}),
    "diffusion_gemma": (FIXTURES / "tiny-diffusion_gemma", {"max_denoising_steps": 4}),
}


def test_the_tiny_model_decodes_with_the_block_threshold_and_length_its_generation_config_names():
    generation = json.loads((TINY_MODEL_DIR / "generation_config.json").read_text())
    lm = load_model("tiny")
    config = BlockServeEngine(lm).config
    assert (config.block_length, config.threshold, config.gen_length) == (
        generation["block_length"], generation["threshold"], generation["gen_length"]) == (8, 0.7, 64)
    chosen = BlockServeEngine(lm, EngineConfig(block_length=16, threshold=0.9, gen_length=32)).config
    assert (chosen.block_length, chosen.threshold, chosen.gen_length) == (16, 0.9, 32)


def test_a_checkpoint_that_names_no_decoding_defaults_gets_the_engines():
    config = BlockServeEngine(load_model(FIXTURES / "tiny-llada")).config
    assert (config.block_length, config.threshold, config.gen_length) == (32, 0.9, None)


@pytest.mark.parametrize("key, value", [("threshold", 1.5), ("gen_length", 0), ("block_length", "eight")])
def test_a_bad_value_in_generation_config_is_refused_at_load_naming_the_file_and_key(tmp_path, key, value):
    model = tmp_path / "tiny"
    shutil.copytree(TINY_MODEL_DIR, model)
    generation = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps(generation | {key: value}))
    with pytest.raises(ValueError, match=rf"generation_config.json: {key} must be"):
        load_model(model)


def test_the_readme_engine_example_answers_right_whatever_max_new_tokens_it_names():
    engine = BlockServeEngine.from_pretrained("tiny", config=EngineConfig(max_batch_size=16), dtype="float32")
    for max_new_tokens in (64, 256, 4096):
        output = engine.generate([[{"role": "user", "content": "count from 3 to 12"}]],
                                 SamplingParams(max_new_tokens=max_new_tokens))[0]
        assert (output.text, output.finish_reason) == ("3 4 5 6 7 8 9 10 11 12", "eos")


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def engine(request) -> BlockServeEngine:
    path, settings = FAMILIES[request.param]
    return BlockServeEngine(load_model(path, dtype="float32"), EngineConfig(max_batch_size=8, **settings))


def own_length(engine: BlockServeEngine) -> int:
    """The answer length a request that caps nothing gets: the model's gen_length, else a long one."""
    return engine.config.gen_length or 64


@pytest.mark.parametrize("stop_at_eos", [True, False])
def test_an_answer_under_max_new_tokens_is_the_first_tokens_of_the_answer_at_the_models_own_length(
        engine, stop_at_eos):
    prompts = ordinary_prompts(engine.lm, (3, 7, 12), seed=1)
    settings = {"stop_at_eos": stop_at_eos, "seed": 0}  # a canvas starts from noise its seed draws
    whole = engine.generate(prompts, SamplingParams(max_new_tokens=own_length(engine), **settings))
    pairs = [(prompt, answer, cap) for prompt, answer in zip(prompts, whole) for cap in CAPS]
    capped = engine.generate([prompt for prompt, _, _ in pairs],
                             [SamplingParams(max_new_tokens=cap, **settings) for _, _, cap in pairs])
    for (prompt, answer, cap), output in zip(pairs, capped):
        assert output.token_ids == answer.token_ids[:cap], (prompt, cap)
        stopped_within_cap = answer.finish_reason == "eos" and len(answer.token_ids) < cap
        assert output.finish_reason == ("eos" if stopped_within_cap else "length")


def test_a_whole_sequence_answer_under_a_cap_leaves_once_its_capped_blocks_are_final():
    engine = BlockServeEngine(load_model("tiny", dtype="float32"))
    prompt = chat("count from 10 to 50")
    whole = engine.generate([prompt], SamplingParams(max_new_tokens=64))[0]
    capped = engine.generate([prompt], SamplingParams(max_new_tokens=8))[0]
    assert whole.text == " ".join(str(n) for n in range(10, 51)) and whole.finish_reason == "eos"
    assert capped.token_ids == whole.token_ids[:8] and capped.finish_reason == "length"
    assert capped.num_blocks == 1 < whole.num_blocks  # one block of 8 decoded, not the whole canvas


def test_a_request_may_name_its_own_gen_length_as_the_reference_comparisons_do():
    engine = BlockServeEngine(load_model("tiny", dtype="float32"))
    prompt = chat("count from 1 to 5")
    own = engine.generate([prompt], SamplingParams(max_new_tokens=16, gen_length=16))[0]
    assert own.finish_reason in ("eos", "length") and len(own.token_ids) <= 16
    with pytest.raises(ValueError, match="gen_length must be a positive int"):
        engine.check([5, 6], SamplingParams(gen_length=0))


def test_the_openai_server_caps_the_answer_the_same_way():
    from actors.engine_loop import EngineLoop
    from actors.serving.openai.protocol import ChatCompletionRequest
    from actors.serving.openai.server import OpenAIServer

    lm = load_model("tiny", dtype="float32")
    messages = [{"role": "user", "content": "count from 1 to 30"}]
    whole = BlockServeEngine(lm).generate([messages], SamplingParams(max_new_tokens=64))[0]
    loop = EngineLoop(BlockServeEngine(lm)).start()
    try:
        server = OpenAIServer(loop, model_name="tiny")
        for max_tokens in (4, 20, 96):
            response = asyncio.run(server.chat(ChatCompletionRequest.model_validate(
                {"model": "tiny", "messages": messages, "max_tokens": max_tokens})))
            choice = response.choices[0]
            expected = lm.tokenizer.decode(whole.token_ids[:max_tokens])
            assert choice.message.content == expected
            assert choice.finish_reason == ("stop" if max_tokens > len(whole.token_ids) else "length")
    finally:
        loop.stop()


def test_a_max_new_tokens_no_row_can_hold_is_blamed_not_the_prompt():
    engine = BlockServeEngine(load_model(FIXTURES / "tiny-llada", dtype="float32"), EngineConfig(max_model_len=64))
    output = engine.generate(["hello"], SamplingParams(max_new_tokens=10_000))[0]
    assert output.finish_reason == "error"
    assert output.error.startswith("max_new_tokens (10000") and "lower max_new_tokens" in output.error
    assert "prompt is too long" not in output.error
