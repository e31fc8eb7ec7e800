"""tensor_parallel_size: one engine over N ranks gives the tokens one device gives, and fails by name when a
rank dies or hangs (CPU ranks joined by gloo; float64 makes the all-reduce's other summation order exact)."""
from __future__ import annotations

import os
import signal

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models.loader import load_model
from engine.parallel.ranks import TensorParallelError
from engine.parallel.shard import TRAFFIC
from tests.conftest import FIXTURES

PROMPTS = ["hello there", "the quick brown fox jumps", "1 2 3 4", "a"]
PARAMS = SamplingParams(max_new_tokens=16, stop_at_eos=False, seed=7)
FAMILIES = ["llada", "dream", "sdar", "llada2", "diffusion_gemma", "nemotron_labs_diffusion"]
pytestmark = pytest.mark.usefixtures("one_thread_per_rank")  # ranks share the machine's cores (conftest)


def tokens(engine: BlockServeEngine, prompts: list[str]) -> list[list[int]]:
    return [output.token_ids for output in engine.generate(prompts, PARAMS)]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.parametrize("family", FAMILIES)
def test_two_ranks_give_one_devices_tokens_batched_and_alone(family):
    model = FIXTURES / f"tiny-{family}"
    whole = tokens(BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=4), dtype="float64"), PROMPTS)
    with BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=4, tensor_parallel_size=2),
                                          dtype="float64") as split:
        assert tokens(split, PROMPTS) == whole
        assert [tokens(split, [prompt])[0] for prompt in PROMPTS[:2]] == whole[:2]
    assert all(gone(pid) for pid in split.executor.pids)


def test_four_ranks_over_two_key_value_heads_replicate_each_and_keep_one_devices_tokens():
    model = FIXTURES / "tiny-llada2"  # 4 query heads, 2 key/value heads, q/k/v fused, experts, 103 ids
    whole = tokens(BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=2), dtype="float64"),
                   PROMPTS[:2])
    with pytest.warns(UserWarning, match="2 key/value head.*replicated on the 2 ranks"):
        split = BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=2, tensor_parallel_size=4),
                                                 dtype="float64")
    with split:
        assert tokens(split, PROMPTS[:2]) == whole


def test_batch_invariant_bf16_two_ranks_keep_a_rows_tokens_whatever_its_batch():
    model = FIXTURES / "tiny-llada2"
    with BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=4, tensor_parallel_size=2),
                                          dtype="bfloat16", batch_invariant=True) as split:
        assert tokens(split, PROMPTS) == [tokens(split, [prompt])[0] for prompt in PROMPTS]


def test_a_greedy_step_sums_each_layer_twice_and_gathers_three_numbers_a_position_not_the_logits():
    model = FIXTURES / "tiny-sdar"
    with BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=4, tensor_parallel_size=2),
                                          dtype="float64") as split:
        layers, hidden = len(split.lm.model.layers), split.lm.model.config.hidden_size
        for prompt in PROMPTS:
            split.add_request(prompt, PARAMS)
        TRAFFIC.reset()
        split.step()
        assert TRAFFIC.calls == 1 + 2 * layers + 1  # embedding, attention and MLP of each layer, candidates
        tokens = TRAFFIC.all_reduce_bytes // (8 * hidden * (1 + 2 * layers))  # each all-reduce: [tokens, hidden]
        assert TRAFFIC.all_reduce_bytes == tokens * 8 * hidden * (1 + 2 * layers)
        assert TRAFFIC.all_gather_bytes % (3 * 8) == 0 and 0 < TRAFFIC.all_gather_bytes // 24 <= tokens
        assert split.executor.bytes_sent > 0


def test_sampled_rows_and_log_probabilities_join_the_logits_and_keep_one_devices_tokens():
    model = FIXTURES / "tiny-llada2"
    sampled = SamplingParams(max_new_tokens=16, stop_at_eos=False, seed=7, temperature=0.8, logprobs=2)
    whole = BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=4), dtype="float64")
    expected = [(o.token_ids, o.logprobs) for o in whole.generate(PROMPTS, sampled)]
    with BlockServeEngine.from_pretrained(model, EngineConfig(max_batch_size=4, tensor_parallel_size=2),
                                          dtype="float64") as split:
        answers = [(o.token_ids, o.logprobs) for o in split.generate(PROMPTS, sampled)]
    assert [tokens for tokens, _ in answers] == [tokens for tokens, _ in expected]
    for (_, ours), (_, theirs) in zip(answers, expected):
        assert [p.token_id for p in ours] == [p.token_id for p in theirs]
        # log-probabilities are float32: a last-bit difference of a float64 logit may round either way
        assert [p.logprob for p in ours] == pytest.approx([p.logprob for p in theirs], rel=1e-5, abs=1e-6)


def test_a_size_that_does_not_divide_the_heads_is_refused_by_name():
    with pytest.raises(ValueError, match="tensor_parallel_size=3 does not divide the model's attention heads"):
        load_model(FIXTURES / "tiny-sdar", tensor_parallel_size=3)


def test_an_engine_split_otherwise_than_its_model_is_refused():
    lm = load_model(FIXTURES / "tiny-sdar", dtype="float64")
    with pytest.raises(ValueError, match="tensor_parallel_size=2 but the model was loaded as 1 share"):
        BlockServeEngine(lm, EngineConfig(tensor_parallel_size=2))


def test_a_killed_rank_ends_the_engine_with_an_error_that_names_it_and_leaves_no_process():
    engine = BlockServeEngine.from_pretrained(FIXTURES / "tiny-sdar", EngineConfig(tensor_parallel_size=2),
                                              dtype="float64")
    engine.add_request(PROMPTS[1], PARAMS)
    engine.step()
    os.kill(engine.executor.pids[0], signal.SIGKILL)
    with pytest.raises(TensorParallelError, match="rank 1"):
        while True:
            engine.step()
    engine.close()
    assert gone(engine.executor.pids[0])


def test_a_hung_rank_ends_the_engine_after_the_collective_timeout():
    engine = BlockServeEngine.from_pretrained(
        FIXTURES / "tiny-sdar", EngineConfig(tensor_parallel_size=2, tensor_parallel_timeout_s=3), dtype="float64")
    engine.add_request(PROMPTS[1], PARAMS)
    engine.step()
    os.kill(engine.executor.pids[0], signal.SIGSTOP)
    with pytest.raises(TensorParallelError, match="tensor_parallel_timeout_s=3"):
        engine.step()
    engine.close()
    assert gone(engine.executor.pids[0])
