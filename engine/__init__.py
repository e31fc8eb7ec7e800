"""BlockServe engine: block-grained continuous batching for diffusion LLMs (pure torch, no Ray)."""
from engine.config import EngineConfig, SamplingParams
from engine.engine import BlockServeEngine
from engine.request import RequestOutput
from engine.stats import EngineStats

__all__ = ["BlockServeEngine", "EngineConfig", "EngineStats", "RequestOutput", "SamplingParams"]
