"""DiffusionGemma: its logits and its seeded tokens equal transformers' own (``DiffusionGemmaForBlockDiffusion``
and its ``generate``) on the tiny fixture, batched equals alone, and what it cannot do is refused by name."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import DiffusionGemmaForBlockDiffusion, DynamicCache

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.diffusion_gemma.step import CanvasStep, DecodePart, StorePart
from engine.models.kv_cache import KVCache
from engine.models.loader import load_model

FIXTURE = Path(__file__).parent / "fixtures" / "tiny-diffusion_gemma"
PROMPTS = ("Hello there, how are you?", "2+2=", "The quick brown fox jumps over the lazy dog. " * 2, "a",
           "Write a poem", "xyz 123", "Tell me", "Why is the sky blue?")
ADAPTIVE = {"stability_threshold": 0, "confidence_threshold": 0.3}  # stops some canvases early on the fixture


@pytest.fixture(scope="module")
def lm():
    return load_model(FIXTURE)


@pytest.fixture(scope="module")
def reference():
    return DiffusionGemmaForBlockDiffusion.from_pretrained(FIXTURE, dtype=torch.float32).eval()


def reference_tokens(reference, lm, prompt: str, seed: int, max_new_tokens: int, settings: dict) -> list[int]:
    """transformers' generate at batch 1 after torch.manual_seed(seed), cut as our outputs are: before the
    first stop token and at max_new_tokens."""
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    torch.manual_seed(seed)
    tokens = reference.generate(ids, max_new_tokens=max_new_tokens, **settings).sequences[0, ids.shape[1]:].tolist()
    stop = next((index for index, token in enumerate(tokens) if token in lm.special_ids.stop_ids), len(tokens))
    return tokens[:min(stop, max_new_tokens)]


@pytest.mark.parametrize("prompt_length", [5, 13])  # 13: longer than the sliding window (6)
def test_encoder_and_decoder_logits_equal_transformers(lm, reference, prompt_length):
    generator = torch.Generator().manual_seed(prompt_length)
    vocab, canvas_length = lm.vocab_size, lm.model.config.canvas_length
    prompt = torch.randint(3, vocab, (1, prompt_length), generator=generator)
    canvas = torch.randint(0, vocab, (2, 1, canvas_length), generator=generator)
    conditioning = torch.randn(1, canvas_length, vocab, generator=generator)
    cache = DynamicCache(config=reference.config.get_text_config(decoder=True))
    ours = KVCache(lm.model.config.cache_spec(64), 2, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        reference.model.encoder(input_ids=prompt, cache=cache)
        expected = reference(decoder_input_ids=canvas[0], cache=cache, self_conditioning_logits=conditioning).logits
        step = CanvasStep(StorePart(prompt[0], (1,), (0,), (prompt_length,)),
                          DecodePart(canvas[0], (1,), (prompt_length,), lm.model.soft_embeddings(conditioning)))
        assert (lm.model.forward_canvas(step, ours) - expected).abs().max() < 1e-4
        committed = expected.argmax(-1)  # the next canvas reads the committed one through the cache
        positions = torch.arange(prompt_length, prompt_length + canvas_length)[None]
        reference.model.encoder(input_ids=committed, cache=cache, position_ids=positions)
        expected = reference(decoder_input_ids=canvas[1], cache=cache).logits
        step = CanvasStep(StorePart(committed[0], (1,), (prompt_length,), (canvas_length,)),
                          DecodePart(canvas[1], (1,), (prompt_length + canvas_length,)))
        assert (lm.model.forward_canvas(step, ours) - expected).abs().max() < 1e-4


@pytest.mark.parametrize("settings, max_new_tokens", [({}, 20), (ADAPTIVE, 20), (ADAPTIVE, 16)])
def test_seeded_tokens_equal_transformers_generate_and_batched_equals_alone(lm, reference, settings, max_new_tokens):
    settings = {"max_denoising_steps": 12, **settings}
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **settings))
    params = [SamplingParams(max_new_tokens=max_new_tokens, seed=seed) for seed in range(len(PROMPTS))]
    batched = engine.generate(list(PROMPTS), params)
    alone = BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings))
    for seed, (prompt, output) in enumerate(zip(PROMPTS, batched)):
        assert output.token_ids == reference_tokens(reference, lm, prompt, seed, max_new_tokens, settings)
        assert output.token_ids == alone.generate([prompt], params[seed])[0].token_ids
        assert len(output.token_ids) <= max_new_tokens
    if settings.get("confidence_threshold"):  # some canvas stopped before its last step
        assert sum(output.num_steps for output in batched) < len(PROMPTS) * 3 * settings["max_denoising_steps"]


def test_rows_advance_on_their_own_and_a_finished_row_frees_its_slot_at_once(lm):
    config = EngineConfig(max_batch_size=2, max_denoising_steps=12, sort_pending=False, **ADAPTIVE)
    engine = BlockServeEngine(lm, config)
    engine.add_request("short", SamplingParams(max_new_tokens=8, seed=1))
    engine.add_request("a longer answer", SamplingParams(max_new_tokens=32, seed=2))
    engine.add_request("waiting", SamplingParams(max_new_tokens=8, seed=3))
    steps, joined = 0, {}
    while engine.has_unfinished_requests():
        report = engine.step()
        steps += 1
        for request_id in report.admitted:
            joined[request_id] = steps
    assert joined["req-2"] > 1  # it joined when the first request left, not when the longest did
    assert joined["req-2"] < steps


def test_an_image_prompt_and_what_the_canvas_runner_lacks_are_refused_by_name(lm):
    engine = BlockServeEngine(lm, EngineConfig(max_denoising_steps=4))
    image = lm.image_token_ids[0]
    output = engine.generate([[5, image, 6]], SamplingParams(max_new_tokens=8))[0]
    assert output.finish_reason == "error" and "text only" in output.error and "diffusion_gemma" in output.error
    output = engine.generate(["hi"], SamplingParams(max_new_tokens=8, temperature=0.7))[0]
    assert output.finish_reason == "error" and output.error.startswith("temperature")
    with pytest.raises(ValueError, match="entropy_bound"):
        BlockServeEngine(lm, EngineConfig(decoding="low_confidence"))
    with pytest.raises(ValueError, match="max_denoising_steps"):
        EngineConfig(max_denoising_steps=0)


def test_the_canvas_settings_come_from_the_checkpoint_then_transformers(lm):
    config = BlockServeEngine(lm, EngineConfig()).config
    assert config.decoding == "entropy_bound" and config.block_length == 8
    assert config.max_denoising_steps == 16  # the fixture's generation_config.json
    assert (config.entropy_bound, config.t_min, config.t_max) == (0.1, 0.4, 0.8)  # transformers' defaults


def test_batch_invariant_bf16_gives_each_row_its_tokens_alone():
    lm = load_model(FIXTURE, dtype="bfloat16", batch_invariant=True)
    settings = {"max_denoising_steps": 8, **ADAPTIVE}
    params = [SamplingParams(max_new_tokens=20, seed=seed) for seed in range(len(PROMPTS))]
    batched = BlockServeEngine(lm, EngineConfig(max_batch_size=8, **settings)).generate(list(PROMPTS), params)
    alone = BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings))
    for prompt, param, output in zip(PROMPTS, params, batched):
        assert alone.generate([prompt], param)[0].token_ids == output.token_ids
