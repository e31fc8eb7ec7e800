"""DiffusionGemma's experts (``engine.models.diffusion_gemma.layers.Experts``): the grouped path equals,
bit for bit, a loop over the experts hit that adds each one's weighted outputs into zeros with
``index_add_`` (transformers' order), in float32, float64 and bfloat16, with tokens that repeat an expert
across slots and experts that get no token; and it compiles into one graph (no host read) equal to it."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch._inductor.config
import torch.nn.functional as F

from engine.models.diffusion_gemma.layers import Experts
from engine.models.moe import gelu_tanh, grouped_mm_supported
from engine.parallel.shard import WHOLE

NUM_EXPERTS, SIZE, HIDDEN = 8, 16, 32


def random_experts(dtype: torch.dtype, seed: int = 0) -> Experts:
    experts = Experts(SimpleNamespace(num_experts=NUM_EXPERTS, moe_intermediate_size=SIZE, hidden_size=HIDDEN,
                                      shard=WHOLE))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in experts.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * param.shape[-1] ** -0.5)
    return experts.to(dtype)


def loop_over_experts(experts: Experts, x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """The reference: one host read of the experts hit, each expert's tokens added into zeros in turn."""
    out = torch.zeros_like(x)
    for expert in torch.unique(chosen).tolist():
        tokens, slot = torch.where(chosen == expert)
        gate, up = F.linear(x[tokens], experts.gate_up_proj[expert]).chunk(2, dim=-1)
        expert_out = F.linear(gelu_tanh(gate) * up, experts.down_proj[expert])
        out.index_add_(0, tokens, (expert_out * weights[tokens, slot, None]).to(out.dtype))
    return out


def routing(tokens: int, k: int, repeats: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, experts)`` as the router gives them (float32, distinct experts per token) or, with
    ``repeats``, experts drawn with replacement; the last two experts never get a token."""
    generator = torch.Generator().manual_seed(seed)
    used = NUM_EXPERTS - 2
    if repeats:
        chosen = torch.randint(0, used, (tokens, k), generator=generator)
        chosen[:1] = 1  # one token with every slot on the same expert
    else:
        chosen = torch.rand(tokens, used, generator=generator).argsort(dim=1)[:, :k]
    weights = torch.rand(tokens, k, generator=generator) * 2
    return weights, chosen


DTYPES = [torch.float32, torch.float64] + ([torch.bfloat16] if grouped_mm_supported(torch.bfloat16,
                                                                                     torch.device("cpu")) else [])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("repeats", [False, True])
@pytest.mark.parametrize("tokens, k", [(37, 3), (64, 2), (1, 4), (20, 6), (0, 2)])
def test_grouped_path_equals_the_loop_over_experts_bit_for_bit(dtype, repeats, tokens, k):
    experts = random_experts(dtype, seed=tokens)
    generator = torch.Generator().manual_seed(k)
    # rows of very different sizes, so rounding differs between summation orders
    x = (torch.randn(tokens, HIDDEN, generator=generator) * torch.rand(tokens, 1, generator=generator) * 8).to(dtype)
    weights, chosen = routing(tokens, k, repeats, seed=tokens * k)
    with torch.no_grad():
        grouped = experts(x, weights, chosen)
        looped = loop_over_experts(experts, x, weights, chosen)
    assert grouped.dtype == dtype and grouped.shape == x.shape
    assert torch.equal(grouped, looped)


def test_summation_is_in_expert_order_not_slot_order():
    """Swapping a token's slots (with their weights) changes nothing: the sum follows the expert ids."""
    experts = random_experts(torch.bfloat16)
    x = torch.randn(16, HIDDEN).to(torch.bfloat16)
    weights, chosen = routing(16, 4, repeats=False, seed=3)
    flipped = torch.flip(chosen, dims=[1]), torch.flip(weights, dims=[1])
    with torch.no_grad():
        assert torch.equal(experts(x, weights, chosen), experts(x, flipped[1], flipped[0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiles_into_one_graph_that_equals_the_loop(dtype):
    """A full graph (no host read). Inductor keeps a fused bfloat16 chain in float32 unless told to
    round where eager rounds (``emulate_precision_casts``); told so, it equals the loop too."""
    experts = random_experts(dtype)
    x = torch.randn(24, HIDDEN).to(dtype)
    weights, chosen = routing(24, 3, repeats=False, seed=5)
    compiled = torch.compile(experts, fullgraph=True, dynamic=False)
    with torch.no_grad(), torch._inductor.config.patch(emulate_precision_casts=True):
        assert torch.equal(compiled(x, weights, chosen), loop_over_experts(experts, x, weights, chosen))
