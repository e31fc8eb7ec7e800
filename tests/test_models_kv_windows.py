"""Windowed forwards against the KV cache equal the full forward: a dual-cache window (one block per row,
at a different column in each row) and a prefix-cache ragged window; grouped-query attention never takes
SDPA's math backend.

On the float64 (and, for grouped-query attention, float32) random LLaDA and Dream fixtures.
"""
from __future__ import annotations

import pytest
import torch

from engine.models import DiffusionLM
from engine.models.kv_cache import KVCache
from engine.models.step_inputs import RefreshPart, WindowPart
from tests.model_helpers import left_padded


def _window_check(lm: DiffusionLM, input_ids, position_ids, key_mask, columns, valid):
    """A window forward over ``columns`` (``valid`` marks real entries) against a cache filled by a
    refresh of the same tokens reproduces the full forward's logits there and leaves the cache as it was."""
    model = lm.model
    rows, width = input_ids.shape
    kv_cache = KVCache(model.config.cache_spec(width), rows, lm.dtype, input_ids.device)
    kv_cache.key_mask[:, :width] = key_mask
    slots = torch.arange(rows)
    all_columns = torch.arange(width).expand(rows, -1)
    with torch.no_grad():
        hidden_full = model.forward_step(RefreshPart(input_ids, position_ids, key_mask, all_columns, slots),
                                         None, kv_cache)
        keys_before = [k[:, :, :-1].clone() for k in kv_cache.keys]
        values_before = [v[:, :, :-1].clone() for v in kv_cache.values]
        safe = columns.clamp(max=width - 1)
        window_ids = torch.where(valid, input_ids.gather(1, safe), lm.special_ids.pad_id)
        window_positions = torch.where(valid, position_ids.gather(1, safe), 0)
        window = WindowPart(window_ids, window_positions, columns, context_start=0, num_read=columns.shape[1])
        got = model.logits(model.forward_step(None, window, kv_cache))
        expected = model.logits(hidden_full.gather(1, safe[..., None].expand(-1, -1, hidden_full.shape[-1])))
        torch.testing.assert_close(got[valid], expected[valid], atol=1e-10, rtol=1e-10)
    for before, after in zip(keys_before + values_before, kv_cache.keys + kv_cache.values):
        torch.testing.assert_close(after[:, :, :-1], before, atol=1e-10, rtol=1e-10)
    assert not kv_cache.key_mask[:, kv_cache.scratch_column].any()


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_dual_cache_window_equals_full_forward(loaded64, family):
    """Dual cache: the window is one block per row, at a different column in each row."""
    lm = loaded64[family]
    assert lm.dtype == torch.float64
    input_ids, position_ids, key_mask = left_padded([12, 9, 6], lm.vocab_size, lm.special_ids.pad_id, seed=4)
    columns = torch.tensor([[4, 5, 6], [8, 9, 10], [9, 10, 11]])
    _window_check(lm, input_ids, position_ids, key_mask, columns, torch.ones_like(columns, dtype=torch.bool))


def test_grouped_query_attention_never_takes_the_math_backend(loaded):
    """Dream (4 query heads over 2 key heads): a refresh and a window forward run with SDPA's math
    backend disabled, and folding the query groups into the query length (the CUDA route) gives the
    numbers of the fused enable_gqa kernel exactly."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from engine.models.layers import attend

    lm = loaded["dream"]
    assert lm.model.config.num_kv_heads < lm.model.config.num_heads
    input_ids, position_ids, key_mask = left_padded([10, 7], lm.vocab_size, lm.special_ids.pad_id, seed=8)
    fused_only = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with torch.no_grad(), sdpa_kernel(fused_only):
        kv_cache = KVCache(lm.model.config.cache_spec(10), 2, lm.dtype, input_ids.device)
        kv_cache.key_mask[:, :10] = key_mask
        lm.model.forward_step(RefreshPart(input_ids, position_ids, key_mask, torch.arange(10).expand(2, -1),
                                          torch.arange(2)), None, kv_cache)
        columns = torch.tensor([[4, 5], [6, 7]])
        lm.model.forward_step(None, WindowPart(input_ids.gather(1, columns), position_ids.gather(1, columns),
                                               columns, 0, 2), kv_cache)
        generator = torch.Generator().manual_seed(9)
        q = torch.randn(2, 5, 4, 8, generator=generator)
        keys, values = torch.randn(2, 2, 2, 7, 8, generator=generator).unbind(0)
        mask = torch.zeros(2, 1, 1, 7).masked_fill(torch.arange(7) < 2, float("-inf"))
        assert torch.equal(attend(q, keys, values, mask, fold_groups=True),
                           attend(q, keys, values, mask, fold_groups=False))


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_prefix_cache_ragged_window_equals_full_forward(loaded64, family):
    """Prefix cache: each row's window is its block through the end of the row, so windows are ragged;
    the missing entries point at the cache's scratch column."""
    lm = loaded64[family]
    width = 12
    input_ids, position_ids, key_mask = left_padded([12, 9, 6], lm.vocab_size, lm.special_ids.pad_id, seed=5)
    starts = [4, 8, 10]
    window = width - min(starts)
    scratch = width  # the cache has one scratch column after the last real one
    columns = torch.full((len(starts), window), scratch, dtype=torch.long)
    valid = torch.zeros((len(starts), window), dtype=torch.bool)
    for row, start in enumerate(starts):
        columns[row, :width - start] = torch.arange(start, width)
        valid[row, :width - start] = True
    assert (~valid).sum(dim=1).tolist() == [0, 4, 6]
    _window_check(lm, input_ids, position_ids, key_mask, columns, valid)
