"""LLaDA2.2's block routing: each request's absolute block of 32 tokens chooses its experts together.

Checked outside the project against SGLang 0.5.23's released kernels (``_block_aggregation_kernel`` and
``_token_topk_kernel`` of ``sglang/srt/models/llada2.py``, taken from the wheel by their source, ``libdevice.exp``
swapped for ``tl.exp``, launched as ``block_topk_triton`` launches them) with
``TRITON_INTERPRET=1 python check_gate.py`` (triton 3.9, CPU): on 48 cases (256 experts, capacity 48, top-8;
8 / 4 / 2; whole blocks and a partial last one; quantised logits and biases that tie experts exactly) the
expert ids of :class:`Router` equalled the kernels' in all 48, weights within 4e-7.
"""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.config import MoEConfig
from engine.models.loader import load_model
from engine.models.moe import MoE, Router, routing_blocks
from engine.models.transformer import Layer
from engine.parallel.shard import TensorShard
from scripts.make_llada22_fixture import EXPERT_CAPACITY, write_llada22

CAPACITY_MOE = MoEConfig(num_experts=8, experts_per_token=2, moe_intermediate_size=8, n_group=4, topk_group=2,
                         routed_scaling_factor=2.5, expert_capacity=4, routing_block=4)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return load_model(write_llada22(tmp_path_factory.mktemp("tiny-llada2.2")), dtype="float32")


def router(seed: int = 0) -> Router:
    generator = torch.Generator().manual_seed(seed)
    gate = Router(16, 8)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(8, 16, generator=generator))
        gate.expert_bias.copy_(0.1 * torch.randn(8, generator=generator))
    return gate


def test_routing_blocks_split_rows_blocks_and_padding():
    positions = torch.tensor([4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 0, 0])  # row 1: blocks 1, 2; row 2: 0, 1; padding
    assert routing_blocks(positions, 4).tolist() == [0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 5]


def test_a_rows_experts_do_not_depend_on_the_rows_beside_it():
    gate, generator = router(), torch.Generator().manual_seed(1)
    rows = [torch.randn(count, 16, generator=generator) for count in (6, 8, 5)]
    starts = [torch.arange(4, 10), torch.arange(0, 8), torch.arange(8, 13)]  # each row from a block start
    packed = gate(torch.cat(rows), CAPACITY_MOE, routing_blocks(torch.cat(starts), 4))[0]
    alone = torch.cat([gate(row, CAPACITY_MOE, routing_blocks(start, 4))[0] for row, start in zip(rows, starts)])
    assert torch.equal(packed, alone)
    changed = gate(torch.cat([rows[0], -rows[1], rows[2]]), CAPACITY_MOE, routing_blocks(torch.cat(starts), 4))[0]
    assert torch.equal(changed[:6], packed[:6]) and torch.equal(changed[14:], packed[14:])


def test_a_block_keeps_capacity_experts_and_ties_go_to_the_lower_id():
    gate = router()
    with torch.no_grad():
        gate.weight.zero_()
        gate.expert_bias.zero_()  # every score ties: the lowest ids win, in id order
    experts, weights = gate(torch.randn(4, 16), CAPACITY_MOE, torch.zeros(4, dtype=torch.long))
    assert experts.tolist() == [[0, 1]] * 4
    assert torch.allclose(weights, torch.full((4, 2), 1.25))  # normalised sigmoid x routed scaling 2.5
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(2))
    experts = router()(x, CAPACITY_MOE, torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]))[0]
    assert all(len(set(experts[block * 4:block * 4 + 4].flatten().tolist())) <= 4 for block in range(2))


def test_the_checkpoints_expert_capacity_switches_the_gate(lm):
    moe = lm.model.config.moe
    assert (moe.expert_capacity, moe.routing_block, lm.model.config.routing_block) == (EXPERT_CAPACITY, 32, 32)
    gate, x = lm.model.layers[1].mlp.gate, torch.randn(64, 32, generator=torch.Generator().manual_seed(3))
    blocks = routing_blocks(torch.arange(64), 32)
    by_block = gate(x, moe, blocks)[0]
    per_token = gate(x, MoEConfig(**{**moe.__dict__, "expert_capacity": None}))[0]
    assert not torch.equal(by_block, per_token)  # the group-limited gate chooses otherwise
    with pytest.raises(ValueError, match="routing block"):
        gate(x, moe)


def test_a_partial_prompt_block_is_routed_with_its_masked_suffix(lm):
    seen = []
    hook = next(m for m in lm.model.modules() if isinstance(m, MoE)).register_forward_pre_hook(
        lambda module, args: seen.append((args[0].shape[0], args[2].bincount().tolist())))
    try:
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2))
        engine.generate([list(range(10, 50)), list(range(20, 25))], SamplingParams(max_new_tokens=8))
    finally:
        hook.remove()
    # the prefill: row 1's 40-token prompt is a whole block and 8 prompt tokens + 24 masks, row 2's 5 + 27
    assert seen[0] == (96, [32, 32, 32])


def test_the_gate_stays_whole_on_a_tensor_parallel_rank(lm):
    share = lm.model.config.rank_share(TensorShard(0, 2))
    assert share.moe.expert_capacity == EXPERT_CAPACITY and share.routing_block == 32
    moe_layer = Layer(share, 1).mlp
    assert moe_layer.gate.weight.shape == (8, 32)  # every rank routes every token alike
    assert moe_layer.experts.gate_up_proj.shape == (8, 2 * 16 // 2, 32)  # the experts are split


def test_another_block_length_is_refused(lm):
    with pytest.raises(ValueError, match="block_length=16.*routes its experts over blocks of 32"):
        BlockServeEngine(lm, EngineConfig(block_length=16))
