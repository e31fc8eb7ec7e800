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


def test_the_guard_bound_is_the_longest_vocabulary_string_and_counts_only_covered_characters(
        tiny_tokenizer):
    from engine.models.prompts import counted_characters, max_chars_per_token

    assert tiny_tokenizer.backend_tokenizer.normalizer is None
    assert max_chars_per_token(tiny_tokenizer) == max(map(len, tiny_tokenizer.get_vocab())) == len(
        "<|start_header_id|>")
    assert counted_characters("a b\tc\n\u200bd\u0301e") == 5  # not whitespace, a format char, a mark


def test_every_prompt_the_guard_refuses_really_has_more_tokens_than_allowed(tiny_tokenizer):
    from engine.models.prompts import PromptTooLongError, check_fits

    texts = ["count from 1 to 399 " * 40, "x" * 2000, "<|start_header_id|>" * 60, "1,2;3 " * 300]
    for text in texts:
        tokens = len(tiny_tokenizer(text)["input_ids"])
        for limit in (tokens, tokens // 2, tokens // 20):
            try:
                check_fits(tiny_tokenizer, [text], limit)
            except PromptTooLongError:
                assert tokens > limit, (text[:20], limit)


def test_the_engine_refuses_a_60000_character_word_without_tokenizing_it(tiny_engine_factory, monkeypatch):
    from engine import SamplingParams

    engine = tiny_engine_factory(dtype="float32", max_batch_size=2)
    tokenizer = engine.lm.tokenizer
    calls = []
    monkeypatch.setattr(type(tokenizer), "__call__", lambda self, *a, **k: calls.append(a) or 1 / 0)
    (output,) = engine.generate(["w" * 60_000], SamplingParams(max_new_tokens=32))
    assert output.finish_reason == "error" and "60000 characters" in output.error and calls == []
