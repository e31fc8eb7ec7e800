"""Long inputs cost linear time and are refused before tokenizing when they cannot fit.

No test here reads a clock: linear time is shown by the pre-tokenizer's bounded pieces (WordPiece's
cost is quadratic only within a piece), the guard by what it refuses without calling the tokenizer.
"""
from __future__ import annotations

import pytest

from engine.models.loader import TINY_MODEL_DIR, load_tokenizer
from tinylm.tokenizer import MAX_PIECE_CHARS, UNK, build_tokenizer


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return load_tokenizer(TINY_MODEL_DIR)


def test_shipped_tokenizer_splits_long_runs_like_build_tokenizer(tiny_tokenizer):
    shipped = tiny_tokenizer.backend_tokenizer.pre_tokenizer.__getstate__()
    built = build_tokenizer().backend_tokenizer.pre_tokenizer.__getstate__()
    assert shipped == built


def test_a_long_word_is_cut_into_bounded_pieces(tiny_tokenizer):
    pieces = tiny_tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("x" * 1000 + " count")
    assert max(len(text) for text, _ in pieces) == MAX_PIECE_CHARS
    assert "".join(text for text, _ in pieces) == "x" * 1000 + "count"


def test_a_60000_character_word_becomes_characters_never_unk(tiny_tokenizer):
    ids = tiny_tokenizer("ab" * 30_000)["input_ids"]
    tokens = tiny_tokenizer.convert_ids_to_tokens(ids)
    assert len(ids) == 60_000
    assert UNK not in tokens
    assert {token.removeprefix("##") for token in tokens} == {"a", "b"}


def test_words_up_to_the_piece_length_tokenize_as_one_wordpiece_run(tiny_tokenizer):
    word = "q" * MAX_PIECE_CHARS
    assert tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer(word)["input_ids"]) == (
        ["q"] + ["##q"] * (MAX_PIECE_CHARS - 1))
    assert tiny_tokenizer.convert_ids_to_tokens(tiny_tokenizer("count from 17 to 52")["input_ids"]) == [
        "count", "from", "17", "to", "52"]
