"""Ray adapters around the engine. Names load on first use, so ``import actors`` pulls in neither
torch nor ray (Ray Data imports this package on every worker)."""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BlockServeActor": "actors.block_serve_actor",
    "BlockServeProcessorConfig": "actors.processor",
    "StatsRegistry": "actors.stats_registry",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'actors' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
