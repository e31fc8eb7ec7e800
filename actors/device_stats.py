"""What one actor's device went through: memory peak, and on a GPU, utilization sampled over time."""
from __future__ import annotations

import resource
import sys
import time

import torch


def memory_peak(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): the CUDA allocator's peak on a GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_max_rss"  # Linux reports KiB


class UtilizationSampler:
    """Mean GPU utilization (percent) from NVML, sampled at most every ``interval_s``; None off a GPU.

    ``torch.cuda.utilization`` is NVML underneath (it needs the ``pynvml`` package); when that is missing
    or the device is not a GPU, :attr:`mean` stays None rather than reporting a made-up number.
    """

    def __init__(self, device: torch.device, interval_s: float = 1.0):
        self.device = device
        self.interval_s = interval_s
        self.available = device.type == "cuda"
        self._last = 0.0
        self._total = 0.0
        self._count = 0

    def maybe_sample(self) -> None:
        now = time.monotonic()
        if not self.available or now - self._last < self.interval_s:
            return
        self._last = now
        try:
            self._total += float(torch.cuda.utilization(self.device))
            self._count += 1
        except Exception:  # no pynvml / NVML: report "unknown", not zero
            self.available = False

    @property
    def mean(self) -> float | None:
        return self._total / self._count if self._count else None
