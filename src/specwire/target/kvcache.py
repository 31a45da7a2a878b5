"""The target's KV cache for decoding: transformers' `DynamicCache`, its full-attention layers written in place.

Scope: `GrowingLayer` (a `DynamicLayer` whose keys and values are views of buffers with room to spare),
`decoding_cache` (a `DynamicCache` for a model with those layers; sliding-window layers are kept as they are) and
`croppable` (can every layer of a cache drop its last positions at any length).
Plain decoding, the speculative engine, the pass-cost curve and the invariance check all take it, so what is
measured and checked is what decodes. Does not own cropping a rejected tree branch (`decode.engine.keep_accepted`
writes through the views) nor the continuous-batching cache (`data.continuous.SlotCache`).

Why: `DynamicLayer.update` concatenates the new keys and values onto the whole cache, so every pass copies the
cache of every layer: 60 copies a pass for the built-in target, each a few hundred kB at a few hundred tokens
of context, and growing with it. Here the new rows are written into free room and the layer's keys are the view
of the rows in use: a pass writes only its own rows. The attention reads the same numbers through a view whose
head stride is the buffer's (the compiled attention takes strides; sdpa takes strided tensors), so every logit
is bitwise what the concatenating cache gives (tests/unit/test_kvcache.py checks it on every architecture).
On a 2-core Zen 4 a one-token step of the built-in target in float32 took 0.8 ms less at 256 tokens of
context and 1.5 ms less at 700 (about 19 ms a step).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

MIN_ROOM = 64  # positions a buffer holds beyond what it was asked for when it is (re)allocated (fillers, a tree)


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, [B, H, length, D] views of [B, H, capacity, D] buffers. `crop` (inherited)
    narrows the views; `update` writes the new positions after them and widens them, reallocating (twice the
    need) only when the buffers are full."""

    def __init__(self, capacity: int = 0):
        super().__init__()
        self.capacity_hint = capacity
        self._k_buf: torch.Tensor | None = None
        self._v_buf: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k_buf = self._v_buf = None

    def _room(self, buf: torch.Tensor | None, new: torch.Tensor, used: int, need: int) -> torch.Tensor:
        """`buf`, or a larger buffer holding its first `used` positions, with room for `need` positions."""
        if buf is not None and buf.shape[-2] >= need:
            return buf
        size = (2 * need if buf is not None else max(need, self.capacity_hint)) + MIN_ROOM
        grown = new.new_empty((*new.shape[:-2], size, new.shape[-1]))  # shape: [B, H, size, D]
        if used:
            grown[..., :used, :] = buf[..., :used, :]
        return grown

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write key_states / value_states [B, H, T, D] after the cached positions; return the keys and values of
        every position, [B, H, length + T, D] views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        used = self.keys.shape[-2] if self._k_buf is not None else 0
        end = used + key_states.shape[-2]
        self._k_buf = self._room(self._k_buf, key_states, used, end)
        self._v_buf = self._room(self._v_buf, value_states, used, end)
        self._k_buf[..., used:end, :] = key_states
        self._v_buf[..., used:end, :] = value_states
        self.keys, self.values = self._k_buf[..., :end, :], self._v_buf[..., :end, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._k_buf = self._v_buf = None
        super().reset()

    # transformers' batch reshaping (beam search; decoding never calls it) makes new tensors: they become the buffers
    def batch_repeat_interleave(self, repeats: int) -> None:
        super().batch_repeat_interleave(repeats)
        self._adopt()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._adopt()

    def _adopt(self) -> None:
        if self._k_buf is not None:
            self._k_buf, self._v_buf = self.keys, self.values


def croppable(cache) -> bool:
    """Can every layer of `cache` drop its last positions at any length? transformers' plain layers and ours can;
    its sliding-window layers refuse once their window is full."""
    return all(type(layer) in (DynamicLayer, GrowingLayer) for layer in getattr(cache, "layers", [None]))


def decoding_cache(model, capacity: int = 0) -> DynamicCache:
    """A `DynamicCache` for `model` whose full-attention layers are `GrowingLayer`s with room for `capacity`
    positions at first (it grows past that by reallocating)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [GrowingLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
