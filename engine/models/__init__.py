from engine.models.loader import DiffusionLM, SpecialTokens, load_model
from engine.models.transformer import BidirectionalTransformer, KVCache, TransformerConfig

__all__ = ["BidirectionalTransformer", "DiffusionLM", "KVCache", "SpecialTokens", "TransformerConfig",
           "load_model"]
