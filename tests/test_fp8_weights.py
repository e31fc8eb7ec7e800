"""FP8-dynamic weights (compressed-tensors): checkpoints made by the library from the LLaDA2 fixture (the
transformer stack, experts split per expert) and the DiffusionGemma fixture (its 3-D experts split per expert, as
RedHatAI stores them) follow the library's fake-quantized model; quantization="fp8" on a bf16 checkpoint is the
FP8 checkpoint made from it; two ranks give one device's tokens; other schemes are refused by name."""
from __future__ import annotations

import pytest
import torch

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.layers.fp8 import FP8
from engine.models.diffusion_gemma.step import CanvasStep, DecodePart, StorePart
from engine.models.kv_cache import KVCache
from engine.models.loader import load_model
from tests.conftest import FIXTURES
from tests.fp8_helpers import (
    dequantized_checkpoint,
    fake_quantized_activations,
    fp8_checkpoint,
    quantization_config,
    write_checkpoint,
)
from tests.model_helpers import left_padded, our_logits, raw_checkpoint, read_config

FAMILIES = ["llada2", "diffusion_gemma"]
PROMPT_LENGTHS = [9, 5]  # two rows of different lengths: batched, then each alone
TOLERANCE = 1e-3  # logits within float32 rounding of the reference's sums


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Per family: the fixture in bf16, its FP8 checkpoint, that one dequantized, and dequantized but with the
    original (unquantized) experts."""
    made = {}
    for family in FAMILIES:
        source, root = FIXTURES / f"tiny-{family}", tmp_path_factory.mktemp(family)
        bf16 = write_checkpoint(source, root / "bf16", {name: tensor.to(torch.bfloat16) for name, tensor in
                                                        raw_checkpoint(source).items()}, read_config(source))
        fp8 = fp8_checkpoint(source, root / "fp8")
        made[family] = {"bf16": bf16, "fp8": fp8, "dequantized": dequantized_checkpoint(fp8, root / "dequantized"),
                        "float_experts": dequantized_checkpoint(fp8, root / "float_experts", original=source)}
    return made


def canvas_logits(lm, lengths: list[int]) -> torch.Tensor:
    """DiffusionGemma's logits ``[rows, canvas, vocab]``: each row stores a random prompt and decodes a canvas."""
    generator = torch.Generator().manual_seed(len(lengths))
    prompts = [torch.randint(3, lm.vocab_size, (length,), generator=generator) for length in lengths]
    canvas = torch.randint(0, lm.vocab_size, (len(lengths), lm.model.config.canvas_length), generator=generator)
    cache = KVCache(lm.model.config.cache_spec(64), len(lengths), torch.float32, torch.device("cpu"))
    slots = tuple(range(len(lengths)))
    step = CanvasStep(StorePart(torch.cat(prompts), slots, (0,) * len(lengths), tuple(lengths)),
                      DecodePart(canvas, slots, tuple(lengths)))
    return lm.model.forward_canvas(step, cache)


def logits(family: str, lm, lengths: list[int]) -> torch.Tensor:
    if family == "diffusion_gemma":
        return canvas_logits(lm, lengths)
    input_ids, position_ids, key_mask = left_padded(lengths, lm.vocab_size, lm.special_ids.pad_id, seed=len(lengths))
    return our_logits(lm, input_ids, position_ids, key_mask)[key_mask]


@pytest.mark.parametrize("family", FAMILIES)
def test_an_fp8_checkpoint_follows_the_librarys_fake_quantized_model_batched_and_alone(family, checkpoints,
                                                                                       monkeypatch):
    made = checkpoints[family]
    fp8, reference = load_model(made["fp8"]), load_model(made["dequantized"])
    float_experts = load_model(made["float_experts"])
    for lengths in (PROMPT_LENGTHS, PROMPT_LENGTHS[:1], PROMPT_LENGTHS[1:]):
        with torch.no_grad():
            ours, unquantized_activations = logits(family, fp8, lengths), logits(family, reference, lengths)
            with fake_quantized_activations(reference.model, monkeypatch):
                expected = logits(family, reference, lengths)
            with fake_quantized_activations(float_experts.model, monkeypatch):
                unquantized_experts = logits(family, float_experts, lengths)
        assert (ours - expected).abs().max() < TOLERANCE
        assert torch.equal(ours.argmax(-1), expected.argmax(-1))
        # what a loader that skipped the activations' rounding or the experts' quantization would give is far off
        assert (unquantized_activations - expected).abs().max() > 100 * TOLERANCE
        assert (unquantized_experts - expected).abs().max() > 100 * TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_quantization_fp8_on_a_bf16_checkpoint_is_the_fp8_checkpoint_made_from_it(family, checkpoints):
    made = checkpoints[family]
    stored, quantized = load_model(made["fp8"]), load_model(made["bf16"], quantization="fp8")
    with torch.no_grad():
        assert torch.equal(logits(family, stored, PROMPT_LENGTHS), logits(family, quantized, PROMPT_LENGTHS))
    prompts, params = ["hello there", "1 2 3 4"], SamplingParams(max_new_tokens=8, stop_at_eos=False, seed=3)
    engine = BlockServeEngine.from_pretrained(made["bf16"], EngineConfig(max_batch_size=2, quantization="fp8"))
    assert ([output.token_ids for output in engine.generate(prompts, params)]
            == [output.token_ids for output in BlockServeEngine(stored).generate(prompts, params)])


@pytest.mark.usefixtures("one_thread_per_rank")
@pytest.mark.parametrize("family, stored", [("llada2", True), ("diffusion_gemma", False)])
def test_two_ranks_give_one_devices_tokens_with_fp8_weights(family, stored, checkpoints):
    """LLaDA2's FP8 checkpoint (fused q/k/v cut with its scales); DiffusionGemma's own checkpoint quantized at
    load (3-D experts quantized whole, then cut). Row-parallel layers round each token over both ranks' parts."""
    model = checkpoints[family]["fp8"] if stored else FIXTURES / f"tiny-{family}"
    prompts, params = ["hello there", "the quick brown fox jumps", "a"], SamplingParams(
        max_new_tokens=16, stop_at_eos=False, seed=7)
    whole = BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=3, quantization="fp8"),
                                             dtype="float64").generate(prompts, params)
    with BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=3, tensor_parallel_size=2,
                                                              quantization="fp8"), dtype="float64") as split:
        assert [output.token_ids for output in split.generate(prompts, params)] == [
            output.token_ids for output in whole]


@pytest.mark.parametrize("family", FAMILIES)
def test_fp8_layers_hold_about_half_the_bytes_of_bf16(family, checkpoints):
    bf16 = load_model(checkpoints[family]["bf16"], dtype="bfloat16")
    fp8 = load_model(checkpoints[family]["bf16"], dtype="bfloat16", quantization="fp8")
    fp8_tensors = {name: tensor for name, tensor in fp8.model.named_parameters()
                   if tensor.dtype == FP8 or name.endswith("_scale") and name.removesuffix("_scale") in dict(
                       fp8.model.named_parameters())}
    quantized = {name for name, tensor in fp8_tensors.items() if tensor.dtype == FP8}
    assert quantized and any(".experts." in name for name in quantized)
    bf16_bytes = sum(tensor.nbytes for name, tensor in bf16.model.named_parameters() if name in quantized)
    fp8_bytes = sum(tensor.nbytes for tensor in fp8_tensors.values())
    assert 0.5 < fp8_bytes / bf16_bytes < 0.6  # one byte a weight, plus a float32 scale per output channel


def changed_config(**changes) -> dict:
    """The LLaDA2 fixture's config.json with an FP8-dynamic quantization_config, ``changes`` made to it
    (``"weights.num_bits"``: the config group's)."""
    quantization = quantization_config()
    group = quantization["config_groups"]["group_0"]
    for key, value in changes.items():
        part, _, field = key.partition(".")
        if field:
            group[part][field] = value
        else:
            quantization[key] = value
    return read_config(FIXTURES / "tiny-llada2") | {"quantization_config": quantization}


@pytest.mark.parametrize("changes, key", [
    ({"weights.num_bits": 4}, "config_groups.group_0.weights.num_bits"),  # NVFP4, int4
    ({"weights.type": "int"}, "config_groups.group_0.weights.type"),  # int8 (W8A8)
    ({"weights.strategy": "group", "weights.group_size": 128}, "config_groups.group_0.weights.strategy"),
    ({"input_activations.dynamic": False, "input_activations.strategy": "tensor"},
     "config_groups.group_0.input_activations.strategy"),  # static activation scales
    ({"format": "pack-quantized"}, "format"),
    ({"quant_method": "gptq"}, "quant_method"),
])
def test_other_schemes_are_refused_at_load_naming_quantization_config_and_the_key(changes, key, tmp_path):
    source = FIXTURES / "tiny-llada2"
    write_checkpoint(source, tmp_path, raw_checkpoint(source), changed_config(**changes))
    with pytest.raises(ValueError, match=f"quantization_config.{key} is"):
        load_model(tmp_path)
