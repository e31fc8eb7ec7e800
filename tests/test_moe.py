"""The LLaDA2 mixture-of-experts MLP (``engine.models.moe``): routing equals a brute-force loop written
from the reference's ``LLaDA2MoeGate`` (sigmoid scores, the bias added for the choice only, groups
scored by their two best biased experts, top groups then top experts, unbiased weights renormalised and
scaled), the grouped GEMM equals a loop over experts exactly in float32, a token's output does not
depend on the other tokens of the batch in batch-invariant mode, and the router stays float32.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.config import MoEConfig
from engine.models.moe import MoE, Router, expert_loop, grouped_mm_supported
from engine.models.projections import MLP

CONFIG = MoEConfig(num_experts=8, experts_per_token=2, moe_intermediate_size=16, n_group=4, topk_group=2,
                   num_shared_experts=1, routed_scaling_factor=2.5)
HIDDEN = 32


def random_moe(config: MoEConfig = CONFIG, seed: int = 0, bias_scale: float = 0.1) -> MoE:
    generator = torch.Generator().manual_seed(seed)
    shared = config.moe_intermediate_size * config.num_shared_experts
    moe = MoE(HIDDEN, config, MLP(HIDDEN, shared) if shared else None)
    with torch.no_grad():
        for param in moe.parameters():
            param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * param.shape[-1] ** -0.5)
        moe.gate.expert_bias.copy_(bias_scale * torch.randn(config.num_experts, generator=generator))
    return moe.eval()


def brute_force_route(scores: torch.Tensor, bias: torch.Tensor, config: MoEConfig):
    """Per token, in plain Python: the chosen experts (descending biased score) and their weights."""
    size = config.num_experts // config.n_group
    chosen, weights = [], []
    for token_scores in scores.tolist():
        biased = [s + b for s, b in zip(token_scores, bias.tolist())]
        group_score = [sum(sorted(biased[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(config.n_group)]
        groups = sorted(range(config.n_group), key=lambda g: -group_score[g])[:config.topk_group]
        candidates = [e for g in groups for e in range(g * size, (g + 1) * size)]
        experts = sorted(candidates, key=lambda e: -biased[e])[:config.experts_per_token]
        unbiased = [token_scores[e] for e in experts]
        total = sum(unbiased) if config.experts_per_token > 1 else 1.0
        chosen.append(experts)
        weights.append([w / total * config.routed_scaling_factor for w in unbiased])
    return chosen, weights


def test_routing_equals_a_brute_force_loop_over_tokens_groups_and_experts():
    moe = random_moe(bias_scale=0.2)
    x = torch.randn(64, HIDDEN, generator=torch.Generator().manual_seed(1))
    experts, weights = moe.gate(x, CONFIG)
    scores = torch.sigmoid(F.linear(x.float(), moe.gate.weight.float()))
    chosen, expected = brute_force_route(scores, moe.gate.expert_bias, CONFIG)
    assert experts.tolist() == chosen
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, torch.tensor(expected), rtol=1e-6, atol=1e-6)


def test_a_token_only_takes_experts_of_its_best_groups():
    router = Router(4, 8)
    with torch.no_grad():
        router.weight.zero_()
    # scores per expert (through the bias, weights zero: sigmoid(0) = 0.5 + bias): group 0 holds the
    # single best expert (0.5 + 0.4) but a weak partner; groups 2 and 3 have two good experts each
    bias = torch.tensor([0.4, -0.4, 0.0, 0.0, 0.3, 0.2, 0.35, 0.1])
    router.expert_bias.copy_(bias)
    config = MoEConfig(num_experts=8, experts_per_token=2, moe_intermediate_size=4, n_group=4, topk_group=2)
    experts, _ = router(torch.zeros(1, 4), config)
    # group sums: g0 0.9+0.1=1.0, g1 1.0, g2 1.5, g3 1.45 -> groups 2, 3 -> experts 6 (0.85), 4 (0.8)
    assert experts.tolist() == [[6, 4]]
    assert 0 not in experts.tolist()[0]  # the best single expert is outside the kept groups


def test_the_expert_bias_changes_the_choice_but_not_the_weights():
    router = Router(4, 8)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        router.weight.copy_(torch.randn(8, 4, generator=generator))
    config = MoEConfig(num_experts=8, experts_per_token=2, moe_intermediate_size=4, n_group=1, topk_group=1)
    x = torch.randn(16, 4, generator=generator)
    scores = torch.sigmoid(F.linear(x, router.weight))
    unbiased_experts, _ = router(x, config)
    router.expert_bias.copy_(torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0]))  # expert 7 always wins
    experts, weights = router(x, config)
    assert (experts[:, 0] == 7).all() and not (unbiased_experts == 7).any(dim=1).all()
    picked = scores.gather(1, experts)  # the weights are the unbiased scores, renormalised
    torch.testing.assert_close(weights, picked / picked.sum(-1, keepdim=True), rtol=0, atol=1e-7)


def test_one_expert_per_token_is_not_renormalised():
    moe = random_moe(MoEConfig(num_experts=8, experts_per_token=1, moe_intermediate_size=16, n_group=4,
                               topk_group=2, routed_scaling_factor=2.5))
    x = torch.randn(8, HIDDEN)
    experts, weights = moe.gate(x, moe.config)
    scores = torch.sigmoid(F.linear(x, moe.gate.weight))
    torch.testing.assert_close(weights, scores.gather(1, experts) * 2.5, rtol=0, atol=0)


def test_grouped_gemm_equals_a_loop_over_experts_exactly_in_float32():
    assert grouped_mm_supported(torch.float32, torch.device("cpu"))
    experts = random_moe().experts
    counts = torch.tensor([5, 0, 3, 1, 0, 7, 2, 4])  # an expert without tokens included
    x = torch.randn(int(counts.sum()), HIDDEN)
    grouped = experts(x, counts)
    looped = expert_loop(x, experts.gate_up_proj, experts.down_proj, counts)
    assert torch.equal(grouped, looped)
    # and the loop is the experts' SwiGLU through their checkpoint-level views
    views = experts.checkpoint_views("")
    rows = x[5:8]
    expected = F.linear(F.silu(F.linear(rows, views["2.gate_proj.weight"])) * F.linear(rows, views["2.up_proj.weight"]),
                        views["2.down_proj.weight"])
    torch.testing.assert_close(looped[5:8], expected, rtol=0, atol=1e-6)


def test_moe_output_is_the_weighted_sum_of_its_experts_plus_the_shared_expert():
    moe = random_moe()
    x = torch.randn(12, HIDDEN, generator=torch.Generator().manual_seed(5))
    experts, weights = moe.gate(x, CONFIG)
    views = moe.experts.checkpoint_views("")
    expected = moe.shared_experts(x).clone()
    for token in range(x.shape[0]):
        routed = torch.zeros(HIDDEN)
        for slot, expert in enumerate(experts[token].tolist()):
            gate, up, down = (views[f"{expert}.{name}_proj.weight"] for name in ("gate", "up", "down"))
            routed += weights[token, slot] * F.linear(F.silu(F.linear(x[token], gate)) * F.linear(x[token], up), down)
        expected[token] += routed
    torch.testing.assert_close(moe(x), expected, rtol=0, atol=1e-5)
    assert moe.experts_touched.item() == len(set(experts.flatten().tolist()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_batch_invariant_mode_runs_each_row_alone(dtype):
    moe = random_moe().to(dtype)
    generator = torch.Generator().manual_seed(7)
    rows = [torch.randn(n, HIDDEN, generator=generator).to(dtype) for n in (5, 9, 3)]
    alone = [moe(row) for row in rows]
    packed = torch.cat(rows)
    spans = ((0, 5), (5, 9), (14, 3))
    together = moe(packed, spans)
    for (start, count), solo in zip(spans, alone):
        assert torch.equal(together[start:start + count], solo)
    # a row's output does not move when other rows join it
    assert torch.equal(moe(torch.cat(rows[:1] + rows[1:]), spans)[:5], moe(rows[0], ((0, 5),)))


def test_the_router_stays_float32_when_the_model_is_cast_and_moved():
    moe = random_moe().to(torch.bfloat16)
    assert moe.experts.gate_up_proj.dtype == torch.bfloat16
    assert moe.gate.weight.dtype == moe.gate.expert_bias.dtype == torch.float32
    with torch.device("meta"):
        meta = MoE(HIDDEN, CONFIG, None)
    meta.to(torch.bfloat16).to_empty(device="cpu")
    assert meta.gate.weight.device.type == "cpu" and meta.gate.weight.dtype == torch.float32
    assert meta.experts.down_proj.dtype == torch.bfloat16
