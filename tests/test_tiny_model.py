"""The tiny model's tokenizer, tasks and training recipe, specified (the shipped weights are scored by
``python -m tinylm.evaluate``; figures in README)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.pipeline_helpers import REPO_ROOT


@pytest.fixture(scope="module")
def tokenizer():
    from tinylm.tokenizer import build_tokenizer

    return build_tokenizer()


def test_every_number_and_task_word_is_one_token_and_answers_round_trip(tokenizer):
    from tinylm.tasks import answer_length, make_split

    for example in make_split(seed=7, size=40):
        ids = tokenizer(example.answer, add_special_tokens=False)["input_ids"]
        assert len(ids) == answer_length(example)  # one token per number
        assert tokenizer.decode(ids) == example.answer
        assert tokenizer.unk_token_id not in tokenizer(example.prompt)["input_ids"]
    assert tokenizer.tokenize("count down from 399 to 7") == ["count", "down", "from", "399", "to", "7"]


def test_text_outside_the_vocabulary_falls_back_to_characters_not_unk(tokenizer):
    tokens = tokenizer.tokenize("def fib(n): return 1234")
    assert tokenizer.unk_token not in tokens
    assert tokens[:3] == ["d", "##e", "##f"] and tokens[-2:] == ["123", "##4"]


def test_heldout_answers_span_one_to_eight_blocks_of_eight_evenly_with_their_eos(tokenizer, heldout_rows):
    from tinylm.evaluate import blocks_spanned

    blocks = Counter(blocks_spanned(len(tokenizer(row["answer"], add_special_tokens=False)["input_ids"]))
                     for row in heldout_rows)
    assert sorted(blocks) == list(range(1, 9))
    assert max(blocks.values()) <= 2 * min(blocks.values())


def test_the_shipped_checkpoint_is_llada_format_under_10_mb_with_this_tokenizer(tokenizer):
    directory = REPO_ROOT / "assets" / "tiny"
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "llada" and config["vocab_size"] == len(tokenizer)
    assert sum(path.stat().st_size for path in directory.iterdir()) < 10 * 1024 * 1024


def test_training_is_seeded_resumable_and_exports_the_best_validated_checkpoint(tmp_path):
    def train(steps: int) -> None:
        subprocess.run([sys.executable, "-m", "tinylm.train", "--steps", str(steps), "--batch-size", "4",
                        "--validate-every", "2", "--validation-prompts", "2", "--work", str(tmp_path / "work"),
                        "--out", str(tmp_path / "out"), "--data", str(tmp_path / "data"), "--threads", "1"],
                       cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)

    import torch

    train(2)
    first = torch.load(tmp_path / "work" / "state.pt", weights_only=False)
    train(3)  # resumes at step 2: the state carries the step, optimizer, RNGs and the best score
    resumed = torch.load(tmp_path / "work" / "state.pt", weights_only=False)
    assert (first["step"], resumed["step"]) == (2, 3)
    assert resumed["best"]["step"] in (2, 3)
    chosen = json.loads((tmp_path / "out" / "training.json").read_text())["validation"]
    assert chosen["step"] == resumed["best"]["step"]
    assert (tmp_path / "data" / "heldout.jsonl").read_text() == (
        REPO_ROOT / "assets" / "data" / "heldout.jsonl").read_text()  # same definitions, same split


def test_warm_start_reads_the_shipped_weights_and_exports_them_unchanged_at_step_zero(tmp_path):
    from safetensors.torch import load_file

    subprocess.run([sys.executable, "-m", "tinylm.train", "--init", "assets/tiny", "--steps", "0",
                    "--validation-prompts", "2", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"),
                    "--data", str(tmp_path / "data"), "--threads", "1"],
                   cwd=REPO_ROOT, check=True, capture_output=True, timeout=300)
    shipped = load_file(REPO_ROOT / "assets" / "tiny" / "model.safetensors")
    exported = load_file(tmp_path / "out" / "model.safetensors")
    assert shipped.keys() == exported.keys()
    assert all(shipped[name].equal(exported[name]) for name in shipped)


def test_resume_restores_the_random_streams_from_a_state_saved_anywhere(tmp_path):
    import random

    import torch

    from engine.models.transformer import BidirectionalTransformer
    from tinylm.train import Progress, resume, save_state, tiny_config

    model = BidirectionalTransformer(tiny_config(32))
    optimizer = torch.optim.AdamW(model.parameters())
    rng = random.Random(3)
    torch.manual_seed(11)
    save_state(tmp_path / "state.pt", model, optimizer, rng, Progress(step=7, cpu_seconds=36.0))
    expected = (rng.random(), torch.rand(3))
    torch.manual_seed(99)
    restored_rng = random.Random(0)
    progress = resume(tmp_path / "state.pt", model, optimizer, restored_rng)
    assert (progress.step, progress.cpu_seconds) == (7, 36.0)
    assert torch.get_rng_state().device.type == "cpu"  # a CUDA map_location must not move it
    assert restored_rng.random() == expected[0] and torch.rand(3).equal(expected[1])


def test_decoder_states_cover_the_frontier_and_the_stop_on_a_full_canvas():
    import random

    from tinylm.mixtures import BLOCK, CANVAS, canvas_mask

    rng = random.Random(5)
    for answer_tokens in (2, 9, 17, 64):  # numbers + EOS
        for kind in ("plain", "semi_ar", "frontier", "stop"):
            masked, scale = canvas_mask(rng, kind, answer_tokens)
            assert len(masked) == len(scale) == CANVAS  # never depends on the answer length
        for _ in range(20):
            masked, _ = canvas_mask(rng, "frontier", answer_tokens)
            first = masked.index(True)
            assert all(masked[first:])  # a committed prefix, then the rest of the canvas masked
            masked, _ = canvas_mask(rng, "stop", answer_tokens)
            assert masked.index(True) in (answer_tokens - 2, answer_tokens - 1)  # the last number or EOS
            assert all(masked[masked.index(True):])
    with pytest.raises(ValueError, match="unknown kind"):
        canvas_mask(rng, "random", 5)
    assert BLOCK * 8 == CANVAS


def test_the_decoding_setting_is_named_or_rejected():
    from tinylm.evaluate import decode_rule

    assert decode_rule("threshold:0.7").threshold == 0.7
    assert (decode_rule("quota").name, decode_rule("quota").steps_per_block) == ("quota", 8)
    with pytest.raises(ValueError, match="threshold:<value>' or 'quota'"):
        decode_rule("greedy")
