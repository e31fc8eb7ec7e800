"""load_model(..., compile=True) on the CPU: each forward runs at its own shape through graphs whose rows and
widths are dynamic (``engine.models.compiled_shapes``). Nothing is padded, the tokens are the eager
engine's, and a run compiles one graph per kind of forward and row count of one or more, whatever its
widths."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import ModelOptions, load_model
from engine.models.compiled import CompiledForward
from engine.models.compiled_shapes import ANY, WIDTH_BUCKETS, CompiledShapes
from engine.models.loader import apply_model_options
from engine.models.transformer import BidirectionalTransformer
from tests.engine_helpers import two_waves

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def fresh_weights(lm, compile: bool):
    """``lm``'s family with random weights (seed 0) and a wider MLP than any other test's model: its
    guards match no graph compiled before, so the graphs a run counts are its own."""
    torch.manual_seed(0)
    config = dataclasses.replace(lm.model.config, intermediate_size=lm.model.config.intermediate_size + 24)
    model = BidirectionalTransformer(config).eval().requires_grad_(False)
    apply_model_options(model, ModelOptions(compile=compile))
    return dataclasses.replace(lm, model=model)



def recorded_shapes(forward: CompiledForward, run) -> list[tuple]:
    """``run()``, recording each compiled call's (window, tokens' shape, key mask)."""
    graph, calls = forward.forward, []

    def recording(model, tokens, positions, key_mask, *rest):
        calls.append((rest[4], tuple(tokens.shape), key_mask.clone()))
        return graph(model, tokens, positions, key_mask, *rest)

    forward.forward = recording
    try:
        run()
    finally:
        forward.forward = graph
    return calls


@pytest.fixture(scope="module")
def llada_waves():
    lm = fresh_weights(load_model(FIXTURES / "tiny-llada", dtype="float32"), compile=True)
    forward = lm.model.compiled
    graphs_before = counters["stats"]["unique_graphs"]
    outputs = {}
    calls = recorded_shapes(forward, lambda: outputs.update(
        tokens=two_waves(BlockServeEngine(lm, EngineConfig(max_batch_size=16)))))
    return lm, outputs["tokens"], calls, counters["stats"]["unique_graphs"] - graphs_before


def test_on_the_cpu_a_compiled_model_runs_exact_shapes_and_static_buckets_only_when_asked():
    lm = load_model(FIXTURES / "tiny-llada", dtype="float32", compile=True)
    assert lm.model.compiled.shape_rule == CompiledShapes(static=False)
    assert CompiledForward(lm.model, static_shapes=True).shape_rule == CompiledShapes(static=True)
    exact = CompiledShapes(static=False)
    assert exact.graph("refresh", 16, 83, 83) == ("refresh", ANY, ANY, ANY)
    assert exact.graph("window", 1, 8, 90) == ("window", 1, ANY, ANY)
    assert CompiledShapes(static=True).graph("window", 1, 8, 96) == ("window", 1, 8, 96)


def test_exact_shapes_give_the_eager_engines_tokens(llada_waves):
    lm, compiled, _, _ = llada_waves
    eager = fresh_weights(load_model(FIXTURES / "tiny-llada", dtype="float32"), compile=False)
    assert two_waves(BlockServeEngine(eager, EngineConfig(max_batch_size=16))) == compiled


def test_exact_shapes_compile_four_graphs_for_a_run_of_many_widths_and_row_counts(llada_waves):
    lm, _, calls, graphs = llada_waves
    forward = lm.model.compiled
    assert graphs == forward.num_graphs <= 4  # torch's own count of graphs compiled, and ours
    assert forward.shapes <= {(kind, rows, ANY, ANY) for kind in ("refresh", "window") for rows in (1, ANY)}
    shapes = {(window, *shape, key_mask.shape[1]) for window, shape, key_mask in calls}
    assert len(shapes) > 3 * graphs  # shapes of their own (bucketed, each would be a graph of its own)


def test_exact_shapes_pad_no_row_and_no_column(llada_waves):
    """A refresh box is its rows' own: each row has a key, and the widest row fills column 0 (rows are
    right-aligned); a window's rows are the window's."""
    _, _, calls, _ = llada_waves
    refreshes = [key_mask for window, _, key_mask in calls if not window]
    assert refreshes and all(mask.any(1).all() and mask[:, 0].any() for mask in refreshes)
    widths = {mask.shape[1] for mask in refreshes}
    assert widths - set(WIDTH_BUCKETS)  # widths of their own, not bucketed


@pytest.mark.parametrize("family", ["tiny-sdar", "tiny-dream"])
def test_block_causal_and_shifted_families_compile_exact_shapes_to_the_eager_tokens(family):
    lm = load_model(FIXTURES / family, dtype="float32")
    models = {compile: fresh_weights(lm, compile) for compile in (True, False)}
    prompts = [[3 + (5 * i + j) % 60 for j in range(6 + 9 * i)] for i in range(6)]
    params = [SamplingParams(max_new_tokens=16 * (1 + i % 3), stop_at_eos=False) for i in range(6)]
    tokens = {compile: [o.token_ids for o in BlockServeEngine(m, EngineConfig(max_batch_size=4)).generate(
        prompts, params)] for compile, m in models.items()}
    assert tokens[True] == tokens[False]
    assert models[True].model.compiled.compile_failures == {} and models[True].model.compiled.num_graphs <= 4
