"""``decoding="joint_threshold"`` (LLaDA2.1's token editing) in the engine, on the block-causal fixtures at
their trained blocks: batching changes no row, a request's own editing settings are honoured or refused by
name, the rule is refused where attention is not block-causal, an edited token's log-probability is its
final token's, the counts of edits and post-mask forwards, the budget, the prefix cache, a compiled model,
and requests arriving while others edit. diffusers' tokens: ``tests/test_llada21_reference.py``.

tiny-llada2's random head never settles: once a block holds no mask its tokens flip at every forward, so
each of its blocks spends its whole post-mask budget; tiny-sdar's blocks often settle first.
"""
from __future__ import annotations

import dataclasses

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from engine.oracle.reference_block_causal import block_causal_generate
from engine.rules import rule_for
from tests.conftest import FIXTURES
from tests.engine_helpers import StepRecorder
from tests.test_block_causal_engine import assert_logprobs_close, mixed_params, ordinary_prompts
from tests.test_prefix_cache import shared_instruction

FAMILIES = ("tiny-sdar", "tiny-llada2")
S_MODE = {"threshold": 0.5, "editing_threshold": 0.0}  # the model card's speed mode
Q_MODE = {"threshold": 0.7, "editing_threshold": 0.5}  # its quality mode
LENGTHS = (5, 6, 7, 8, 9, 13, 3, 1, 22, 17)  # answers start at every offset of a block of 4


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return load_model(FIXTURES / request.param)


def editing(lm, max_batch_size: int = 4, **settings) -> EngineConfig:
    return EngineConfig(decoding="joint_threshold", block_length=lm.block_length, max_batch_size=max_batch_size,
                        **(S_MODE | settings))


def prompts_over_blocks(lm, count: int, seed: int = 0) -> list[list[int]]:
    """Prompts of LENGTHS scaled to the fixture's block: answers start at different offsets and blocks."""
    return ordinary_prompts(lm, [length * lm.block_length // 4 for length in LENGTHS[:count]], seed)


def answers(lm, config: EngineConfig, prompts, params) -> list[list[int]]:
    return [output.token_ids for output in BlockServeEngine(lm, config).generate(prompts, params)]


def long_params(lm, count: int, **settings) -> list[SamplingParams]:
    """Answers of one to three blocks that never stop early."""
    return [SamplingParams(max_new_tokens=lm.block_length * (1 + index % 3), stop_at_eos=False, **settings)
            for index in range(count)]


@pytest.mark.parametrize("name", FAMILIES)
def test_bf16_batched_rows_equal_each_row_alone_in_batch_invariant_mode(name):
    """Mixed rows (greedy and sampled, logprobs, S and Q editing thresholds per request) at batch 4, rows
    joining and leaving at different blocks: a row's tokens and log-probabilities are bitwise those of its
    run alone."""
    lm = load_model(FIXTURES / name, dtype="bfloat16", batch_invariant=True)
    config = editing(lm)
    prompts = prompts_over_blocks(lm, 6)
    params = [p if index % 2 else dataclasses.replace(p, editing_threshold=0.5, max_post_steps=3)
              for index, p in enumerate(mixed_params(len(prompts)))]
    engine = BlockServeEngine(lm, config)
    recorder = StepRecorder(engine)
    batched = engine.generate(prompts, params)
    assert recorder.saw_mixed_batch and engine.stats().counters["edits"] > 0
    for prompt, param, output in zip(prompts, params, batched):
        alone = BlockServeEngine(lm, config).generate([prompt], [param])[0]
        assert (output.token_ids, output.logprobs) == (alone.token_ids, alone.logprobs)


def test_float32_batched_rows_equal_each_row_alone_and_the_oracle(lm):
    config = editing(lm, **Q_MODE)
    prompts = prompts_over_blocks(lm, len(LENGTHS))
    params = mixed_params(len(prompts))
    batched = BlockServeEngine(lm, config).generate(prompts, params)
    for prompt, param, output in zip(prompts, params, batched):
        alone = BlockServeEngine(lm, config).generate([prompt], [param])[0]
        oracle = block_causal_generate(lm, prompt, max_new_tokens=param.max_new_tokens, block_length=lm.block_length,
                                       rule=rule_for(config), temperature=param.temperature, seed=param.seed,
                                       top_k=param.top_k, logprobs=param.logprobs)
        assert output.token_ids == alone.token_ids == oracle.token_ids
        assert_logprobs_close(output.logprobs, alone.logprobs)
        assert_logprobs_close(output.logprobs, oracle.logprobs)


def test_a_requests_own_editing_settings_equal_an_engine_configured_with_them(lm):
    """Requests that carry Q mode's editing_threshold and a budget of 2 run beside requests that take the
    engine's S mode; each gives what an engine configured with its settings gives."""
    prompts = ordinary_prompts(lm, LENGTHS, seed=1)
    own = {"editing_threshold": 0.5, "max_post_steps": 2}
    params = [SamplingParams(max_new_tokens=2 * lm.block_length, stop_at_eos=False, **(own if i % 2 else {}))
              for i in range(len(prompts))]
    mixed = answers(lm, editing(lm), prompts, params)
    plain = [SamplingParams(max_new_tokens=p.max_new_tokens, stop_at_eos=False) for p in params]
    engine_s = answers(lm, editing(lm), prompts, plain)
    engine_own = answers(lm, editing(lm, **own), prompts, plain)
    assert mixed[0::2] == engine_s[0::2]
    assert mixed[1::2] == engine_own[1::2]
    assert engine_own[1::2] != engine_s[1::2]  # the settings matter on this fixture


@pytest.mark.parametrize("field, value", [("editing_threshold", 1.5), ("editing_threshold", -0.1),
                                          ("editing_threshold", True), ("max_post_steps", -1),
                                          ("max_post_steps", 2.5), ("max_post_steps", True)])
def test_a_bad_editing_setting_fails_its_request_alone_naming_the_field(lm, field, value):
    prompts = ordinary_prompts(lm, (5, 9))
    bad = SamplingParams(max_new_tokens=4, **{field: value})
    outputs = BlockServeEngine(lm, editing(lm)).generate(prompts, [bad, SamplingParams(max_new_tokens=4)])
    assert outputs[0].finish_reason == "error" and outputs[0].error.startswith(f"{field} must be")
    assert repr(value) in outputs[0].error
    assert outputs[1].finish_reason in ("length", "eos") and outputs[1].token_ids


@pytest.mark.parametrize("field, value", [("editing_threshold", 0.5), ("max_post_steps", 3)])
def test_an_editing_setting_on_a_request_to_another_rule_is_refused_by_name(lm, field, value):
    config = EngineConfig(decoding="low_confidence_dynamic", steps_per_block=4, threshold=0.95,
                          block_length=lm.block_length)
    output = BlockServeEngine(lm, config).generate(ordinary_prompts(lm, (5,)),
                                                   SamplingParams(max_new_tokens=4, **{field: value}))[0]
    assert output.finish_reason == "error"
    assert output.error.startswith(f"{field} is a setting of decoding='joint_threshold'")
    assert "'low_confidence_dynamic'" in output.error


@pytest.mark.parametrize("name, kind, instead", [("tiny-llada", "bidirectional", "low_confidence_dynamic"),
                                                  ("tiny-diffusion_gemma", "canvas", "entropy_bound")])
def test_joint_threshold_is_refused_by_name_where_rows_are_not_block_causal(name, kind, instead):
    lm = load_model(FIXTURES / name)
    with pytest.raises(ValueError, match=f"EngineConfig.decoding: 'joint_threshold' .* needs block-causal "
                                         f"rows; .* rows are {kind}: use {instead}"):
        BlockServeEngine(lm, EngineConfig(decoding="joint_threshold", editing_threshold=0.0))


def test_an_edited_positions_logprob_is_its_final_tokens(lm):
    """With a budget of 0 a block is final at its last mask; with 1, one more forward rewrites tokens of
    the same first block (the runs agree up to then). Those positions report the token they ended with."""
    prompts = ordinary_prompts(lm, LENGTHS[:6], seed=2)
    params = SamplingParams(max_new_tokens=2 * lm.block_length, stop_at_eos=False, logprobs=2)
    at_last_mask, edited = (BlockServeEngine(lm, editing(lm, max_post_steps=m)).generate(prompts, params)
                            for m in (0, 1))
    rewritten = 0
    for before, after in zip(at_last_mask, edited):
        first_block = lm.block_length - len(after.prompt_token_ids) % lm.block_length
        changed = [i for i in range(first_block) if before.token_ids[i] != after.token_ids[i]]
        assert [after.logprobs[i].token_id for i in changed] == [after.token_ids[i] for i in changed]
        assert [lp.token_id for lp in after.logprobs] == after.token_ids
        rewritten += len(changed)
    assert rewritten > 0


def test_the_engine_counts_edits_post_mask_forwards_and_tokens_per_forward(lm):
    prompts = ordinary_prompts(lm, LENGTHS, seed=3)
    params = long_params(lm, len(prompts))
    runs = {}
    for name, settings in {"off": {"editing_threshold": None}, "budget 1": {"max_post_steps": 1}, "S": {}}.items():
        engine = BlockServeEngine(lm, editing(lm, **settings))
        outputs = engine.generate(prompts, params)
        runs[name] = stats = engine.stats()
        assert stats.row_forwards == sum(output.num_steps for output in outputs)
        assert stats.generated_tokens == sum(len(output.token_ids) for output in outputs)
        assert stats.tokens_per_forward == stats.generated_tokens / stats.row_forwards
    off, one, s_mode = runs.values()
    assert (off.counters["edits"], off.counters["post_mask_forwards"]) == (0, 0)
    assert one.counters["post_mask_forwards"] == one.blocks_decoded  # one forward after each block's last mask
    assert s_mode.counters["edits"] > 0
    assert one.blocks_decoded < s_mode.counters["post_mask_forwards"] <= 16 * s_mode.blocks_decoded
    assert off.tokens_per_forward > s_mode.tokens_per_forward


def test_a_budget_of_zero_ends_each_block_at_its_last_mask(lm):
    """No forward after a block's last mask; tokens are still edited while masks remain, as the oracle does."""
    config = editing(lm, max_post_steps=0)
    prompts = ordinary_prompts(lm, LENGTHS, seed=4)
    params = long_params(lm, len(prompts))
    engine = BlockServeEngine(lm, config)
    outputs = engine.generate(prompts, params)
    assert engine.stats().counters["post_mask_forwards"] == 0 and engine.stats().counters["edits"] > 0
    for prompt, param, output in zip(prompts, params, outputs):
        assert output.num_steps <= output.num_blocks * lm.block_length
        oracle = block_causal_generate(lm, prompt, max_new_tokens=param.max_new_tokens, block_length=lm.block_length,
                                       rule=rule_for(config), stop_at_eos=False)
        assert (output.token_ids, output.num_steps) == (oracle.token_ids, oracle.num_steps)


def test_prefix_caching_changes_no_edited_answer(lm):
    prompts = shared_instruction(lm, 8)
    params = long_params(lm, len(prompts))
    runs = {}
    for caching in (False, True):
        engine = BlockServeEngine(lm, dataclasses.replace(editing(lm), enable_prefix_caching=caching))
        runs[caching] = [output.token_ids for output in engine.generate(prompts, params)]
        assert (engine.stats().cached_prompt_tokens > 0) == caching
    assert runs[True] == runs[False]


def test_a_compiled_engine_gives_the_eager_engines_edited_tokens():
    """Rows editing after their last mask run the same window graphs as rows unmasking. (Four rows: with
    max_batch_size=2 tiny-sdar's 2-row window graph fails to compile under torch 2.13, any rule, and runs
    eagerly.)"""
    eager, compiled = (load_model(FIXTURES / "tiny-sdar", compile=flag) for flag in (False, True))
    config = editing(eager)
    prompts = ordinary_prompts(eager, (5, 13, 3))
    params = long_params(eager, len(prompts))
    assert answers(compiled, config, prompts, params) == answers(eager, config, prompts, params)
    assert compiled.model.compiled.num_graphs > 0 and not compiled.model.compiled.compile_failures


def test_requests_arriving_while_others_edit_equal_each_request_alone(lm):
    """A request joins every other step: rows spending their post-mask budget share steps with rows still
    unmasking (counted from the stats of each step)."""
    config = editing(lm, **Q_MODE)
    engine = BlockServeEngine(lm, config)
    prompts = ordinary_prompts(lm, (3, 9, 6, 14, 1, 8), seed=5)
    params = SamplingParams(max_new_tokens=2 * lm.block_length, stop_at_eos=False)
    outputs, shared_steps = {}, 0
    for index in range(len(prompts)):
        engine.add_request(prompts[index], params, request_id=str(index))
        shared_steps += sum(step_of(engine, outputs) for _ in range(2))
    while engine.has_unfinished_requests():
        shared_steps += step_of(engine, outputs)
    assert shared_steps > 0
    for index, prompt in enumerate(prompts):
        assert outputs[str(index)].token_ids == answers(lm, config, [prompt], params)[0]


def step_of(engine, outputs) -> bool:
    """One step, its finished requests into ``outputs``; whether it ran rows past their last mask beside
    rows that still held masks."""
    before = engine.stats()
    outputs |= {output.request_id: output for output in engine.step().finished}
    after = engine.stats()
    return 0 < (after.counters["post_mask_forwards"] - before.counters.get("post_mask_forwards", 0)
                < after.row_forwards - before.row_forwards)
