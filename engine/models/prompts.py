"""Turn what a user passes as a prompt into token ids, with clear errors for what cannot be one.

A prompt too long to fit is refused BEFORE tokenizing (``max_tokens``), so a huge input costs a character
count, not a tokenizer run. The bound is valid for any tokenizer: no token stands for more characters
than its own vocabulary string has (a WordPiece ``##ab`` covers 2, a byte-level ``Ġthe`` 4 bytes, so
at most 4 characters; a byte-fallback ``<0x41>`` 1), so ``tokens >= counted characters / L`` with L the
longest vocabulary string. Only characters every tokenizer must cover are counted: whitespace, control
and format characters and combining marks are not (pre-tokenizers and normalizers may drop them). A
normalizer may also compose characters (Unicode NFC/NFKC merge at most three counted characters into
one: Hangul jamo), so with a normalizer, or a tokenizer we cannot inspect, L is multiplied by three.
"""
from __future__ import annotations

import unicodedata
import weakref
from collections.abc import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

Prompt = str | Sequence[int] | Sequence[Mapping[str, object]]
# the chat roles a prompt may use, the OpenAI server's too; "developer" is OpenAI's newer name for "system"
CHAT_ROLES = ("system", "developer", "user", "assistant")
ROLE_ALIASES = {"developer": "system"}
MAX_COMPOSED_CHARACTERS = 3  # a Hangul syllable from three jamo: the most Unicode composition merges
_chars_per_token: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class PromptTooLongError(ValueError):
    """The prompt cannot fit, whatever it tokenizes to (raised before tokenizing)."""


def is_chat(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 0 and all(
        isinstance(message, Mapping) for message in prompt)


def max_chars_per_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """The most characters of input one token of ``tokenizer`` can stand for (see the module doc)."""
    if tokenizer not in _chars_per_token:
        longest = max(map(len, tokenizer.get_vocab()), default=1)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        composes = backend is None or backend.normalizer is not None
        _chars_per_token[tokenizer] = longest * (MAX_COMPOSED_CHARACTERS if composes else 1)
    return _chars_per_token[tokenizer]


def counted_characters(text: str) -> int:
    """Characters any tokenizer must cover: not whitespace, control/format (C*) or combining marks (M*)."""
    return sum(1 for char in text if not char.isspace() and unicodedata.category(char)[0] not in "CM")


def check_fits(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_tokens: int | None) -> None:
    """Raise PromptTooLongError if ``texts`` cannot tokenize to ``max_tokens`` tokens or fewer, whatever the
    tokenizer does; a cheap pre-check (a length, then a count only when the length alone does not pass)."""
    if max_tokens is None:
        return
    per_token = max_chars_per_token(tokenizer)
    if sum(map(len, texts)) <= max_tokens * per_token:
        return
    characters = sum(map(counted_characters, texts))
    least = -(-characters // per_token)
    if least > max_tokens:
        raise PromptTooLongError(
            f"prompt is too long: {characters} characters are at least {least} tokens (no token of this "
            f"tokenizer stands for more than {per_token} characters), more than the {max_tokens} that fit")


def message_text(content: object, index: int) -> str:
    """A chat message's text: a string, or OpenAI's content parts ``[{"type": "text", "text": ...}]``
    joined with newlines (as vLLM joins them); any other part type is refused, naming it."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise ValueError(f"chat message {index} needs string 'role' and 'content' fields "
                         f"(content may also be a list of text parts)")
    texts = []
    for number, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text":
            shown = f"type {kind!r}" if isinstance(part, Mapping) else f"a {type(part).__name__}"
            raise ValueError(f"chat message {index} content part {number} is {shown}: only 'text' parts "
                             "are supported")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"chat message {index} content part {number} needs a string 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


def chat_role(role: object, index: int) -> str:
    """The role the chat template gets for message ``index``: one of :data:`CHAT_ROLES`, aliases resolved."""
    if not isinstance(role, str):
        raise ValueError(f"chat message {index} needs string 'role' and 'content' fields")
    if role not in CHAT_ROLES:
        raise ValueError(f"chat message {index} has role {role!r}: the roles are {', '.join(CHAT_ROLES)}")
    return ROLE_ALIASES.get(role, role)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, vocab_size: int,
                  max_tokens: int | None = None) -> list[int]:
    """str -> tokenized as is; list[int] -> used as is; list of {"role", "content"} -> chat template.

    ``max_tokens``: the most prompt tokens that can fit; a text prompt that cannot possibly fit is
    refused before it is tokenized (:func:`check_fits`). Token ids are measured by the caller."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty")
        check_fits(tokenizer, [prompt], max_tokens)
        return list(tokenizer(prompt)["input_ids"])
    if is_chat(prompt):
        messages = []
        for index, message in enumerate(prompt):
            role = chat_role(message.get("role"), index)
            messages.append({"role": role, "content": message_text(message.get("content"), index)})
        if not any(message["content"].strip() for message in messages):
            raise ValueError("prompt is empty (every chat message has empty content)")
        check_fits(tokenizer, [message["content"] for message in messages], max_tokens)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
        return list(ids)
    if isinstance(prompt, Sequence) and not isinstance(prompt, (bytes, bytearray)):
        if len(prompt) == 0:
            raise ValueError("prompt is empty")
        ids = list(prompt)
        if not all(isinstance(token, int) and not isinstance(token, bool) for token in ids):
            raise ValueError("a token-id prompt must be a list of ints")
        bad = [token for token in ids if not 0 <= token < vocab_size]
        if bad:
            raise ValueError(f"token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
        return ids
    raise ValueError(
        f"prompt must be a string, a list of token ids or a list of chat messages, got "
        f"{type(prompt).__name__}")
