from engine.models.config import TransformerConfig
from engine.models.loader import DiffusionLM, SpecialTokenIds, load_model
from engine.models.transformer import BidirectionalTransformer

__all__ = ["BidirectionalTransformer", "DiffusionLM", "SpecialTokenIds", "TransformerConfig", "load_model"]
