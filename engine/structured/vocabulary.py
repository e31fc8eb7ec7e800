"""The text each token of a model's vocabulary adds to an answer, as xgrammar reads it.

xgrammar reads byte-level BPE, byte-fallback and one-character vocabularies from the tokenizer itself: an
answer's text is its tokens' strings joined. A WordPiece decoder (the shipped tiny model's) joins differently::

    tokens:   "{"   "##\""  "ok"   "##\""  ","    "12"
    decoded:  "{"   "\""    " ok"  "\""    ","    " 12"      -> '{" ok", 12'

A word token adds a space and itself, a ``##`` piece adds itself without the prefix, and each token's string
is then cleaned up on its own (``" ,"`` becomes ``","``). The first token gets no space. So the grammar is given
each token's string as it decodes after another token, and constrains the text with one space in front
(``ANSWER_PREFIX``): a first token must then be a word, whose decoded form is that text without the space.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import xgrammar


WORD_PIECE_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                      (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))
# the tokenizers library's WordPiece cleanup, applied to each token's string in order


@dataclass(frozen=True)
class Vocabulary:
    """What xgrammar needs of a tokenizer, and the text a grammar's sentences are prefixed with."""

    info: xgrammar.TokenizerInfo
    answer_prefix: str = ""  # the grammar constrains answer_prefix + the answer's decoded text


def vocabulary(tokenizer: Any, vocab_size: int, stop_ids: list[int]) -> Vocabulary:
    """The vocabulary of a Hugging Face tokenizer, with WordPiece's spaces made explicit."""
    import xgrammar

    decoder = decoder_settings(tokenizer)
    if decoder.get("type") != "WordPiece":
        return Vocabulary(xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                                  stop_token_ids=stop_ids))
    prefix, cleanup = decoder.get("prefix", "##"), decoder.get("cleanup", True)
    by_id = {index: token for token, index in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    encoded = [word_piece_text(by_id.get(index, ""), prefix, cleanup) if index not in special else ""
               for index in range(vocab_size)]  # xgrammar never proposes an empty token but a stop
    return Vocabulary(xgrammar.TokenizerInfo(encoded, xgrammar.VocabType.RAW, vocab_size=vocab_size,
                                             stop_token_ids=stop_ids), answer_prefix=" ")


def word_piece_text(token: str, prefix: str, cleanup: bool) -> str:
    """The text a WordPiece token adds after another token."""
    text = token[len(prefix):] if token.startswith(prefix) else " " + token
    if cleanup:
        for dirty, clean in WORD_PIECE_CLEANUP:
            text = text.replace(dirty, clean)
    return text


def decoder_settings(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer's decoder as its tokenizer.json writes it ({} when it has none)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return (json.loads(backend.to_str()).get("decoder") or {}) if backend is not None else {}
