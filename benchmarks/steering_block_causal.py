"""The replay's steering for a block-causal family (SDAR, LLaDA2): rows are known by their cached keys.

:class:`benchmarks.steering.SteeredModel` knows a row by its width, which a block-causal row does not
show: rows sit left-aligned, a prefill reads only up to its first block's end, and a window only its
block. So this wrapper knows a row by its first two prompt tokens, which the replay makes distinct per
request (:func:`tag_prompts`):

* in a prefill, the row's prompt length (its real tokens that are not MASK: nothing is committed yet)
  names the request, as before; after the forward the row's layer-0 keys at columns 0 and 1 (a function
  of those two tokens and positions 0 and 1 only) are stored as the request's fingerprint;
* in a window, row i holds cache slot i (the window rows are packed into slots ``[0, n)``), and its
  keys at columns 0 and 1 are matched to the nearest stored fingerprint, on the device.

The commits are steered exactly as by the base class. For an MoE model it also keeps, per forward, the
distinct routed experts each MoE layer read (``model.experts_touched()``), on the device;
:meth:`BlockCausalSteeredModel.experts_per_forward` reads them back once, after a run.
"""
from __future__ import annotations

import torch

from benchmarks.steering import SteeredModel
from engine.models.kv_cache import KVCache
from engine.models.step_inputs import RefreshPart, WindowPart

TAG_TOKENS = 2  # leading prompt tokens that name a request
MATCH_TOLERANCE = 1e-6  # a fingerprint's squared distance, relative to its squared norm, that still matches


def tag_prompts(prompts: list[list[int]], ordinary: list[int]) -> list[list[int]]:
    """Each prompt with its first two tokens replaced by a pair no other prompt has (ordinary ids)."""
    base = len(ordinary)
    if len(prompts) > base * base:
        raise ValueError(f"{len(prompts)} requests need more than {base} ordinary tokens to be told apart")
    if min(map(len, prompts), default=TAG_TOKENS) < TAG_TOKENS:
        raise ValueError(f"a block-causal replay prompt needs at least {TAG_TOKENS} tokens")
    return [[ordinary[index // base], ordinary[index % base], *prompt[TAG_TOKENS:]]
            for index, prompt in enumerate(prompts)]


class BlockCausalSteeredModel(SteeredModel):
    def __init__(self, base, **kwargs):
        super().__init__(base, **kwargs)
        config = base.config
        width = TAG_TOKENS * config.num_kv_heads * config.head_dim
        self._fingerprints = torch.full((self._target.shape[0], width), 1e30, device=self._device)
        self._experts: list[torch.Tensor] = []

    def forward_step(self, refresh: RefreshPart | None, window: WindowPart | None,
                     kv_cache: KVCache | None) -> torch.Tensor:
        hidden = super().forward_step(refresh, window, kv_cache)
        if refresh is not None:
            request = self._pending[0][0]
            self._fingerprints.index_copy_(0, request, self._keys(kv_cache, refresh.slots))
        touched = self._base.experts_touched() if hasattr(self._base, "experts_touched") else None
        if touched is not None:
            self._experts.append(touched)
        return hidden

    @staticmethod
    def _keys(kv_cache: KVCache, slots: torch.Tensor) -> torch.Tensor:
        """[rows, TAG_TOKENS x kv_heads x head_dim] layer-0 keys of the rows' first prompt columns."""
        return kv_cache.keys[0][slots, :, :TAG_TOKENS, :].float().flatten(1)

    def _refresh_rows(self, part: RefreshPart):
        request = self._request((part.key_mask & (part.tokens != self._mask_id)).sum(1))
        columns = part.read_columns
        return request, part.positions.gather(1, columns), part.tokens.gather(1, columns) == self._mask_id

    def _window_rows(self, part: WindowPart, kv_cache: KVCache):
        keys = self._keys(kv_cache, torch.arange(part.num_rows, device=self._device))
        distance = (keys[:, None, :] - self._fingerprints[None]).square().sum(-1)
        best, request = distance.min(1)
        self._unknown |= (best > MATCH_TOLERANCE * (keys.square().sum(-1) + 1)).any()
        if part.read_columns is None:
            positions, tokens = part.positions[:, :part.num_read], part.tokens[:, :part.num_read]
        else:
            positions, tokens = part.positions.gather(1, part.read_columns), part.tokens.gather(1, part.read_columns)
        return request, positions, tokens == self._mask_id

    def experts_per_forward(self) -> list[float] | None:
        """Per forward, the distinct routed experts an MoE layer read, averaged over the MoE layers (one
        host read); None for a dense model."""
        if not self._experts:
            return None
        return torch.stack(self._experts).float().mean(1).tolist()
