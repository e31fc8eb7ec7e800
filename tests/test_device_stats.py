"""Device stats, specified on the CPU: GPU utilization is None with a reason, never a made-up number."""
from __future__ import annotations

import logging
import sys

import torch

from actors.ray_data.device_stats import UtilizationSampler


def test_without_nvidia_ml_py_a_gpu_sampler_says_what_to_install(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails, as on the CPU install
    with caplog.at_level(logging.WARNING, logger="actors.ray_data.device_stats"):
        sampler = UtilizationSampler(torch.device("cuda"), interval_s=0.0)
    sampler.maybe_sample()  # must not reach torch.cuda (there is no GPU here)
    assert sampler.mean is None and not sampler.available
    assert "nvidia-ml-py" in sampler.unavailable and "pip install -e '.[gpu]'" in sampler.unavailable
    assert [record.getMessage() for record in caplog.records] == [sampler.unavailable]


def test_on_the_cpu_utilization_is_none_and_says_why():
    sampler = UtilizationSampler(torch.device("cpu"), interval_s=0.0)
    sampler.maybe_sample()
    assert sampler.mean is None and "runs on cpu, not a GPU" in sampler.unavailable
