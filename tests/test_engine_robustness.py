"""What the engine refuses and survives: a bad request fails alone with a message while the others are
served, an unknown or inconsistent config field is refused, and a model whose argmax is MASK still ends
every block."""
import pytest

from engine import EngineConfig, SamplingParams
from tests.engine_helpers import BLOCK, chat


def test_bad_requests_fail_alone_with_a_message(tiny_engine_factory, heldout_rows):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4, token_budget=300)
    good = chat(heldout_rows[0]["prompt"])
    cases = {
        "empty": ("", SamplingParams(max_new_tokens=32)),
        "too_long": ([5] * (engine.lm.max_length + 1), SamplingParams(max_new_tokens=32)),
        "no_tokens": (good, SamplingParams(max_new_tokens=0)),
        "bad_ids": ([5, engine.lm.vocab_size + 7], SamplingParams(max_new_tokens=32)),
        "never_fits": ([5] * 100, SamplingParams(max_new_tokens=256)),  # 356 > 300 tokens
        "not_a_prompt": (3.5, SamplingParams(max_new_tokens=32)),
    }
    prompts = [good] + [case[0] for case in cases.values()] + [good]
    params = [SamplingParams(max_new_tokens=64)] + [case[1] for case in cases.values()] + [
        SamplingParams(max_new_tokens=64)]
    outputs = engine.generate(prompts, params)
    for output in outputs[1:-1]:
        assert output.finish_reason == "error"
        assert output.error
    messages = [o.error for o in outputs[1:-1]]
    assert "empty" in messages[0]
    assert "maximum length" in messages[1]
    assert "max_new_tokens" in messages[2]
    assert "vocabulary" in messages[3]
    assert "budget" in messages[4]
    assert outputs[0].finish_reason in ("eos", "length") and outputs[-1].token_ids == outputs[0].token_ids


def test_engine_config_rejects_unknown_or_inconsistent_fields():
    with pytest.raises(ValueError, match="unknown field.*block_size"):
        EngineConfig.from_dict({"block_size": 32})
    with pytest.raises(ValueError, match="steps_per_block"):
        EngineConfig(decoding="quota")
    with pytest.raises(ValueError, match="schedule"):
        EngineConfig(schedule="fifo")
    with pytest.raises(ValueError, match="steps_per_block"):
        EngineConfig(block_length=16, steps_per_block=32)


def test_a_model_whose_argmax_is_mask_still_ends_every_block(tiny_engine_factory, heldout_rows, monkeypatch):
    engine = tiny_engine_factory(dtype="float32", max_batch_size=4)
    lm, logits = engine.lm, engine.lm.model.logits

    def mask_first(hidden, at=None, row_spans=None):
        scores = logits(hidden, at, row_spans)
        scores[..., lm.special_ids.mask_id] = scores.amax(-1) + 10.0  # MASK is every position's argmax
        return scores

    monkeypatch.setattr(lm.model, "logits", mask_first)
    outputs = engine.generate([chat(r["prompt"]) for r in heldout_rows[:4]], SamplingParams(max_new_tokens=64))
    assert all(o.finish_reason in ("eos", "length") and lm.special_ids.mask_id not in o.token_ids for o in outputs)
    assert all(o.num_steps <= o.num_blocks * BLOCK for o in outputs)
