"""What one actor's device went through: memory peak, and on a GPU, utilization sampled over time."""
from __future__ import annotations

import logging
import resource
import sys
import time

import torch

logger = logging.getLogger(__name__)

NVML_MISSING = ("GPU utilization is not sampled: nvidia-ml-py (module pynvml) is not installed; "
                "install the project's gpu extra: pip install -e '.[gpu]'")


def memory_peak(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): the CUDA allocator's peak on a GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024), "process_max_rss"  # Linux reports KiB


def utilization_unavailable(device: torch.device) -> str | None:
    """Why GPU utilization cannot be sampled on ``device``; None when it can (NVML is importable)."""
    if device.type != "cuda":
        return f"GPU utilization is not sampled: the engine runs on {device.type}, not a GPU"
    try:
        import pynvml  # noqa: F401  (what torch.cuda.utilization calls; the nvidia-ml-py package)
    except ImportError:
        return NVML_MISSING
    return None


class UtilizationSampler:
    """Mean GPU utilization (percent) from NVML, sampled at most every ``interval_s``.

    ``torch.cuda.utilization`` is NVML underneath (the ``nvidia-ml-py`` package, the project's ``gpu``
    extra). When that is missing, the device is not a GPU or NVML fails, :attr:`mean` stays None
    rather than reporting a made-up number, and :attr:`unavailable` says why (logged once on a GPU).
    """

    def __init__(self, device: torch.device, interval_s: float = 1.0):
        self.device = device
        self.interval_s = interval_s
        self.unavailable = utilization_unavailable(device)
        if self.unavailable is not None and device.type == "cuda":
            logger.warning(self.unavailable)
        self._last = 0.0
        self._total = 0.0
        self._count = 0

    @property
    def available(self) -> bool:
        return self.unavailable is None

    def maybe_sample(self) -> None:
        now = time.monotonic()
        if not self.available or now - self._last < self.interval_s:
            return
        self._last = now
        try:
            self._total += float(torch.cuda.utilization(self.device))
            self._count += 1
        except Exception as error:  # NVML present but failing (driver, permissions): "unknown", not zero
            self.unavailable = f"GPU utilization is not sampled: NVML failed ({type(error).__name__}: {error})"
            logger.warning(self.unavailable)

    @property
    def mean(self) -> float | None:
        return self._total / self._count if self._count else None
