"""Batch-invariant bf16 (``EngineConfig(batch_invariant=True)``): a request's tokens do not depend on the
requests batched beside it, in the dtype users serve in."""
from __future__ import annotations

import pytest
import torch

from benchmarks.exactness import FAMILIES, RULES, agreement, mixed_prompts
from engine import EngineConfig
from engine.models import load_model
from engine.models.layers import attend


def test_a_row_left_padded_into_a_wider_box_attends_bitwise_as_alone():
    """The kernel-level cause: a bf16 row's attention, alone and left-padded by any width, is the same
    to the bit once the reductions are widened to float64 (rounded once)."""
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, head_dim, queries = 4, 2, 32, 8
    for keys_alone in (9, 33, 70):
        q = torch.randn(1, queries, heads, head_dim, generator=generator).bfloat16()
        keys, values = (torch.randn(1, kv_heads, keys_alone, head_dim, generator=generator).bfloat16()
                        for _ in range(2))
        alone = attend(q, keys, values, torch.zeros(1, 1, 1, keys_alone, dtype=torch.bfloat16),
                       reduction_dtype=torch.float64)
        for pad in (1, 3, 8, 17, 64):
            padded = [torch.cat([torch.randn(1, kv_heads, pad, head_dim, generator=generator).bfloat16(), t], 2)
                      for t in (keys, values)]
            mask = torch.cat([torch.full((pad,), float("-inf")), torch.zeros(keys_alone)]).bfloat16()
            out = attend(q, *padded, mask.view(1, 1, 1, -1), reduction_dtype=torch.float64)
            assert torch.equal(out, alone), (keys_alone, pad)


def test_widened_attention_equals_sdpa_in_float64():
    """The widened path computes attention, not something else: in float64 it is SDPA's result."""
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(3, 5, 4, 16, generator=generator, dtype=torch.float64)
    keys, values = (torch.randn(3, 2, 11, 16, generator=generator, dtype=torch.float64) for _ in range(2))
    mask = torch.zeros(3, 1, 1, 11, dtype=torch.float64)
    mask[0, ..., :4] = float("-inf")
    widened = attend(q.float(), keys.float(), values.float(), mask.float(), reduction_dtype=torch.float64)
    assert torch.allclose(widened.double(), attend(q, keys, values, mask), atol=1e-6)


def test_chunking_the_score_matrix_changes_no_number(monkeypatch):
    """Long rows are computed in chunks of rows and queries (bounded float64 scores): bitwise the same."""
    from engine.models import layers

    generator = torch.Generator().manual_seed(2)
    q = torch.randn(3, 6, 4, 16, generator=generator).bfloat16()
    keys, values = (torch.randn(3, 2, 40, 16, generator=generator).bfloat16() for _ in range(2))
    mask = torch.zeros(3, 1, 1, 40, dtype=torch.bfloat16)
    mask[1, ..., :7] = float("-inf")
    whole = attend(q, keys, values, mask, reduction_dtype=torch.float64)
    monkeypatch.setattr(layers, "WIDENED_SCORE_BYTES", 2 * 40 * 8 * 5)  # 5 queries per chunk
    assert torch.equal(attend(q, keys, values, mask, reduction_dtype=torch.float64), whole)


@pytest.mark.parametrize("family", ["llada", "dream"])
@pytest.mark.parametrize("rule", ["threshold", "quota"])
@pytest.mark.parametrize("cache", ["dual", "none"])
def test_bf16_batched_requests_equal_the_oracle_alone_in_batch_invariant_mode(family, rule, cache):
    """Mixed prompts at batch 8 on the step schedule (rows at different blocks), bf16, random fixtures
    (flat distributions, near-ties everywhere: the worst case): every request equals the
    single-request oracle."""
    lm = load_model(FAMILIES[family], dtype="bfloat16")
    prompts, caps = mixed_prompts(8, lm.vocab_size, lm.tokens.mask_id, seed=3)
    assert agreement(lm, RULES[rule], cache, prompts, caps, batch_invariant=True) == 1.0


def test_batch_invariant_is_a_validated_switch():
    assert EngineConfig(batch_invariant=True).batch_invariant
    with pytest.raises(ValueError, match="batch_invariant"):
        EngineConfig(batch_invariant="yes")
