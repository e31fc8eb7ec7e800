"""BlockServe engine: block-grained continuous batching for diffusion LLMs (pure torch, no Ray).

Names load on first use, so ``import engine.scheduling.scheduler`` pulls in neither torch nor transformers.
"""
from __future__ import annotations

from engine.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports("engine", {
    "BlockServeEngine": "engine.engine",
    "EngineConfig": "engine.config",
    "EngineStats": "engine.scheduling.stats",
    "RequestOutput": "engine.scheduling.request",
    "SamplingParams": "engine.config",
})
