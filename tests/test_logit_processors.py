"""top_k, top_p and logit_bias: what each does to a distribution, and batched decoding == the oracle.

Golden tests run in float64: a batch mixing rows with and without these settings gives every request
exactly the tokens ``reference_generate`` gives it alone.
"""
from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.oracle.reference import reference_generate
from engine.runner.logit_processors import TokenFilters, filter_top_k_top_p

INF = float("-inf")


def kept(scaled: list[float], top_k: int = 0, top_p: float = 1.0) -> list[bool]:
    logits = torch.tensor([[scaled]], dtype=torch.float64)
    filters = TokenFilters(torch.tensor([top_k]), torch.tensor([top_p], dtype=torch.float64))
    return (filter_top_k_top_p(logits, filters) > INF)[0, 0].tolist()


def test_top_k_keeps_the_k_largest_and_ties_with_the_kth():
    assert kept([1.0, 3.0, 2.0, 0.0], top_k=2) == [False, True, True, False]
    assert kept([1.0, 2.0, 2.0, 0.0], top_k=1) == [False, True, True, False]
    assert kept([1.0, 3.0, 2.0, 0.0], top_k=0) == [True] * 4  # 0: off
    assert kept([1.0, 3.0, 2.0, 0.0], top_k=99) == [True] * 4


def test_top_p_keeps_the_smallest_prefix_reaching_p_and_always_the_top_token():
    probabilities = [0.5, 0.3, 0.15, 0.05]
    logits = [float(torch.tensor(p).log()) for p in probabilities]
    assert kept(logits, top_p=0.5) == [True, False, False, False]
    assert kept(logits, top_p=0.6) == [True, True, False, False]
    assert kept(logits, top_p=0.9) == [True, True, True, False]
    assert kept(logits, top_p=0.01) == [True, False, False, False]
    assert kept(logits, top_k=2, top_p=0.9) == [True, True, False, False]  # top-k first


def test_a_row_is_filtered_the_same_alone_and_in_a_batch():
    generator = torch.Generator().manual_seed(0)
    scaled = torch.randn(5, 4, 50, generator=generator, dtype=torch.float64)
    filters = TokenFilters(torch.tensor([0, 3, 10, 1, 0]),
                           torch.tensor([0.7, 1.0, 0.9, 1.0, 0.2], dtype=torch.float64))
    batched = filter_top_k_top_p(scaled.clone(), filters)
    for row in range(5):
        alone = filter_top_k_top_p(scaled[row:row + 1].clone(),
                                   TokenFilters(filters.top_k[row:row + 1], filters.top_p[row:row + 1]))
        assert torch.equal(batched[row:row + 1], alone)


def test_a_strong_logit_bias_forces_and_bans_tokens(tiny_engine_factory):
    engine = tiny_engine_factory(dtype="float64", max_batch_size=2)
    forced = engine.lm.tokenizer.convert_tokens_to_ids("7")
    (output,) = engine.generate(["count from 1 to 5"], SamplingParams(
        max_new_tokens=32, stop_at_eos=False, logit_bias={forced: 100.0}))
    assert output.token_ids == [forced] * 32
    plain = engine.generate(["count from 1 to 5"], SamplingParams(max_new_tokens=32))[0]
    if plain.token_ids:
        banned = plain.token_ids[0]
        (output,) = engine.generate(["count from 1 to 5"], SamplingParams(
            max_new_tokens=32, logit_bias={banned: -100.0}))
        assert banned not in output.token_ids


@pytest.mark.parametrize("cache", ["dual", "none"])
def test_batched_decoding_with_top_k_top_p_and_logit_bias_equals_the_oracle(tiny_engine_factory, heldout_rows,
                                                                             cache):
    engine = tiny_engine_factory(dtype="float64", max_batch_size=4, cache=cache)
    lm = engine.lm
    seven, nine = lm.tokenizer.convert_tokens_to_ids(["7", "9"])
    settings = [  # sampled and greedy rows, with and without each setting, side by side
        dict(temperature=1.0, seed=3, top_k=5),
        dict(temperature=0.0),
        dict(temperature=0.8, seed=4, top_p=0.6),
        dict(temperature=1.2, seed=5, top_k=20, top_p=0.9, logit_bias={seven: 2.0, nine: -3.0}),
        dict(temperature=0.0, logit_bias={seven: 1.5}),
        dict(temperature=1.0, seed=6),
    ]
    prompts = [lm.tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)
               for row in heldout_rows[:len(settings)]]
    params = [SamplingParams(max_new_tokens=64, **setting) for setting in settings]
    outputs = engine.generate(prompts, params)
    for prompt, setting, output in zip(prompts, settings, outputs):
        alone = reference_generate(lm, prompt, max_new_tokens=64, cache=cache, **setting)
        assert output.token_ids == alone.token_ids, setting
        assert output.num_steps == alone.num_steps, setting


def test_bad_values_are_the_requests_own_error(tiny_engine_factory):
    engine = tiny_engine_factory(dtype="float64", max_batch_size=2)
    cases = [SamplingParams(top_k=-1), SamplingParams(top_p=0.0), SamplingParams(top_p=1.5),
             SamplingParams(logit_bias={"7": 1.0}), SamplingParams(logit_bias={7: 500.0}),
             SamplingParams(logit_bias={engine.lm.vocab_size: 1.0})]
    outputs = engine.generate(["count from 1 to 5"] * len(cases), cases)
    assert [output.finish_reason for output in outputs] == ["error"] * len(cases)
    assert all(("top_" in o.error or "logit_bias" in o.error) for o in outputs)


def test_ray_data_rows_take_top_k_top_p_and_logit_bias_with_vllm_conventions():
    from actors.ray_data.row_params import sampling_params_for_row

    defaults = SamplingParams(max_new_tokens=32)
    params = sampling_params_for_row(defaults, {"top_k": -1.0, "top_p": 0.9, "temperature": 0.7,
                                                "logit_bias": {"7": 5.0, "12": None}})
    assert (params.top_k, params.top_p, params.logit_bias) == (0, 0.9, {7: 5.0})
    assert sampling_params_for_row(defaults, {"top_k": 4.0}).top_k == 4
    assert "logit_bias" in sampling_params_for_row(defaults, {"logit_bias": {"seven": 1.0}})
    for refused in ("frequency_penalty", "logprobs"):
        assert f"unsupported key(s) ['{refused}']" in sampling_params_for_row(defaults, {refused: 1})


@pytest.mark.parametrize("cache", ["dual", "none"])
def test_logprobs_are_each_tokens_at_its_commit_step_batched_as_alone(tiny_engine_factory, heldout_rows, cache):
    engine = tiny_engine_factory(dtype="float64", max_batch_size=4, cache=cache)
    lm = engine.lm
    seven = lm.tokenizer.convert_tokens_to_ids("7")
    settings = [dict(logprobs=2), dict(temperature=0.0), dict(temperature=1.0, seed=2, top_k=4, logprobs=0),
                dict(logprobs=5, logit_bias={seven: 3.0})]
    prompts = [lm.tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}],
                                                add_generation_prompt=True, tokenize=True, return_dict=False)
               for row in heldout_rows[:len(settings)]]
    outputs = engine.generate(prompts, [SamplingParams(max_new_tokens=64, stop_at_eos=False, **setting)
                                        for setting in settings])
    for prompt, setting, output in zip(prompts, settings, outputs):
        alone = reference_generate(lm, prompt, max_new_tokens=64, cache=cache, stop_at_eos=False, **setting)
        assert output.token_ids == alone.token_ids
        if setting.get("logprobs") is None:
            assert output.logprobs is None
            continue
        assert [entry.token_id for entry in output.logprobs] == output.token_ids
        for entry, solo in zip(output.logprobs, alone.logprobs):
            assert entry.logprob == pytest.approx(solo.logprob, abs=1e-9) and entry.logprob <= 0
            assert [token for token, _ in entry.top] == [token for token, _ in solo.top]
            assert len(entry.top) == setting["logprobs"]
            if not setting.get("temperature") and entry.top:  # greedy: the token is the most likely one
                assert entry.top[0][0] == entry.token_id
