"""The model side of the engine: checkpoints, the transformer, its options.

Names load on first use, so ``import engine.models.options`` pulls in neither torch nor transformers.
"""
from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "BidirectionalTransformer": "engine.models.transformer",
    "DiffusionLM": "engine.models.loader",
    "ModelOptions": "engine.models.options",
    "SpecialTokenIds": "engine.models.loader",
    "TransformerConfig": "engine.models.config",
    "load_model": "engine.models.loader",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'engine.models' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
