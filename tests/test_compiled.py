"""load_model(..., compile=True) with static shapes, CUDA's rule (``engine.models.compiled_shapes``), run
on the CPU: forwards compiled over bucketed shapes give the tokens of the eager engine, batched equals
solo, a run compiles a bounded number of graphs, and every step of a bucket refills the same buffers
(the contract captured CUDA graphs replay on)."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.utils import counters

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import ModelOptions, compiled_shapes, load_model
from engine.models.compiled import CompiledForward, guards_up_to_layer
from engine.models.compiled_shapes import bucket, max_graphs
from engine.models.loader import apply_model_options
from engine.models.transformer import BidirectionalTransformer
from tests.engine_helpers import two_waves

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny-llada"


def static(lm):
    """``lm`` compiled over static, bucketed shapes, as on CUDA (on the CPU the default is exact shapes)."""
    lm.model.compiled = CompiledForward(lm.model, static_shapes=True)
    return lm


@pytest.fixture(scope="module")
def workload():
    """Rows of 36-59 tokens (one width bucket) two at a time: four graphs to compile in all (refresh
    and window, 1 and 2 rows), while rows still join, start blocks and leave at different steps."""
    prompts = [[3 + (5 * i + j) % 60 for j in range(4 + 7 * i % 24)] for i in range(5)]
    params = [SamplingParams(max_new_tokens=32, stop_at_eos=False) for _ in range(5)]
    return prompts, params


@pytest.fixture(scope="module")
def compiled_run(workload):
    """One compiled model (compiled once per test session's shapes), its batched outputs."""
    lm = static(load_model(FIXTURE, dtype="float32", compile=True))
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2))
    graphs_before = counters["stats"]["unique_graphs"]
    outputs = [o.token_ids for o in engine.generate(*workload)]
    run = {"graphs": counters["stats"]["unique_graphs"] - graphs_before, "steps": engine.stats().denoise_steps}
    return lm, outputs, run


def random_model(lm, seed: int, compile: bool, **changes):
    """``lm`` with random weights (``seed``) in a transformer of its config with ``changes``, run with
    ``compile``: two such models of one seed hold the same weights."""
    torch.manual_seed(seed)
    model = BidirectionalTransformer(dataclasses.replace(lm.model.config, **changes)).eval().requires_grad_(False)
    apply_model_options(model, ModelOptions(compile=compile))
    return static(dataclasses.replace(lm, model=model)) if compile else dataclasses.replace(lm, model=model)


def test_buckets_round_rows_to_powers_of_two_and_widths_to_the_next_listed_width():
    assert [bucket(n, 16) for n in (1, 2, 3, 5, 9, 17)] == [1, 2, 4, 8, 16, 16]
    assert bucket(70, 4096, (32, 64, 96, 128)) == 96 and bucket(100, 90, (32, 64, 96, 128)) == 90


def test_compiled_engine_gives_the_eager_engines_tokens(compiled_run, workload):
    _, compiled, _ = compiled_run
    eager = BlockServeEngine(load_model(FIXTURE, dtype="float32"), EngineConfig(max_batch_size=2))
    assert [o.token_ids for o in eager.generate(*workload)] == compiled


def test_compiled_batched_requests_equal_the_same_requests_alone(compiled_run, workload):
    lm, batched, _ = compiled_run
    prompts, params = workload
    for index in (0, 3, 4):
        engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2))
        assert engine.generate([prompts[index]], params[index])[0].token_ids == batched[index]


def test_a_compiled_run_compiles_one_graph_per_bucketed_shape_not_per_step(compiled_run):
    lm, _, run = compiled_run
    assert run["graphs"] == lm.model.compiled.num_graphs <= 4  # torch's own count: one per shape
    assert run["steps"] > 4 * run["graphs"]


def test_a_model_one_layer_deeper_gets_graphs_of_its_own(compiled_run, workload):
    """Guards on layers 1 and up are dropped (host time every step); the layer count stays guarded, so
    a deeper model of the same shapes never runs the graphs compiled for the shallower one."""
    lm, _, _ = compiled_run
    deeper = {compile: random_model(lm, 1, compile, num_layers=lm.model.config.num_layers + 1)
              for compile in (True, False)}
    prompts, params = workload
    graphs_before = counters["stats"]["unique_graphs"]
    compiled = BlockServeEngine(deeper[True], EngineConfig(max_batch_size=2)).generate(prompts[:2], params[:2])
    assert counters["stats"]["unique_graphs"] > graphs_before  # compiled anew, not the shallower model's
    eager = BlockServeEngine(deeper[False], EngineConfig(max_batch_size=2)).generate(prompts[:2], params[:2])
    assert [o.token_ids for o in compiled] == [o.token_ids for o in eager]


def test_guards_stay_on_the_first_layer_of_each_kind_and_leave_the_later_ones():
    """LLaDA2's dense layer 0 and its first expert layer 1 keep their guards; layers 2 and up, built
    like layer 1, drop theirs. Guards outside the layers always stay."""
    names = [f"L['model']._modules['layers']._modules['{i}']._parameters['weight']" for i in range(4)]
    guards = [SimpleNamespace(name=name) for name in names + ["L['tokens']"]]
    assert guards_up_to_layer(1, guards) == [True, True, False, False, True]
    assert guards_up_to_layer(0, guards) == [True, False, False, False, True]


def test_compile_is_an_option_of_the_loaded_model_and_every_engine_on_it_runs_it_so():
    compiled, eager = (load_model(FIXTURE, dtype="float32", compile=compile) for compile in (True, False))
    assert compiled.options == ModelOptions(compile=True) and eager.options == ModelOptions()
    forward = compiled.model.compiled
    engines = [BlockServeEngine(compiled, EngineConfig(max_batch_size=n)) for n in (4, 2)]
    BlockServeEngine(eager, EngineConfig(max_batch_size=4))
    assert all(engine.lm.model.compiled is forward is not None for engine in engines)
    assert eager.model.compiled is None
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['compile'\]"):
        EngineConfig(compile=True)


def recorded_calls(lm, workload) -> list[tuple[tuple, tuple]]:
    """Each compiled forward call of a run: its bucketed shape (window or not, rows, length, keys) and,
    per input tensor, its address and shape."""
    forward = lm.model.compiled
    graph, calls = forward.forward, []

    def recording(model, tokens, positions, key_mask, key_positions, kv, write_slots, write_columns, window,
                  *rest):
        inputs = (tokens, positions, key_mask, key_positions, write_slots, write_columns)
        calls.append(((window, *tokens.shape, key_mask.shape[1]),
                      tuple(None if t is None else (t.data_ptr(), tuple(t.shape)) for t in inputs)))
        return graph(model, tokens, positions, key_mask, key_positions, kv, write_slots, write_columns, window,
                     *rest)

    forward.forward = recording
    try:
        BlockServeEngine(lm, EngineConfig(max_batch_size=2)).generate(*workload)
    finally:
        forward.forward = graph
    return calls


def test_every_step_of_a_compiled_shape_reads_the_same_input_buffers_of_the_buckets_shape(compiled_run, workload):
    """The static-shape contract a captured graph replays on: one set of input tensors per bucketed
    shape, refilled in place at every step, each of the bucket's shape (rows x length, rows x keys)."""
    lm, _, _ = compiled_run
    calls = recorded_calls(lm, workload)
    buffers: dict[tuple, set] = {}
    for shape, inputs in calls:
        buffers.setdefault(shape, set()).add(inputs)
    assert len(calls) > 2 * len(buffers)  # shapes repeat across steps
    assert all(len(sets) == 1 for sets in buffers.values())
    for (_, rows, length, keys), (inputs,) in buffers.items():
        tokens, positions, key_mask, _, write_slots, write_columns = inputs
        assert tokens[1] == positions[1] == write_columns[1] == (rows, length)
        assert key_mask[1] == (rows, keys) and write_slots[1] == (rows, 1)
    addresses = [{address for address, _ in filter(None, inputs)} for (inputs,) in buffers.values()]
    assert len(set().union(*addresses)) == sum(map(len, addresses))  # no two graphs share a buffer


def test_a_compiled_step_buckets_its_shapes_in_a_few_calls_not_one_per_width(compiled_run, workload, monkeypatch):
    """Host work of a compiled step stays off the cache's width: how many graphs a run may compile is
    counted once per shape of the run, not at every forward (thousands of bucket calls a step)."""
    lm, _, _ = compiled_run
    calls = []
    monkeypatch.setattr(compiled_shapes, "bucket", lambda *args: calls.append(args) or bucket(*args))
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=2))
    engine.generate(*workload)
    assert 0 < len(calls) <= 8 * engine.stats().denoise_steps


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA-graph capture needs a GPU")
def test_on_cuda_captured_graphs_give_the_eager_engines_tokens(workload):
    lm = load_model(FIXTURE, dtype="float32", device="cuda", compile=True)
    compiled = BlockServeEngine(lm, EngineConfig(max_batch_size=2))
    assert lm.model.compiled.cuda_graphs
    tokens = [o.token_ids for o in compiled.generate(*workload)]
    eager = BlockServeEngine(load_model(FIXTURE, dtype="float32", device="cuda"), EngineConfig(max_batch_size=2))
    assert [o.token_ids for o in eager.generate(*workload)] == tokens


def run_in_new_thread(function):
    """``function()`` on a fresh thread, as an engine loop runs (dynamo's settings are per thread)."""
    result = {}

    def target():
        try:
            result["value"] = function()
        except BaseException as error:  # re-raised on the test's thread
            result["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]



def test_an_engine_thread_compiles_more_shapes_than_torchs_default_limit_without_failing():
    lm = static(load_model(FIXTURE, dtype="float32", compile=True))
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=16))
    compiled = run_in_new_thread(lambda: two_waves(engine))
    forward = lm.model.compiled
    assert forward.compile_failures == {}
    default_limit = run_in_new_thread(lambda: torch._dynamo.config.recompile_limit)
    assert default_limit == 8 < forward.num_graphs <= max_graphs(16, engine.runner.rows.batch.width)
    eager = BlockServeEngine(load_model(FIXTURE, dtype="float32"), EngineConfig(max_batch_size=16))
    assert two_waves(eager) == compiled


def test_a_shape_that_fails_to_compile_runs_eagerly_with_a_warning_naming_the_cause(compiled_run, caplog):
    """A real compiler failure (no C++ compiler where inductor looks) on a model of its own shapes (no
    cached kernels): the engine keeps stepping eagerly and gives the eager tokens."""
    lm, _, _ = compiled_run
    odd = {compile: random_model(lm, 2, compile, intermediate_size=lm.model.config.intermediate_size + 8)
           for compile in (True, False)}
    prompts = [[3 + j for j in range(9 + i)] for i in range(3)]
    params = [SamplingParams(max_new_tokens=32, stop_at_eos=False)] * 3
    no_compiler = {"cpp.cxx": (None, "/nonexistent/c++"), "fx_graph_cache": False}
    with torch._inductor.config.patch(no_compiler), caplog.at_level("WARNING", "engine.models.compiled"):
        compiled = BlockServeEngine(odd[True], EngineConfig(max_batch_size=4)).generate(prompts, params)
    failures = odd[True].model.compiled.compile_failures
    assert set(failures) == {"refresh 4x64", "window 4x32"}
    assert all("No working C++ compiler" in cause for cause in failures.values())
    assert len([r for r in caplog.records if "runs eagerly" in r.getMessage()]) == len(failures)
    eager = BlockServeEngine(odd[False], EngineConfig(max_batch_size=4)).generate(prompts, params)
    assert [o.token_ids for o in compiled] == [o.token_ids for o in eager]
