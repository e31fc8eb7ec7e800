"""DiffusionGemma's text stack: one set of layers run as the encoder (context, causal, writes the cache)
and as the decoder (the canvas, bidirectional, reads the cache), packed into one forward per step.

The two uses differ only in their attention (``engine.models.diffusion_gemma.step``), the canvas's
self-conditioning input and each layer's scalar (the checkpoint keeps the encoder's and the decoder's
apart). Logits exist only for canvas positions: a store reads none.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.layers import vocab
from engine.layers.loading import checkpoint_slots
from engine.models.diffusion_gemma.attention import attention as layer_attention
from engine.models.diffusion_gemma.config import GemmaTextConfig, LayerShape
from engine.models.diffusion_gemma.layers import (
    Experts,
    GatedMLP,
    GemmaRMSNorm,
    Router,
    SelfAttentionProjections,
    SelfConditioning,
)
from engine.models.diffusion_gemma.step import CanvasStep, DecodePlan, StorePlan, plan_decode, plan_store, split_by_row
from engine.models.kv_cache import KVCache, PagePool
from engine.models.options import ModelOptions


class DecoderLayer(nn.Module):
    def __init__(self, config: GemmaTextConfig, shape: LayerShape):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.shape = shape
        self.self_attn = SelfAttentionProjections(config, shape)
        self.mlp = GatedMLP(hidden, config.intermediate_size, config.shard)
        self.router = Router(config)
        self.experts = Experts(config)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm", "post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                     "pre_feedforward_layernorm_2"):
            setattr(self, name, GemmaRMSNorm(hidden, eps))
        self.register_buffer("layer_scalar", torch.ones(1))  # the decoder's
        self.register_buffer("encoder_layer_scalar", torch.ones(1))  # the encoder's, kept apart

    def forward(self, x: torch.Tensor, attention, num_store: int) -> torch.Tensor:
        # split over ranks, attention, the MLP and the experts each sum their outputs before the norms that follow
        x = x + self.post_attention_layernorm(attention(self.input_layernorm(x)))
        dense = self.post_feedforward_layernorm_1(self.mlp(self.pre_feedforward_layernorm(x)))
        weights, experts = self.router(x)
        routed = self.post_feedforward_layernorm_2(self.experts(self.pre_feedforward_layernorm_2(x), weights, experts))
        x = x + self.post_feedforward_layernorm(dense + routed)
        scalars = torch.cat([self.encoder_layer_scalar.expand(num_store),
                             self.layer_scalar.expand(x.shape[0] - num_store)])
        return x * scalars[:, None]


class DiffusionGemmaTransformer(nn.Module):
    def __init__(self, config: GemmaTextConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = vocab.embedding(config.vocab_size, config.hidden_size, config.shard)
        self.layers = nn.ModuleList(DecoderLayer(config, shape) for shape in config.layers)
        self.norm = GemmaRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_conditioning = SelfConditioning(config)
        self.embed_scale = config.hidden_size ** 0.5
        self.options = ModelOptions()
        self.compiled = None  # a CompiledCanvas when options.compile
        # per layer kind, computed on first use (a buffer would be lost by the loader's meta-device build)
        self._inverse_frequencies: dict[str, torch.Tensor] = {}

    # -- what the loader and the engine ask of any model --------------------------------------------
    def tie_weights(self) -> None:
        pass  # the head reads embed_tokens directly

    def apply_options(self, options: ModelOptions) -> None:
        """Run canvases through compiled, bucketed graphs (``engine.models.diffusion_gemma.compiled``) or
        eagerly, and batch-invariantly (each row alone) or not. An eager model never imports the compiler."""
        self.options = options
        self.compiled = None
        if options.compile:
            from engine.models.diffusion_gemma.compiled import CompiledCanvas

            self.compiled = CompiledCanvas(self)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer, and each layer's experts also one at a time, as FP8 checkpoints split
        them (``layers.N.experts.{e}.{gate,up,down}_proj.weight`` and ``weight_scale``)."""
        return {name: slot.tensor for name, slot in checkpoint_slots(self).items()}

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor(self.embed_scale, dtype=torch.float32).to(self.dtype)
        return self.embed_tokens(tokens) * scale

    # -- the forward -------------------------------------------------------------------------------
    def forward_canvas(self, step: CanvasStep, cache: KVCache) -> torch.Tensor | None:
        """Store the store part's tokens and run the decode part's canvases: logits ``[rows, canvas,
        vocab]`` in float32, soft-capped, or None when no canvas ran. Every row's logits at once: the
        runner reads :meth:`run_spans` and runs the head over chunks of rows instead."""
        hidden = self.decode_hidden(step, cache)
        return None if hidden is None else self.logits(hidden)

    def run_spans(self, step: CanvasStep, cache: KVCache, pool: PagePool | None) -> torch.Tensor | None:
        """The runner's entry point: each row's store and canvas, the canvases' hidden states
        (:meth:`decode_hidden`), whose head the canvas rule runs over chunks of rows."""
        return self.decode_hidden(step, cache, pool)

    def decode_hidden(self, step: CanvasStep, cache: KVCache, pool: PagePool | None = None
                      ) -> torch.Tensor | None:
        """Store the store part's tokens and run the decode part's canvases: their final normed hidden
        states ``[rows, canvas, hidden]``, or None when no canvas ran. The store's pages
        (``StorePart.pages``) go to ``pool`` too. Batch-invariant mode runs each row alone, as in a batch
        of one."""
        if self.options.batch_invariant and step.decode is not None and step.decode.num_rows > 1:
            hidden = [self.decode_hidden(row, cache, pool) for row in split_by_row(step)]
            return torch.cat([row for row in hidden if row is not None])
        if self.compiled is not None:
            return self.compiled.decode_hidden(step, cache, pool)
        return self.eager_hidden(step, cache, pool)

    def eager_hidden(self, step: CanvasStep, cache: KVCache, pool: PagePool | None = None
                     ) -> torch.Tensor | None:
        """:meth:`decode_hidden` as one eager forward of both parts."""
        ring, window = cache.ring, self.config.sliding_window
        page_length = pool.page_length if pool is not None else 0
        store = (plan_store(step.store, ring, window, self.dtype, page_length) if step.store is not None
                 else None)
        decode = plan_decode(step.decode, ring, self.dtype) if step.decode is not None else None
        store_tokens = step.store.tokens if store is not None else None
        canvas, soft = (step.decode.tokens, step.decode.soft_embeddings) if decode is not None else (None, None)
        return self.run_plans(store_tokens, store, canvas, soft, decode, cache.layers,
                              pool.layers if pool is not None else None)

    def run_plans(self, store_tokens: torch.Tensor | None, store: StorePlan | None, canvas: torch.Tensor | None,
                  soft: torch.Tensor | None, decode: DecodePlan | None, cache_layers: tuple[torch.Tensor, ...],
                  pool_layers: tuple[torch.Tensor, ...] | None) -> torch.Tensor | None:
        """The layers over planned parts: what :meth:`decode_hidden` returns (``soft`` None: zeros)."""
        pieces, positions = [], []
        if store is not None:
            pieces.append(self.embed(store_tokens))
            positions.append(store.positions)
        if decode is not None:
            embedded = self.embed(canvas)
            pieces.append(self.self_conditioning(embedded, soft if soft is not None else torch.zeros_like(embedded))
                          .reshape(-1, embedded.shape[-1]))
            positions.append(decode.positions)
        x, positions = torch.cat(pieces), torch.cat(positions)
        rotary = self.rotary_tables(positions)
        num_store = 0 if store is None else store.positions.shape[0]
        for index, layer in enumerate(self.layers):
            cos, sin = rotary[layer.shape.kind]

            def attention(h, layer=layer, index=index, cos=cos, sin=sin):
                pages = pool_layers[index] if pool_layers is not None else None
                return layer_attention(layer, cache_layers[index], pages, h, cos, sin, store, decode, num_store)
            x = layer(x, attention, num_store)
        if decode is None:
            return None
        return self.norm(x[num_store:]).view(decode.rows, decode.length, -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[rows, canvas, vocab]`` of final hidden states, soft-capped in place: one
        float32 copy of the vocabulary per position. Batch-invariant mode runs each row alone."""
        if self.options.batch_invariant and hidden.shape[0] > 1:
            return torch.cat([self.logits(row) for row in hidden.split(1)])
        cap = self.config.final_logit_softcapping
        logits = vocab.tied_logits(self.embed_tokens, hidden, self.config.vocab_size).float()
        return logits.div_(cap).tanh_().mul_(cap)

    def soft_embeddings(self, processed_logits: torch.Tensor) -> torch.Tensor:
        """The next step's self-conditioning input from this step's temperature-scaled logits, as the
        reference makes it: softmax in float32, cast to the model's dtype, times the scaled embeddings."""
        if self.options.batch_invariant and processed_logits.shape[0] > 1:
            return torch.cat([self.soft_embeddings(row) for row in processed_logits.split(1)])
        probabilities = processed_logits.to(self.dtype).softmax(dim=-1, dtype=torch.float32).to(self.dtype)
        scale = torch.tensor(self.embed_scale, dtype=torch.float32).to(self.dtype)
        return vocab.weighted_embeddings(self.embed_tokens, probabilities) * scale

    def rotary_tables(self, positions: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Each layer kind's ``cos``, ``sin`` at ``positions``, computed once per kind, not once per layer."""
        kinds = {shape.kind: shape for shape in self.config.layers}
        return {kind: self.rotary(positions, shape) for kind, shape in kinds.items()}

    def rotary(self, positions: torch.Tensor, shape: LayerShape) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos``, ``sin`` ``[tokens, 1, head_dim]`` of a layer kind, computed as transformers does."""
        if shape.kind not in self._inverse_frequencies:
            self._inverse_frequencies[shape.kind] = shape.inverse_frequencies().to(positions.device)
        frequencies = positions[:, None].float() * self._inverse_frequencies[shape.kind]
        angles = torch.cat([frequencies, frequencies], dim=-1)[:, None]
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)
