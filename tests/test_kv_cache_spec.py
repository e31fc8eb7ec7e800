"""The one KV cache, its page pool and its prefix cache, stated as specifications: what a layer spec keeps,
how the pages of one slot come back in another, and that the memory check prices what every row kind allocates."""
from __future__ import annotations

import pytest
import torch

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.kv_cache import CacheSpec, KVCache, LayerSpec
from engine.models.loader import load_model
from engine.runner import memory_model
from engine.runner.prefix_cache import PrefixCache
from engine.scheduling.request import Request
from tests.conftest import FIXTURES

CPU = torch.device("cpu")
PAGE = 4


def request(tokens: list[int]) -> Request:
    return Request(request_id="r", prompt_token_ids=tokens, params=SamplingParams(), block_length=PAGE,
                   arrival_time=0.0)


def numbered(cache: KVCache, slot: int) -> None:
    """Write position p's keys and values as p + 1 in every full layer of ``slot``."""
    for layer in cache.layers:
        layer[slot] = torch.arange(1, layer.shape[3] + 1, dtype=layer.dtype)[None, None, :, None]


def test_a_sliding_layers_ring_holds_the_last_window_minus_one_positions_and_never_more_than_a_row():
    spec = CacheSpec((LayerSpec(2, 8), LayerSpec(1, 4, window=6)), width=20)
    cache = KVCache(spec, slots=3, dtype=torch.float32, device=CPU)
    assert cache.ring == 5 and [layer.shape for layer in cache.layers] == [(3, 2, 2, 20, 8), (3, 2, 1, 5, 4)]
    assert cache.data is None and cache.key_mask is None  # two shapes: one tensor per layer
    assert CacheSpec((LayerSpec(1, 4, window=64),), width=20).ring == 20


def test_layers_of_one_shape_are_views_of_one_tensor_with_a_key_mask_and_a_scratch_column():
    spec = CacheSpec.uniform(3, kv_heads=2, head_dim=4, width=10, scratch_column=True, key_mask=True)
    cache = KVCache(spec, slots=2, dtype=torch.float32, device=CPU)
    assert cache.data.shape == (3, 2, 2, 2, 11, 4) and cache.key_mask.shape == (2, 11)
    assert cache.scratch_column == 10
    cache.layers[1][0, 1, 0, 3] = 7.0  # a per-layer view writes the one tensor
    assert cache.data[1, 0, 1, 0, 3, 0] == 7.0 and cache.values[1][0, 0, 3, 0] == 7.0


def test_pages_kept_from_one_slot_come_back_in_another_from_column_zero():
    cache = KVCache(CacheSpec.uniform(2, kv_heads=1, head_dim=2, width=12), slots=2, dtype=torch.float32,
                    device=CPU)
    numbered(cache, 0)
    prefix = PrefixCache(cache, pages=4, page_length=PAGE)
    owner, reader = request(list(range(10))), request(list(range(9)) + [99])
    prefix.claim(owner, owner.prompt_token_ids, 2, slot=0)
    prefix.fill()
    assert prefix.reuse(reader, 1, max_pages=2) == 2 * PAGE and reader.cached_prefix == 2 * PAGE
    assert torch.equal(cache.data[:, 1, :, :, :2 * PAGE], cache.data[:, 0, :, :, :2 * PAGE])
    assert not cache.data[:, 1, :, :, 2 * PAGE:].any()


def test_a_reused_run_fills_a_sliding_ring_with_its_last_positions_at_position_mod_ring():
    spec = CacheSpec((LayerSpec(1, 2), LayerSpec(1, 3, window=4)), width=16)
    cache = KVCache(spec, slots=1, dtype=torch.float32, device=CPU)
    prefix = PrefixCache(cache, pages=4, page_length=PAGE)
    tokens = list(range(12))
    pages = prefix.claim(request(tokens), tokens, 3)  # no slot: the store that computes them fills them
    for page in pages:  # as a store would: page of depth d holds positions 4d .. 4d + 3, valued p + 1
        for layer in prefix.pool.layers:
            layer[page.entry] = torch.arange(page.depth * PAGE + 1, (page.depth + 1) * PAGE + 1,
                                             dtype=layer.dtype)[None, None, :, None]
    assert prefix.reuse(request(tokens + [5]), 0, max_pages=3) == 12
    assert cache.layers[0][0, 0, 0, :12, 0].tolist() == [p + 1 for p in range(12)]
    ring = cache.layers[1][0, 0, 0, :, 0].tolist()  # ring 3: positions 9, 10, 11 at columns 0, 1, 2
    assert ring == [10.0, 11.0, 12.0]


@pytest.mark.parametrize("fixture", ["tiny-sdar", "tiny-diffusion_gemma", "tiny-nemotron_labs_diffusion"])
def test_the_memory_check_prices_exactly_the_cache_and_pool_each_row_kind_allocates(fixture):
    lm = load_model(FIXTURES / fixture)
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2, max_model_len=128, prefix_cache_tokens=64,
                                               enable_prefix_caching=True))
    runner = engine.runner
    cache = runner.rows.cache
    prefix = runner.prefix_cache
    assert cache.spec.num_bytes(2, lm.dtype) == cache.num_bytes
    priced = memory_model.cache_bytes(lm, engine.config, cache.spec, prefix.page_length)
    assert priced == cache.num_bytes + prefix.num_bytes and prefix.num_bytes > 0
