"""Fused projections (q/k/v; gate/up) and the dense SwiGLU MLP built on them.

Both are the layer kit's column- and row-parallel linears (``engine.layers.linear``): on a split model a fused
projection holds its rank's heads or intermediate width, and the MLP's ``down_proj`` sums its output over the
ranks.

A fused projection is one GEMM over several projections of the same input, its weights concatenated
along the output. Checkpoints name the parts separately (LLaDA, Dream, SDAR) or fused (LLaDA2's
``query_key_value``); its weight slots (``engine.layers.linear.linear_slots``) offer both names as views of the
one parameter, so a loader copies a checkpoint's tensors straight into it, and the state dict keeps the parts' names.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.linear import ColumnParallelLinear, RowParallelLinear
from engine.parallel.shard import WHOLE, TensorShard


def _split_on_save(fused: str, parts: dict[str, int]):
    """A state-dict hook that writes a fused parameter as the checkpoint's separate projections."""
    def hook(module, state_dict, prefix, local_metadata):
        for kind in ("weight", "bias"):
            tensor = state_dict.pop(f"{prefix}{fused}.{kind}", None)
            if tensor is not None:
                for name, piece in zip(parts, tensor.split(list(parts.values()))):
                    state_dict[f"{prefix}{name}.{kind}"] = piece.clone()
    return hook


def _fuse_on_load(fused: str, parts: dict[str, int]):
    """A load pre-hook that concatenates the checkpoint's separate projections into the fused one."""
    def hook(module, state_dict, prefix, *args):
        for kind in ("weight", "bias"):
            names = [f"{prefix}{name}.{kind}" for name in parts]
            if all(name in state_dict for name in names):
                state_dict[f"{prefix}{fused}.{kind}"] = torch.cat([state_dict.pop(name) for name in names])
    return hook


class FusedLinear(ColumnParallelLinear):
    """One GEMM for several projections of the same input (q/k/v; gate/up), weights concatenated
    along the output. State dicts and checkpoints keep the separate projections' names; ``alias`` is
    the name of the whole fused tensor in checkpoints that store it fused."""

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool, alias: str | None = None,
                 shard: TensorShard = WHOLE):
        super().__init__(in_features, sum(parts.values()), bias, shard)
        self.parts = parts
        self.alias = alias


def fused_projection(owner: nn.Module, fused: str, in_features: int, parts: dict[str, int],
                     bias: bool, alias: str | None = None, shard: TensorShard = WHOLE) -> FusedLinear:
    """A :class:`FusedLinear` for ``owner.<fused>``, with the state-dict hooks that keep the parts' names."""
    owner.register_state_dict_post_hook(_split_on_save(fused, parts))
    owner.register_load_state_dict_pre_hook(_fuse_on_load(fused, parts))
    return FusedLinear(in_features, parts, bias, alias, shard)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``, gate and up in one GEMM. ``intermediate_size``: this rank's
    share; ``reduce_results=False`` leaves the output a partial sum (an MoE adds its experts' first)."""

    def __init__(self, hidden_size: int, intermediate_size: int, shard: TensorShard = WHOLE,
                 reduce_results: bool = True):
        super().__init__()
        self.gate_up_proj = fused_projection(self, "gate_up_proj", hidden_size, {
            "gate_proj": intermediate_size, "up_proj": intermediate_size}, False, shard=shard)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, shard, reduce_results)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
