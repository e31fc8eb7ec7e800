"""One admission check: a request that can never run gets the same error from the engine, the OpenAI
server (a 400) and a Ray Data row, because all three ask ``engine.tokenize`` / ``engine.check``. The check
itself (``AdmissionLimits``) needs no model: it names the setting at fault from sizes alone."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from actors.serving.openai.protocol import ChatCompletionRequest, CompletionRequest, OpenAIError
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.scheduling.admission import AdmissionError, AdmissionLimits
from tests.pipeline_helpers import freeze_tiny_model

ENGINE = {"block_length": 8, "max_batch_size": 2, "max_model_len": 64}
PROMPT = [5] * 20  # 20 tokens + one block of 8 fit in 64; with 64 new tokens (84) they do not


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return freeze_tiny_model(tmp_path_factory.mktemp("model") / "tiny", gen_length=False)  # max_new_tokens sizes


@pytest.fixture(scope="module")
def engine(model) -> BlockServeEngine:
    return BlockServeEngine.from_pretrained(model, EngineConfig(**ENGINE), dtype="float32")


def engine_error(engine: BlockServeEngine, prompt, params: SamplingParams) -> str:
    output = engine.generate([prompt], params)[0]
    assert output.finish_reason == "error"
    return output.error


def test_the_limits_name_the_setting_at_fault_and_the_limit_it_exceeds_with_no_model():
    limits = AdmissionLimits(block_length=8, vocab_size=100, model_max_length=128, token_budget=96, max_model_len=64)
    faults = {}
    for prompt_tokens, max_new_tokens in ((20, 64), (60, 8), (100, 8), (20, 100)):
        with pytest.raises(AdmissionError) as raised:
            limits.check_width(prompt_tokens, SamplingParams(max_new_tokens=max_new_tokens))
        assert raised.value.too_long
        faults[prompt_tokens, max_new_tokens] = (raised.value.param, str(raised.value).rsplit(" exceeds ", 1)[1])
    assert faults == {(20, 64): ("max_new_tokens", "the engine's max_model_len (64)"),  # 20 + 8 blocks = 84
                      (60, 8): ("prompt", "the engine's max_model_len (64)"),  # not even one block fits
                      (100, 8): ("prompt", "the engine's token budget (96)"),
                      (20, 100): ("max_new_tokens", "the engine's token budget (96)")}  # 20 + 13 blocks = 124
    limits.check_width(20, SamplingParams(max_new_tokens=40))  # 20 + 40 fits: nothing raised
    assert limits.prompt_room(SamplingParams(max_new_tokens=40)) == 24
    for params, param in ((SamplingParams(logit_bias={100: 1.0}), "logit_bias"), (SamplingParams(top_p=0), "top_p"),
                          ({"max_new_tokens": 8}, "params")):
        with pytest.raises(AdmissionError) as raised:
            limits.check_params(params)
        assert raised.value.param == param and not raised.value.too_long


def test_check_raises_what_add_request_reports(engine):
    params = SamplingParams(max_new_tokens=64)
    with pytest.raises(AdmissionError) as raised:
        engine.check(PROMPT, params)
    assert raised.value.param == "max_new_tokens" and raised.value.too_long
    assert str(raised.value) == engine_error(engine, PROMPT, params)
    assert "leaves no room for a prompt in a row of at most 64 tokens" in str(raised.value)
    with pytest.raises(AdmissionError) as raised:
        engine.check([5] * 60, SamplingParams(max_new_tokens=8))  # 60 + one block > 64: the prompt's fault
    assert raised.value.param == "prompt"
    engine.check(PROMPT, SamplingParams(max_new_tokens=40))  # 20 + 40 fits: nothing raised


def test_a_row_wider_than_max_model_len_gets_the_same_error_from_the_engine_the_server_and_ray_data(
        engine, model):
    from actors.engine_loop import EngineLoop
    from actors.ray_data.block_serve_actor import BlockServeActor
    from actors.serving.openai.server import OpenAIServer

    expected = engine_error(engine, PROMPT, SamplingParams(max_new_tokens=64))
    loop = EngineLoop(BlockServeEngine(engine.lm, EngineConfig(**ENGINE))).start()
    try:
        server = OpenAIServer(loop, model_name="tiny")
        with pytest.raises(OpenAIError) as refused:
            asyncio.run(server.completions(CompletionRequest.model_validate(
                {"prompt": PROMPT, "max_tokens": 64})))
        assert refused.value.status == 400 and refused.value.param == "max_tokens"
        assert refused.value.code == "context_length_exceeded" and refused.value.message == expected
        with pytest.raises(OpenAIError) as refused:
            asyncio.run(server.chat(ChatCompletionRequest.model_validate(
                {"messages": [{"role": "user", "content": "count " * 60}], "max_tokens": 8})))
        assert refused.value.param == "messages" and refused.value.code == "context_length_exceeded"
    finally:
        loop.stop()
    actor = BlockServeActor(model=str(model), engine=ENGINE, torch_threads=1)
    rows = asyncio.run(actor({"prompt": np.array([PROMPT], dtype=object),
                              "sampling_params": np.array([{"max_tokens": 64}], dtype=object)}))
    assert rows["__inference_error__"].to_pylist() == [expected]


def test_openai_and_vllm_names_map_to_sampling_params_in_one_place():
    params = SamplingParams.from_openai({"max_tokens": 40, "ignore_eos": True, "top_k": -1, "top_p": None,
                                         "logit_bias": {"7": 2.0}, "temperature": 0.5})
    assert params == SamplingParams(max_new_tokens=40, stop_at_eos=False, top_k=0, logit_bias={7: 2.0},
                                    temperature=0.5)
    assert SamplingParams.from_openai({}, SamplingParams(max_new_tokens=8)) == SamplingParams(max_new_tokens=8)
    with pytest.raises(ValueError, match=r"unsupported key\(s\) \['logprobs', 'n'\]"):
        SamplingParams.from_openai({"n": 2, "logprobs": 1}, refused=("logprobs",))
