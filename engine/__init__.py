"""BlockServe engine: block-grained continuous batching for diffusion LLMs (pure torch, no Ray).

Names load on first use, so ``import engine.scheduler`` pulls in neither torch nor transformers.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BlockServeEngine": "engine.engine",
    "EngineConfig": "engine.config",
    "EngineStats": "engine.stats",
    "RequestOutput": "engine.request",
    "SamplingParams": "engine.config",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
