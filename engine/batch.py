"""The mixed-state batch: the only place that knows left padding, position ids and block indices.

Rows are right-aligned (left-padded) into one ``[rows, width]`` tensor, each with its own prompt length
and current block::

    row 0:  pad pad [ prompt 0      | blk | blk |>blk<| blk ]
    row 1:  [ prompt 1 (longer)       |>blk<| blk | blk | blk ]
    row 2:  pad pad pad pad [ p2 | blk |>blk<| blk ]          (shorter canvas: more pad)
                                          >blk< = the row's active block

Every row carries position ids that start at 0 on its first real token, and pad columns are masked as
keys, so a row's computation is the one it would have alone. Each row's active block is addressed by a
``[rows, block_length]`` column index, so gather/scatter of the active blocks is one tensor op.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn.utils.rnn import pad_sequence

from engine.request import Request


@dataclass
class BlockBatch:
    tokens: torch.Tensor  # [rows, width] left-padded prompt + canvas
    positions: torch.Tensor  # [rows, width] 0 at each row's first real token (0 on pads)
    key_mask: torch.Tensor  # [rows, width] True on real tokens
    block_columns: torch.Tensor  # [rows, block_length] columns of each row's active block
    block_indices: torch.Tensor  # [rows] index of the active block within the row's canvas
    temperatures: torch.Tensor  # [rows]
    seeds: torch.Tensor  # [rows] int64
    num_real_tokens: int  # sum of row widths (the rest of the box is padding)

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @property
    def bounding_box_tokens(self) -> int:
        return self.num_rows * self.width

    @property
    def block_length(self) -> int:
        return self.block_columns.shape[1]

    def canvas_positions(self) -> torch.Tensor:
        """[rows, block_length] position of each active-block token within its row's canvas."""
        offsets = torch.arange(self.block_length, device=self.tokens.device)
        return self.block_indices[:, None] * self.block_length + offsets

    def global_steps(self, step: int) -> torch.Tensor:
        """[rows] a per-row counter of denoising steps that is unique across the row's blocks."""
        return self.block_indices * self.block_length + step

    def block_tokens(self) -> torch.Tensor:
        return self.tokens.gather(1, self.block_columns)

    def write_block(self, block_tokens: torch.Tensor) -> None:
        self.tokens.scatter_(1, self.block_columns, block_tokens)

    def hidden_columns(self, logit_shift: int) -> torch.Tensor:
        """Columns whose hidden states predict the active blocks (one to the left for Dream)."""
        return self.block_columns - logit_shift

    def dual_window(self, logit_shift: int) -> torch.Tensor:
        """[rows, logit_shift + block_length]: the active block, plus the column before it for Dream."""
        offsets = torch.arange(-logit_shift, self.block_length, device=self.tokens.device)
        return self.block_columns[:, :1] + offsets

    def prefix_window(self, logit_shift: int) -> torch.Tensor:
        """[rows, w]: from the active block (minus the shift) to the row's end, left-aligned per row.

        Rows end at the same column, so windows are ragged; the missing tail of shorter windows points at
        the cache's scratch column ``width``, which is never attended.
        """
        starts = self.block_columns[:, 0] - logit_shift
        window = self.width - int(starts.min())
        columns = starts[:, None] + torch.arange(window, device=self.tokens.device)
        return columns.masked_fill(columns >= self.width, self.width)

    def select_rows(self, rows: torch.Tensor) -> BlockBatch:
        """A new batch holding only ``rows`` (their tokens copied): rows whose block is done leave."""
        return BlockBatch(
            tokens=self.tokens[rows], positions=self.positions[rows], key_mask=self.key_mask[rows],
            block_columns=self.block_columns[rows], block_indices=self.block_indices[rows],
            temperatures=self.temperatures[rows], seeds=self.seeds[rows],
            num_real_tokens=int(self.key_mask[rows].sum()))

    def gather_window(self, columns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and positions at ``columns`` (scratch columns read as column 0; they are discarded)."""
        safe = columns.masked_fill(columns >= self.width, 0)
        return self.tokens.gather(1, safe), self.positions.gather(1, safe)


def build_block_batch(requests: Sequence[Request], pad_id: int, device: torch.device) -> BlockBatch:
    """Left-pad the running requests' rows and index each row's active block."""
    rows = pad_sequence([request.row_tokens for request in requests], batch_first=True,
                        padding_value=pad_id, padding_side="left")
    width = rows.shape[1]
    widths = torch.tensor([request.width for request in requests], device=device)
    pads = width - widths
    columns = torch.arange(width, device=device)[None]
    block_length = requests[0].block_length
    block_starts = pads + torch.tensor([request.block_start for request in requests], device=device)
    return BlockBatch(
        tokens=rows,
        positions=(columns - pads[:, None]).clamp(min=0),
        key_mask=columns >= pads[:, None],
        block_columns=block_starts[:, None] + torch.arange(block_length, device=device),
        block_indices=torch.tensor([request.block_index for request in requests], device=device),
        temperatures=torch.tensor([float(request.params.temperature) for request in requests],
                                  device=device, dtype=torch.float64),
        seeds=torch.tensor([request.seed for request in requests], device=device, dtype=torch.long),
        num_real_tokens=int(widths.sum()),
    )
