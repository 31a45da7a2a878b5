"""The in-place decoding cache (`target.kvcache`) gives bitwise the logits of transformers' concatenating cache.

On tiny models of every supported architecture, in fp32 and bf16, with the compiled attention and the torch
form: a prefill, one-token steps, a chain pass, a tree pass whose accepted branch is gathered into place by the
engine's `keep_accepted`, crops, and growth past the buffers' first capacity, each pass's logits compared
bitwise with the same passes through `DynamicCache`. (Decoding end to end on it, plain and speculative, is
checked against greedy decoding by the engine's own tests.)
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from helpers import ARCHS, prompt_of
from specwire.decode.engine import keep_accepted
from specwire.decode.tree import pass_mask
from specwire.decode.invariance import random_tree
from specwire.target.attention import use_invariant_attention
from specwire.target.kvcache import MIN_ROOM, GrowingLayer, decoding_cache
from specwire.target.load import load_target


def _passes(target, cache, prompt: list[int], g: torch.Generator) -> list[torch.Tensor]:
    """The logits of a fixed script of passes through `cache` (the random numbers come from `g`)."""
    model, V = target.model, target.info.vocab_size
    out = []
    run = lambda ids, **kw: model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True, **kw).logits[0]
    out.append(run(prompt))  # prefill
    for _ in range(3):  # one-token steps
        out.append(run([int(torch.randint(0, V, (1,), generator=g))]))
    past = cache.get_seq_length()
    out.append(run(torch.randint(0, V, (5,), generator=g).tolist()))  # a chain pass, then 2 of its 5 kept
    cache.crop(-3)
    past += 2
    tree = random_tree(9, V, g, torch.device("cpu"))
    eager = model.config._attn_implementation == "eager"
    mask = pass_mask(tree, past, additive=target.dtype if eager else None)
    out.append(model(input_ids=tree.tokens[None], position_ids=(tree.positions() + past)[None], attention_mask=mask,
                     past_key_values=cache, use_cache=True).logits[0])  # a tree pass, one branch kept
    leaf = max(i for i in range(len(tree.parents)) if not tree.children[i])
    keep_accepted(cache, past, tree.path(leaf))
    for _ in range(2):
        out.append(run([int(torch.randint(0, V, (1,), generator=g))]))
    out.append(run(torch.randint(0, V, (120,), generator=g).tolist()))  # past the first capacity and its room
    return out


@pytest.mark.parametrize("dtype,attention", [("float32", "auto"), ("bfloat16", "auto"), ("float32", "torch")])
@pytest.mark.parametrize("arch", ARCHS)
def test_passes_through_the_growing_cache_are_bitwise_the_concatenating_caches(tiny_target, arch, dtype, attention):
    target = load_target(tiny_target(arch), device="cpu", dtype=dtype)
    use_invariant_attention(target.model, attention)
    prompt = prompt_of(37, seed=3)
    with torch.inference_mode():
        ref = _passes(target, DynamicCache(config=target.model.config), prompt, torch.Generator().manual_seed(0))
        cache = decoding_cache(target.model, capacity=len(prompt) + 4)  # small: the script outgrows it
        got = _passes(target, cache, prompt, torch.Generator().manual_seed(0))
    assert len(got) == len(ref)
    for i, (a, b) in enumerate(zip(got, ref)):
        assert torch.equal(a, b), f"{arch} {dtype}: pass {i} differs (max {(a.float() - b.float()).abs().max():.3g})"
    assert all(type(layer) is GrowingLayer for layer in cache.layers)
    assert cache.layers[0]._k_buf.shape[-2] > len(prompt) + 4 + MIN_ROOM  # it did grow


def test_sliding_window_layers_stay_transformers_own(tiny_target):
    target = load_target(tiny_target("mistral", sliding_window=16), device="cpu", dtype="float32")
    theirs = [type(layer) for layer in DynamicCache(config=target.model.config).layers]
    assert theirs and DynamicLayer not in theirs  # every layer slides
    assert [type(layer) for layer in decoding_cache(target.model).layers] == theirs


def test_a_crop_keeps_the_buffer_and_the_next_pass_writes_after_the_kept_rows():
    layer = GrowingLayer(capacity=8)
    k = torch.arange(2 * 6 * 4, dtype=torch.float32).view(1, 2, 6, 4)
    keys, _ = layer.update(k, k + 1000)
    buf = layer._k_buf
    assert keys.shape == (1, 2, 6, 4) and keys.data_ptr() == buf.data_ptr() and buf.shape[-2] >= 8
    layer.crop(-4)
    assert layer.get_seq_length() == 2
    new = torch.full((1, 2, 1, 4), -1.0)
    keys, values = layer.update(new, new)
    assert layer._k_buf is buf  # written in place, not reallocated
    assert torch.equal(keys[:, :, :2], k[:, :, :2]) and torch.equal(keys[:, :, 2:], new)
    assert torch.equal(values[:, :, :2], k[:, :, :2] + 1000)


def test_batch_reshaping_keeps_the_rows_it_selects():
    layer = GrowingLayer(capacity=8)
    k = torch.randn(2, 1, 3, 4)
    layer.update(k, -k)
    layer.batch_select_indices(torch.tensor([1]))
    keys, values = layer.update(torch.ones(1, 1, 1, 4), torch.ones(1, 1, 1, 4))
    assert torch.equal(keys[:, :, :3], k[1:]) and torch.equal(values[:, :, :3], -k[1:]) and keys.shape[-2] == 4
