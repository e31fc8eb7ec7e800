"""The single-request reference decoder: stopping rules and input validation."""

import pytest

from engine.models import load_model
from engine.oracle.reference import reference_generate
from engine.rules import make_rule

BLOCK = 32


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", dtype="float32")


def prompt_ids(lm, text):
    return lm.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True, return_dict=False)


def test_decoding_stops_at_the_end_of_the_block_that_committed_eos(tiny, heldout_rows):
    for row in heldout_rows[:6]:
        result = reference_generate(tiny, prompt_ids(tiny, row["prompt"]), max_new_tokens=256)
        if result.finish_reason == "eos":
            assert result.num_blocks == len(result.token_ids) // BLOCK + 1
            assert tiny.special_ids.eos_id not in result.token_ids
            return
    pytest.fail("no held-out prompt ended with EOS")


def test_without_eos_stopping_every_block_is_decoded_and_every_token_is_kept(tiny, heldout_rows):
    ids = prompt_ids(tiny, heldout_rows[0]["prompt"])
    stopped = reference_generate(tiny, ids, max_new_tokens=128)
    full = reference_generate(tiny, ids, max_new_tokens=128, stop_at_eos=False)
    assert stopped.finish_reason == "eos"
    assert (full.num_blocks, len(full.token_ids), full.finish_reason) == (4, 128, "length")
    assert full.token_ids[:len(stopped.token_ids)] == stopped.token_ids
    assert full.token_ids[len(stopped.token_ids)] in tiny.special_ids.stop_ids  # the stop token is kept
    assert full.num_steps >= stopped.num_steps


def test_a_block_takes_at_most_one_step_per_token_and_quota_takes_exactly_its_steps(tiny, heldout_rows):
    ids = prompt_ids(tiny, heldout_rows[1]["prompt"])
    threshold = reference_generate(tiny, ids, max_new_tokens=64, stop_at_eos=False)
    assert threshold.num_blocks <= threshold.num_steps <= threshold.num_blocks * BLOCK
    quota = reference_generate(tiny, ids, max_new_tokens=64, stop_at_eos=False,
                               rule=make_rule("quota", steps_per_block=4))
    assert quota.num_steps == 2 * 4


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
def test_every_cache_mode_decodes(tiny, heldout_rows, cache):
    result = reference_generate(tiny, prompt_ids(tiny, heldout_rows[2]["prompt"]), max_new_tokens=64,
                                cache=cache)
    assert result.finish_reason in ("eos", "length") and result.num_blocks >= 1


def test_bad_input_raises_a_clear_value_error(tiny):
    with pytest.raises(ValueError, match="empty"):
        reference_generate(tiny, [], max_new_tokens=32)
    with pytest.raises(ValueError, match="max_new_tokens"):
        reference_generate(tiny, [5, 6], max_new_tokens=0)
    with pytest.raises(ValueError, match="maximum"):
        reference_generate(tiny, [5] * tiny.max_length, max_new_tokens=32)
    with pytest.raises(ValueError, match="unknown model"):
        load_model("/no/such/model")

