"""The benchmark harness keeps working: its smallest pieces run end to end on the CPU in seconds."""
import contextlib
import io
import json
from pathlib import Path

import pytest

STORED = Path(__file__).resolve().parents[1] / "benchmarks" / "results"

HOST = {"fixed_ops": {"refresh": 200.0, "window": 150.0, "packed": 230.0},
        "ops_per_layer": {"refresh": 30.0, "window": 30.0, "packed": 45.0},
        "seconds_per_op": 5e-6, "gap_s": 2e-4, "source": "test figures"}


@pytest.fixture
def host_model_file(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps(HOST))
    return str(path)



def test_gpu_smoke_runs_the_whole_path_and_leaves_results_traces_and_a_summary(tmp_path):
    from benchmarks.__main__ import main

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["gpu", "--smoke", "--out", str(tmp_path)])
    results = json.loads((tmp_path / "results.json").read_text())
    runs = results["models"]["llada-tiny"]["runs"]["modes"]["eager"]
    assert set(runs) == {"continuous", "block_sync", "static", "shrink"}
    invariant = results["exactness_bf16"]["batch-invariant"]  # a child process, bf16, every rule x cache
    assert len(invariant) == 9 and set(invariant.values()) == {1.0}
    for system, run in runs.items():
        assert run["generated_tokens"] > 0 and not run["timed_out"]
        assert set(run["projection_error"]) == {"host model, default", "host model, fitted", "old, default"}
        assert (tmp_path / "traces" / f"eager-{system}.jsonl").read_text().count("\n") == run["forwards"]
    calibration = results["models"]["llada-tiny"]["calibration"]
    assert calibration["rows"] and all(row["host_s"] > 0 for row in calibration["rows"])
    assert (tmp_path / "environment.json").exists()
    summary = (tmp_path / "summary.txt").read_text()
    assert summary == printed.getvalue().rstrip("\n") + "\n" and len(summary.splitlines()) < 20


def test_length_replay_stops_every_request_at_its_target_through_the_real_decoder(tiny_engine_factory):
    from benchmarks.replay import replay
    from benchmarks.systems import run_system

    engine = tiny_engine_factory(dtype="float32")
    workload = replay("short", engine.lm, 6)
    steered = workload.steered(engine.lm)
    results = {system: run_system(steered, system, workload.workload, max_batch_size=4)
               for system in ("continuous", "block_sync", "static")}
    for result in results.values():
        assert [r["output_tokens"] for r in result.requests] == workload.answer_lengths
    eos_blocks = [length // 32 + 1 for length in workload.answer_lengths]  # EOS sits right after the answer
    for system in ("continuous", "block_sync"):
        assert [r["num_blocks"] for r in results[system].requests] == eos_blocks
    assert len({result.extra["outputs_digest"] for result in results.values()}) == 1


def test_throughput_projects_each_schedule_with_the_host_model_and_the_old_projection(tmp_path, host_model_file):
    from benchmarks.__main__ import main
    from benchmarks.host_ops import FIXTURES

    result = main(["throughput", "--scale", "smoke", "--workload", "short", "--host-model", host_model_file,
                   "--model", str(FIXTURES / "tiny-llada"), "--out", str(tmp_path)])
    summary = result["workloads"]["short"]
    assert summary["identical_outputs"]
    for row in summary["systems"].values():
        projected = row["projected"]
        assert row["tokens_per_s"] > 0 and 0 < projected["tokens_per_s"] < projected["sensitivity_tokens_per_s"][
            "no host (GPU time only)"]
        assert 0 < projected["mfu"] <= 1 and projected["old_tokens_per_s"] > 0
        assert projected["refresh_s"] + projected["window_s"] == pytest.approx(projected["total_s"])
    assert {"continuous_over_block_sync_projected", "block_sync_over_static_old_projection"} <= set(summary["figures"])
    assert json.loads((tmp_path / "throughput.json").read_text())["meta"]["command"].startswith(
        "python -m benchmarks throughput")
    assert (tmp_path / "throughput.png").read_bytes()[:4] == b"\x89PNG"


def test_every_experiment_is_reachable_from_the_one_cli():
    import importlib

    from benchmarks.__main__ import EXPERIMENTS, main, translate

    for experiment in EXPERIMENTS:
        module, argv = translate(experiment, "smoke", None, None, [])
        assert callable(importlib.import_module(module).main), experiment
    assert translate("exactness", "full", None, Path("/tmp/x"), [])[1] == ["--out", "/tmp/x/exactness.json"]
    with pytest.raises(SystemExit, match="no --device"):
        translate("gpu", None, "cuda", None, [])
    with pytest.raises(SystemExit):  # everything the GPU run writes goes under --out: it has to be given
        main(["gpu", "--smoke"])


def test_the_cli_help_lists_every_experiment_once_from_its_summary():
    from benchmarks.__main__ import EXPERIMENTS, describe

    help_text = describe()
    for name, experiment in EXPERIMENTS.items():
        assert help_text.count(f"\n    {name} ") == 1 and experiment.summary in help_text, name
    readme = (STORED.parent / "README.md").read_text()
    assert all(f"| `{name}` |" in readme for name in EXPERIMENTS)


def old_labels(value) -> list:
    """Every place an old system label still sits: a label field, a key of a mapping by system, a ratio's key."""
    from benchmarks.results_io import OLD_LABELS, OLD_RATIO

    if isinstance(value, list):
        return [found for item in value for found in old_labels(item)]
    if not isinstance(value, dict):
        return []
    found = [key for key in value if ("static" in value and key in OLD_LABELS) or OLD_RATIO.match(key)]
    found += [item for key, item in value.items() if key in ("system", "label") and item in OLD_LABELS]
    return found + [inner for item in value.values() for inner in old_labels(item)]


def test_stored_results_read_back_under_the_schedule_names(tmp_path):
    from benchmarks.plots import measured_vs_projected
    from benchmarks.results_io import read_results

    stored = sorted(STORED.rglob("*.json"))
    assert len(stored) > 10 and any(old_labels(json.loads(path.read_text())) for path in stored)
    for path in stored:
        assert not old_labels(read_results(path)), path
    raw = json.loads((STORED / "serve_load" / "step-vs-block.json").read_text())["summary"][0]
    row = read_results(STORED / "serve_load" / "step-vs-block.json")["summary"][0]
    assert row["continuous"] == raw["step"] and row["block_sync"] == raw["blockserve"]
    assert row["continuous_over_block_sync_throughput"] == raw["step_over_block_throughput"]
    throughput = read_results(STORED / "throughput" / "throughput.json")
    assert list(throughput["workloads"]["humaneval"]["systems"]) == ["continuous", "block_sync", "static", "shrink"]
    assert measured_vs_projected(throughput, tmp_path / "figure.png").stat().st_size > 1000


def test_one_median_and_one_percentile():
    from benchmarks.summary import median, median_item, percentile

    assert median([3.0, 1.0, 2.0, 10.0]) == 2.0  # the lower middle: an observed value
    assert median_item([{"v": 3}, {"v": 1}, {"v": 2}, {"v": 10}], key=lambda item: item["v"]) == {"v": 2}
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([1.0, 2.0], 100) == 2.0


def expected_row_steps(counts, answer_lengths: list[int], block: int = 32) -> int:
    """Steps of every request's blocks up to its EOS block when each step commits what the table says."""
    total = 0
    for request, target in enumerate(answer_lengths):
        for index in range(target // block + 1):
            left = max(0, min(block, target - index * block))  # content positions before the EOS
            steps = 1 if left == 0 else 0
            while left:
                left -= min(int(counts[request, index, left]), left)
                steps += 1
            total += steps
    return total


def test_commit_profile_decides_every_steps_commits_identically_for_every_schedule():
    from benchmarks.host_ops import FIXTURES
    from benchmarks.replay import replay
    from benchmarks.systems import run_system
    from engine.models import load_model

    lm = load_model(FIXTURES / "tiny-llada", dtype="float32")  # random weights: the profile alone paces it
    workload = replay("humaneval", lm, 4)
    steered = workload.steered(lm)
    counts = steered.model.commit_counts(32)
    results = {system: run_system(steered, system, workload.workload, max_batch_size=3)
               for system in ("continuous", "block_sync", "static")}
    for system in ("continuous", "block_sync"):
        assert sum(record.rows for record in results[system].extra["trace"]) == expected_row_steps(
            counts, workload.answer_lengths)
    assert len({result.extra["outputs_digest"] for result in results.values()}) == 1
    assert [r["output_tokens"] for r in results["static"].requests] == workload.answer_lengths


def test_replay_prompts_have_the_shipped_humaneval_bpe_widths(tiny_engine_factory):
    from benchmarks.replay import CANVAS_TOKENS, load_humaneval_lengths as load, replay

    lm = tiny_engine_factory(dtype="float32").lm
    shipped = load()
    assert len(shipped["prompt_tokens"]) == 164 and 100 < shipped["prompt_tokens_median"] < 160
    workload = replay("humaneval", lm)
    keep = lm.max_length - CANVAS_TOKENS
    widths = [len(p) for p in workload.prompt_token_ids]
    assert len(set(widths)) == len(widths) <= keep  # distinct: the steering knows a request by its width
    shifts = [abs(width - min(w, keep)) for width, w in zip(widths, shipped["prompt_tokens"])]
    assert sum(shifts) / len(shifts) < 8 and workload.workload.notes["prompt_width_shift_mean"] < 8
    assert workload.answer_lengths == [min(n, CANVAS_TOKENS - 1) for n in shipped["solution_tokens"]]


def test_steering_reads_nothing_back_to_the_host(monkeypatch):
    """The wrapper's refresh and window steps add no host synchronisation to the base model's own."""
    import torch

    from benchmarks.calibrate_gpu import _parts, random_lm
    from benchmarks.commit_profile import LLADA_THRESHOLD_09
    from benchmarks.gpu import SMOKE_SHAPES
    from benchmarks.steering import SteeredModel

    lm = random_lm("t", *SMOKE_SHAPES["llada-tiny"], torch.device("cpu"), torch.float32)
    syncs = []
    for name in ("tolist", "item", "__bool__", "__int__", "__index__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name, lambda self, *a, _o=original, _n=name: syncs.append(_n) or _o(self, *a))
    steered = SteeredModel(lm.model, logit_shift=0, mask_id=lm.special_ids.mask_id, eos_id=lm.special_ids.eos_id,
                           stop_ids=lm.special_ids.stop_ids, prompt_lengths=[32], answer_lengths=[10],
                           canvas_tokens=64, profile=LLADA_THRESHOLD_09)  # rows of 96 = 32 + 64 columns
    for refresh_rows, window_rows in ((2, 0), (0, 2), (1, 2)):
        refresh, window, kv_cache, _ = _parts(lm, refresh_rows, window_rows, 96)
        with torch.no_grad():
            syncs.clear()
            lm.model.logits(lm.model.forward_step(refresh, window, kv_cache))
            base = len(syncs)
            syncs.clear()
            steered.logits(steered.forward_step(refresh, window, kv_cache))
        assert len(syncs) == base, f"steering added host syncs: {syncs}"

