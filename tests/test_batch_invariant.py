"""Batch-invariant bf16 (``load_model(..., batch_invariant=True)``): a request's tokens do not depend on the
requests batched beside it, in the dtype users serve in."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.exactness import FAMILIES, RULES, agreement, mixed_prompts
from engine.models import ModelOptions, load_model
from engine.models.step_inputs import RefreshPart


def test_a_row_left_padded_into_a_wider_box_gets_bitwise_its_hidden_states_alone():
    """The kernel-level cause and its cure: a bf16 row's forward, alone and left-padded into a box with
    a wider row beside it, is the same to the bit in batch-invariant mode."""
    lm = load_model(FAMILIES["llada"], dtype="bfloat16", batch_invariant=True)
    generator = torch.Generator().manual_seed(0)
    short, wide = (torch.randint(4, 90, (1, n), generator=generator) for n in (13, 41))

    def forward(rows: list[torch.Tensor]) -> torch.Tensor:
        width = max(row.shape[1] for row in rows)
        tokens = torch.cat([F.pad(row, (width - row.shape[1], 0), value=0) for row in rows])
        key_mask = torch.cat([F.pad(torch.ones_like(row, dtype=torch.bool), (width - row.shape[1], 0)) for row in rows])
        positions = (key_mask.cumsum(1) - 1).clamp(min=0)
        columns = torch.arange(width).expand(len(rows), -1)
        part = RefreshPart(tokens, positions, key_mask, columns, row_widths=tuple(row.shape[1] for row in rows))
        return lm.model.forward_step(part, None, None)

    alone = forward([short])[0]
    assert torch.equal(forward([short, wide])[0, -short.shape[1]:], alone)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("rule", ["threshold", "quota"])
@pytest.mark.parametrize("cache", ["dual", "none"])
def test_bf16_batched_requests_equal_the_oracle_alone_in_batch_invariant_mode(family, rule, cache):
    """Mixed prompts at batch 8 on the continuous schedule (rows at different blocks), bf16, random fixtures
    (flat distributions, near-ties everywhere: the worst case): every request equals the
    single-request oracle."""
    lm = load_model(FAMILIES[family], dtype="bfloat16", batch_invariant=True)
    prompts, caps = mixed_prompts(8, lm.vocab_size, lm.special_ids.mask_id, seed=3)
    assert agreement(lm, RULES[rule], cache, prompts, caps) == 1.0


def test_batch_invariant_is_a_validated_option_of_the_loaded_model():
    assert ModelOptions(batch_invariant=True).batch_invariant
    with pytest.raises(ValueError, match="batch_invariant"):
        ModelOptions(batch_invariant="yes")
    with pytest.raises(ValueError, match="compile=True"):
        ModelOptions(batch_invariant=True, compile=True)
    with pytest.raises(ValueError, match="compile=True"):
        load_model(FAMILIES["llada"], batch_invariant=True, compile=True)
