"""The job's summary says how parallel the decoding rule was: tokens per row forward, and the rule's own counters
(joint_threshold's edits and post-mask forwards), summed by name over actors."""
from __future__ import annotations


def snapshot(actor_id: str, tokens: int, row_forwards: int, edits: int, post_mask_forwards: int) -> dict:
    engine = {"generated_tokens": tokens, "denoise_steps": 10, "effective_compute_ratio": 1.0,
              "useful_row_fraction": 1.0, "padding_fraction": 0.0, "row_forwards": row_forwards,
              "counters": {"edits": edits, "post_mask_forwards": post_mask_forwards} if edits else {}}
    return {"actor_id": actor_id, "instance_id": actor_id, "node_id": "n", "device": "cpu", "rows": 4,
            "error_rows": 0, "batches": 1, "busy_s": 1.0, "active_s": 2.0, "memory_peak_bytes": 0,
            "gpu_utilization": None, "engine": engine,
            "samples": {"num_generated_tokens": [32] * 4, "latency_s": [1.0] * 4}}


def test_the_summary_gives_tokens_per_row_forward_and_what_editing_rewrote():
    from pipeline.stats import aggregate, format_table

    stats = aggregate([snapshot("a", 100, 40, 7, 5), snapshot("b", 200, 60, 3, 1)], wall_s=10.0, bin_tokens=32)
    totals = stats["totals"]
    assert (totals["tokens_per_forward"], totals["counters"]) == (3.0, {"edits": 10, "post_mask_forwards": 6})
    assert "decoding: 3.00 tokens per row forward, edits 10, post_mask_forwards 6" in format_table(stats)


def test_a_mask_only_rule_reports_its_tokens_per_row_forward_and_no_counters():
    from pipeline.stats import aggregate, format_table

    table = format_table(aggregate([snapshot("a", 90, 30, 0, 0)], wall_s=10.0, bin_tokens=32))
    assert "decoding: 3.00 tokens per row forward\n" in table + "\n" and "edits" not in table


def test_an_engine_reports_its_row_forwards_edits_and_post_mask_forwards():
    from engine import BlockServeEngine, EngineConfig, SamplingParams
    from engine.models import load_model
    from tests.conftest import FIXTURES

    lm = load_model(FIXTURES / "tiny-llada2", dtype="float32")
    engine = BlockServeEngine(lm, EngineConfig(decoding="joint_threshold", threshold=0.5, editing_threshold=0.0,
                                               max_post_steps=2, max_batch_size=2))
    outputs = engine.generate([[5, 6, 7], [8, 9]], SamplingParams(max_new_tokens=8, stop_at_eos=False))
    stats = engine.stats().to_dict()
    assert stats["row_forwards"] == sum(output.num_steps for output in outputs)
    assert stats["tokens_per_forward"] == 16 / stats["row_forwards"]
    assert stats["counters"]["post_mask_forwards"] > 0 and stats["counters"]["edits"] > 0
