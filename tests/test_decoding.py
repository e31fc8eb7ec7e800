"""The decoding rules on hand-made confidences: what each step commits."""
import pytest
import torch

from engine.rules import make_rule
from engine.rules.dream import dream_transfer_count
from engine.rules.proposals import Sampling, gumbel_noise, propose_tokens
from engine.rules.quota import quota_for_step


def commits(rule, confidence, masked=None, step=0):
    confidence = torch.tensor([confidence], dtype=torch.float64)
    masked = torch.ones_like(confidence, dtype=torch.bool) if masked is None else torch.tensor([masked])
    return rule.select(confidence, masked, torch.tensor([step]))[0].tolist()


def test_threshold_commits_every_position_at_or_above_tau():
    rule = make_rule("threshold", threshold=0.9)
    assert commits(rule, [0.95, 0.2, 0.9, 0.5]) == [True, False, True, False]


def test_threshold_commits_at_least_the_most_confident_position():
    rule = make_rule("threshold", threshold=0.9)
    assert commits(rule, [0.3, 0.6, 0.1, 0.5]) == [False, True, False, False]


def test_threshold_ignores_positions_already_committed():
    rule = make_rule("threshold", threshold=0.9)
    assert commits(rule, [0.99, 0.4, 0.3], masked=[False, True, True]) == [False, True, False]


def test_row_without_masks_commits_nothing():
    for kind in ("threshold", "factor"):
        assert commits(make_rule(kind), [0.99, 0.99], masked=[False, False]) == [False, False]


def test_quota_splits_masks_evenly_with_the_remainder_first():
    quotas = [int(quota_for_step(torch.tensor(10), torch.tensor(step), 4)) for step in range(4)]
    assert quotas == [3, 3, 2, 2]
    assert sum(quotas) == 10


def test_quota_commits_the_most_confident_positions():
    rule = make_rule("quota", steps_per_block=2)
    assert commits(rule, [0.1, 0.8, 0.5, 0.7], step=0) == [False, True, False, True]


def test_quota_breaks_confidence_ties_to_the_left():
    rule = make_rule("quota", steps_per_block=4)
    assert commits(rule, [0.5, 0.5, 0.5, 0.5], step=0) == [True, False, False, False]


def test_factor_prefix_rule_takes_the_largest_prefix_with_n_plus_1_times_error_below_f():
    # sorted: 0.9 (n=1: 2*0.1=0.2<1), 0.7 (n=2: 3*0.3=0.9<1), 0.6 (n=3: 4*0.4=1.6), 0.1
    rule = make_rule("factor_prefix", factor=1.0)
    assert commits(rule, [0.6, 0.9, 0.1, 0.7]) == [False, True, False, True]


def test_factor_rules_always_commit_one():
    for kind in ("factor", "factor_prefix"):
        assert commits(make_rule(kind, factor=1.0), [0.2, 0.1, 0.3, 0.05]) == [False, False, True, False]


# Fast-dLLM's factor rule (get_transfer_index_dynamic): rank n passes when c_n >= 1 - f/(n+1).
def test_fast_dllm_factor_rule_commits_the_ranks_before_the_first_failure():
    # thresholds 1-1/3, 1-1/4, 1-1/5: 0.7 passes, 0.6 fails at rank 3 of 4
    assert commits(make_rule("factor", factor=1.0), [0.6, 0.9, 0.1, 0.7]) == [False, True, False, True]


def test_fast_dllm_factor_rule_also_commits_the_last_candidate_when_only_it_fails():
    confidence = [0.99, 0.95, 0.3]  # 0.3 < 0.75 fails, but it is the last-ranked mask
    assert commits(make_rule("factor", factor=1.0), confidence) == [True, True, True]
    assert commits(make_rule("factor_prefix", factor=1.0), confidence) == [True, True, False]


def test_fast_dllm_factor_rule_commits_the_last_two_masks_together():
    assert commits(make_rule("factor", factor=1.0), [0.2, 0.1]) == [True, True]
    assert commits(make_rule("factor_prefix", factor=1.0), [0.2, 0.1]) == [True, False]


def test_fast_dllm_factor_rule_passes_a_confidence_equal_to_its_threshold():
    confidence = [0.9, 0.8, 0.75, 0.1, 0.05]  # rank 3's threshold is exactly 1 - 1/4 = 0.75
    assert commits(make_rule("factor", factor=1.0), confidence) == [True, True, True, False, False]
    assert commits(make_rule("factor_prefix", factor=1.0), confidence) == [True, True, False, False, False]


def test_shifted_decoding_commits_a_blocks_first_position_alone_while_it_is_masked():
    rule = make_rule("threshold", threshold=0.9, first_step_first_position=True)
    confidence = [0.2, 0.99, 0.95, 0.3]
    assert commits(rule, confidence, step=0) == [True, False, False, False]
    assert commits(rule, confidence, [False, True, True, True], step=1) == [False, True, True, False]
    assert commits(rule, confidence, [False, True, True, True], step=0) == [False, True, True, False]  # a lead


def test_step_cap_commits_everything_left_at_the_last_allowed_step():
    rule = make_rule("threshold", threshold=0.99, steps_per_block=3)
    assert commits(rule, [0.1, 0.2, 0.3], step=1) == [False, False, True]
    assert commits(rule, [0.1, 0.2, 0.3], step=2) == [True, True, True]


def test_greedy_proposal_is_argmax_with_softmax_confidence():
    logits = torch.tensor([[[0.0, 2.0, 1.0]]])
    expected = torch.softmax(logits[0, 0], -1)[1]
    candidates, confidence = propose_tokens(logits, mask_id=0)
    assert candidates.tolist() == [[1]]
    assert torch.allclose(confidence[0, 0], expected)


def test_mask_is_never_a_candidate_even_where_it_is_the_argmax():
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 2.0]]])
    probabilities = torch.softmax(logits, -1)
    candidates, confidence = propose_tokens(logits.clone(), mask_id=1)
    assert candidates.tolist() == [[2, 0]]
    assert torch.allclose(confidence, probabilities[0, [0, 1], [2, 0]][None])


def test_every_rule_commits_all_that_is_left_at_the_block_length_th_step():
    for rule in (make_rule("threshold", threshold=1.0), make_rule("factor", factor=0.01)):
        assert commits(rule, [0.1, 0.2, 0.3], step=1) == [False, False, True]
        assert commits(rule, [0.1, 0.2, 0.3], step=2) == [True, True, True]


def test_gumbel_noise_depends_only_on_seed_step_and_position():
    positions = torch.tensor([[0, 1, 2], [0, 1, 2]])
    noise = gumbel_noise(torch.tensor([7, 7]), torch.tensor([3, 3]), positions, 5)
    assert torch.equal(noise[0], noise[1])
    other_seed = gumbel_noise(torch.tensor([8]), torch.tensor([3]), positions[:1], 5)
    assert not torch.equal(noise[0], other_seed[0])
    alone = gumbel_noise(torch.tensor([7]), torch.tensor([3]), positions[:1, 1:2], 5)
    assert torch.equal(alone[0, 0], noise[0, 1])


def test_sampling_with_temperature_follows_the_noise():
    logits = torch.zeros(1, 4, 6, dtype=torch.float64)
    positions = torch.arange(4)[None]
    noise = gumbel_noise(torch.tensor([1]), torch.tensor([0]), positions, 6)
    sampling = Sampling(rows=torch.tensor([0]), temperatures=torch.tensor([1.0]), noise=noise)
    candidates, _ = propose_tokens(logits, mask_id=5, sampling=sampling)
    assert torch.equal(candidates, noise[..., :5].argmax(-1))


# Dream's diffusion_generate (alg maskgit_plus / topk_margin / entropy, greedy): its scores and its schedule.
# Three positions, each the best by one measure (MASK, the last column, has probability 0):
#   A [.50, .45, .05]          probability .50 (best), margin .05, entropy .86
#   B [.45, .1375 x 4]         probability .45, margin .3125 (best), entropy 1.45
#   C [.48, .48, .04]          probability .48, margin 0, entropy .83 (best)
DREAM_PROBABILITIES = torch.tensor([[[0.50, 0.45, 0.05, 0.0, 0.0, 0.0],
                                     [0.45, 0.1375, 0.1375, 0.1375, 0.1375, 0.0],
                                     [0.48, 0.48, 0.04, 0.0, 0.0, 0.0]]], dtype=torch.float64)
DREAM_MASK_ID = 5


def dream_logits():
    return DREAM_PROBABILITIES.log()


def test_dream_scores_are_probability_margin_and_negative_entropy():
    p = DREAM_PROBABILITIES[0]
    entropy = -(p * torch.log(p + 1e-10)).sum(-1)
    expected = {"probability": torch.tensor([0.50, 0.45, 0.48]), "margin": torch.tensor([0.05, 0.3125, 0.0]),
                "neg_entropy": -entropy}
    for measure, scores in expected.items():
        candidates, confidence = propose_tokens(dream_logits(), DREAM_MASK_ID, measure=measure)
        assert candidates.tolist() == [[0, 0, 0]]
        assert torch.allclose(confidence[0], scores.to(torch.float64)), measure


def test_dream_algs_commit_the_position_their_own_measure_ranks_first():
    # 3 masks, 2 steps: step 0 commits int(3 * (1 - 0.5005 / 1)) = 1 position
    chosen = {}
    for alg in ("maskgit_plus", "topk_margin", "entropy"):
        rule = make_rule("dream", steps_per_block=2, dream_alg=alg)
        _, confidence = propose_tokens(dream_logits(), DREAM_MASK_ID, measure=rule.measure)
        masked = torch.ones(1, 3, dtype=torch.bool)
        commit = rule.select(confidence, masked, torch.tensor([0]))
        chosen[alg] = commit[0].tolist()
    assert chosen == {"maskgit_plus": [True, False, False], "topk_margin": [False, True, False],
                      "entropy": [False, False, True]}


def test_dream_schedule_commits_int_of_masks_times_one_minus_s_over_t():
    def count(masked, step, steps):
        return int(dream_transfer_count(torch.tensor([masked]), torch.tensor([step]), steps, 1e-3)[0])
    # linspace(1, 1e-3, 5) = 1, .75025, .5005, .25075, .001: 64 * .24975 = 15.98, truncated to 15
    assert count(64, 0, 4) == 15
    assert count(49, 1, 4) == int(49 * (1 - 0.5005 / 0.75025))
    assert count(7, 3, 4) == 7  # the last step commits everything left
    # as many steps as masks: the first step's 8 * 0.999 / 8 truncates to 0, Dream commits nothing
    assert count(8, 0, 8) == 0


def test_dream_rule_may_commit_nothing_at_a_step_and_everything_at_the_last():
    rule = make_rule("dream", steps_per_block=8)
    assert commits(rule, [0.9, 0.5, 0.7] + [0.1] * 5, step=0) == [False] * 8
    assert commits(rule, [0.9, 0.5, 0.7], step=7) == [True, True, True]


def test_committed_positions_never_outrank_masks_with_negative_scores():
    rule = make_rule("dream", steps_per_block=2, dream_alg="entropy")  # 3 masks: 1 commits at step 0
    assert commits(rule, [-0.1, -4.0, -2.5, -3.0], masked=[False, True, True, True]) == [False, False, True, False]


def test_dream_decoding_rejects_origin_missing_steps_and_fast_dllm_windows():
    from engine import EngineConfig
    from engine.rules import rule_for

    with pytest.raises(ValueError, match="maskgit_plus.*topk_margin.*entropy.*origin"):
        EngineConfig(decoding="dream", steps_per_block=8, dream_alg="origin")
    with pytest.raises(ValueError, match="origin"):
        make_rule("dream", steps_per_block=8, dream_alg="origin")
    with pytest.raises(ValueError, match="steps_per_block"):
        EngineConfig(decoding="dream")
    with pytest.raises(ValueError, match="dream_eps"):
        EngineConfig(decoding="dream", steps_per_block=8, dream_eps=0.0)
    shifted = EngineConfig(decoding="dream", steps_per_block=8)  # shifted_decoding="fast-dllm"
    with pytest.raises(ValueError, match="lookback"):
        rule_for(shifted, logit_shift=1)
    assert not rule_for(shifted, logit_shift=0).first_step_first_position  # LLaDA: no shift, no issue


# Dream's own diffusion_generate on this fixture (float32, greedy, 8 prompts, 64 tokens, 8-64 steps)
# gave the reference's tokens for all three algs (see the issue 12 report).
@pytest.mark.parametrize("alg", ["maskgit_plus", "topk_margin", "entropy"])
def test_batched_dream_decoding_equals_the_reference(alg):
    from engine import BlockServeEngine, EngineConfig, SamplingParams
    from engine.models import load_model
    from engine.oracle.reference import reference_generate
    from tests.model_helpers import DREAM_DIR

    lm = load_model(DREAM_DIR, dtype="float64")
    prompts = [[5 + (i * 7 + j) % 90 for j in range(3 + 2 * i)] for i in range(4)]
    config = EngineConfig(decoding="dream", dream_alg=alg, steps_per_block=8, block_length=32, cache="none",
                          shifted_decoding="lookback", max_batch_size=4)
    outputs = BlockServeEngine(lm, config).generate(prompts, SamplingParams(max_new_tokens=32, stop_at_eos=False))
    rule = make_rule("dream", steps_per_block=8, dream_alg=alg)
    for output, prompt in zip(outputs, prompts):
        expected = reference_generate(lm, prompt, max_new_tokens=32, block_length=32, rule=rule, cache="none",
                                      stop_at_eos=False, shifted_decoding="lookback")
        assert output.token_ids == expected.token_ids


def test_sampling_noise_is_the_same_whatever_its_chunking_and_its_scratch_is_bounded(monkeypatch):
    """The int64 hashing runs over chunks of positions (LLaDA's 126k vocabulary at 64 sampled rows would
    otherwise build ~2 GiB temporaries); the noise does not depend on the chunk size."""
    import engine.rules.proposals as decoding

    seeds, steps = torch.tensor([5, 123456789]), torch.tensor([3, 40])
    positions = torch.arange(8).repeat(2, 1) + torch.tensor([[0], [64]])
    whole = gumbel_noise(seeds, steps, positions, 1000)
    monkeypatch.setattr(decoding, "NOISE_CHUNK_ELEMENTS", 3000)  # three positions per chunk
    assert torch.equal(gumbel_noise(seeds, steps, positions, 1000), whole)
