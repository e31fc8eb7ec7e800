"""An anchored row's step count is its request's: ``Request.step_in_block`` counts denoising steps, not stores.

The scheduler counts each row's steps within its active block, and every runner reads that count. An anchored
row (Nemotron-Labs-Diffusion) also runs store spans (its prompt, then each finished block) and verify spans
(a whole draft) between its denoising or drafting steps; those are no steps of a block, so a block's first
denoising step reads 0 as a block row's does.
"""
from __future__ import annotations

import pytest

from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.models.loader import load_model
from engine.rules.base import BlockUpdate, BlockView
from engine.scheduling.outputs import RowResult, RunnerOutput
from tests.conftest import FIXTURES
from tests.factories import make_requests, make_scheduler, runner_output

NEMOTRON_DIR = FIXTURES / "tiny-nemotron_labs_diffusion"
PROMPT = [11, 23, 35, 47, 59]


class StepsSeen:
    """A rule that records the ``step_in_block`` of every block step it takes, and otherwise is ``rule``."""

    def __init__(self, rule) -> None:
        self.rule, self.seen = rule, []

    def __getattr__(self, name: str):
        return getattr(self.rule, name)

    def step(self, view: BlockView) -> BlockUpdate:
        self.seen += view.step_in_block.tolist()
        return self.rule.step(view)


@pytest.fixture(scope="module")
def lm():
    return load_model(NEMOTRON_DIR, dtype="float32")


def recording_engine(lm, **settings) -> tuple[BlockServeEngine, StepsSeen]:
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=1, **settings))
    engine.runner.rule = StepsSeen(engine.runner.rule)
    return engine, engine.runner.rule


def test_a_store_step_leaves_the_step_count_where_it_was_and_a_denoising_step_adds_one():
    scheduler = make_scheduler(requests=make_requests(caps=8))
    (request,) = scheduler.schedule(0.0).starting
    scheduler.update(RunnerOutput(rows={request.request_id: RowResult(False, None, None, denoised=False)},
                                  model_time_s=0.0))
    assert request.step_in_block == 0
    scheduler.update(runner_output(scheduler.schedule(0.0)))
    assert request.step_in_block == 1


def test_the_prompt_store_of_an_anchored_row_is_not_a_step_of_its_first_block(lm):
    engine, _ = recording_engine(lm, decoding="threshold", threshold=0.5)
    engine.add_request(PROMPT, SamplingParams(max_new_tokens=8, stop_at_eos=False))
    engine.step()  # the prompt's store, which seeds the first block
    (request,) = engine.scheduler.running
    assert (request.step_in_block, request.num_steps) == (0, 1)


@pytest.mark.parametrize("causal_context", [True, False])
def test_each_block_of_a_quota_row_reads_its_denoising_steps_from_zero(lm, causal_context):
    engine, rule = recording_engine(lm, decoding="quota", steps_per_block=4, causal_context=causal_context)
    block = engine.config.block_length
    engine.generate([PROMPT], SamplingParams(max_new_tokens=3 * block, stop_at_eos=False))
    assert rule.seen == [0, 1, 2, 3] * 3


def test_each_draft_of_a_linear_spec_row_reads_its_drafting_steps_from_zero(lm):
    engine, rule = recording_engine(lm, decoding="linear_spec", threshold=0.9)
    engine.generate([PROMPT], SamplingParams(max_new_tokens=24, stop_at_eos=False))
    assert rule.seen[0] == 0 and rule.seen.count(0) > 1  # several drafts, each verified before the next
    assert all(step in (0, before + 1) for before, step in zip(rule.seen, rule.seen[1:]))
    assert max(rule.seen) > 0  # a draft at threshold 0.9 takes more than one step
