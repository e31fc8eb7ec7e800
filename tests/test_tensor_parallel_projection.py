"""The tensor-parallel projection (``python -m research tensor-parallel``): what one rank holds, what a step
sends between ranks, and that the experiment runs from its CLI."""
from __future__ import annotations

import json

import pytest

from research.diffusion_gemma import GemmaShape
from research.tensor_parallel_memory import gemma_lm, gemma_rank, kv_share, model_rank
from research.tensor_parallel_projection import LLADA2_FLASH, allgather_bytes, allreduce_bytes, main


def parameters_gb(lm) -> float:
    return sum(p.numel() * p.element_size() for p in lm.model.parameters()) / 1e9


def test_a_ring_all_reduce_sends_twice_n_minus_1_over_n_of_its_buffer_and_a_gather_once():
    assert allreduce_bytes(100.0, 2) == 100.0 and allreduce_bytes(100.0, 4) == 150.0
    assert allgather_bytes(100.0, 2) == 50.0 and allgather_bytes(100.0, 4) == 75.0


def test_key_value_heads_are_split_or_replicated_and_an_uneven_split_names_tensor_parallel_size():
    assert kv_share(8, 4) == 2 and kv_share(2, 4) == 1 and kv_share(4, 4) == 1
    with pytest.raises(ValueError, match="tensor_parallel_size=3"):
        kv_share(4, 3)
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide heads=32"):
        model_rank(LLADA2_FLASH, 3)


def test_a_ranks_share_of_diffusiongemma_is_half_its_weights_and_a_little_more():
    whole, half = parameters_gb(gemma_lm(GemmaShape())), parameters_gb(gemma_lm(gemma_rank(GemmaShape(), 2)))
    assert whole == pytest.approx(50.50, abs=0.01)  # configs/diffusiongemma-26b-a4b.yaml's weights
    assert whole / 2 < half < whole / 2 * 1.01  # the routers and norms stay whole on every rank


def test_the_projection_runs_from_its_cli_and_26b_does_not_fit_two_24_gb_gpus(tmp_path):
    rows = main(["--max-rows", "4", "--block-steps", "8", "--out", str(tmp_path)])
    found = {(row["model"], row["device"], row["ranks"]): row for row in rows}
    assert found["diffusiongemma", "NVIDIA A10G", 2]["rows_fit"] == 0
    assert found["diffusiongemma", "NVIDIA A10G", 4]["rows_fit"] == 4 == found["llada2-flash", "NVIDIA H100 SXM", 4][
        "rows_fit"]
    alone = found["diffusiongemma", "NVIDIA H100 SXM", 1]["one_row"]
    assert alone["allreduce_ms"] == alone["gather_ms"] == 0.0
    split = found["diffusiongemma", "NVIDIA L40S", 2]["one_row"]
    assert split["allreduce_ms"] > 0 and split["tok_s_tp_local"] > split["tok_s"]
    saved = json.loads((tmp_path / "tensor_parallel.json").read_text())
    assert saved["meta"]["command"].startswith("python -m research tensor-parallel") and len(saved["projected"]) == 6
