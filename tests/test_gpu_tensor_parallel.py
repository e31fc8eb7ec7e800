"""The GPU run's ``tensor-parallel`` stage (``research.gpu_tensor_parallel``) on a machine that cannot split a
model: it says why and records the skip, and the other stages still run."""
from __future__ import annotations

import json

import torch


def test_the_tensor_parallel_stage_skips_on_one_gpu_and_says_so(tmp_path, monkeypatch, capsys):
    from research import gpu_checks

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu_checks.main(["--smoke", "--stages", "tensor-parallel", "--out", str(tmp_path)])
    stage = json.loads((tmp_path / "gpu_checks.json").read_text())["stages"]["tensor-parallel"]
    reason = "this machine has 1 GPU(s); tensor parallel needs 2 or more"
    assert stage["skipped"] == reason and stage["gpus"] == 1 and "error" not in stage
    assert f"tensor-parallel: skipped: {reason}" in capsys.readouterr().out


def test_the_tensor_parallel_stage_runs_first_in_the_default_gpu_run():
    from research import gpu_checks

    assert gpu_checks.STAGES[0] == "tensor-parallel" and "tensor-parallel" in gpu_checks.RUNNERS
