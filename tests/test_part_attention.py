"""A step part's attention is an object (``engine.models.part_attention``). The packed step, the compiled path,
its shapes and inputs, and the transformer ask it where rows sit and what they see; none tests a kind, nor
does the memory model, which asks the row layout."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from engine.models.part_attention import BIDIRECTIONAL, BlockCausal, part_attention
from engine.models.step_inputs import RefreshPart

ROOT = Path(__file__).resolve().parents[1]
PACKING_MODULES = ("models/compiled.py", "models/compiled_inputs.py", "models/compiled_shapes.py",
                   "models/packed_step.py", "models/step_inputs.py", "models/transformer.py", "runner/memory.py",
                   "runner/batch.py", "models/loader.py", "scheduling/model_fit.py", "engine.py")
KIND_TEST = re.compile(r"block_causal|left_aligned|block_size is not None|decodes_canvases|stores_finished_blocks"
                       r"|caches_prefixes")


def test_the_packing_code_asks_the_parts_attention_instead_of_testing_a_kind():
    lines = [f"{name}:{number}: {line.strip()}" for name in PACKING_MODULES
             for number, line in enumerate((ROOT / "engine" / name).read_text().splitlines(), 1)
             if KIND_TEST.search(line)]
    assert not lines, lines


def test_a_part_names_its_attention_by_its_block_size_one_object_per_size():
    part = RefreshPart(torch.zeros(1, 4, dtype=torch.long), torch.arange(4)[None], torch.ones(1, 4, dtype=torch.bool),
                       torch.zeros(1, 1, dtype=torch.long))
    assert part.attention is BIDIRECTIONAL
    assert part_attention(4) is part_attention(4) == BlockCausal(4)


def test_right_aligned_rows_end_at_the_box_and_left_aligned_rows_start_it():
    """A row of 5 keys in a box of 8: columns 3-7 bidirectionally, 0-4 block-causally."""
    for attention, columns in ((BIDIRECTIONAL, range(3, 8)), (BlockCausal(4), range(0, 5))):
        assert attention.first_column(5, 8) == columns[0]
        assert list(range(8))[attention.own_columns(5, 8)] == list(columns)
    assert BIDIRECTIONAL.context_columns(32, 100) == (68, 100) and BlockCausal(4).context_columns(32, 100) == (0, 32)


def test_a_block_causal_query_sees_the_real_keys_of_its_block_and_the_blocks_before_it():
    key_mask = torch.tensor([[True] * 6 + [False] * 2])
    positions = torch.arange(8)[None]
    seen = BlockCausal(4).mask(key_mask, positions, positions, torch.float32)[0, 0] == 0
    assert seen[1].tolist() == [True] * 4 + [False] * 4
    assert seen[5].tolist() == [True] * 6 + [False] * 2
    assert (BIDIRECTIONAL.mask(key_mask, positions, None, torch.float32)[0, 0, 0] == 0).tolist() == key_mask[0].tolist()
