"""Prefix caching: a block-causal model's whole prompt blocks are computed once and read by every later
request that starts with the same tokens, and no answer changes."""
from __future__ import annotations

import random

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import load_model
from tests.conftest import FIXTURES

FAMILIES = ("tiny-sdar", "tiny-llada2")


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return load_model(FIXTURES / request.param)


def ordinary_tokens(lm) -> list[int]:
    special = set(lm.tokenizer.all_special_ids) | {lm.special_ids.mask_id, *lm.special_ids.stop_ids}
    return [token for token in range(min(lm.vocab_size, 90)) if token not in special]


def shared_instruction(lm, count: int, instruction: int = 70, seed: int = 0) -> list[list[int]]:
    """``count`` prompts of one instruction and a question of 1 to 9 tokens: the last prompt block is
    partial for most of them."""
    rng, ordinary = random.Random(seed), ordinary_tokens(lm)
    head = [rng.choice(ordinary) for _ in range(instruction)]
    return [head + [rng.choice(ordinary) for _ in range(rng.randint(1, 9))] for _ in range(count)]


def run(lm, prompts, caching: bool, **settings):
    engine = BlockServeEngine(lm, EngineConfig(decoding="low_confidence", enable_prefix_caching=caching,
                                               **settings))
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=20, stop_at_eos=False))
    return engine, outputs


@pytest.mark.parametrize("max_batch_size", [16, 1])
def test_answers_are_identical_with_the_cache_on_and_off(lm, max_batch_size):
    prompts = shared_instruction(lm, 24)
    cold, without = run(lm, prompts, caching=False, max_batch_size=max_batch_size)
    warm, with_cache = run(lm, prompts, caching=True, max_batch_size=max_batch_size)
    assert [o.token_ids for o in with_cache] == [o.token_ids for o in without]
    assert warm.stats().cached_prompt_tokens > 0 and cold.stats().cached_prompt_tokens == 0
    forwarded = [sum(record.forward_tokens for record in e.stats_collector.trace) for e in (cold, warm)]
    assert forwarded[1] < forwarded[0]


def test_requests_arriving_with_a_prefixs_first_owner_wait_one_step_and_read_it(lm):
    prompts = shared_instruction(lm, 24)
    engine, outputs = run(lm, prompts, caching=True, max_batch_size=16)
    _, without = run(lm, prompts, caching=False, max_batch_size=16)
    whole_instruction_blocks = 70 // engine.config.block_length * engine.config.block_length
    # one row prefills the instruction at the first step; the 15 that arrived with it wait that step
    assert sorted(o.num_cached_tokens for o in outputs) == [0] + [whole_instruction_blocks] * 23
    assert engine.scheduler.prefix_waits == 15
    assert [record.rows for record in list(engine.stats_collector.trace)[:2]] == [1, 16]
    assert [o.token_ids for o in outputs] == [o.token_ids for o in without]


def test_a_shared_run_under_64_tokens_is_computed_again_rather_than_waited_for(lm):
    prompts = shared_instruction(lm, 24, instruction=40)
    engine, outputs = run(lm, prompts, caching=True, max_batch_size=16)
    whole_instruction_blocks = 40 // engine.config.block_length * engine.config.block_length
    assert engine.scheduler.prefix_waits == 0
    assert sorted(o.num_cached_tokens for o in outputs) == [0] * 16 + [whole_instruction_blocks] * 8


def test_block_synchronous_admission_never_holds_a_request_back_for_a_prefix(lm):
    engine, outputs = run(lm, shared_instruction(lm, 24), caching=True, max_batch_size=16, schedule="block_sync")
    assert engine.scheduler.prefix_waits == 0
    assert sorted(o.num_cached_tokens for o in outputs)[:16] == [0] * 16


def test_the_prompts_last_partial_block_is_never_taken_from_the_cache(lm):
    prompts = shared_instruction(lm, 2, instruction=70)
    prompts[1] = list(prompts[0])  # the same prompt twice: everything but its lead block is cached
    engine, outputs = run(lm, [prompts[0]], caching=True, max_batch_size=1)
    again = engine.generate([prompts[1]], SamplingParams(max_new_tokens=20, stop_at_eos=False))[0]
    block = engine.config.block_length
    assert again.num_cached_tokens == len(prompts[1]) // block * block
    assert again.num_cached_tokens < len(prompts[1]) or len(prompts[1]) % block == 0
    assert again.token_ids == outputs[0].token_ids


def test_a_small_cache_evicts_least_recently_used_blocks_and_answers_stay_identical(lm):
    prompts = [p for seed in range(6) for p in shared_instruction(lm, 3, instruction=40, seed=seed)]
    block = lm.block_length
    settings = dict(max_batch_size=2, prefix_cache_tokens=2 * (40 // block) * block)  # two instructions' worth
    _, without = run(lm, prompts, caching=False, **settings)
    engine, with_cache = run(lm, prompts, caching=True, **settings)
    assert [o.token_ids for o in with_cache] == [o.token_ids for o in without]
    index = engine.runner.prefix_cache.index
    assert index.evictions > 0 and len(index) <= index.capacity
    assert engine.stats().cached_prompt_tokens > 0


def test_block_causal_families_cache_by_default_and_full_attention_ones_refuse_it_by_name(lm):
    assert BlockServeEngine(lm, EngineConfig()).config.enable_prefix_caching is True
    tiny = load_model("tiny")
    assert BlockServeEngine(tiny, EngineConfig()).config.enable_prefix_caching is False
    with pytest.raises(ValueError, match="enable_prefix_caching: llada attends over the whole row"):
        BlockServeEngine(tiny, EngineConfig(enable_prefix_caching=True))


@pytest.mark.parametrize("options", [{"dtype": "bfloat16", "batch_invariant": True}, {"compile": True}],
                         ids=["bf16-batch-invariant", "compiled"])
def test_answers_are_identical_with_the_cache_on_and_off_in_bf16_and_compiled(options):
    lm = load_model(FIXTURES / "tiny-sdar", **options)
    prompts = shared_instruction(lm, 24)
    _, without = run(lm, prompts, caching=False, max_batch_size=16)
    engine, with_cache = run(lm, prompts, caching=True, max_batch_size=16)
    assert [o.token_ids for o in with_cache] == [o.token_ids for o in without]
    assert engine.stats().cached_prompt_tokens > 0


def test_a_conversations_next_turn_reads_the_earlier_answer_from_the_cache_too(lm):
    first = shared_instruction(lm, 1, instruction=50)[0]
    engine, (answer,) = run(lm, [first], caching=True, max_batch_size=1)
    follow_up = first + answer.token_ids + ordinary_tokens(lm)[:5]
    second = engine.generate([follow_up], SamplingParams(max_new_tokens=20, stop_at_eos=False))[0]
    block = engine.config.block_length
    assert second.num_cached_tokens == (len(first) + len(answer.token_ids)) // block * block
    _, (alone,) = run(lm, [follow_up], caching=False, max_batch_size=1)
    assert second.token_ids == alone.token_ids
    assert engine.stats().prefix_cache_hit_rate > 0


def test_the_index_never_exceeds_its_entries_orphans_a_block_or_shares_an_entry():
    from engine.scheduling.prefix_index import PrefixIndex

    rng = random.Random(0)
    index = PrefixIndex(capacity=20, block_length=4)
    heads = [[rng.randrange(50) for _ in range(16)] for _ in range(10)]
    for _ in range(500):
        tokens = rng.choice(heads) + [rng.randrange(50) for _ in range(8)]
        index.match(tokens, 6)
        index.insert(tokens, 6)
        blocks = list(index._blocks.values())
        assert len(blocks) <= 20
        assert all(block.parent is None or block.parent.cached for block in blocks)
        assert all(block.children == sum(other.parent is block for other in blocks) for block in blocks)
        assert len({block.entry for block in blocks}) == len(blocks)
    assert index.evictions > 0
