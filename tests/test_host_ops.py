"""The host cost of a step, as operations: a deterministic count, so a regression in the hot path
(an extra op per layer is ~32 kernel launches per LLaDA-8B step) fails here rather than on a GPU."""
from __future__ import annotations

import pytest

from benchmarks.host_ops import per_layer_ops

MAX_OPS_PER_LAYER = 45  # issue 18's bar (from 67)
MAX_FIXED_OPS = 100


@pytest.mark.parametrize("fixture", ["tiny-llada", "tiny-dream"])
def test_a_single_part_step_issues_at_most_45_operations_per_layer(fixture):
    kinds = per_layer_ops(fixture, count=4, steps_per_block=4)["kinds"]  # 4 steps a block: short
    assert {"refresh", "window"} <= set(kinds)
    for kind in ("refresh", "window"):
        assert kinds[kind]["per_layer"] <= MAX_OPS_PER_LAYER, (kind, kinds[kind])
        assert kinds[kind]["fixed"] <= MAX_FIXED_OPS, (kind, kinds[kind])


def test_a_block_causal_window_step_issues_at_most_100_fixed_operations():
    """SDAR: its dense layers make the 1- and 2-layer difference a layer's (LLaDA2's second layer is MoE)."""
    window = per_layer_ops("tiny-sdar", count=4)["kinds"]["window"]
    assert window["fixed"] <= MAX_FIXED_OPS, window
