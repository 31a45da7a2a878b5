"""Capture by hs index with forward hooks, on a tiny random model of each supported architecture."""

from __future__ import annotations

import pytest
import torch

from specwire.target.capture import capture_hidden_states, capture_hooks, position_ids_from_mask
from specwire.errors import SpecwireError
from specwire.target.load import model_parts

from helpers import ARCHS, PAD_ID, make_tiny_model

ATOL = 1e-5


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    return request.param, make_tiny_model(request.param, seed=1)


def _no_hooks(parts) -> bool:
    """No pre-hook on any layer, and no forward hook of ours.

    transformers 5 installs its own permanent forward hook on each layer the first time a model runs
    with output_hidden_states=True (its output-capturing hook), so forward hooks are filtered by origin.
    """
    for layer in parts.layers:
        if layer._forward_pre_hooks:
            return False
        if any(getattr(h, "__module__", "").startswith("specwire") for h in layer._forward_hooks.values()):
            return False
    return True


def test_capture_equals_hf_hidden_states(arch_model):
    arch, model = arch_model
    parts = model_parts(model)
    L = len(parts.layers)
    assert L == model.config.num_hidden_layers
    torch.manual_seed(0)
    input_ids = torch.randint(0, 256, (2, 11))  # shape: [B, T]
    with torch.no_grad():
        ref = model(input_ids=input_ids, output_hidden_states=True)
    assert len(ref.hidden_states) == L + 1
    cap = capture_hidden_states(model, input_ids, list(range(L + 1)), with_logits=True)
    assert cap.states.shape == (L + 1, 2, 11, model.config.hidden_size)
    for i in range(L):
        torch.testing.assert_close(cap.states[i], ref.hidden_states[i], atol=ATOL, rtol=0, msg=f"{arch} hs {i}")
    # HF's last entry is taken after the final norm (docs/CONVENTIONS.md section 1), ours before it: for all six
    # architectures (transformers 5.19), final_norm(hs L) reproduces HF's entry L exactly, and hs L differs.
    torch.testing.assert_close(parts.final_norm(cap.states[L]), ref.hidden_states[L], atol=ATOL, rtol=0)
    assert not torch.allclose(cap.states[L], ref.hidden_states[L], atol=1e-3)
    # and lm_head(final_norm(hs L)) gives the model's logits
    torch.testing.assert_close(parts.lm_head(parts.final_norm(cap.states[L])), ref.logits, atol=ATOL, rtol=0)
    torch.testing.assert_close(cap.logits, ref.logits, atol=ATOL, rtol=0)
    assert _no_hooks(parts)


def test_capture_order_and_fused(arch_model):
    arch, model = arch_model
    L = model.config.num_hidden_layers
    input_ids = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(3))
    ids = [L - 3, 0, L // 2, L]  # not sorted: states come back in the order asked for
    cap = capture_hidden_states(model, input_ids, ids)
    assert cap.hs_ids == tuple(ids)
    assert cap.logits is None
    full = capture_hidden_states(model, input_ids, list(range(L + 1)))
    for k, i in enumerate(ids):
        torch.testing.assert_close(cap.states[k], full.states[i], atol=0, rtol=0)
    H = model.config.hidden_size
    fused = cap.fused()  # shape: [B, T, 4 * H]
    assert fused.shape == (1, 7, 4 * H)
    torch.testing.assert_close(fused[..., H:2 * H], full.states[0], atol=0, rtol=0)


def _padded_batch(seqs: list[list[int]], side: str) -> tuple[torch.Tensor, torch.Tensor]:
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), PAD_ID, dtype=torch.long)  # shape: [B, T]
    mask = torch.zeros((len(seqs), T), dtype=torch.long)
    for b, s in enumerate(seqs):
        if side == "left":
            ids[b, T - len(s):] = torch.tensor(s)
            mask[b, T - len(s):] = 1
        else:
            ids[b, :len(s)] = torch.tensor(s)
            mask[b, :len(s)] = 1
    return ids, mask


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_matches_unpadded(arch_model, side):
    arch, model = arch_model
    L = model.config.num_hidden_layers
    hs_ids = [0, 2, L // 2, L - 3, L]
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (9, 4, 6)]
    ids, mask = _padded_batch(seqs, side)
    cap = capture_hidden_states(model, ids, hs_ids, attention_mask=mask, with_logits=True)
    T = ids.shape[1]
    for b, s in enumerate(seqs):
        alone = capture_hidden_states(model, torch.tensor([s]), hs_ids, with_logits=True)
        real = slice(T - len(s), T) if side == "left" else slice(0, len(s))
        torch.testing.assert_close(cap.states[:, b, real], alone.states[:, 0], atol=1e-4, rtol=1e-4,
                                   msg=lambda m: f"{arch} {side} row {b}: {m}")
        torch.testing.assert_close(cap.logits[b, real], alone.logits[0], atol=1e-4, rtol=1e-4)


def test_position_ids_from_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 2, 2]]


def test_hooks_removed_after_success_and_on_error(arch_model):
    arch, model = arch_model
    parts = model_parts(model)
    L = len(parts.layers)
    input_ids = torch.randint(0, 256, (1, 5))
    capture_hidden_states(model, input_ids, [0, 3, L])
    assert _no_hooks(parts)

    # an exception raised inside the forward, in the middle of the decoder stack
    def boom(module, args, output):
        raise RuntimeError("boom inside forward")

    handle = parts.layers[L // 2].mlp.register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom inside forward"):
            capture_hidden_states(model, input_ids, [0, 2, L])
    finally:
        handle.remove()
    assert _no_hooks(parts)

    # an exception from the embedding (token id past the vocabulary), before any layer runs
    with pytest.raises(IndexError):
        capture_hidden_states(model, torch.tensor([[model.config.vocab_size + 5]]), [1, L])
    assert _no_hooks(parts)

    # an exception raised by the caller inside the context manager
    with pytest.raises(KeyError):
        with capture_hooks(parts, [1, L]) as store:
            assert not _no_hooks(parts)
            raise KeyError("caller")
    assert _no_hooks(parts)
    assert store == {}


def test_capture_refuses_out_of_range_ids(tiny_llama_target):
    t = tiny_llama_target
    L = t.num_layers
    ids = torch.tensor([t.encode_chat("hi")])
    for bad in ([0, L + 1], [-1, 2]):
        with pytest.raises(SpecwireError, match="out of range"):
            capture_hidden_states(t.model, ids, bad, parts=t.parts)
    assert _no_hooks(t.parts)
