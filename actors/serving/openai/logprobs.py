"""Log-probabilities in OpenAI's two shapes (legacy completions, chat), from the engine's per-token ones.

Each number is the log-probability of the token at the denoising step that committed it, under the
model's distribution over every token but MASK, with ``logit_bias`` and without temperature, top-k or
top-p (see ``engine/runner/logit_processors.py``). A diffusion decoder commits tokens out of order, so a token's
number is conditioned on the tokens committed before it in any position, not only those to its left.
"""
from __future__ import annotations

from collections.abc import Sequence

from openai.types.chat import ChatCompletionTokenLogprob
from openai.types.chat.chat_completion import ChoiceLogprobs
from openai.types.chat.chat_completion_token_logprob import TopLogprob
from openai.types.completion_choice import Logprobs
from transformers import PreTrainedTokenizerBase

from engine.scheduling.request import TokenLogprob


def within_text(tokenizer: PreTrainedTokenizerBase, entries: Sequence[TokenLogprob],
                text: str) -> list[TokenLogprob]:
    """The entries of the tokens whose decoded prefix fits in ``text`` (a stop string may cut it)."""
    kept = []
    for count in range(1, len(entries) + 1):
        ids = [entry.token_id for entry in entries[:count]]
        if len(tokenizer.decode(ids, skip_special_tokens=True)) > len(text):
            break
        kept.append(entries[count - 1])
    return kept


def _token(tokenizer: PreTrainedTokenizerBase, token_id: int) -> str:
    return tokenizer.decode([token_id])


def completion_logprobs(tokenizer: PreTrainedTokenizerBase, entries: Sequence[TokenLogprob]) -> Logprobs:
    tokens = [_token(tokenizer, entry.token_id) for entry in entries]
    offsets, text = [], ""
    for count in range(len(entries)):
        offsets.append(len(text))
        text = tokenizer.decode([entry.token_id for entry in entries[:count + 1]], skip_special_tokens=True)
    return Logprobs(tokens=tokens, token_logprobs=[entry.logprob for entry in entries], text_offset=offsets,
                    top_logprobs=[{_token(tokenizer, token): value for token, value in entry.top}
                                  for entry in entries])


def chat_logprobs(tokenizer: PreTrainedTokenizerBase, entries: Sequence[TokenLogprob]) -> ChoiceLogprobs:
    def item(token_id: int, value: float) -> dict:
        token = _token(tokenizer, token_id)
        return {"token": token, "bytes": list(token.encode()), "logprob": value}

    return ChoiceLogprobs(content=[
        ChatCompletionTokenLogprob(**item(entry.token_id, entry.logprob),
                                   top_logprobs=[TopLogprob(**item(token, value)) for token, value in entry.top])
        for entry in entries])
