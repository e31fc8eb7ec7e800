"""A canvas rule plans each canvas row's step as spans and reads it back (``CanvasRule.plan_canvas``,
``read_canvas``): a store of the row's pending context and a new canvas where none is being denoised, then the
canvas; a completed canvas is reported and becomes the context its next step stores."""
from __future__ import annotations

import torch

from engine.rules.entropy_bound import EntropyBound
from engine.rules.spans import SpanPlan

RULE = EntropyBound(max_denoising_steps=4, entropy_bound=0.1, t_min=0.4, t_max=0.8, stability_threshold=1,
                    confidence_threshold=0.005)
PROMPT = [11, 12, 13]


def test_an_admitted_row_stores_its_prompt_and_draws_a_canvas_in_its_first_step():
    state = RULE.new_canvas_row(seed=7, device=torch.device("cpu"))
    assert RULE.plan_canvas(PROMPT, state) == SpanPlan("canvas", False, (), stores=True, draws=True)
    expected = torch.Generator().manual_seed(7)
    assert torch.equal(RULE.initial_canvas(state.generator, 4, 50, torch.device("cpu")),
                       torch.randint(0, 50, (1, 4), generator=expected))


def test_a_canvas_that_goes_on_keeps_its_store_and_plans_neither_store_nor_draw_next():
    state = RULE.new_canvas_row(seed=0, device=torch.device("cpu"))
    plan = RULE.plan_canvas(PROMPT, state)
    reading = RULE.read_canvas(plan, state, PROMPT, [5, 6, 7, 8, False])
    assert (reading.kept, reading.emitted, reading.pending) == (len(PROMPT), None, None)
    assert state.conditioned and state.drawn
    assert RULE.plan_canvas([], state) == SpanPlan("canvas", False, (), stores=False, draws=False)


def test_a_completed_canvas_is_reported_then_stored_before_a_new_canvas_is_drawn():
    state = RULE.new_canvas_row(seed=0, device=torch.device("cpu"))
    RULE.read_canvas(RULE.plan_canvas(PROMPT, state), state, PROMPT, [5, 6, 7, 8, False])
    plan = RULE.plan_canvas([], state)
    reading = RULE.read_canvas(plan, state, [], [5, 6, 9, 1, True])
    assert (reading.kept, reading.emitted, reading.pending) == (0, [5, 6, 9, 1], [5, 6, 9, 1])
    assert RULE.plan_canvas(reading.pending, state) == SpanPlan("canvas", False, (), stores=True, draws=True)
