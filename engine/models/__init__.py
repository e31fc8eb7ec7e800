from engine.models.loader import DiffusionLM, SpecialTokens, load_model
from engine.models.step_inputs import KVArena
from engine.models.transformer import BidirectionalTransformer, TransformerConfig

__all__ = ["BidirectionalTransformer", "DiffusionLM", "KVArena", "SpecialTokens", "TransformerConfig",
           "load_model"]
