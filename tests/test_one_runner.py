"""One runner steps every family's rows: it hands out the slots, keeps the prompt pages and owns the sampler,
and a step kind's module does the rest (``engine.runner.runner``, ``engine.runner.interface``)."""
from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from engine.runner.runner import Runner

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ENGINE = Path(__file__).resolve().parents[1] / "engine"
STEP_KINDS = {"tiny-llada": "blocks", "tiny-dream": "blocks", "tiny-sdar": "blocks", "tiny-llada2": "blocks",
              "tiny-nemotron_labs_diffusion": "anchored", "tiny-diffusion_gemma": "canvas"}


def _prompts(count: int) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(10, 60) for _ in range(rng.randrange(3, 20))] for _ in range(count)]


@pytest.mark.parametrize("fixture", sorted(STEP_KINDS))
def test_every_family_steps_on_the_one_runner_whose_slots_and_sampler_its_rows_share(fixture):
    lm = load_model(FIXTURES / fixture, dtype="float32")
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=3, enable_prefix_caching=lm.layout.caches_prefixes))
    runner = engine.runner
    assert type(runner) is Runner and lm.layout.step_kind == STEP_KINDS[fixture]
    assert runner.rows.sampler is runner.sampler
    if STEP_KINDS[fixture] == "blocks":
        assert runner.rows.batch.slots is runner.slots  # packing moves rows within the runner's slots
    used_slots: set[int] = set()
    original = runner.rows.admit

    def admit(request, cached):
        assert runner.slots.holder(request.slot) is request  # the runner gave the joining row its own slot
        used_slots.add(request.slot)
        original(request, cached)

    runner.rows.admit = admit
    outputs = engine.generate(_prompts(7), SamplingParams(max_new_tokens=8))
    assert all(output.finish_reason in ("length", "eos") for output in outputs)
    assert used_slots == {0, 1, 2} and runner.slots.num_free == 3  # 7 rows went through 3 slots, all given back
    assert not getattr(runner.rows, "rows", {}) and not getattr(runner.rows, "row_states", {})


def test_only_the_runner_executes_a_step():
    """No second runner: one class in the engine takes the scheduler's decisions (``execute``)."""
    executing = []
    for path in ENGINE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(isinstance(item, ast.FunctionDef) and item.name == "execute"
                                                      for item in node.body):
                executing.append(f"{path.relative_to(ENGINE)}:{node.name}")
    assert executing == ["runner/runner.py:Runner"]
