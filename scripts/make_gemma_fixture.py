"""Write the tiny DiffusionGemma fixture with transformers' own classes, in the released on-disk layout.

``scripts.make_fixtures`` calls :func:`make_diffusion_gemma` for ``tiny-diffusion_gemma``: a
``DiffusionGemmaForBlockDiffusion`` (transformers >= 5.24) of three layers (sliding, global, sliding:
sliding, global, global), sliding window 6, global layers
with their own head size (16 against 8) and one key/value head, 4 experts (2 per token) beside the dense
MLP, canvases of 8, and a one-layer vision tower (its weights are saved, as the release's are, and never
loaded by the engine). Every parameter and buffer is drawn from the fixtures' generator: norm weights
and layer scalars around 1 (the encoder's scalars differ from the decoder's, so a swapped one shows),
the router's scales too, the tied embeddings wide enough that the canvas sampler stops early on some
canvases. The tokenizer is the fixtures' character tokenizer with Gemma's special tokens first
(``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2) and a Gemma-style chat template.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    DiffusionGemmaConfig,
    DiffusionGemmaForBlockDiffusion,
    Gemma4VisionConfig,
    PreTrainedTokenizerFast,
)
from transformers.models.diffusion_gemma.configuration_diffusion_gemma import DiffusionGemmaTextConfig

PAD, EOS, BOS, UNK = "<pad>", "<eos>", "<bos>", "<unk>"
START_TURN, END_TURN, IMAGE, BEGIN_IMAGE, END_IMAGE = (
    "<start_of_turn>", "<end_of_turn>", "<image_soft_token>", "<start_of_image>", "<end_of_image>")
SPECIAL_TOKENS = (PAD, EOS, BOS, UNK, START_TURN, END_TURN, IMAGE, BEGIN_IMAGE, END_IMAGE)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n{{ message['content'] }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
CANVAS_LENGTH = 8
EMBEDDING_SCALE = 1.0  # tied embeddings ~ N(0, 1): logits below the soft cap, so a canvas can grow confident


def build_tokenizer(characters: tuple[str, ...]) -> PreTrainedTokenizerFast:
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + characters)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token=PAD, eos_token=EOS, bos_token=BOS, unk_token=UNK,
        additional_special_tokens=[START_TURN, END_TURN, IMAGE, BEGIN_IMAGE, END_IMAGE], padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(tokenizer: PreTrainedTokenizerFast) -> DiffusionGemmaConfig:
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    text = DiffusionGemmaTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6, num_experts=4,
        top_k_experts=2, moe_intermediate_size=16, global_head_dim=16, num_global_key_value_heads=1,
        max_position_embeddings=4096, layer_types=["sliding_attention", "full_attention", "full_attention"],
        pad_token_id=ids[PAD], eos_token_id=ids[EOS], bos_token_id=ids[BOS])
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=8, position_embedding_size=16, patch_size=4)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=CANVAS_LENGTH,
                                image_token_id=ids[IMAGE], boi_token_id=ids[BEGIN_IMAGE], eoi_token_id=ids[END_IMAGE])


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Every tensor of the model from ``generator``, in name order."""
    tensors = dict(model.named_parameters()) | {name: b for name, b in model.named_buffers()
                                               if "inv_freq" not in name and "embed_scale" not in name}
    with torch.no_grad():
        for name, tensor in sorted(tensors.items()):
            if tensor.dtype not in (torch.float32,):
                continue
            if name.endswith("embed_tokens.weight"):
                tensor.copy_(EMBEDDING_SCALE * torch.randn(tensor.shape, generator=generator))
            elif name.endswith(("norm.weight", "layer_scalar", "router.scale", "per_expert_scale")):
                tensor.copy_(1 + 0.2 * torch.randn(tensor.shape, generator=generator))
            elif tensor.dim() >= 2:
                bound = tensor.shape[-1] ** -0.5
                tensor.copy_((torch.rand(tensor.shape, generator=generator) * 2 - 1) * bound)
            else:
                tensor.copy_(0.1 * torch.randn(tensor.shape, generator=generator))


def make_diffusion_gemma(directory: Path, generator: torch.Generator, characters: tuple[str, ...]) -> None:
    tokenizer = build_tokenizer(characters)
    config = tiny_config(tokenizer)
    model = DiffusionGemmaForBlockDiffusion(config).eval()
    randomize(model, generator)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    generation = {"eos_token_id": [config.text_config.eos_token_id, tokenizer.convert_tokens_to_ids(END_TURN)],
                  "pad_token_id": config.text_config.pad_token_id, "max_denoising_steps": 16}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
