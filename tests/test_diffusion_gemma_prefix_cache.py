"""DiffusionGemma's prefix cache: a prompt that starts with cached pages computes only the rest, and its seeded
tokens are those it gets with the cache off (which equal transformers', ``test_diffusion_gemma.py``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import load_model
from engine.runner import memory
from engine.runner.prefix_cache import PAGE_LENGTH
from engine.scheduling.model_fit import config_for_model

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-diffusion_gemma"
SETTINGS = {"max_denoising_steps": 4, "stability_threshold": 0, "confidence_threshold": 0.3}
INSTRUCTION = [(7 * i) % 90 + 10 for i in range(70)]  # 4 whole pages and 6 tokens, no special token
PROMPTS = [INSTRUCTION + [50 + i, 60 + i, 70 + i] for i in range(5)] + [INSTRUCTION[:32], INSTRUCTION[:35] + [40]]


@pytest.fixture(scope="module")
def lm():
    return load_model(FIXTURE)


@pytest.fixture(scope="module")
def wide_window_lm(tmp_path_factory):
    """The fixture with a sliding window of 40: a reused run's ring spans three pages."""
    directory = tmp_path_factory.mktemp("wide-window")
    for path in FIXTURE.iterdir():
        shutil.copy(path, directory / path.name)
    config = json.loads((FIXTURE / "config.json").read_text())
    config["text_config"]["sliding_window"] = 40
    (directory / "config.json").write_text(json.dumps(config))
    return load_model(directory)


def generate(lm, caching: bool, prompts: list[list[int]] = PROMPTS, **overrides):
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=3, enable_prefix_caching=caching,
                                               **SETTINGS | overrides))
    params = [SamplingParams(max_new_tokens=12, seed=seed) for seed in range(len(prompts))]
    return engine, engine.generate(prompts, params)


@pytest.mark.parametrize("model", ["lm", "wide_window_lm"])
def test_cached_pages_give_the_tokens_of_a_full_prompt_store(model, request):
    lm = request.getfixturevalue(model)
    _, uncached = generate(lm, caching=False)
    engine, cached = generate(lm, caching=True)
    assert [output.token_ids for output in cached] == [output.token_ids for output in uncached]
    assert all(output.finish_reason == "length" for output in cached)
    reused = [output.num_cached_tokens for output in cached]
    assert all(tokens % PAGE_LENGTH == 0 for tokens in reused)
    assert sum(tokens == 4 * PAGE_LENGTH for tokens in reused) >= 4  # the instruction's whole pages
    assert PROMPTS[5] == INSTRUCTION[:2 * PAGE_LENGTH] and reused[5] in (0, 2 * PAGE_LENGTH)  # all of it, or first
    assert engine.stats().cached_prompt_tokens == sum(reused)
    assert all(output.num_cached_tokens == 0 for output in uncached)


def test_a_pool_too_small_for_every_prompt_evicts_and_stays_exact(lm):
    other = INSTRUCTION[::-1]  # a second instruction: two of its pages evict the first one's
    prompts = [instruction[:2 * PAGE_LENGTH] + [50 + i] for i in range(3) for instruction in (INSTRUCTION, other)]
    _, uncached = generate(lm, caching=False, prompts=prompts)
    engine, cached = generate(lm, caching=True, prompts=prompts, prefix_cache_tokens=3 * PAGE_LENGTH)
    assert [output.token_ids for output in cached] == [output.token_ids for output in uncached]
    assert engine.runner.prefix_cache.index.evictions > 0
    assert engine.stats().cached_prompt_tokens > 0


def test_a_later_request_reads_what_an_earlier_one_stored(lm):
    engine = BlockServeEngine(lm, EngineConfig(**SETTINGS))
    assert engine.config.enable_prefix_caching  # on by default: the encoder stores a prompt causally
    params = SamplingParams(max_new_tokens=12, seed=3)
    first = engine.generate([PROMPTS[0]], params)[0]
    second = engine.generate([PROMPTS[0]], params)[0]
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 4 * PAGE_LENGTH)
    assert second.token_ids == first.token_ids


def test_the_memory_check_counts_the_pool(lm):
    def arena(caching: bool) -> int:
        config = config_for_model(EngineConfig(max_batch_size=2, max_model_len=256, prefix_cache_tokens=128,
                                               enable_prefix_caching=caching), lm)
        return memory.memory_model(lm, config).arena_bytes

    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2, max_model_len=256, prefix_cache_tokens=128))
    assert arena(True) - arena(False) == engine.runner.prefix_cache.num_bytes > 0
