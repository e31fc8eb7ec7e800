"""The model side of the engine: checkpoints, the transformer, its options.

Names load on first use, so ``import engine.models.options`` pulls in neither torch nor transformers.
"""
from __future__ import annotations

from engine.lazy_exports import lazy_exports

__getattr__, __all__ = lazy_exports("engine.models", {
    "BidirectionalTransformer": "engine.models.transformer",
    "DiffusionLM": "engine.models.loader",
    "ModelOptions": "engine.models.options",
    "SpecialTokenIds": "engine.models.loader",
    "TransformerConfig": "engine.models.config",
    "load_model": "engine.models.loader",
})
