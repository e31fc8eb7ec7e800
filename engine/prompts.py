"""Turn what a user passes as a prompt into token ids, with clear errors for what cannot be one."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

Prompt = str | Sequence[int] | Sequence[Mapping[str, str]]


def is_chat(prompt: object) -> bool:
    return isinstance(prompt, Sequence) and not isinstance(prompt, str) and len(prompt) > 0 and all(
        isinstance(message, Mapping) for message in prompt)


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: Prompt, vocab_size: int) -> list[int]:
    """str -> tokenized as is; list[int] -> used as is; list of {"role", "content"} -> chat template."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ValueError("prompt is empty")
        return list(tokenizer(prompt)["input_ids"])
    if is_chat(prompt):
        for index, message in enumerate(prompt):
            if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
                raise ValueError(f"chat message {index} needs string 'role' and 'content' fields")
        if not any(message["content"].strip() for message in prompt):
            raise ValueError("prompt is empty (every chat message has empty content)")
        ids = tokenizer.apply_chat_template(
            [dict(message) for message in prompt], add_generation_prompt=True, tokenize=True,
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
