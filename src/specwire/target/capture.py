"""Capture of target hidden states by hs index, with forward hooks.

Owns: reading hs indices 0..L out of an unmodified HF model (FIELD-NOTES section 1):
  hs i < L : the input of decoder layer i (forward pre-hook on layers[i]);
  hs L     : the output of the last decoder layer, before the final norm (forward hook).
Hooks are removed on exit, also on error. Never a patched copy of a model file.
Does not decide which ids to capture (`wiring`) or what to do with the states (data, engine, doctor).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from specwire.errors import SpecwireError
from specwire.target.load import ModelParts, model_parts


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    if hasattr(x, "last_hidden_state"):
        return x.last_hidden_state
    raise SpecwireError(f"cannot read the hidden state from a decoder layer that returned {type(x).__name__}.")


@contextlib.contextmanager
def capture_hooks(parts: ModelParts, hs_ids: list[int] | tuple[int, ...]) -> Iterator[dict[int, torch.Tensor]]:
    """Register hooks for `hs_ids`; yield a dict that each forward fills with {hs index: [B, T, H]}."""
    L = len(parts.layers)
    for i in hs_ids:
        if not 0 <= i <= L:
            raise SpecwireError(f"hs index {i} out of range 0..{L} for this {L}-layer target.")
    store: dict[int, torch.Tensor] = {}
    handles = []

    def pre_hook(idx):
        def fn(module, args, kwargs):
            store[idx] = args[0] if args else kwargs["hidden_states"]
        return fn

    def post_hook(idx):
        def fn(module, args, output):
            store[idx] = _first_tensor(output)
        return fn

    try:
        for i in sorted(set(hs_ids)):
            if i < L:
                handles.append(parts.layers[i].register_forward_pre_hook(pre_hook(i), with_kwargs=True))
            else:
                handles.append(parts.layers[L - 1].register_forward_hook(post_hook(i)))
        yield store
    finally:
        for h in handles:
            h.remove()


@dataclass
class Capture:
    states: torch.Tensor  # [n_ids, B, T, H], in the order of hs_ids
    hs_ids: tuple[int, ...]
    logits: torch.Tensor | None = None  # [B, T, V] when asked for

    def fused(self) -> torch.Tensor:
        """The fc input: states concatenated in id order. shape: [B, T, n_ids * H]"""
        return torch.cat(list(self.states), dim=-1)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding: cumulative count of real tokens minus one (0 on pads)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def capture_hidden_states(
    model: nn.Module,
    input_ids: torch.Tensor,
    hs_ids: list[int] | tuple[int, ...],
    *,
    attention_mask: torch.Tensor | None = None,
    with_logits: bool = False,
    parts: ModelParts | None = None,
) -> Capture:
    """One forward pass over a (padded) batch; returns the states at `hs_ids` for every position.

    input_ids: [B, T]. attention_mask: [B, T] (1 = real token), left or right padding.
    Without `with_logits`, only the decoder runs (no lm_head), which is what datagen needs.
    """
    parts = parts or model_parts(model)
    position_ids = position_ids_from_mask(attention_mask) if attention_mask is not None else None
    runner = model if with_logits else model.base_model
    with capture_hooks(parts, hs_ids) as store:
        out = runner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        states = torch.stack([store[i] for i in hs_ids])
    return Capture(states=states, hs_ids=tuple(hs_ids), logits=out.logits if with_logits else None)
