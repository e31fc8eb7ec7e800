"""Each layer of the kit cuts a checkpoint tensor to its rank's share: column-parallel rows (part by part when
fused, a replicated key/value head included), row-parallel columns, vocabulary rows padded on the last rank,
stacked experts' widths, and FP8 scales with their weights. No process group: the cuts are pure indexing."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.layers.experts import expert_slots
from engine.layers.fp8_modules import Fp8Linear
from engine.layers.linear import ColumnParallelLinear, RowParallelLinear
from engine.layers.loading import checkpoint_slots
from engine.layers.vocab import VocabularyHead
from engine.models.projections import FusedLinear
from engine.parallel.shard import TensorShard


def numbered(*shape: int) -> torch.Tensor:
    return torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(*shape)


def load(module: nn.Module, name: str, full: torch.Tensor) -> torch.Tensor:
    slots = checkpoint_slots(nn.ModuleDict({"layer": module}))
    slots[name].load(full, name)
    return slots[name].tensor


def test_a_column_parallel_linear_keeps_its_rows_and_a_row_parallel_one_its_columns():
    full = numbered(8, 6)
    column = ColumnParallelLinear(6, 4, shard=TensorShard(1, 2))
    assert torch.equal(load(column, "layer.weight", full), full[4:])
    row = RowParallelLinear(3, 8, TensorShard(1, 2))
    assert torch.equal(load(row, "layer.weight", full), full[:, 3:])


@pytest.mark.parametrize("rank", range(4))
def test_fused_qkv_over_more_ranks_than_key_value_heads_gives_each_rank_the_head_its_queries_read(rank):
    heads, kv_heads, d, hidden = 4, 2, 2, 3
    q, k, v = numbered(heads * d, hidden), 100 + numbered(kv_heads * d, hidden), 200 + numbered(kv_heads * d, hidden)
    layer = FusedLinear(hidden, {"q_proj": d, "k_proj": d, "v_proj": d}, False, "query_key_value",
                        TensorShard(rank, 4))
    expected = torch.cat([q[rank * d:(rank + 1) * d], k[rank // 2 * d:(rank // 2 + 1) * d],
                          v[rank // 2 * d:(rank // 2 + 1) * d]])
    for part, full in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
        load(layer, f"{part}.weight", full)
    assert torch.equal(layer.weight, expected)
    layer.weight.data.zero_()
    assert torch.equal(load(layer, "query_key_value.weight", torch.cat([q, k, v])), expected)


def test_the_last_vocabulary_rank_pads_its_rows_with_zeros():
    full = numbered(5, 2)
    head = VocabularyHead(2, 5, TensorShard(1, 2))
    assert torch.equal(load(head, "layer.weight", full), torch.cat([full[3:], torch.zeros(1, 2, dtype=full.dtype)]))


def test_fp8_scales_are_cut_with_a_column_layers_rows_and_held_whole_by_a_row_layer():
    scale = numbered(8, 1)
    column = Fp8Linear.like(ColumnParallelLinear(6, 4, shard=TensorShard(1, 2)))
    assert torch.equal(load(column, "layer.weight_scale", scale).float(), scale[4:])
    row = Fp8Linear.like(RowParallelLinear(3, 8, TensorShard(1, 2)))
    assert torch.equal(load(row, "layer.weight_scale", scale).float(), scale)
    codes = numbered(8, 6).to(torch.float8_e4m3fn)
    assert torch.equal(load(row, "layer.weight", codes).view(torch.uint8), codes[:, 3:].view(torch.uint8))


def test_a_stacked_expert_tensor_and_its_per_expert_tensors_give_one_share():
    experts, hidden, width = 3, 4, 2  # rank 1 of 2 holds intermediate rows 2..4 of each expert's 4
    stack = nn.Module()
    stack.gate_up_proj = nn.Parameter(torch.zeros(experts, 2 * width, hidden, ))
    stack.down_proj = nn.Parameter(torch.zeros(experts, hidden, width, ))
    gate_up, down = numbered(experts, 4 * width, hidden), numbered(experts, hidden, 2 * width)
    slots = expert_slots(stack, "", TensorShard(1, 2), stacked=True)
    slots["gate_up_proj"].load(gate_up, "gate_up_proj")
    slots["down_proj"].load(down, "down_proj")
    from_stack = stack.gate_up_proj.clone(), stack.down_proj.clone()
    for expert in range(experts):
        gate, up = gate_up[expert].chunk(2)
        for projection, full in (("gate_proj", gate), ("up_proj", up), ("down_proj", down[expert])):
            slots[f"{expert}.{projection}.weight"].load(full, projection)
    assert torch.equal(stack.gate_up_proj, from_stack[0]) and torch.equal(stack.down_proj, from_stack[1])
    assert torch.equal(from_stack[0][:, :width], gate_up[:, width:2 * width])
    assert torch.equal(from_stack[1], down[:, :, width:])


def test_a_tensor_no_kit_layer_cuts_is_held_whole_and_a_wrong_shape_is_refused_by_name():
    with pytest.raises(ValueError, match=r"weight 'layer.weight' has shape \(8, 6\), expected \(4, 6\)"):
        load(nn.Linear(6, 4, bias=False), "layer.weight", numbered(8, 6))
    with pytest.raises(ValueError, match="'layer.weight'.*not a rank's 4 times a divisor"):
        load(ColumnParallelLinear(6, 4, shard=TensorShard(0, 2)), "layer.weight", numbered(6, 6))
