"""Fast-dLLM v2 (a tiny ``Fast_dLLM_Qwen`` checkpoint in the release's layout, written by
``scripts.make_fast_dllm_fixture``): its tokens equal the release's own ``generate``, batched and alone.

``tests/fixtures/fast_dllm_v2_remote_code.json`` holds ``generate``'s answers on this checkpoint, one prompt at a
time, greedy, float32, ``use_block_cache=False``, for thresholds 1.0 and 0.9 and ``small_block_size`` 8, 4 and 32,
over prompts of 7, 20 and 45 tokens (shorter than a block, and longer with a tail) and of 64 and 96 (whole
blocks, so each answer's first token is the stored prompt's argmax). They were run outside this repository under
transformers 4.53.3 by ``research/peers/fast_dllm_v2_ref.py`` (the JSON's ``command`` key)::

    python -m scripts.make_fast_dllm_fixture /tmp/fdllm/tiny-fast_dllm_v2
    /tmp/ref67/bin/python research/peers/fast_dllm_v2_ref.py --peer-dir <modeling.py + configuration.py> \\
        --checkpoint /tmp/fdllm/tiny-fast_dllm_v2 --out tests/fixtures/fast_dllm_v2_remote_code.json

The release's comparison is strict (``> threshold``), so the engine runs ``low_confidence`` with
``sub_block_length``. ``generate`` always decodes whole blocks: an answer here is the tokens of its first two blocks
after the prompt, cut before its first stop. The release ends an answer after its first stop, so a request that
ignores stops (``stop_at_eos=False``, vLLM's ``ignore_eos``) is compared through that stop, and holds all its tokens.
"""
from __future__ import annotations

import json

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from engine.runner.batch_inputs import step_parts
from engine.runner.parts_shifted_block_causal import ShiftedBlockCausalParts
from scripts.make_fast_dllm_fixture import write_fixture
from tests.conftest import FIXTURES

REMOTE_CODE = json.loads((FIXTURES / "fast_dllm_v2_remote_code.json").read_text())
PROMPTS = REMOTE_CODE["prompts"]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_model(write_fixture(tmp_path_factory.mktemp("fast_dllm_v2")), dtype="float32")


def settings(threshold: float, sub_block: int, **more) -> EngineConfig:
    return EngineConfig(decoding="low_confidence", threshold=threshold, sub_block_length=sub_block, **more)


def two_blocks(lm, stop_at_eos: bool = True) -> list[SamplingParams]:
    """Each answer's first two blocks (the first holds the prompt's tail): a block never sees the ones after it,
    so they are the release's whatever it decodes next."""
    return [SamplingParams(max_new_tokens=2 * lm.block_length - len(prompt) % lm.block_length, stop_at_eos=stop_at_eos)
            for prompt in PROMPTS]


def release_answer(answer: list[int], params: SamplingParams, stop: int) -> list[int]:
    """The release's answer as ours begins: up to its stop, or through it when the request ignores stops."""
    if stop in answer:
        answer = answer[:answer.index(stop) + (not params.stop_at_eos)]
    return answer[:params.max_new_tokens]


def test_the_release_config_is_read_as_a_qwen2_stack_with_shifted_block_causal_rows(lm):
    config = lm.model.config
    assert (lm.family, lm.logit_shift, lm.row_kind, lm.block_length) == ("fast_dllm_v2", 1, "block_causal", 32)
    assert config.qkv_bias and (config.num_heads, config.num_kv_heads) == (4, 2) and not config.qk_norm
    assert lm.layout.step_kind == "blocks" and isinstance(step_parts(lm.layout), ShiftedBlockCausalParts)
    assert (lm.special_ids.mask_id, lm.special_ids.stop_ids) == (100, (99,))  # config.json's ids


@pytest.mark.parametrize("setting", REMOTE_CODE["settings"],
                         ids=lambda s: f"threshold{s['threshold']}-sub{s['small_block_size']}")
@pytest.mark.parametrize("stop_at_eos", [True, False], ids=["stops", "ignore_eos"])
def test_batched_tokens_equal_the_releases_generate(lm, setting, stop_at_eos):
    config = settings(setting["threshold"], setting["small_block_size"], max_batch_size=len(PROMPTS))
    params = two_blocks(lm, stop_at_eos)
    outputs = BlockServeEngine(lm, config).generate(PROMPTS, params)
    expected = [release_answer(answer, p, lm.special_ids.eos_id) for answer, p in zip(setting["answers"], params)]
    assert [output.token_ids[:len(answer)] for output, answer in zip(outputs, expected)] == expected
    if stop_at_eos:
        assert [output.token_ids for output in outputs] == expected
    else:
        assert [len(output.token_ids) for output in outputs] == [p.max_new_tokens for p in params]


def test_batched_equals_alone_greedy_and_sampled(lm):
    """Five prompts, three rows at a time (rows join and leave mid-flight), greedy and sampled rows together."""
    config = settings(0.9, 8, max_batch_size=3)
    params = [SamplingParams(max_new_tokens=24, temperature=0.8 * (seed % 2), seed=seed, stop_at_eos=False)
              for seed in range(len(PROMPTS))]
    batched = BlockServeEngine(lm, config).generate(PROMPTS, params)
    alone = [BlockServeEngine(lm, config).generate([prompt], [p])[0] for prompt, p in zip(PROMPTS, params)]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]


def test_a_sampled_block_starts_with_the_stored_contexts_argmax(lm):
    """The release seeds a block's first position by argmax even when it samples: for a prompt of whole
    blocks, every seed's answer starts with the greedy answer's first token."""
    whole = [prompt for prompt in PROMPTS if len(prompt) % lm.block_length == 0]
    engine = BlockServeEngine(lm, settings(0.9, 8, max_batch_size=8))
    greedy = engine.generate(whole, SamplingParams(max_new_tokens=8, stop_at_eos=False))
    sampled = engine.generate(whole * 2, [SamplingParams(max_new_tokens=8, temperature=1.5, seed=seed,
                                                         stop_at_eos=False) for seed in range(2 * len(whole))])
    assert [o.token_ids[0] for o in sampled] == [o.token_ids[0] for o in greedy] * 2
    assert [o.token_ids for o in sampled] != [o.token_ids for o in greedy] * 2  # the rest is sampled


@pytest.mark.parametrize("length, reused", [(64, 63), (45, 32)])
def test_a_prompt_on_cached_blocks_decodes_as_without_the_cache(lm, length, reused):
    """The prefix cache holds a prompt's whole blocks. A prompt of whole blocks computes its last column again:
    it predicts the first answer token. A prompt with a tail reuses them all."""
    prompt = next(prompt for prompt in PROMPTS if len(prompt) == length)
    params = SamplingParams(max_new_tokens=12, stop_at_eos=False)
    cached = BlockServeEngine(lm, settings(0.9, 8, enable_prefix_caching=True))
    first, second = (cached.generate([prompt], params)[0] for _ in range(2))
    plain = BlockServeEngine(lm, settings(0.9, 8, enable_prefix_caching=False)).generate([prompt], params)[0]
    assert second.num_cached_tokens == reused and first.token_ids == second.token_ids == plain.token_ids


@pytest.mark.parametrize("fields, problem", [
    ({"sub_block_length": 5, "block_length": 32}, "sub_block_length: must divide block_length 32"),
    ({"sub_block_length": 8, "steps_per_block": 4}, "leave steps_per_block unset"),
    ({"sub_block_length": 8, "decoding": "factor"}, "setting of decoding='threshold'"),
])
def test_sub_block_settings_are_checked_by_name(fields, problem):
    with pytest.raises(ValueError, match=problem):
        EngineConfig(**fields)


def test_full_attention_window_settings_are_refused(lm):
    with pytest.raises(ValueError, match="shifted_decoding: 'lookback'"):
        BlockServeEngine(lm, EngineConfig(shifted_decoding="lookback"))
