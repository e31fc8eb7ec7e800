"""LLaDA2.2's insert / delete editing through the doors, without Ray: the real OpenAIServer over a real EngineLoop
on the LLaDA2.2-layout fixture (``scripts/make_llada22_fixture``), its steps recorded by a ServeMetrics whose Ray
metrics are stand-ins. A request's ``editing_threshold`` / ``max_post_steps`` reach the rule; a stream sends each
block when it is final; the rule's edits, deletes and splits reach the engine's stats, the Serve metric and the job
summary."""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from actors.engine_loop import EngineLoop
from actors.serving import serve_metrics
from actors.serving.openai.protocol import CompletionRequest
from actors.serving.openai.server import OpenAIServer
from engine import BlockServeEngine, EngineConfig, SamplingParams
from scripts.make_llada22_fixture import write_llada22
from tests.serve_helpers import wait_until

MODEL = "tiny-llada2.2"
ENGINE = {"max_batch_size": 4}  # the checkpoint's own rule: joint_threshold_indel 0.5 / 0.0 / 16
PROMPTS = ("the quick brown fox jumps over", "hello", "a b c d e f g h i j k l m n o p q r s t u v w x y z 0 1 2")
SETTINGS = {"editing_threshold": 0.5, "max_post_steps": 2}


class StandInMetric:
    """A Ray metric's calls, kept: the last value set (gauges) or the sum (counters), by tags."""

    def __init__(self, name: str, doc: str, tag_keys: tuple[str, ...] = (), **options) -> None:
        self.name, self.values = name, {}

    def set_default_tags(self, tags: dict) -> None:
        pass

    def set(self, value: float, tags: dict | None = None) -> None:
        self.values[tuple(sorted((tags or {}).items()))] = value

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        key = tuple(sorted((tags or {}).items()))
        self.values[key] = self.values.get(key, 0) + value

    def observe(self, value: float, tags: dict | None = None) -> None:
        pass


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model_dir = write_llada22(tmp_path_factory.mktemp("llada22-serving"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(serve_metrics, "ray_metrics", SimpleNamespace(Counter=StandInMetric, Gauge=StandInMetric,
                                                                    Histogram=StandInMetric))
        metrics = serve_metrics.ServeMetrics(MODEL)
    loop = EngineLoop(BlockServeEngine.from_pretrained(model_dir, EngineConfig(**ENGINE)),
                      on_step=metrics.record_step).start()
    yield SimpleNamespace(server=OpenAIServer(loop, model_name=MODEL, default_max_tokens=16), metrics=metrics)
    loop.stop()


def completion(server: OpenAIServer, prompt: str, **fields):
    request = CompletionRequest.model_validate({"model": MODEL, "prompt": prompt, "ignore_eos": True, **fields})
    return asyncio.run(server.completions(request))


def engine_answers(served, **settings) -> list:
    engine = BlockServeEngine(served.server.loop.engine.lm, EngineConfig(**ENGINE))
    return engine.generate(list(PROMPTS), SamplingParams(max_new_tokens=40, stop_at_eos=False, **settings))


def test_a_requests_editing_threshold_and_max_post_steps_reach_the_rule(served):
    assert served.server.loop.engine.config.decoding == "joint_threshold_indel"
    defaults, set_ = engine_answers(served), engine_answers(served, **SETTINGS)
    assert [o.text for o in defaults] != [o.text for o in set_]  # the settings change these answers
    for prompt, expected in zip(PROMPTS, set_):
        assert completion(served.server, prompt, max_tokens=40, **SETTINGS).choices[0].text == expected.text
    for prompt, expected in zip(PROMPTS, defaults):
        assert completion(served.server, prompt, max_tokens=40).choices[0].text == expected.text


def test_a_stream_sends_each_block_once_it_is_final(served):
    async def collect(prompt: str) -> list[str]:
        request = CompletionRequest.model_validate({"model": MODEL, "prompt": prompt, "max_tokens": 40,
                                                    "ignore_eos": True, "stream": True})
        return [event async for event in await served.server.completions(request)]

    for prompt, expected in zip(PROMPTS, engine_answers(served)):
        events = asyncio.run(collect(prompt))
        assert events[-1] == "data: [DONE]\n\n" and len(events) - 1 == expected.num_blocks > 1
        chunks = [json.loads(event.removeprefix("data: "))["choices"][0]["text"] for event in events[:-1]]
        assert "".join(chunks) == expected.text  # no block was sent before its edits ended


def test_edits_deletes_and_splits_reach_stats_the_serve_metric_and_the_job_summary(served):
    from pipeline.stats import aggregate, format_table
    from tests.test_job_summary_decoding import snapshot

    for prompt in PROMPTS:
        completion(served.server, prompt, max_tokens=40)
    counters = served.server.loop.engine.stats().counters
    assert set(counters) == {"edits", "deletes", "splits"} and min(counters.values()) > 0
    gauge = served.metrics.rule_counters.values  # set after the step's blocks are pushed: wait for it
    wait_until(lambda: {dict(tags)["counter"]: value for tags, value in gauge.items()} == counters, 30.0,
               "blockserve_rule_counter to equal the engine's counters")
    engine = served.server.loop.stats.to_dict()
    summary = aggregate([snapshot("a", 0, 0, 0, 0) | {"engine": engine}], wall_s=10.0, bin_tokens=32)
    assert summary["totals"]["counters"] == counters
    table = format_table(summary)
    assert f"deletes {counters['deletes']}, edits {counters['edits']}, splits {counters['splits']}" in table
