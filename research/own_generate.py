"""The families' own generate loops at batch 1, as traces: what each forward of their code computes.

Both loops run one request at a time and commit by the same rule as the engine, so each block takes
the steps it takes in the engine's batch-1 run. A trace of that run (one row per record, each request's
prefill first) is rewritten here forward by forward into the loop's own forwards:

* SDAR (``block_diffusion_generate``, JetAstra/SDAR ``evaluation/opencompass/opencompass/models/
  huggingface_bd3.py`` @ c2041a8): one forward prefills the prompt's whole blocks, with logits at every
  position (``logits_to_keep`` 0). Each step is then a forward of the block's B tokens over the cache.
  A finished block's keys and values are stored by one more forward of its B tokens, the last block's
  included. The loop stops after the block that holds a stop token.
* LLaDA2 (``LLaDA2MoeModelLM.generate``, ZHZisZZ/dllm ``modeling_llada2_moe.py`` @ d8cc1190, a copy of
  the checkpoint's code): no cache. Each step is a forward of every position up to the active block's
  end, with logits at all of them. The loop breaks after the block that holds EOS (``eos_early_stop``
  off, its default, still stops there).

Their MoE forwards read the experts that uniform routing expects of their tokens, scaled by the spread
the replay model showed in the engine's batch-1 run (``benchmarks.perfmodel.moe``; an assumption).
"""
from __future__ import annotations

from collections.abc import Sequence

from benchmarks.perfmodel.moe import expected_experts_touched
from engine.scheduling.trace import ForwardRecord


def _active_end(record: ForwardRecord) -> int:
    """The end of the block the record's row is decoding (its prefill box, or its window's context)."""
    if record.rows != 1:
        raise ValueError(f"a batch-1 trace has one row per forward, not {record.rows}")
    return record.refresh_width if record.refresh_rows else record.window_context


def _block_forward(block: int, context: int) -> ForwardRecord:
    return ForwardRecord(window_rows=1, window_tokens=block, window_context=context, logit_positions=block,
                         real_tokens=context)


def _full_forward(width: int) -> ForwardRecord:
    return ForwardRecord(refresh_rows=1, refresh_width=width, logit_positions=width, real_tokens=width)


def sdar_generate(trace: Sequence[ForwardRecord], block: int) -> list[ForwardRecord]:
    """SDAR's own loop for the requests of an engine batch-1 trace (module docstring)."""
    forwards: list[ForwardRecord] = []
    end = 0
    for record in trace:
        if record.refresh_rows:  # a request starts: the last one's final block is stored first
            if end:
                forwards.append(_block_forward(block, end))
            end = _active_end(record)
            if end > block:
                forwards.append(_full_forward(end - block))
        else:
            end = _active_end(record)
            if record.window_tokens > block:  # the engine rewrote the finished block in this step
                forwards.append(_block_forward(block, end - block))
        forwards.append(_block_forward(block, end))
    if end:
        forwards.append(_block_forward(block, end))
    return forwards


def llada2_generate(trace: Sequence[ForwardRecord], block: int) -> list[ForwardRecord]:
    """LLaDA2's own loop for the requests of an engine batch-1 trace (module docstring)."""
    return [_full_forward(_active_end(record)) for record in trace]


OWN_GENERATE = {"sdar-8b": sdar_generate, "llada2-mini": llada2_generate}


def carried_experts(own: Sequence[ForwardRecord], engine: Sequence[ForwardRecord], recorded: Sequence[float],
                    experts: int, per_token: int) -> list[float]:
    """Experts each of ``own``'s forwards reads: uniform routing's expectation times the mean spread of
    the ``recorded`` counts of the engine's forwards against their own uniform expectation."""
    ratios = [count / expected for count, record in zip(recorded, engine)
              if (expected := expected_experts_touched(record.forward_tokens, experts, per_token))]
    spread = sum(ratios) / len(ratios) if ratios else 1.0
    return [min(float(experts), spread * expected_experts_touched(record.forward_tokens, experts, per_token))
            for record in own]
