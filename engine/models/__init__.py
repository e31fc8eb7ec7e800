from engine.models.loader import DiffusionLM, SpecialTokens, load_model
from engine.models.transformer import BidirectionalTransformer, KVArena, TransformerConfig

__all__ = ["BidirectionalTransformer", "DiffusionLM", "KVArena", "SpecialTokens", "TransformerConfig",
           "load_model"]
