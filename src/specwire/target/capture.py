"""Capture of target hidden states by hs index, with forward hooks.

Owns: reading hs indices 0..L out of an unmodified HF model:
  hs i < L : the input of decoder layer i (forward pre-hook on layers[i]);
  hs L     : the output of the last decoder layer, before the final norm (forward hook).
Hooks are removed on exit, also on error. Never a patched copy of a model file.
Also owns `capture_batch`, the one capture code path for training data: the dump writer
(`specwire.data.datagen`) and the trainer's online mode both read their states through it (the
dump writer through its packed form, `capture_packed`), so offline and online states are the same.
Does not decide which ids to capture (`wiring`) or what to do with the states (data, engine, doctor).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn

from specwire.errors import SpecwireError
from specwire.target.load import ModelParts, Target, model_parts


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


# ---- the capture path for training data (dump writing and online training) ------------------------

@dataclass
class PackedCapture:
    """The states of a batch's real tokens, rows packed one after another (batch order)."""

    hidden: torch.Tensor  # [N, n_ids * H]: the fused hs ids, N = sum(lengths)
    last_hidden: torch.Tensor  # [N, H]: hs L, the last layer before the final norm
    lengths: list[int]  # tokens of each row


@torch.no_grad()
def capture_packed(target: Target, input_ids_list: Sequence[Sequence[int]], hs_ids: Sequence[int], *,
                   dtype: torch.dtype | None = None) -> PackedCapture:
    """One prefill of a right-padded batch; states of the real tokens packed flat, on the target's device.

    Right padding needs no attention mask: under causal attention a real token only sees earlier
    tokens, which are all real, so each row computes exactly what it would alone (and SDPA keeps its
    causal fast path). `dtype` casts the states (default: the model's).
    """
    lens = [len(x) for x in input_ids_list]
    if not lens or min(lens) < 1:
        raise SpecwireError("capture: every sequence needs at least one token.")
    T = max(lens)
    L = target.num_layers
    ids = torch.zeros(len(lens), T, dtype=torch.long)  # shape: [B, T], right-padded with id 0
    for r, x in enumerate(input_ids_list):
        ids[r, :lens[r]] = torch.as_tensor(x, dtype=torch.long)
    ids = ids.to(target.device)
    cap = capture_hidden_states(target.model, ids, list(hs_ids) + [L], parts=target.parts)
    dtype = dtype or cap.states.dtype
    valid = torch.arange(T, device=ids.device)[None, :] < torch.tensor(lens, device=ids.device)[:, None]  # shape: [B, T]
    states = cap.states.to(dtype)  # shape: [n_ids + 1, B, T, H]
    hidden = torch.cat(list(states[:-1]), dim=-1)[valid]  # shape: [N, n_ids * H], rows in batch order
    last_hidden = states[-1][valid]  # shape: [N, H]
    return PackedCapture(hidden=hidden, last_hidden=last_hidden, lengths=lens)


def capture_batch(target: Target, input_ids_list: Sequence[Sequence[int]], hs_ids: Sequence[int], *,
                  dtype: torch.dtype | None = None) -> dict[str, list[torch.Tensor]]:
    """Capture the fused `hs_ids` states and hs L for each sequence: the one capture code path.

    Returns {"hidden": [[T_i, n_ids*H]...], "last_hidden": [[T_i, H]...]} on the target's device, in
    `dtype` (default: the model's). Training targets come from lm_head(final_norm(last_hidden)).
    """
    packed = capture_packed(target, input_ids_list, hs_ids, dtype=dtype)
    return {"hidden": list(torch.split(packed.hidden, packed.lengths)),
            "last_hidden": list(torch.split(packed.last_hidden, packed.lengths))}
