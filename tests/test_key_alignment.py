"""A window's attention reads a multiple of ``KEY_ALIGNMENT`` keys: its rows' bounding box, widened over
columns that are no row's keys (left of right-aligned rows, or past left-aligned rows' active blocks).
The widening changes no token: the engine gives the tokens of windows that read the box itself."""
from __future__ import annotations

from pathlib import Path

import pytest

import engine.models.step_inputs as step_inputs
from engine import BlockServeEngine, EngineConfig, SamplingParams
from engine.models import load_model
from engine.models.step_inputs import KEY_ALIGNMENT, aligned_keys

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def test_a_key_count_rounds_up_to_the_alignment_and_never_past_the_cache():
    assert KEY_ALIGNMENT == 16
    assert [aligned_keys(keys, 4096) for keys in (1, 16, 17, 106, 112)] == [16, 16, 32, 112, 112]
    assert aligned_keys(100, 104) == 104


def run_recording_windows(lm, alignment: int, monkeypatch) -> tuple[list[list[int]], list[tuple[int, int, int]]]:
    """Rows of 5 to 42 prompt tokens, leaving at different blocks; every window's (keys read, widest row's
    keys, cache width)."""
    monkeypatch.setattr(step_inputs, "KEY_ALIGNMENT", alignment)
    forward_step, windows = lm.model.forward_step, []

    def recording(refresh, window, kv_cache):
        if window is not None:
            end = window.context_end or kv_cache.width
            windows.append((end - window.context_start, max(window.row_widths), kv_cache.width))
        return forward_step(refresh, window, kv_cache)

    monkeypatch.setattr(lm.model, "forward_step", recording)
    prompts = [[3 + (5 * i + j) % 50 for j in range(5 + 3 * i)] for i in range(13)]
    params = [SamplingParams(max_new_tokens=16 * (1 + i % 3), stop_at_eos=False) for i in range(13)]
    engine = BlockServeEngine(lm, EngineConfig(max_batch_size=8, max_model_len=200))
    tokens = [output.token_ids for output in engine.generate(prompts, params)]
    monkeypatch.undo()
    return tokens, windows


@pytest.mark.parametrize("family", ["tiny-llada", "tiny-sdar"])
def test_windows_read_aligned_keys_and_give_the_tokens_of_the_exact_box(family, monkeypatch):
    lm = load_model(FIXTURES / family, dtype="float64")
    aligned_tokens, aligned = run_recording_windows(lm, KEY_ALIGNMENT, monkeypatch)
    exact_tokens, exact = run_recording_windows(lm, 1, monkeypatch)
    assert aligned and len(aligned) == len(exact)
    assert all(keys % KEY_ALIGNMENT == 0 or keys == width for keys, _, width in aligned)
    assert all(widest <= keys < widest + KEY_ALIGNMENT for keys, widest, _ in aligned)
    assert any(keys > widest for keys, widest, _ in aligned)  # boxes that were not aligned grew
    assert [keys for keys, _, _ in exact] == [widest for _, widest, _ in exact]
    assert aligned_tokens == exact_tokens
