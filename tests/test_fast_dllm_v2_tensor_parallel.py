"""Fast-dLLM v2 at the release's head shape (28 query heads over 4 key/value heads, as both the 1.5B's and the
7B's) split over two ranks: each rank holds 14 query and 2 key/value heads with their q/k/v biases, and the
engine gives the tokens one device gives, batched and alone (two CPU ranks joined by gloo; float64 makes the
all-reduce's other summation order exact)."""
from __future__ import annotations

import json

import pytest

from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from scripts.make_fast_dllm_fixture import write_fixture
from tests.conftest import FIXTURES

# 20, 45 and 64 tokens: shorter than a block, longer with a tail, and whole blocks (the seeded first token)
PROMPTS = json.loads((FIXTURES / "fast_dllm_v2_remote_code.json").read_text())["prompts"][1:4]
HEADS, HEAD_DIM = (28, 4), 4
CONFIG = {"decoding": "low_confidence", "threshold": 0.9, "sub_block_length": 8, "max_batch_size": 2}
PARAMS = [SamplingParams(max_new_tokens=24, temperature=0.8 * (seed % 2), seed=seed, stop_at_eos=False)
          for seed in range(len(PROMPTS))]  # greedy and sampled rows together, across a block boundary


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("fast_dllm_v2_28x4"), heads=HEADS, head_dim=HEAD_DIM)


def tokens(engine: BlockServeEngine, prompts: list, params: list[SamplingParams]) -> list[list[int]]:
    return [output.token_ids for output in engine.generate(prompts, params)]


@pytest.mark.usefixtures("one_thread_per_rank")
def test_two_ranks_at_28_query_and_4_key_value_heads_give_one_devices_tokens(checkpoint):
    whole_lm = load_model(checkpoint, dtype="float64")
    whole = tokens(BlockServeEngine(whole_lm, EngineConfig(**CONFIG)), PROMPTS, PARAMS)
    with BlockServeEngine.from_pretrained(checkpoint, EngineConfig(**CONFIG, tensor_parallel_size=2),
                                          dtype="float64") as split:
        config = split.lm.model.config
        assert (config.num_heads, config.num_kv_heads, config.head_dim, config.hidden_size) == (14, 2, 4, 112)
        ours = split.lm.model.layers[0].attention.qkv_proj.bias  # rank 0: queries 0-13, key/value heads 0-1
        theirs = whole_lm.model.layers[0].attention.qkv_proj.bias
        queries, keys = HEADS[0] * HEAD_DIM, HEADS[1] * HEAD_DIM
        assert ours.tolist() == [*theirs[:queries // 2].tolist(), *theirs[queries:queries + keys // 2].tolist(),
                                 *theirs[queries + keys:queries + keys + keys // 2].tolist()]
        assert tokens(split, PROMPTS, PARAMS) == whole  # three rows, two at a time: the third joins mid-flight
        assert tokens(split, PROMPTS[2:], PARAMS[2:]) == whole[2:]  # alone
    assert len(set(map(tuple, whole))) == len(PROMPTS)
