"""A per-forward trace: what every model call computed, as data (cheap enough to stay on).

One record per model call. A call may hold two parts. Eagerly they run as one packed forward: their
linear layers share one pass over the weights, and attention runs per part. Compiled, they run as two
forwards (``engine.models.compiled``).

* refresh: full rows, the first denoising step of each row's block; ``refresh_width`` tokens per row,
  each attending to the same ``refresh_width`` columns (the part's bounding box, padding included).
  The linear layers see only the real ones (``forward_tokens``).
* window: cached steps; ``window_tokens`` tokens per row (the block, plus the column before it for a
  shifted family, or the block to the row's end with a prefix cache), attending to ``window_context``
  cached columns.

Anchored and canvas rows have no refresh or window rows; their records price them with the same fields. A
store span (a prompt, a finished block or canvas) fills the refresh fields, every other span the window
fields.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ForwardRecord:
    refresh_rows: int = 0
    refresh_width: int = 0  # tokens per refresh row = keys each of them attends to
    window_rows: int = 0
    window_tokens: int = 0  # tokens per window row
    window_context: int = 0  # keys of the window rows' bounding box (padding included; attention may read
    # up to KEY_ALIGNMENT - 1 more, masked: engine.models.step_inputs)
    logit_positions: int = 0  # positions whose vocabulary logits were computed: those its rule reads
    real_tokens: int = 0  # non-pad tokens of the rows computed (prompt + canvas)
    refresh_pad_tokens: int = 0  # box positions of the refresh part with no real token (packed away)
    window_pad_tokens: int = 0  # the same for the window part

    @property
    def kind(self) -> str:
        if self.refresh_rows and self.window_rows:
            return "packed"
        return "refresh" if self.refresh_rows else "window"

    @property
    def rows(self) -> int:
        return self.refresh_rows + self.window_rows

    @property
    def forward_tokens(self) -> int:
        """Tokens that went through the linear layers: the parts' boxes less their pad positions (an
        eager forward packs each row's real tokens; attention alone sees the boxes). A compiled forward
        runs its bucketed boxes whole, so for it this counts less than it computed."""
        return (self.refresh_rows * self.refresh_width + self.window_rows * self.window_tokens
                - self.refresh_pad_tokens - self.window_pad_tokens)

    @property
    def bounding_box_tokens(self) -> int:
        """rows x widest row of the rows computed (what a dense batch would materialize)."""
        return self.rows * max(self.refresh_width, self.window_context)

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__} | {"kind": self.kind}
