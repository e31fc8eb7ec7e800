"""What one rank of a tensor-parallel engine holds, priced by the engine's own memory model.

A rank's share of a model is the model with its split dimensions divided by the ranks: query heads, key/value
heads (one replicated head each when the ranks are a multiple of them), the dense MLP's, each expert's and the
shared expert's intermediate, and the vocabulary (embedding rows and LM head). The hidden size, the routers and
the norms stay whole. This module builds that share on the meta device (no weights) and asks
``engine.runner.memory.memory_model`` what its weights, KV arena and step activations take. The vocabulary
temporaries are the whole model's: rank 0 samples from the gathered logits, so its share is the largest.
"""
from __future__ import annotations

import dataclasses

import torch

from benchmarks.perfmodel.hardware import ModelShape
from engine import EngineConfig
from engine.models.loader import DiffusionLM
from engine.runner import memory
from engine.scheduling.model_fit import config_for_model
from research.diffusion_gemma import GemmaShape

RESERVE_BYTES = 2e9  # assumed: the CUDA context, NCCL's buffers and the allocator's slack on every GPU


def split(value: int, ranks: int, what: str) -> int:
    """``value / ranks``; ValueError naming ``what`` when the ranks do not divide it."""
    if value % ranks:
        raise ValueError(f"tensor_parallel_size={ranks} does not divide {what}={value}")
    return value // ranks


def kv_share(kv_heads: int, ranks: int) -> int:
    """Key/value heads one rank holds: a 1/ranks share, or one replicated head when ranks is a multiple."""
    if kv_heads % ranks == 0:
        return kv_heads // ranks
    if ranks % kv_heads == 0:
        return 1
    raise ValueError(f"tensor_parallel_size={ranks} neither divides nor is a multiple of kv_heads={kv_heads}")


def gemma_rank(shape: GemmaShape, ranks: int) -> GemmaShape:
    return dataclasses.replace(
        shape, heads=split(shape.heads, ranks, "heads"), sliding_kv_heads=kv_share(shape.sliding_kv_heads, ranks),
        global_kv_heads=kv_share(shape.global_kv_heads, ranks),
        dense_intermediate=split(shape.dense_intermediate, ranks, "intermediate_size"),
        expert_intermediate=split(shape.expert_intermediate, ranks, "moe_intermediate_size"),
        vocab=split(shape.vocab, ranks, "vocab_size"))


def model_rank(shape: ModelShape, ranks: int) -> ModelShape:
    return dataclasses.replace(
        shape, heads=split(shape.heads, ranks, "heads"), kv_heads=kv_share(shape.kv_heads, ranks),
        intermediate=split(shape.intermediate, ranks, "intermediate_size"),
        moe_intermediate=split(shape.moe_intermediate, ranks, "moe_intermediate_size"),
        vocab=split(shape.vocab, ranks, "vocab_size"))


def gemma_lm(shape: GemmaShape) -> DiffusionLM:
    """DiffusionGemma of ``shape`` in bf16 on the meta device, as its config.json would load."""
    from engine.models.diffusion_gemma.config import gemma_text_config
    from engine.models.diffusion_gemma.model import DiffusionGemmaTransformer
    from engine.models.families import diffusion_gemma

    kinds = ["full_attention" if shape.is_global(layer) else "sliding_attention" for layer in range(shape.layers)]
    text = {"vocab_size": shape.vocab, "hidden_size": shape.hidden, "intermediate_size": shape.dense_intermediate,
            "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.sliding_kv_heads, "head_dim": shape.sliding_head_dim,
            "global_head_dim": shape.global_head_dim, "num_global_key_value_heads": shape.global_kv_heads,
            "sliding_window": shape.sliding_window, "num_experts": shape.experts,
            "top_k_experts": shape.experts_per_token, "moe_intermediate_size": shape.expert_intermediate,
            "max_position_embeddings": 262_144, "layer_types": kinds}
    config = {"model_type": "diffusion_gemma", "canvas_length": shape.canvas, "text_config": text}
    text_config = gemma_text_config(config)
    with torch.device("meta"):
        model = DiffusionGemmaTransformer(text_config).to(torch.bfloat16)
    return DiffusionLM("diffusiongemma-26B-A4B", diffusion_gemma.NAME, model, tokenizer=None, special_ids=None,
                       layout=diffusion_gemma.layout(config), max_length=text_config.max_position_embeddings)


def llada2_lm(shape: ModelShape) -> DiffusionLM:
    """LLaDA2 of ``shape`` in bf16 on the meta device, as its config.json would load."""
    from engine.models.families import llada2
    from engine.models.transformer import BidirectionalTransformer

    config = {"model_type": "llada2_moe", "num_hidden_layers": shape.layers, "hidden_size": shape.hidden,
              "intermediate_size": shape.intermediate, "first_k_dense_replace": shape.dense_layers,
              "moe_intermediate_size": shape.moe_intermediate, "num_experts": shape.experts,
              "num_experts_per_tok": shape.experts_per_token, "num_shared_experts": shape.shared_experts,
              "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim,
              "vocab_size": shape.vocab, "use_bias": False, "use_qkv_bias": False, "tie_word_embeddings": False,
              "max_position_embeddings": 16_384}
    with torch.device("meta"):
        model = BidirectionalTransformer(llada2.transformer_config(config)).to(torch.bfloat16)
    return DiffusionLM(shape.name, llada2.NAME, model, tokenizer=None, special_ids=None,
                       layout=llada2.layout(config), max_length=16_384)


def rank_model(rank: DiffusionLM, whole: DiffusionLM, config: EngineConfig) -> memory.MemoryModel:
    """Rank 0's memory model: its share's weights, arena and activations, the whole vocabulary's temporaries."""
    share = memory.memory_model(rank, config_for_model(config, rank))
    gathered = memory.memory_model(whole, config_for_model(config, whole))
    return dataclasses.replace(share, logit_bytes_per_row=gathered.logit_bytes_per_row,
                               logit_rows=gathered.logit_rows, sampling_bytes_per_row=gathered.sampling_bytes_per_row,
                               sampling_scratch_bytes=gathered.sampling_scratch_bytes)


def rank_memory(rank: DiffusionLM, whole: DiffusionLM, engine: dict, gpu_bytes: float, row_tokens: int,
                max_rows: int) -> dict:
    """Weights and KV room per GPU, and the most rows (at most ``max_rows``) whose arena and a step over
    ``row_tokens`` each fit ``gpu_bytes`` less the reserve. ``engine``: the EngineConfig's other settings."""
    usable = gpu_bytes - RESERVE_BYTES
    fits, model = 0, None
    for rows in range(1, max_rows + 1):
        config = EngineConfig(max_batch_size=rows, token_budget=rows * row_tokens, **engine)
        model = rank_model(rank, whole, config)
        if model.weight_bytes + model.arena_bytes + model.step_bytes(rows * row_tokens, rows) > usable:
            break
        fits = rows
    one = rank_model(rank, whole, EngineConfig(max_batch_size=1, token_budget=row_tokens, **engine))
    two = rank_model(rank, whole, EngineConfig(max_batch_size=2, token_budget=2 * row_tokens, **engine))
    return {"gpu_gb": gpu_bytes / 1e9, "weights_gb": one.weight_bytes / 1e9,
            "kv_room_gb": (usable - one.weight_bytes) / 1e9, "arena_gb_per_row": (two.arena_bytes - one.arena_bytes)
            / 1e9, "step_gb_per_row": two.bytes_per_box_token * row_tokens / 1e9,
            "vocab_temporaries_gb": (one.step_bytes(0, max_rows) / 1e9), "rows_fit": fits}
