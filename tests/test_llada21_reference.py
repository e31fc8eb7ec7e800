"""LLaDA2.1's token editing (``decoding="joint_threshold"``) against code we did not write: diffusers 0.42.1's
``LLaDA2Pipeline`` and ``BlockRefinementScheduler``, on the block-causal fixtures, token for token.

What diffusers is handed, and why (``docs/decoding.md``, LLaDA2.1's token editing):

* The model: our *uncached* forward of the canvas up to the block's end (``forward_full`` with the block
  size), so attention is strict block-causal over absolute blocks, as the engine's. Prompts and answers
  fill whole blocks, so the pipeline's 2-D mask is all ones and the callable can ignore it.
* The budget: diffusers runs at most ``max_post_steps + 1`` post-mask forwards (and applies the last one's
  edits), the remote code and we at most ``max_post_steps``: it is called with ``max_post_steps - 1``. It
  ends a block whose masks took ``num_inference_steps`` steps without editing it: ``block_length + 1``
  never binds, every step commits a mask. It edits only for a positive ``editing_threshold``: our 0.0
  (every disagreement) is 1e-12 there (an argmax's probability is at least 1 / vocab).
* Stop tokens: with ``eos_early_stop=False`` diffusers' ``sequences`` hold all ``gen_length`` tokens, stop
  tokens and what follows them included; ours with ``stop_at_eos=False`` (vLLM's ``ignore_eos``) do too, so
  every answer token is compared, whatever the fixture commits.
* MASK: diffusers' argmax may pick MASK, ours never does. The logits are *not* patched: the callable counts
  the current-block positions whose argmax is MASK and every test asserts there was none, so both sides
  run the same rule on the same softmax (MASK's probability included, as in ours).

Greedy, ``eos_early_stop=False``, float32: the engine's cached windows and diffusers' whole-canvas forwards
round differently, and a probability within that rounding of a threshold, or an exact tie (diffusers'
``topk`` against our leftmost argmax), could split them; none does on these workloads, so float64 is not
needed.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import diffusers  # the test extra pins 0.42.1: the budget mapping below is that version's
import pytest
import torch

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from tests.conftest import FIXTURES
from tests.engine_helpers import StepRecorder

MODES = {  # name -> (threshold, editing_threshold, max_post_steps)
    "S": (0.5, 0.0, 16),  # the model card's speed mode
    "Q": (0.7, 0.5, 16),  # its quality mode
    "S, budget 2": (0.5, 0.0, 2),  # a budget that ends blocks still editing
    "Q, budget 2": (0.7, 0.5, 2),
}
PROMPT_BLOCKS, ANSWER_BLOCKS = (1, 2, 3, 1), (2, 3, 2, 2)  # rows at different blocks when batched


@pytest.fixture(scope="module", params=("tiny-llada2", "tiny-sdar"))
def lm(request):
    return load_model(FIXTURES / request.param, dtype="float32")


def workload(lm) -> tuple[list[list[int]], list[int]]:
    """Prompts of ordinary tokens filling whole trained blocks, and answer lengths of whole blocks."""
    special = set(lm.tokenizer.all_special_ids) | {lm.special_ids.mask_id, *lm.special_ids.stop_ids}
    ordinary = [token for token in range(min(lm.vocab_size, 90)) if token not in special]
    rng, block = random.Random(0), lm.block_length
    prompts = [[rng.choice(ordinary) for _ in range(blocks * block)] for blocks in PROMPT_BLOCKS]
    return prompts, [blocks * block for blocks in ANSWER_BLOCKS]


class UncachedForward:
    """diffusers' ``model(x, attention_mask, position_ids).logits``: the whole canvas each call, strict
    block-causal; it counts calls, calls on a block without masks, and MASK argmaxes in the block."""

    def __init__(self, lm):
        self.lm, self.block = lm, lm.block_length
        self.forwards = self.post_mask_forwards = self.mask_argmaxes = 0

    @torch.no_grad()
    def __call__(self, x, attention_mask=None, position_ids=None):
        mask_id = self.lm.special_ids.mask_id
        hidden = self.lm.model.forward_full(x, position_ids, torch.ones_like(x, dtype=torch.bool),
                                            block_size=self.block)
        logits = self.lm.model.logits(hidden)
        self.forwards += 1
        self.post_mask_forwards += not (x[:, -self.block:] == mask_id).any()
        self.mask_argmaxes += int((logits[:, -self.block:].argmax(-1) == mask_id).sum())
        return SimpleNamespace(logits=logits)


_DIFFUSERS_RUNS: dict[tuple[str, str], SimpleNamespace] = {}


def diffusers_run(lm, mode: str) -> SimpleNamespace:
    """diffusers' answers to :func:`workload`, one prompt at a time, and its counts (cached per mode)."""
    key = (lm.family, mode)
    if key not in _DIFFUSERS_RUNS:
        threshold, editing_threshold, max_post_steps = MODES[mode]
        model, edits = UncachedForward(lm), []
        pipe = diffusers.LLaDA2Pipeline(model=model, scheduler=diffusers.BlockRefinementScheduler(), tokenizer=None)
        pipe.set_progress_bar_config(disable=True)

        def count_edits(pipe, step, timestep, tensors):
            edits.append(int(tensors["editing_transfer_index"].sum()))
            return tensors

        answers = []
        for prompt, length in zip(*workload(lm)):
            out = pipe(input_ids=torch.tensor([prompt]), gen_length=length, block_length=lm.block_length,
                       num_inference_steps=lm.block_length + 1, temperature=0.0, threshold=threshold,
                       editing_threshold=editing_threshold or 1e-12, max_post_steps=max_post_steps - 1,
                       eos_early_stop=False, mask_token_id=lm.special_ids.mask_id, output_type="seq",
                       callback_on_step_end=count_edits, callback_on_step_end_tensor_inputs=["editing_transfer_index"])
            answers.append(out.sequences[0].tolist())
        assert model.mask_argmaxes == 0, "the fixture predicted MASK: diffusers and we would not compare one rule"
        _DIFFUSERS_RUNS[key] = SimpleNamespace(answers=answers, forwards=model.forwards, edits=sum(edits),
                                               post_mask_forwards=model.post_mask_forwards)
    return _DIFFUSERS_RUNS[key]


def engine_for(lm, mode: str, max_batch_size: int = 1) -> BlockServeEngine:
    threshold, editing_threshold, max_post_steps = MODES[mode]
    return BlockServeEngine(lm, EngineConfig(
        decoding="joint_threshold", threshold=threshold, editing_threshold=editing_threshold,
        max_post_steps=max_post_steps, block_length=lm.block_length, max_batch_size=max_batch_size))


def params_for(lm, lengths: list[int]) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=length, stop_at_eos=False) for length in lengths]


@pytest.mark.parametrize("mode", MODES)
def test_each_prompt_alone_decodes_to_diffusers_tokens(lm, mode):
    prompts, lengths = workload(lm)
    expected = diffusers_run(lm, mode).answers
    for prompt, params, answer in zip(prompts, params_for(lm, lengths), expected):
        assert engine_for(lm, mode).generate([prompt], params)[0].token_ids == answer


@pytest.mark.parametrize("mode", MODES)
def test_rows_batched_at_different_blocks_decode_to_diffusers_tokens_and_counts(lm, mode):
    """Four requests, three rows at a time: rows join, edit and leave at different blocks. The engine's
    counts are diffusers': row forwards, forwards of blocks without masks, tokens rewritten."""
    prompts, lengths = workload(lm)
    expected = diffusers_run(lm, mode)
    engine = engine_for(lm, mode, max_batch_size=3)
    recorder = StepRecorder(engine)
    outputs = engine.generate(prompts, params_for(lm, lengths))
    assert [output.token_ids for output in outputs] == expected.answers
    assert recorder.saw_mixed_batch
    stats = engine.stats()
    assert (stats.row_forwards, stats.counters["post_mask_forwards"], stats.counters["edits"]) == (
        expected.forwards, expected.post_mask_forwards, expected.edits)


def test_the_comparisons_exercise_every_way_a_block_ends(lm):
    """Guard on the fixtures: both moves run, and a block ends by a forward that edits nothing (tiny-sdar;
    tiny-llada2's random head keeps flipping tokens) and by a spent budget."""
    blocks = sum(ANSWER_BLOCKS)
    for mode in MODES:
        run, budget = diffusers_run(lm, mode), MODES[mode][2]
        assert run.edits > 0 and run.forwards > run.post_mask_forwards > 0
        assert run.post_mask_forwards <= budget * blocks
        if budget == 2:
            assert run.post_mask_forwards == budget * blocks
    settled = diffusers_run(lm, "S").post_mask_forwards < 16 * blocks
    assert settled == (lm.family == "sdar")


def test_the_answers_compared_hold_stop_tokens_with_tokens_after_them(lm):
    """Guard on the fixtures: on tiny-llada2 a stop token inside an answer is compared with what follows it
    (ignore_eos); tiny-sdar's answers commit none."""
    stops = set(lm.special_ids.stop_ids)
    answers = [answer for mode in MODES for answer in diffusers_run(lm, mode).answers]
    held = any(token in stops for answer in answers for token in answer[:-1])
    assert held == (lm.family != "sdar")
