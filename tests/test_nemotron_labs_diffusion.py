"""Nemotron-Labs-Diffusion (``tests/fixtures/tiny-nemotron_labs_diffusion``, the release's on-disk layout):
logits equal transformers' ``Ministral3`` on the same weights, and each decoding mode's tokens equal the
checkpoint's own remote code, batched with requests joining mid-flight.

``tests/fixtures/nemotron_remote_code.json`` holds the remote code's answers, one prompt at a time: its
``generate`` (the dLM mode, ``causal_context`` True and False), ``ar_generate`` and ``linear_spec_generate``,
run outside this repository by ``research/peers/nemotron_ref.py`` (its ``command`` key). The fixture's
``original_max_position_embeddings`` is 48, so rows up to 112 positions cross YaRN's ramp and the Llama-4
query scale.
"""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.anchored.spans import SpanStep
from engine.models.kv_cache import KVCache
from engine.models.loader import load_model
from engine.rules.linear_spec import LinearSpec
from tests.conftest import FIXTURES

NEMOTRON_DIR = FIXTURES / "tiny-nemotron_labs_diffusion"
REMOTE_CODE = json.loads((FIXTURES / "nemotron_remote_code.json").read_text())
MODES = {  # the remote code's run -> the engine settings that decode as it does
    "dlm_threshold_none": {"decoding": "quota", "steps_per_block": 8},  # one token a step
    "dlm_threshold_0.5": {"decoding": "threshold", "threshold": 0.5},
    "dlm_threshold_0.9": {"decoding": "threshold", "threshold": 0.9},
    "dlm_bidirectional_context": {"decoding": "threshold", "threshold": 0.5, "causal_context": False},
    "autoregressive": {"decoding": "autoregressive"},
    "linear_spec_0.0": {"decoding": "linear_spec", "threshold": 0.0},
    "linear_spec_0.5": {"decoding": "linear_spec", "threshold": 0.5},
}


@pytest.fixture(scope="module")
def lm():
    return load_model(NEMOTRON_DIR, dtype="float32")


def transformers_ministral3():
    """transformers' own Ministral-3 causal LM on the fixture's weights (``encoder.`` -> ``model.``)."""
    from transformers import Ministral3Config, Ministral3ForCausalLM

    config = json.loads((NEMOTRON_DIR / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_parameters")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Ministral3ForCausalLM(Ministral3Config(**{key: config[key] for key in keys},
                                                       tie_word_embeddings=False))
    weights = load_file(str(NEMOTRON_DIR / "model.safetensors"))
    model.load_state_dict({name.replace("encoder.", "model.").replace("diffusion_head", "lm_head"): tensor
                           for name, tensor in weights.items()}, strict=True)
    return model.eval()


def span_logits(lm, tokens: list[int], starts: int, causal: bool, cache: KVCache) -> torch.Tensor:
    step = SpanStep(torch.tensor(tokens), (0,), (starts,), (len(tokens),), (causal,), torch.arange(len(tokens)))
    return lm.model.span_logits(step, cache)


def test_stored_and_denoised_logits_equal_transformers_ministral3(lm):
    """A 70-token prompt stored causally, then a block of 8 denoised bidirectionally over it: positions past
    48, where YaRN's long wavelengths and the query scale differ from plain RoPE."""
    prompt, block = [(7 * i) % 90 for i in range(70)], [5, *[lm.special_ids.mask_id] * 7]
    cache = KVCache(lm.model.config.cache_spec(96), 1, torch.float32, torch.device("cpu"))
    stored = span_logits(lm, prompt, 0, True, cache)
    denoised = span_logits(lm, block, len(prompt), False, cache)
    width = len(prompt) + len(block)
    visible = torch.ones(width, width, dtype=torch.bool).tril()
    visible[len(prompt):] = True  # the block reads the prompt and itself, the prompt only what precedes it
    mask = torch.zeros(1, 1, width, width).masked_fill(~visible, float("-inf"))
    with torch.no_grad():
        reference = transformers_ministral3()(torch.tensor([prompt + block]), attention_mask=mask).logits[0]
    torch.testing.assert_close(stored, reference[:len(prompt)], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(denoised, reference[len(prompt):], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("max_batch_size", [1, 5])
def test_each_mode_answers_as_the_remote_code(lm, mode, max_batch_size):
    """Twelve prompts of 3 to 79 tokens: alone, and five rows at a time with the rest joining as rows finish."""
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=max_batch_size, **MODES[mode]))
    outputs = engine.generate(REMOTE_CODE["prompts"], SamplingParams(max_new_tokens=REMOTE_CODE["max_new_tokens"]))
    eos = lm.special_ids.eos_id
    ours = [output.token_ids + ([eos] if output.finish_reason == "eos" else []) for output in outputs]
    assert ours == REMOTE_CODE["modes"][mode]["answers"]
    if mode == "dlm_threshold_0.5":  # some answers stop at EOS inside a block, with masks after it
        assert any(output.finish_reason == "eos" for output in outputs)


def test_linear_spec_gives_autoregressive_tokens_in_float64_at_every_draft_threshold():
    lm = load_model(NEMOTRON_DIR, dtype="float64")
    prompts = [[(11 * i + 3 * n) % 90 for i in range(n)] for n in (2, 9, 33, 60, 17, 41)]
    params = SamplingParams(max_new_tokens=29, stop_at_eos=False)
    answers = {(decoding, threshold): [output.token_ids for output in BlockServeEngine(
        lm, EngineConfig(decoding=decoding, threshold=threshold, max_batch_size=4)).generate(prompts, params)]
        for decoding, threshold in (("autoregressive", 0.9), ("linear_spec", 0.0), ("linear_spec", 0.7))}
    first, *others = answers.values()
    assert all(len(answer) == 29 for answer in first)
    assert all(other == first for other in others)


@pytest.mark.parametrize("settings", [{"decoding": "threshold", "threshold": 0.5}, {"decoding": "autoregressive"},
                                      {"decoding": "linear_spec", "threshold": 0.0}])
@pytest.mark.parametrize("max_new_tokens", [1, 5, 13])
def test_answers_hold_exactly_max_new_tokens(lm, settings, max_new_tokens):
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=3, **settings))
    outputs = engine.generate([[4, 8, 15], [16] * 40, [23, 42]],
                              SamplingParams(max_new_tokens=max_new_tokens, stop_at_eos=False))
    assert [len(output.token_ids) for output in outputs] == [max_new_tokens] * 3
    assert {output.finish_reason for output in outputs} == {"length"}


@pytest.mark.parametrize("settings", [{"decoding": "threshold", "threshold": 0.5}, {"decoding": "autoregressive"},
                                      {"decoding": "linear_spec", "threshold": 0.0}])
def test_in_bf16_batch_invariant_mode_a_batched_row_answers_as_it_does_alone(settings):
    lm = load_model(NEMOTRON_DIR, dtype="bfloat16", batch_invariant=True)
    prompts = REMOTE_CODE["prompts"][:6]
    params = SamplingParams(max_new_tokens=20, stop_at_eos=False)
    batched = BlockServeEngine(lm, EngineConfig(max_batch_size=4, **settings)).generate(prompts, params)
    alone = [BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings)).generate([prompt], params)[0]
             for prompt in prompts]
    assert [output.token_ids for output in batched] == [output.token_ids for output in alone]


def test_log_probabilities_are_each_tokens_own_and_speculation_gives_autoregressive_ones():
    """float64: a token's log-probability is the greedy top alternative's, at the step it was committed; a
    speculative row's come from its verify forward, which computes what the autoregressive step does."""
    lm = load_model(NEMOTRON_DIR, dtype="float64")
    prompts = REMOTE_CODE["prompts"][:4]
    params = SamplingParams(max_new_tokens=17, stop_at_eos=False, logprobs=3)
    runs = {decoding: BlockServeEngine(lm, EngineConfig(decoding=decoding, threshold=0.5, max_batch_size=3)).generate(
        prompts, params) for decoding in ("threshold", "autoregressive", "linear_spec")}
    for outputs in runs.values():
        for output in outputs:
            assert [entry.token_id for entry in output.logprobs] == output.token_ids
            assert all(entry.top[0][0] == entry.token_id and entry.top[0][1] == entry.logprob and len(entry.top) == 3
                       for entry in output.logprobs)
    for spec, ar in zip(runs["linear_spec"], runs["autoregressive"]):
        assert [entry.logprob for entry in spec.logprobs] == pytest.approx([entry.logprob for entry in ar.logprobs],
                                                                            abs=1e-9)


@pytest.mark.parametrize("decoding", ["threshold", "autoregressive", "linear_spec"])
def test_a_logit_bias_steers_every_mode(lm, decoding):
    engine = BlockServeEngine(lm, EngineConfig(decoding=decoding, threshold=0.5))
    (output,) = engine.generate([[4, 8, 15, 16]], SamplingParams(max_new_tokens=12, logit_bias={7: 100.0}))
    assert output.token_ids == [7] * 12


def test_a_speculative_row_accepts_its_verified_run_up_to_the_first_disagreement():
    assert LinearSpec.accepted([7, 1, 2, 3], [1, 2, 9, 4]) == 3  # 1 and 2 match the draft, 9 is the bonus
    assert LinearSpec.accepted([7, 1, 2, 3], [5, 2, 3, 4]) == 1  # only the bonus
    assert LinearSpec.accepted([7, 1, 2, 3], [1, 2, 3, 8]) == 4  # the whole draft and the bonus
    assert LinearSpec.accepted([7], [6]) == 1


@pytest.mark.parametrize("settings, field", [
    ({"decoding": "threshold", "threshold": 0.0}, "threshold"),
    ({"decoding": "linear_spec", "threshold": 1.5}, "threshold"),
    ({"decoding": "autoregressive", "schedule": "static"}, "schedule"),
    ({"decoding": "linear_spec", "causal_context": False}, "causal_context"),
    ({"causal_context": "yes"}, "causal_context"),
])
def test_invalid_settings_are_refused_by_name(settings, field):
    with pytest.raises(ValueError, match=f"EngineConfig.{field}"):
        EngineConfig(**settings)


def test_linear_spec_takes_a_zero_draft_threshold():
    assert EngineConfig(decoding="linear_spec", threshold=0.0).threshold == 0.0


def test_the_causal_modes_refuse_other_layouts_and_causal_context_refuses_other_families():
    sdar = load_model(FIXTURES / "tiny-sdar")
    with pytest.raises(ValueError, match="'autoregressive' runs on anchored rows"):
        BlockServeEngine(sdar, EngineConfig(decoding="autoregressive"))
    with pytest.raises(ValueError, match="causal_context=False"):
        BlockServeEngine(sdar, EngineConfig(causal_context=False))


def test_sampled_speculation_draws_autoregressive_tokens_and_a_row_draws_as_it_does_alone():
    """float64, temperature 0.8 with top-k 20 and top-p 0.9: a verified token is drawn with the noise of the
    position it is for, so linear_spec gives autoregressive's draws; every mode's rows draw as they do alone."""
    lm = load_model(NEMOTRON_DIR, dtype="float64")
    prompts = REMOTE_CODE["prompts"][:5]
    params = [SamplingParams(max_new_tokens=19, temperature=0.8, top_k=20, top_p=0.9, seed=seed,
                             stop_at_eos=False) for seed in range(5)]
    answers = {}
    for decoding in ("threshold", "autoregressive", "linear_spec"):
        settings = {"decoding": decoding, "threshold": 0.5}
        batched = BlockServeEngine(lm, EngineConfig(max_batch_size=3, **settings)).generate(prompts, params)
        alone = [BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings)).generate([prompt], [p])[0]
                 for prompt, p in zip(prompts, params)]
        answers[decoding] = [output.token_ids for output in batched]
        assert answers[decoding] == [output.token_ids for output in alone]
    assert answers["linear_spec"] == answers["autoregressive"]
    greedy = BlockServeEngine(lm, EngineConfig(decoding="autoregressive")).generate(
        prompts, SamplingParams(max_new_tokens=19, stop_at_eos=False))
    assert answers["autoregressive"] != [output.token_ids for output in greedy]


@pytest.mark.parametrize("key, value", [("dlm_paradigm", "block_diff"), ("sliding_window", 4096),
                                        ("tie_word_embeddings", True)])
def test_config_keys_it_does_not_reproduce_are_refused_by_name(tmp_path: Path, key, value):
    for file in NEMOTRON_DIR.iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    config = json.loads((NEMOTRON_DIR / "config.json").read_text()) | {key: value}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=key):
        load_model(tmp_path)


@pytest.mark.parametrize("settings", [{"decoding": "threshold", "threshold": 0.5}, {"decoding": "linear_spec",
                                                                                     "threshold": 0.0}])
def test_a_shared_instruction_is_read_from_the_prefix_cache_and_changes_no_answer(settings):
    """float64: a prompt continued from cached pages computes what the whole prompt does. The second wave
    joins after the first has stored the shared 48 tokens (three pages of 16)."""
    lm = load_model(NEMOTRON_DIR, dtype="float64")
    instruction = [(5 * i + 2) % 90 for i in range(50)]
    prompts = [instruction + [(3 * n + i) % 90 for i in range(n % 7 + 1)] for n in range(6)]
    params = SamplingParams(max_new_tokens=12)
    cached = BlockServeEngine(lm, EngineConfig(max_batch_size=2, **settings))
    assert cached.config.enable_prefix_caching
    uncached = BlockServeEngine(lm, EngineConfig(max_batch_size=2, enable_prefix_caching=False, **settings))
    with_cache = cached.generate(prompts, params)
    assert [output.token_ids for output in with_cache] == [
        output.token_ids for output in uncached.generate(prompts, params)]
    assert sum(output.num_cached_tokens for output in with_cache) >= 4 * 48
    assert all(output.num_cached_tokens % 16 == 0 for output in with_cache)


def test_prefix_caching_is_refused_with_a_bidirectional_context():
    lm = load_model(NEMOTRON_DIR)
    assert not BlockServeEngine(lm, EngineConfig(causal_context=False)).config.enable_prefix_caching
    with pytest.raises(ValueError, match="EngineConfig.enable_prefix_caching: with causal_context=False"):
        BlockServeEngine(lm, EngineConfig(causal_context=False, enable_prefix_caching=True))
