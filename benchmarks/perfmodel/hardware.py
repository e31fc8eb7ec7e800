"""Every hardware and model-shape constant the GPU projection uses, each with its source.

Two kinds of number live here:

* **Datasheet / config facts** (peak FLOP/s, HBM bandwidth, memory; layer counts and widths). Sources are
  named next to each value. Vendor "GB" and "TB/s" are decimal (1e9, 1e12).
* **Assumptions to be calibrated** (``efficiency``, ``bandwidth_efficiency``, ``launch_overhead_s``). They
  are round guesses until a GPU run writes ``benchmarks/calibration/<device>.json`` (see
  ``benchmarks.perfmodel.projection.load_constants`` / ``calibration_fit.fit_constants``).

Every constant's value and source is tabulated in this package's README.md.
"""
from __future__ import annotations

from dataclasses import dataclass

# --- assumptions (UNCALIBRATED) --------------------------------------------------------------------
DEFAULT_EFFICIENCY = 0.6
"""Fraction of peak dense bf16 FLOP/s a large GEMM reaches. Assumption: cuBLAS bf16 GEMMs of a few
thousand rows typically reach 60-75% of Hopper's dense peak; 0.6 also absorbs the non-GEMM kernels."""
DEFAULT_BANDWIDTH_EFFICIENCY = 0.85
"""Fraction of datasheet HBM bandwidth a weight/KV stream reaches. Assumption: large copies typically
reach 80-90% of the datasheet figure."""
KERNELS_PER_LAYER = 15
"""Assumption: kernels per transformer layer in a plain eager forward (2 norms, q/k/v/o projections,
RoPE, attention, 3 MLP GEMMs + activation, 2 residual adds); fused paths launch fewer, naive ones more."""
SECONDS_PER_KERNEL = 4e-6
"""Assumption: fixed cost per small kernel (launch + ramp-up/tail) that the roofline does not see."""
DEFAULT_LAUNCH_OVERHEAD_S = KERNELS_PER_LAYER * 32 * SECONDS_PER_KERNEL
"""Fixed seconds added to every forward: 15 kernels x 32 layers (LLaDA-8B) x 4 us ~= 1.9 ms. One figure
per device, NOT scaled by the model's layer count (Dream-7B's 28 layers would give ~1.7 ms). CUDA graphs
or torch.compile shrink it; calibration replaces it."""


ELEMENTWISE_BYTES_PER_HIDDEN_PER_LAYER = 220.0
"""Assumption: HBM bytes per forward token, per layer and per hidden unit, of the elementwise kernels
between the GEMMs (the engine's fp32 RMSNorms ~2 x 40, fp32 RoPE on q and k ~2 x 48, two residual adds
~12, SwiGLU's activation and product on a 3x-wide intermediate ~30): ~29 MB per forward token for
LLaDA-8B. Memory-bound kernels that do not overlap the GEMMs, so their time adds."""
LOGIT_BYTES = 36.0
"""Assumption: bytes moved per logit after the LM head GEMM: bf16 write 2, fp32 cast 2 + 4, logsumexp
4, MASK/stop writes and argmax 4 + 4, the steering's and the decoder's passes ~16."""


@dataclass(frozen=True, slots=True)
class Device:
    """An accelerator's datasheet figures plus the default (uncalibrated) efficiency assumptions."""

    name: str
    peak_flops: float  # dense (no 2:4 sparsity) bf16 tensor-core FLOP/s
    bandwidth: float  # HBM bytes/s
    memory_bytes: float
    efficiency: float = DEFAULT_EFFICIENCY
    bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY
    launch_overhead_s: float = DEFAULT_LAUNCH_OVERHEAD_S


# Sources: NVIDIA H200 Tensor Core GPU datasheet (SXM: BF16 1,979 TFLOPS *with sparsity* -> 989 dense,
# 4.8 TB/s HBM3e, 141 GB); NVIDIA H100 datasheet (SXM: BF16 1,979 sparse -> 989 dense, 3.35 TB/s, 80 GB);
# NVIDIA A100 datasheet (80GB SXM: BF16 312 TFLOPS dense, 2,039 GB/s HBM2e, 80 GB).
H200_SXM = Device("NVIDIA H200 SXM", peak_flops=989e12, bandwidth=4.8e12, memory_bytes=141e9)
H100_SXM = Device("NVIDIA H100 SXM", peak_flops=989e12, bandwidth=3.35e12, memory_bytes=80e9)
A100_SXM_80GB = Device("NVIDIA A100 80GB SXM", peak_flops=312e12, bandwidth=2.039e12, memory_bytes=80e9)

DEVICES: dict[str, Device] = {"h200": H200_SXM, "h100": H100_SXM, "a100": A100_SXM_80GB}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """A transformer's shapes, dense or mixture-of-experts, enough to count parameters, FLOPs and bytes.

    Attention: q (hidden x heads*head_dim), k and v (hidden x kv_heads*head_dim each, + bias when
    ``qkv_bias``), o (heads*head_dim x hidden). A dense layer's MLP is a SwiGLU: gate, up, down (hidden x
    intermediate each). With ``experts`` set, layers from ``dense_layers`` on are MoE layers instead: a
    router (hidden x experts), ``experts`` routed SwiGLUs of width ``moe_intermediate`` of which a token
    takes ``experts_per_token``, and one shared SwiGLU of width ``shared_experts x moe_intermediate``.
    Norm weights are ignored (< 0.01% of the bytes). The embedding is a gather of the rows' tokens,
    never streamed whole, so it is not in ``weight_bytes``; the LM head is (untied in every model here).
    ``block_length`` is a block-causal family's block (None: a full-attention family).
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    qkv_bias: bool = False
    bytes_per_param: int = 2  # bf16
    experts: int = 0  # routed experts of an MoE layer (0: a dense model)
    experts_per_token: int = 0
    moe_intermediate: int = 0
    shared_experts: int = 0
    dense_layers: int = 0  # first_k_dense_replace: the leading layers that keep the dense MLP
    block_length: int | None = None

    @property
    def attention_params(self) -> int:
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        bias = (q_width + 2 * kv_width) if self.qkv_bias else 0
        return self.hidden * q_width + 2 * self.hidden * kv_width + q_width * self.hidden + bias

    @property
    def layer_params(self) -> int:
        """A dense layer: attention and the dense SwiGLU."""
        return self.attention_params + 3 * self.hidden * self.intermediate

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_params(self) -> int:
        """One routed expert's SwiGLU (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    def streamed_block_params(self, experts_read: float) -> float:
        """Parameters of all blocks when each MoE layer reads ``experts_read`` of its routed experts."""
        moe_layer = (self.attention_params + self.hidden * self.experts
                     + (self.shared_experts + experts_read) * self.expert_params)
        return (self.layers - self.moe_layers) * self.layer_params + self.moe_layers * moe_layer

    @property
    def block_params(self) -> int:
        """Parameters of all transformer blocks, every routed expert included (what the weights occupy)."""
        return round(self.streamed_block_params(self.experts))

    @property
    def active_block_params(self) -> int:
        """The block parameters one token multiplies through: its ``experts_per_token`` routed experts
        only (= ``block_params`` for a dense model)."""
        return round(self.streamed_block_params(self.experts_per_token))

    @property
    def lm_head_params(self) -> int:
        return self.hidden * self.vocab

    @property
    def weight_bytes(self) -> int:
        """Bytes streamed from HBM by one forward that computes logits: blocks + LM head."""
        return (self.block_params + self.lm_head_params) * self.bytes_per_param

    @property
    def block_flops_per_token(self) -> int:
        """2 x active block params: the linear-layer FLOPs of one forward token (what the projection uses;
        the LM head is charged only at ``logit_positions``, attention separately)."""
        return 2 * self.active_block_params

    @property
    def flops_per_token(self) -> int:
        """2 x (active block + LM head) params: the usual "FLOPs per token" (~15.0e9 for LLaDA-8B,
        design doc section 7). Informational: it assumes logits at every position."""
        return 2 * (self.active_block_params + self.lm_head_params)

    @property
    def attention_flops_per_query_key(self) -> int:
        """QK^T and AV over all layers: 2 matmuls x 2 FLOPs x heads*head_dim, per (query, key) pair."""
        return 4 * self.layers * self.heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """Cache bytes per cached position: layers x (K and V) x kv_heads x head_dim x bytes."""
        return self.layers * 2 * self.kv_heads * self.head_dim * self.bytes_per_param


# Sources: GSAI-ML/LLaDA-8B-Instruct config.json (n_layers 32, d_model 4096, n_heads 32, n_kv_heads 32,
# mlp_hidden_size 12288, vocab/embedding_size 126464, weight_tying false; SwiGLU, no biases) and
# Dream-org/Dream-v0-Instruct-7B config.json (Qwen2.5-7B shapes: num_hidden_layers 28, hidden_size 3584,
# num_attention_heads 28, num_key_value_heads 4, intermediate_size 18944, vocab_size 152064, QKV bias,
# tie_word_embeddings false). LLaDA-8B's are also benchmarks/gpu.py's SHAPES.
LLADA_8B = ModelShape("LLaDA-8B-Instruct", layers=32, hidden=4096, heads=32, kv_heads=32, head_dim=128,
                      intermediate=12288, vocab=126464)
DREAM_7B = ModelShape("Dream-v0-Instruct-7B", layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128,
                      intermediate=18944, vocab=152064, qkv_bias=True)

# Sources: JetLM/SDAR-8B-Chat config.json (Qwen3-8B shapes: num_hidden_layers 36, hidden_size 4096,
# num_attention_heads 32, num_key_value_heads 8, head_dim 128, intermediate_size 12288, vocab_size 151936,
# attention_bias false, tie_word_embeddings false, block_size 4) and inclusionAI/LLaDA2.0-mini config.json
# (num_hidden_layers 20, hidden_size 2048, num_attention_heads 16, num_key_value_heads 4, head_dim 128,
# first_k_dense_replace 1, intermediate_size 5120, num_experts 256, num_experts_per_tok 8,
# moe_intermediate_size 512, num_shared_experts 1, vocab_size 157184, use_qkv_bias false,
# tie_word_embeddings false; block 32: SGLang's dllm/config.py). docs/plans/block_causal.md cites both.
SDAR_8B = ModelShape("SDAR-8B-Chat", layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                     intermediate=12288, vocab=151936, block_length=4)
LLADA2_MINI = ModelShape("LLaDA2.0-mini", layers=20, hidden=2048, heads=16, kv_heads=4, head_dim=128,
                         intermediate=5120, vocab=157184, experts=256, experts_per_token=8, moe_intermediate=512,
                         shared_experts=1, dense_layers=1, block_length=32)

MODELS: dict[str, ModelShape] = {"llada-8b": LLADA_8B, "dream-7b": DREAM_7B, "sdar-8b": SDAR_8B,
                                 "llada2-mini": LLADA2_MINI}
