"""One decoding pass of the target over T new tokens, run on the row multiple its linear layers pad to.

Scope: `padded_pass` (the logits of a chain or tree pass whose token count is rounded up to `rows` with filler
tokens, their keys and values dropped after) and `pass_rows` (the multiple a loaded model's products pad to, where
its cache can drop the fillers).
Plain decoding, the speculative engine, the invariance check and the pass-cost curve run their passes through
it, so what is checked and measured is what decodes. Does not own the row padding itself (`fastlinear`,
measured by `invariance`) nor the KV cache (`kvcache`).

Why: where a kernel's rows are invariant only on a multiple of `rows` (oneDNN in bf16 here: 2; nn.Linear in
float32: 4), every product of a pass pads its rows to that multiple, each with a few tensor ops of its own: for
a one-token step of the built-in target that is 211 products and about 2.5 ms of a 30 ms step. Padding the pass
once instead, with filler tokens, gives every product a whole multiple, so none pads. A row's logits do not
depend on the rows after it (each row attends only to the cache and to the rows its mask allows, which never
include a filler, and each product row is its own), so the real rows are bitwise what the unpadded pass gives:
`tests/unit/test_passes.py` checks it on every architecture.
"""

from __future__ import annotations

import torch


def pass_rows(model, cache) -> int:
    """The row multiple the model's products pad to, for passes into `cache`: 1 (no filler) where they pad
    nothing, or where a layer of the cache cannot drop the fillers' keys and values at any length (transformers'
    sliding-window layers refuse a crop once the window is full); those passes pad per product, as before."""
    from specwire.target.fastlinear import linear_min_rows
    from specwire.target.kvcache import croppable

    return linear_min_rows(model) if croppable(cache) else 1


def _padded_mask(mask: torch.Tensor, pad: int) -> torch.Tensor:
    """A [1, 1, T, P + T] pass mask (bool, True = may attend, or additive) grown to [1, 1, T + pad, P + T + pad]:
    the real rows see no filler; a filler row sees the cached prefix and itself."""
    T = mask.shape[-2]
    P = mask.shape[-1] - T
    sees = mask if mask.dtype == torch.bool else mask == 0
    grown = torch.zeros(*mask.shape[:-2], T + pad, P + T + pad, dtype=torch.bool, device=mask.device)
    grown[..., :T, :P + T] = sees
    grown[..., T:, :P] = True
    grown[..., T:, P + T:] = torch.eye(pad, dtype=torch.bool, device=mask.device)
    if mask.dtype == torch.bool:
        return grown
    return torch.zeros(grown.shape, dtype=mask.dtype, device=mask.device).masked_fill(~grown, torch.finfo(mask.dtype).min)


def padded_pass(model, ids: torch.Tensor, cache, rows: int, *, mask: torch.Tensor | None = None,
                positions: torch.Tensor | None = None, logits_to_keep: int = 0) -> torch.Tensor:
    """The logits [1, T', V] of the pass over ids [1, T] (T' = T, or `logits_to_keep` of the last real rows) with
    `mask` [1, 1, T, P + T] or None (causal) and `positions` [1, T] or None (after the cache), run on a multiple
    of `rows` tokens. Filler tokens (copies of the last) follow the real ones; their keys and values are cropped
    from `cache` after the pass. Forward hooks see the filler rows too, after the real ones."""
    T = ids.shape[1]
    pad = -T % rows
    if pad == 0:
        return model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True,
                     logits_to_keep=logits_to_keep).logits
    ids = torch.cat([ids, ids[:, -1:].expand(1, pad)], dim=1)  # shape: [1, T + pad]
    if positions is not None:
        positions = torch.cat([positions, positions[:, -1:].expand(1, pad)], dim=1)
    if mask is not None:
        mask = _padded_mask(mask, pad)
    keep = T + pad if logits_to_keep == 0 else min(T, logits_to_keep) + pad  # whole multiples through the lm_head
    logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, past_key_values=cache, use_cache=True,
                   logits_to_keep=keep).logits
    cache.crop(-pad)
    return logits[:, :-pad]
