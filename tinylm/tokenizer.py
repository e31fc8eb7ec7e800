"""A character-level tokenizer saved in Hugging Face format, with LLaDA's special-token names."""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS, BOS, MASK, EOT = "<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>"
HEADER_START, HEADER_END, UNK = "<|start_header_id|>", "<|end_header_id|>", "<|unk|>"
SPECIAL_TOKENS = (EOS, BOS, MASK, EOT, HEADER_START, HEADER_END, UNK)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}")


def build_tokenizer() -> PreTrainedTokenizerFast:
    characters = [c for c in string.printable if c not in "\x0b\x0c\r"]
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + tuple(characters))}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=EOS, unk_token=UNK,
        mask_token=MASK, additional_special_tokens=[EOT, HEADER_START, HEADER_END],
        padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def save_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(directory))
    return tokenizer
