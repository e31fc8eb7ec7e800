"""The block-causal families (SDAR, LLaDA2) in the engine: blocks at absolute positions, each finished
block's keys/values written once, every rule and schedule giving the single-request oracle's tokens.

The fixtures are tiny random checkpoints in each family's real layout (``scripts/make_fixtures``).
"""
from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from engine.oracle.reference import reference_generate
from engine.rules import rule_for
from tests.conftest import FIXTURES

FAMILIES = ("tiny-sdar", "tiny-llada2")
RULES = {  # decoding -> its other settings
    "low_confidence_dynamic": {"steps_per_block": 4, "threshold": 0.9},
    "low_confidence_static": {"steps_per_block": 2},
    "low_confidence": {"threshold": 0.95},
    "threshold": {"threshold": 0.9},
}
BLOCK = 4


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return load_model(FIXTURES / request.param)


def ordinary_prompts(lm, lengths, seed=0) -> list[list[int]]:
    """Prompts of ordinary (non-special) token ids; lengths put the answer at every offset in a block."""
    special = set(lm.tokenizer.all_special_ids) | {lm.special_ids.mask_id, *lm.special_ids.stop_ids}
    ordinary = [token for token in range(min(lm.vocab_size, 90)) if token not in special]
    rng = random.Random(seed)
    return [[rng.choice(ordinary) for _ in range(length)] for length in lengths]


def oracle(lm, prompt, config: EngineConfig, params: SamplingParams, cache="dual"):
    rule = rule_for(config)
    return reference_generate(lm, prompt, max_new_tokens=params.max_new_tokens, block_length=config.block_length,
                              rule=rule, cache=cache, temperature=params.temperature, seed=params.seed or 0,
                              stop_at_eos=params.stop_at_eos, top_k=params.top_k, logprobs=params.logprobs)


def mixed_params(count: int, seed: int = 0) -> list[SamplingParams]:
    rng = random.Random(seed)
    return [SamplingParams(max_new_tokens=rng.choice([3, 9, 14]), temperature=rng.choice([0.0, 0.8]), seed=index,
                           top_k=rng.choice([0, 5]), logprobs=rng.choice([None, 2])) for index in range(count)]


@pytest.mark.parametrize("decoding", sorted(RULES))
def test_batched_rows_equal_the_oracle_alone_for_every_rule(lm, decoding):
    config = EngineConfig(block_length=BLOCK, decoding=decoding, max_batch_size=3, **RULES[decoding])
    prompts = ordinary_prompts(lm, (5, 6, 7, 8, 9, 13, 3, 1, 22, 17))
    params = mixed_params(len(prompts))
    outputs = BlockServeEngine(lm, config).generate(prompts, params)
    for prompt, param, output in zip(prompts, params, outputs):
        alone = oracle(lm, prompt, config, param)
        assert output.token_ids == alone.token_ids
        assert output.num_steps == alone.num_steps
        assert_logprobs_close(output.logprobs, alone.logprobs)


def assert_logprobs_close(ours, theirs):
    """Same tokens and alternatives; values equal up to the float32 rounding of logits as large as 45
    (the engine fuses a finished block's store with the next block's first step, the oracle runs them
    apart: other GEMM shapes)."""
    if ours is None or theirs is None:
        assert ours is theirs
        return
    assert [(lp.token_id, [t for t, _ in lp.top]) for lp in ours] == [(lp.token_id, [t for t, _ in lp.top])
                                                                      for lp in theirs]
    flat = [value for lp in ours for value in (lp.logprob, *(v for _, v in lp.top))]
    assert flat == pytest.approx([value for lp in theirs for value in (lp.logprob, *(v for _, v in lp.top))],
                                 abs=1e-4)


@pytest.mark.parametrize("schedule", ["continuous", "block_sync", "shrink"])
def test_every_schedule_gives_the_oracles_tokens(lm, schedule):
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic", steps_per_block=4,
                          threshold=0.5, max_batch_size=3, schedule=schedule)
    prompts = ordinary_prompts(lm, (2, 11, 4, 7, 30, 5, 9), seed=1)
    params = [SamplingParams(max_new_tokens=4 + 5 * (index % 3), stop_at_eos=False) for index in range(len(prompts))]
    outputs = BlockServeEngine(lm, config).generate(prompts, params)
    assert [o.token_ids for o in outputs] == [oracle(lm, p, config, s).token_ids for p, s in zip(prompts, params)]


def test_requests_arriving_mid_flight_equal_the_oracle(lm):
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence", threshold=0.6, max_batch_size=4)
    engine = BlockServeEngine(lm, config)
    prompts = ordinary_prompts(lm, (3, 9, 6, 14, 1, 8), seed=2)
    params = SamplingParams(max_new_tokens=11, stop_at_eos=False)
    outputs = {}
    for prompt in prompts:
        engine.add_request(prompt, params, request_id=str(len(outputs) + len(engine._requests)))
        for output in engine.step().finished + engine.step().finished:
            outputs[output.request_id] = output
    while engine.has_unfinished_requests():
        outputs |= {output.request_id: output for output in engine.step().finished}
    for index, prompt in enumerate(prompts):
        assert outputs[str(index)].token_ids == oracle(lm, prompt, config, params).token_ids


def test_the_cached_oracle_equals_a_full_forward_every_step(lm):
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic", steps_per_block=4)
    params = SamplingParams(max_new_tokens=12, stop_at_eos=False)
    for prompt in ordinary_prompts(lm, (1, 4, 6, 11), seed=3):
        assert oracle(lm, prompt, config, params).token_ids == oracle(lm, prompt, config, params, "none").token_ids


def test_a_block_never_sees_later_blocks_so_a_longer_canvas_keeps_the_early_tokens(lm):
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic", steps_per_block=4)
    engine = BlockServeEngine(lm, config)
    prompts = ordinary_prompts(lm, (5, 10), seed=4)
    short = engine.generate(prompts, SamplingParams(max_new_tokens=7, stop_at_eos=False))
    long = engine.generate(prompts, SamplingParams(max_new_tokens=40, stop_at_eos=False))
    for a, b in zip(short, long):
        assert b.token_ids[:len(a.token_ids)] == a.token_ids


def test_the_answer_fills_the_prompts_last_block_and_the_row_ends_on_a_block(lm):
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence", max_batch_size=2)
    engine = BlockServeEngine(lm, config)
    prompts = ordinary_prompts(lm, (5, 8), seed=5)
    outputs = engine.generate(prompts, SamplingParams(max_new_tokens=6, stop_at_eos=False))
    # 5 prompt tokens: the first block holds 1 of them, so 5 + 6 rounds up to 12 columns (2 answer blocks);
    # 8 prompt tokens end a block, so 8 + 6 rounds up to 16 (2 answer blocks). Each answer keeps its 6.
    assert [len(o.token_ids) for o in outputs] == [6, 6]
    assert [o.num_blocks for o in outputs] == [2, 2]


def test_a_stop_token_in_the_prompts_part_of_the_first_block_does_not_stop_the_request(lm):
    stops = lm.special_ids.stop_ids
    prompt = ordinary_prompts(lm, (5,), seed=6)[0] + [stops[0]]  # the first block holds 2 prompt tokens
    never_stop = SamplingParams(max_new_tokens=8, logit_bias={stop: -100.0 for stop in stops})
    output = BlockServeEngine(lm, EngineConfig(block_length=BLOCK, decoding="low_confidence")).generate(
        [prompt], never_stop)[0]
    assert output.finish_reason == "length"
    assert len(output.token_ids) == 8  # 6 + 8 = 14 rounds up to 16 columns; the answer keeps its cap


def test_row_width_is_prompt_plus_answer_rounded_up_to_whole_blocks(lm):
    engine = BlockServeEngine(lm, EngineConfig(block_length=BLOCK, max_model_len=16))
    assert engine.limits.row_width(7, 4) == 12  # 7 + 4 = 11 -> 3 blocks
    assert engine.limits.prompt_room(SamplingParams(max_new_tokens=4)) == 12
    engine.check([1] * 12, SamplingParams(max_new_tokens=4))
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.check([1] * 13, SamplingParams(max_new_tokens=4))


@pytest.mark.parametrize("setting, message", [
    ({"cache": "prefix"}, "cache: 'prefix' is a cache mode of full-attention families"),
    ({"cache": "none"}, "cache: 'none'"),
    ({"decoding": "dream", "steps_per_block": 4}, "decoding: 'dream'"),
])
def test_settings_a_block_causal_family_cannot_honour_are_refused_by_name(lm, setting, message):
    with pytest.raises(ValueError, match=message):
        BlockServeEngine(lm, EngineConfig(block_length=BLOCK, **setting))


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_batched_rows_equal_each_row_alone_in_batch_invariant_mode(name):
    """Mixed rows at batch 4 (arrivals as rows leave, some rows storing a finished block beside others
    mid-block), bf16: a row's tokens and log-probabilities are bitwise those of its run alone."""
    lm = load_model(FIXTURES / name, dtype="bfloat16", batch_invariant=True)
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic", steps_per_block=4, max_batch_size=4)
    prompts = ordinary_prompts(lm, (5, 6, 7, 8, 9, 13, 3, 1, 22, 17))
    params = mixed_params(len(prompts))
    batched = BlockServeEngine(lm, config).generate(prompts, params)
    for prompt, param, output in zip(prompts, params, batched):
        alone = BlockServeEngine(lm, config).generate([prompt], [param])[0]
        assert (output.token_ids, output.logprobs) == (alone.token_ids, alone.logprobs)


@pytest.mark.parametrize("name, lengths, rows", [("tiny-sdar", (5, 6, 7, 8, 9, 13, 3, 1), 4),
                                                  ("tiny-llada2", (5, 13), 1)])  # MoE layers compile slowly
def test_a_compiled_float32_engine_gives_the_eager_engines_tokens(name, lengths, rows):
    """Block-causal parts through the compiled, bucketed forward: boxes grow on the right, windows of one
    or two blocks keep their length. LLaDA2's float32 experts run as one opaque grouped operation."""
    config = EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic", steps_per_block=4, max_batch_size=rows)
    eager, compiled = (load_model(FIXTURES / name, compile=flag) for flag in (False, True))
    prompts = ordinary_prompts(eager, lengths)
    params = [SamplingParams(max_new_tokens=9 + index % 3 * 4, stop_at_eos=False) for index in range(len(prompts))]
    expected = [o.token_ids for o in BlockServeEngine(eager, config).generate(prompts, params)]
    assert [o.token_ids for o in BlockServeEngine(compiled, config).generate(prompts, params)] == expected
    assert compiled.model.compiled.num_graphs > 0 and not compiled.model.compiled.compile_failures


@pytest.mark.parametrize("name", FAMILIES)
def test_a_compiled_prefill_writes_every_layers_keys_and_values_as_eager_does(name):
    """The window steps read what the prefill wrote, so a lost write in any layer changes every token after
    the first step. LLaDA2's layers are two kinds of region, and a region dynamo inlines loses the writes
    of the regions after it."""
    import torch

    config = EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic", steps_per_block=4, max_batch_size=2)
    caches = []
    for flag in (False, True):
        lm = load_model(FIXTURES / name, compile=flag)
        engine = BlockServeEngine(lm, config)
        engine.add_request(ordinary_prompts(lm, (5,))[0], SamplingParams(max_new_tokens=9))
        engine.step()  # the prefill: prompt and first block, columns [0, 8) of slot 0
        caches.append(engine.runner.rows.batch.kv_cache.data[:, 0, :, :, :2 * BLOCK])
    torch.testing.assert_close(caches[1], caches[0], rtol=0, atol=1e-4)


def test_a_compiled_bf16_moe_model_gives_the_eager_logits_up_to_rounding_and_routing_flips():
    """LLaDA2 in bf16, compiled: its experts trace as grouped GEMMs. Its logits equal eager's up to
    bf16 rounding, except where rounding moved a token to another expert (a discontinuous choice)."""
    import torch

    eager, compiled = (load_model(FIXTURES / "tiny-llada2", dtype="bfloat16", compile=flag) for flag in (False, True))
    tokens = torch.randint(3, 80, (2, 12), generator=torch.Generator().manual_seed(0))
    positions, key_mask = torch.arange(12).expand(2, 12), torch.ones(2, 12, dtype=torch.bool)
    logits = [lm.model.logits(lm.model.forward_full(tokens, positions, key_mask, block_size=BLOCK)).float()
              for lm in (eager, compiled)]
    per_position = (logits[0] - logits[1]).abs().amax(-1).flatten()
    assert (per_position <= 0.25).float().mean() >= 0.9  # a bf16 ulp at |logit| 32-64 is 0.25
    assert not compiled.model.compiled.compile_failures and compiled.model.compiled.num_graphs > 0


def test_the_padding_of_a_block_causal_step_counts_the_columns_up_to_each_rows_active_block(lm):
    engine = BlockServeEngine(lm, EngineConfig(block_length=BLOCK, decoding="low_confidence", max_batch_size=4))
    engine.generate(ordinary_prompts(lm, (3, 9, 14, 22), seed=7), SamplingParams(max_new_tokens=12, stop_at_eos=False))
    assert 0.0 <= engine.stats().padding_fraction < 1.0


def test_only_each_rows_real_tokens_go_through_the_linear_layers(lm, monkeypatch):
    """A window row that rewrites its finished block is two blocks long and the others one; prompts of
    different lengths prefill boxes of different widths. The linear layers see the real tokens alone,
    packed, never a row padded to the longest one."""
    from engine.models.transformer import BidirectionalTransformer

    seen, real, boxes = [], [], []
    forward = BidirectionalTransformer.forward_step_eager

    def counting(model, refresh, window, kv_cache):
        parts = [(refresh, refresh and refresh.row_widths), (window, window and window.row_tokens)]
        real.append(sum(sum(tokens) for part, tokens in parts if part is not None))
        boxes.append(sum(part.tokens.numel() for part, _ in parts if part is not None))
        return forward(model, refresh, window, kv_cache)

    monkeypatch.setattr(BidirectionalTransformer, "forward_step_eager", counting)
    engine = BlockServeEngine(lm, EngineConfig(block_length=BLOCK, decoding="low_confidence_dynamic",
                                               steps_per_block=4, threshold=0.9, max_batch_size=4))
    hook = lm.model.layers[0].attention.qkv_proj.register_forward_hook(lambda _, args, out: seen.append(len(args[0])))
    try:
        engine.generate(ordinary_prompts(lm, (3, 9, 14, 22), seed=7), SamplingParams(max_new_tokens=12))
    finally:
        hook.remove()
    assert seen == real and sum(real) < sum(boxes)
    assert sum(record.forward_tokens for record in engine.stats_collector.trace) == sum(real)
