"""The tiny model's tokenizer, saved in Hugging Face format with LLaDA's special-token names.

Word-level, its vocabulary owned by the tasks (``tinylm/tasks.py``): every number from 0 to
``MAX_NUMBER`` and every word of the task prompts is one token, so ``count from 17 to 52`` is 5 tokens and its answer is
36 tokens, one per number: the successor of a number is one lookup, and the stop is the token that
equals the prompt's last number. Anything else still tokenizes: a word outside the vocabulary falls
back to characters (WordPiece with ``##`` continuation pieces), so arbitrary text never becomes UNK.
WordPiece's longest-match search is quadratic in a word's length (and Hugging Face's is worse), so
the pre-tokenizer cuts runs longer than ``MAX_PIECE_CHARS`` into pieces of at most that many
characters: any input tokenizes in linear time. A word up to that length (every vocabulary word)
tokenizes as before; a longer one still becomes characters, each piece starting without ``##`` (so
decoding puts a space every ``MAX_PIECE_CHARS`` characters of such a word).
"""
from __future__ import annotations

import string
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tinylm.tasks import MAX_NUMBER, vocabulary_words

EOS, BOS, MASK, EOT = "<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>"
HEADER_START, HEADER_END, UNK = "<|start_header_id|>", "<|end_header_id|>", "<|unk|>"
SPECIAL_TOKENS = (EOS, BOS, MASK, EOT, HEADER_START, HEADER_END, UNK)
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>{% endif %}")
MAX_PIECE_CHARS = 64  # longer runs are split for linear-time WordPiece; far above the longest word


def with_llada_specials(core: Tokenizer) -> PreTrainedTokenizerFast:
    """A Hugging Face tokenizer over ``core`` with LLaDA's special tokens and chat template."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=EOS, unk_token=UNK,
        mask_token=MASK, additional_special_tokens=[EOT, HEADER_START, HEADER_END],
        padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tokenizer(words: tuple[str, ...] | None = None) -> PreTrainedTokenizerFast:
    """Word-level: specials, numbers 0..MAX_NUMBER, the task words, then characters as fallback."""
    if words is None:
        words = vocabulary_words()
    printable = tuple(c for c in string.printable if c not in string.whitespace)
    entries = (SPECIAL_TOKENS + tuple(str(n) for n in range(MAX_NUMBER + 1)) + tuple(words)
               + printable + tuple("##" + c for c in printable))
    vocab: dict[str, int] = {}
    for token in entries:
        vocab.setdefault(token, len(vocab))
    # a long unknown word still falls back to characters, never to UNK
    core = Tokenizer(models.WordPiece(vocab, unk_token=UNK, max_input_chars_per_word=1_000_000))
    core.pre_tokenizer = bounded_word_pre_tokenizer()
    core.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return with_llada_specials(core)


def bounded_word_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """BERT's split on whitespace and punctuation, then runs cut into pieces of <= MAX_PIECE_CHARS."""
    pieces = pre_tokenizers.Split(Regex(f"(?m).{{1,{MAX_PIECE_CHARS}}}"), behavior="isolated")
    return pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer(), pieces])


def save_tokenizer(directory: Path) -> PreTrainedTokenizerFast:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(str(directory))
    return tokenizer
