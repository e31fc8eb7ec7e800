from engine.models.config import TransformerConfig
from engine.models.loader import DiffusionLM, SpecialTokens, load_model
from engine.models.transformer import BidirectionalTransformer

__all__ = ["BidirectionalTransformer", "DiffusionLM", "SpecialTokens", "TransformerConfig", "load_model"]
