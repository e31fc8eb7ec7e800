"""Shared by the engine tests: chat prompts, a mixed workload of held-out rows, and a recorder of steps."""
from __future__ import annotations

import random

from engine import SamplingParams

BLOCK = 32


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class StepRecorder:
    """Wraps the runner to see every step that runs rows: block indices, starting and continuing rows, box, and the
    widest row the scheduler gave it."""

    def __init__(self, engine):
        self.steps: list[dict] = []
        execute = engine.runner.execute

        def recording_execute(scheduled):
            starting, continuing = scheduled.starting, scheduled.continuing
            block_indices = [r.block_index for r in (*starting, *continuing)]
            widest = max((r.width for r in (*starting, *continuing)), default=0)
            output = execute(scheduled)
            if scheduled.num_rows:
                self.steps.append({"block_indices": block_indices, "starting": {r.request_id for r in starting},
                                   "continuing": {r.request_id for r in continuing},
                                   "box": output.record.bounding_box_tokens, "rows": output.record.rows,
                                   "widest": widest})
            return output

        engine.runner.execute = recording_execute

    @property
    def saw_mixed_batch(self) -> bool:
        return any(len(set(step["block_indices"])) > 1 for step in self.steps)

    @property
    def saw_block_starts_beside_continuing_rows(self) -> bool:
        """Some row started a block while others continued theirs, in the same step."""
        return any(step["starting"] and step["continuing"] for step in self.steps)


def mixed_workload(rows, count=16):
    prompts = [chat(row["prompt"]) for row in rows[:count]]
    caps = [BLOCK * (1 + index % 3) for index in range(count)]
    return prompts, caps


def two_waves(engine) -> list[list[int]]:
    """Twelve rows of 10-21 tokens, then twelve of 70-81, leaving at different blocks: refresh and window
    forwards of many row counts at two widths."""
    outputs = []
    for prompt_length in (10, 70):
        prompts = [[3 + (7 * i + j) % 60 for j in range(prompt_length + i)] for i in range(12)]
        params = [SamplingParams(max_new_tokens=32 * (1 + i % 4), stop_at_eos=False) for i in range(12)]
        outputs += [o.token_ids for o in engine.generate(prompts, params)]
    return outputs


def ordinary_prompts(lm, lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    """Token-id prompts of ordinary tokens (no special, mask or stop id), one of each length: lengths that put
    the answer at several offsets in a block."""
    special = set(lm.tokenizer.all_special_ids) | {lm.special_ids.mask_id, *lm.special_ids.stop_ids}
    ordinary = [token for token in range(min(lm.vocab_size, 90)) if token not in special]
    rng = random.Random(seed)
    return [[rng.choice(ordinary) for _ in range(length)] for length in lengths]
