"""Write a tiny LLaDA-layout checkpoint whose tokenizer is byte-level BPE, as Qwen's, Llama 3's and GPT-2's are.

The other fixtures spell text one character a token, and the shipped tiny model is WordPiece: neither has the
multi-character tokens that cross a grammar's boundaries (``":"``, ``{"``, ``","``, `` 12``). This one's BPE is
trained here, with no download, on the repository's demo rows (``assets/data/demo.jsonl``) as they are and as
compact JSON, so its merges are JSON punctuation, keys, prompt words and numbers with their leading space. The
weights are random and sharpened, as the other fixtures' are (``scripts.fixture_parts``); training and weights
are deterministic, so the fixture is the same wherever it is written. The tests write it into a temporary
folder (``python -m scripts.make_bpe_fixture DIR`` writes it anywhere).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from engine.models.families import CheckpointIds, family_named
from scripts.fixture_parts import random_model, sharpened
from scripts.make_fixtures import llada_transformer_config
from tinylm import tokenizer as llada_tokenizer
from tinylm.export import save_checkpoint

DEMO_ROWS = Path(__file__).resolve().parents[1] / "assets" / "data" / "demo.jsonl"
TRAINING_ROWS = 400  # demo rows the merges are learned from
VOCAB_SIZE = 512  # 256 bytes, LLaDA's 7 special tokens, the rest merges
SEED = 68


def training_text() -> list[str]:
    """The demo rows as the file writes them (``": "``, ``", "``) and as compact JSON (``":"``, ``","``)."""
    rows = [json.loads(line) for line in DEMO_ROWS.read_text().splitlines()[:TRAINING_ROWS]]
    return [text for row in rows for text in (json.dumps(row), json.dumps(row, separators=(",", ":")),
                                              row["prompt"], row["answer"])]


def build_bpe_tokenizer():
    """Byte-level BPE (GPT-2's pre-tokenizer and decoder, no prefix space) with LLaDA's special tokens first."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(llada_tokenizer.SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(training_text(), trainer=trainer)
    return llada_tokenizer.with_llada_specials(core)


def write_fixture(directory: Path) -> Path:
    """The fixture written to ``directory`` from :data:`SEED`: the same tokenizer and weights wherever it is."""
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = build_bpe_tokenizer()
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("eos", llada_tokenizer.EOS), ("bos", llada_tokenizer.BOS), ("mask", llada_tokenizer.MASK))}
    config = llada_transformer_config(len(tokenizer))
    model = sharpened(random_model(config, torch.Generator().manual_seed(SEED)), ids["mask"])
    config_json = family_named("llada").config_json(config, CheckpointIds(ids["mask"], ids["eos"], ids["eos"]), None)
    config_json["torch_dtype"] = "float32"
    save_checkpoint(model, directory, "llada", config_json, dtype=torch.float32)
    tokenizer.save_pretrained(str(directory))
    (directory / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["bos"], "eos_token_id": ids["eos"], "pad_token_id": ids["eos"]}, indent=2) + "\n")
    return directory


if __name__ == "__main__":
    print(write_fixture(Path(sys.argv[1])))
