"""What every tiny chat fixture is made of: the character tokenizer and random, sharpened weights.

``scripts.make_fixtures`` and the fixture writers beside it draw their
fixtures with these, so a fixture's weights depend only on its random stream.
"""
from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from engine.models.config import TransformerConfig
from engine.models.transformer import BidirectionalTransformer

CHARACTERS = tuple(c for c in string.printable if c not in "\x0b\x0c\r")  # the fixtures' character order
EOS, UNK = "<|endoftext|>", "<|unk|>"
SHARPEN = 20.0


def build_chat_tokenizer(specials: tuple[str, ...], mask: str, template: str) -> PreTrainedTokenizerFast:
    """The character tokenizer with a family's special tokens placed after the ordinary vocab (as
    Qwen's are), ``<|endoftext|>`` as EOS and pad."""
    vocab = {token: index for index, token in enumerate(CHARACTERS + specials)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS, pad_token=EOS, unk_token=UNK,
        mask_token=mask, additional_special_tokens=[t for t in specials if t not in (EOS, UNK, mask)],
        padding_side="left")
    tokenizer.chat_template = template
    return tokenizer


def random_model(config: TransformerConfig, generator: torch.Generator) -> BidirectionalTransformer:
    """Every parameter drawn from ``generator``: linear weights (stacked experts too) ~
    U(+-1/sqrt(fan_in)), embeddings ~ N(0, 1), norm weights ~ 1 + 0.2 N(0, 1), biases ~ 0.1 N(0, 1)."""
    model = BidirectionalTransformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name == "embed_tokens.weight":
                param.copy_(torch.randn(param.shape, generator=generator))
            elif name.endswith("norm.weight"):
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=generator))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))
            else:
                bound = param.shape[-1] ** -0.5
                param.copy_((torch.rand(param.shape, generator=generator) * 2 - 1) * bound)
    return model


def sharpened(model: BidirectionalTransformer, mask_id: int) -> BidirectionalTransformer:
    """The output head x SHARPEN, MASK's head row zeroed: confident, never MASK (a random model's
    softmax is flat, and MASK could win). MASK's embedding is zeroed too, so a masked position's
    prediction comes from its context: otherwise the MASK input dominates and every masked position
    predicts the same token, and every decoding rule commits the same way."""
    with torch.no_grad():
        model.lm_head.weight.mul_(SHARPEN)
        model.lm_head.weight[mask_id] = 0
        model.embed_tokens.weight[mask_id] = 0
    return model
