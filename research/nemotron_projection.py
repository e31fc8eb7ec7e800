"""Nemotron-Labs-Diffusion-8B's three modes priced on one H200 by the roofline of ``benchmarks.perfmodel``.

A row's forwards at the 8B's shapes, each over a context of ``CONTEXT`` positions: an autoregressive step
(1 token, its logits), a ``linear_spec`` run (a draft of 32 tokens with logits at its 31 masks, then a verify
of 32 with logits at all), and a dLM block (denoising forwards of 32 with logits at the masks, then a causal
store of 32 with one logit). Rows of a batch share each forward's weight reads. Projected tok/s for a given
acceptance, tokens per run or per block, since the release's acceptance cannot be measured without its
weights. The model card's figures (GB200, concurrency 1) stand beside them.
"""
from __future__ import annotations

from benchmarks.perfmodel.hardware import H200_SXM, ModelShape
from benchmarks.perfmodel.projection import forward_cost
from engine.scheduling.trace import ForwardRecord

NEMOTRON_8B = ModelShape("Nemotron-Labs-Diffusion-8B", layers=34, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                         intermediate=14336, vocab=131072, block_length=32)
BLOCK, CONTEXT = 32, 1024
CARD = {"linear_spec": 850.0, "autoregressive": 253.0}  # tok/s, 8B, concurrency 1, GB200 (issue 55's quote)


def _seconds(rows: int, tokens: int, logits: int) -> float:
    record = ForwardRecord(window_rows=rows, window_tokens=tokens, window_context=CONTEXT + tokens,
                           logit_positions=rows * logits, real_tokens=rows * (CONTEXT + tokens))
    return forward_cost(record, NEMOTRON_8B, H200_SXM).time_s


def projection_rows(batches: tuple[int, ...] = (1, 16)) -> list[dict]:
    """Projected tok/s per mode, batch and acceptance (tokens a run or a block yields per row)."""
    rows = []
    for batch in batches:
        step = _seconds(batch, 1, 1)
        rows.append({"mode": "autoregressive", "batch": batch, "tokens_per_forward": 1.0,
                     "forward_ms": 1e3 * step, "tok_s": batch / step, "card_tok_s": CARD["autoregressive"]})
        draft, verify = _seconds(batch, BLOCK, BLOCK - 1), _seconds(batch, BLOCK, BLOCK)
        for accepted in (2, 4, 8, 12):
            rows.append({"mode": "linear_spec", "batch": batch, "tokens_per_run": accepted,
                         "tokens_per_forward": accepted / 2, "forward_ms": 1e3 * (draft + verify) / 2,
                         "tok_s": batch * accepted / (draft + verify), "card_tok_s": CARD["linear_spec"]})
        denoise, store = _seconds(batch, BLOCK, BLOCK - 1), _seconds(batch, BLOCK, 1)
        for steps in (4, 8, 16):
            rows.append({"mode": "dlm", "batch": batch, "denoising_steps_per_block": steps,
                         "tokens_per_forward": BLOCK / (steps + 1), "forward_ms": 1e3 * (steps * denoise + store) /
                         (steps + 1), "tok_s": batch * BLOCK / (steps * denoise + store), "card_tok_s": None})
    return rows
