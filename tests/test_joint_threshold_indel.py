"""LLaDA2.2's insert / delete editing (``decoding="joint_threshold_indel"``) on the tiny LLaDA2.2-layout checkpoint.

Checked outside the project against SGLang 0.5.23's ``JointThresholdInDel`` (the wheel's
``sglang/srt/dllm/algorithm/joint_threshold_indel.py``, unmodified, over three shims of what it imports: its base
class's ``__init__``, ``DllmConfig``'s fields, ``ForwardBatch``'s fields), driven as its ``_run_sync`` drives it
(a forward, then ``step`` until done, at most ``max_steps``) over our *uncached* forward of the canvas up to the
block's end (``forward_full``: strict block-causal, block routing per absolute block), with the engine's stop-id
logit bias of -100 on both sides, float32: ``PYTHONPATH=<shims>:. python ref_indel.py``. Eight prompts of 3 to 77
tokens (partial prompt blocks), 80 answer tokens, settings (threshold, editing_threshold, max_post_steps) =
(0.5, 0.0, 16), (0.9, 0.5, 16), (0.5, 0.0, 2), (0.5, 0.0, 0): the engine's answers, batched (8 rows) and alone,
equalled the reference's in 32 of 32, with 491 deletes, 2,630 splits and the anti-loop in 32 steps of the
defaults' run. The tests below keep what needs no reference: batched equals alone, every setting at once.
Also checked outside, on the workload below: ``load_model(compile=True)`` gave batched == alone == eager, and
``dtype="bfloat16", batch_invariant=True`` batched == alone (``python check_modes.py compile`` / ``bf16``).
"""
from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from engine.rules.joint_threshold_indel import JointThresholdIndel
from scripts.make_llada22_fixture import write_llada22

SETTINGS = ({}, {"editing_threshold": 0.5}, {"max_post_steps": 2}, {"max_post_steps": 0})  # per request


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_model(write_llada22(tmp_path_factory.mktemp("tiny-llada2.2")), dtype="float32")


def rule(**settings) -> JointThresholdIndel:
    return JointThresholdIndel(**{"mask_id": 9, "delete_token_id": 7, "split_token_id": 8} | settings)


@pytest.mark.parametrize("written, tokens, flags", [
    ([1, 7, 8, 4, 5, 9], [1, 9, 3, 4, 5, 9], [False, False, False, False, False, True]),  # delete, then split
    ([1, 8, 8, 4, 5, 6], [1, 9, 2, 9, 3, 4], [False] * 6),  # two splits: the last two tokens fall off
    ([7, 7, 7, 4, 5, 6], [7, 4, 5, 6, 9, 9],  # the prompt's DELETE id stays; masks pad the end
     [False, False, False, True, False, False]),  # an original mask's flag moves with its position
])
def test_delete_shifts_left_and_split_inserts_a_mask_before_the_old_token(written, tokens, flags):
    old = torch.tensor([[1, 2, 3, 4, 5, 9]])
    original = torch.tensor([[False, False, False, False, False, True]])
    prompt = torch.tensor([[True, False, False, False, False, False]])
    new_tokens, new_flags = rule()._insert_delete(torch.tensor([written]), old, original, prompt)
    assert new_tokens.tolist() == [tokens] and new_flags.tolist() == [flags]


def workload(lm) -> tuple[list[list[int]], list[SamplingParams]]:
    rng, bias = random.Random(0), {stop: -100.0 for stop in lm.special_ids.stop_ids}
    prompts = [[rng.randrange(0, 92) for _ in range(length)] for length in (5, 40, 64, 17)]
    return prompts, [SamplingParams(max_new_tokens=40, stop_at_eos=False, logit_bias=bias, **setting)
                     for setting in SETTINGS]


def test_rows_in_a_batch_equal_each_row_alone_in_every_setting(lm):
    prompts, params = workload(lm)
    batched = BlockServeEngine(lm, EngineConfig(max_batch_size=4))
    together = [output.token_ids for output in batched.generate(prompts, params)]
    alone = BlockServeEngine(lm, EngineConfig(max_batch_size=1))
    assert together == [alone.generate([prompt], param)[0].token_ids for prompt, param in zip(prompts, params)]
    counters = batched.stats().counters
    assert counters["deletes"] > 0 and counters["splits"] > 0 and counters["edits"] > 0
    assert all(len(tokens) == 40 and lm.special_ids.mask_id not in tokens for tokens in together)


def test_a_llada22_checkpoint_decodes_with_its_editing_by_default(lm):
    engine = BlockServeEngine(lm, EngineConfig())
    assert engine.rule == rule(threshold=0.5, editing_threshold=0.0, max_post_steps=16, mask_id=lm.special_ids.mask_id,
                               delete_token_id=lm.generation_settings["delete_token_id"],
                               split_token_id=lm.generation_settings["split_token_id"])
    assert engine.config.threshold == 0.5


def test_a_checkpoint_without_delete_and_split_ids_is_refused(tmp_path):
    bare = load_model(write_llada22(tmp_path, with_edit_ids=False), dtype="float32")
    with pytest.raises(ValueError, match="needs delete_token_id and split_token_id: the checkpoint's config.json"):
        BlockServeEngine(bare, EngineConfig())


def test_ids_that_clash_with_the_mask_are_refused(lm):
    with pytest.raises(ValueError, match="distinct MASK, DELETE and SPLIT ids"):
        BlockServeEngine(lm, EngineConfig(delete_token_id=lm.special_ids.mask_id))


@pytest.mark.parametrize("params, field", [(SamplingParams(temperature=0.7), "temperature"),
                                           (SamplingParams(logprobs=1), "logprobs")])
def test_sampling_and_logprobs_are_refused_by_name(params, field):
    assert rule().request_problem(params).startswith(f"{field} is not offered for decoding 'joint_threshold_indel'")


def test_cached_prompt_blocks_give_the_tokens_of_an_uncached_run(lm):
    prompts, params = workload(lm)
    prompt, param = prompts[0] * 14, params[0]  # 70 tokens: two whole blocks to cache, a partial one decoded
    cached = BlockServeEngine(lm, EngineConfig(max_batch_size=2))
    first, second = (cached.generate([prompt], param)[0].token_ids for _ in range(2))
    assert cached.stats().cached_prompt_tokens == 64
    uncached = BlockServeEngine(lm, EngineConfig(max_batch_size=2, enable_prefix_caching=False))
    assert first == second == uncached.generate([prompt], param)[0].token_ids


@pytest.mark.usefixtures("one_thread_per_rank")
def test_two_tensor_parallel_ranks_give_one_devices_tokens(tmp_path):
    """Each rank routes every token with the whole gate; the rule reads the logits joined over the ranks."""
    model = write_llada22(tmp_path)
    lm64 = load_model(model, dtype="float64")
    prompts, params = (values[:2] for values in workload(lm64))
    whole = BlockServeEngine(lm64, EngineConfig(max_batch_size=2))
    with BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=2, tensor_parallel_size=2),
                                          dtype="float64") as split:
        assert [o.token_ids for o in split.generate(prompts, params)] == [
            o.token_ids for o in whole.generate(prompts, params)]
    assert split.stats().counters["deletes"] > 0
