"""`target.passes.padded_pass`: a pass rounded up to the row multiple with filler tokens gives its real rows bitwise
the logits of the same pass unpadded, chain and tree, and leaves the cache as the unpadded pass would.

On tiny models of every supported architecture with a row multiple forced on their products (the padding
oneDNN needs in bf16 here, and nn.Linear in float32), in fp32 and bf16: a prompt, one-token steps, a chain pass
and a tree pass, each through `padded_pass` and through the model directly, on two caches side by side.
"""

from __future__ import annotations

import pytest
import torch

from helpers import ARCHS, prompt_of
from specwire.decode.invariance import random_tree
from specwire.decode.tree import pass_mask
from specwire.target.fastlinear import pad_linear_rows
from specwire.target.kvcache import decoding_cache
from specwire.target.load import load_target
from specwire.target.passes import _padded_mask, padded_pass, pass_rows


# rows 4 and 2: the multiples this machine's products need in those dtypes. rows 3 is no such multiple, so only
# dense models take it: a mixture of experts gives each expert the fillers routed to it, and its products then
# run on another multiple of 3, which only an invariant multiple makes harmless.
CASES = [(arch, dtype, rows) for arch in ARCHS for dtype, rows in (("float32", 4), ("bfloat16", 2), ("float32", 3))
         if not (rows == 3 and arch == "deepseek_v3")]


@pytest.mark.parametrize("arch,dtype,rows", CASES)
def test_a_padded_pass_is_bitwise_the_pass(tiny_target, arch, dtype, rows):
    target = load_target(tiny_target(arch), device="cpu", dtype=dtype)
    model, V = target.model, target.info.vocab_size
    pad_linear_rows(model, rows)
    assert pass_rows(model, decoding_cache(model)) == rows
    g = torch.Generator().manual_seed(0)
    a, b = decoding_cache(model), decoding_cache(model)
    prompt = torch.tensor([prompt_of(21, seed=2)])
    eager = model.config._attn_implementation == "eager"
    with torch.inference_mode():
        passes = [dict(ids=prompt, logits_to_keep=1)]
        passes += [dict(ids=torch.randint(0, V, (1, 1), generator=g)) for _ in range(3)]
        passes.append(dict(ids=torch.randint(0, V, (1, 5), generator=g)))
        for kw in passes:
            padded = padded_pass(model, kw["ids"], a, rows, logits_to_keep=kw.get("logits_to_keep", 0))
            plain = model(input_ids=kw["ids"], past_key_values=b, use_cache=True,
                          logits_to_keep=kw.get("logits_to_keep", 0)).logits
            assert torch.equal(padded, plain), f"{arch} {dtype}: a chain pass of {kw['ids'].shape[1]} differs"
            assert a.get_seq_length() == b.get_seq_length()
        past = a.get_seq_length()
        tree = random_tree(7, V, g, torch.device("cpu"))
        mask = pass_mask(tree, past, additive=target.dtype if eager else None)
        pos = (tree.positions() + past)[None]
        padded = padded_pass(model, tree.tokens[None], a, rows, mask=mask, positions=pos)
        plain = model(input_ids=tree.tokens[None], position_ids=pos, attention_mask=mask, past_key_values=b,
                      use_cache=True).logits
        assert torch.equal(padded, plain), f"{arch} {dtype}: the tree pass differs"
        for la, lb in zip(a.layers, b.layers):
            assert torch.equal(la.keys, lb.keys) and torch.equal(la.values, lb.values)


def test_without_a_row_multiple_the_pass_is_the_models_own(tiny_llama_target):
    model = tiny_llama_target.model
    cache, theirs = decoding_cache(model), decoding_cache(model)
    ids = torch.tensor([prompt_of(6)])
    with torch.inference_mode():
        out = padded_pass(model, ids, cache, 1)
        ref = model(input_ids=ids, past_key_values=theirs, use_cache=True).logits
    assert torch.equal(out, ref) and cache.get_seq_length() == 6


def test_a_filler_row_sees_the_prefix_and_itself_and_no_real_row_sees_a_filler():
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])[None, None]  # P = 2, T = 2
    grown = _padded_mask(mask, 2)[0, 0]
    assert grown.shape == (4, 6)
    assert torch.equal(grown[:2, :4], mask[0, 0]) and not grown[:2, 4:].any()
    assert torch.equal(grown[2:], torch.tensor([[True, True, False, False, True, False],
                                                [True, True, False, False, False, True]]))
    additive = torch.zeros(1, 1, 2, 4).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.equal(_padded_mask(additive, 2)[0, 0] == 0, grown)


def test_a_cache_that_cannot_drop_fillers_gets_none(tiny_target):
    """transformers' sliding-window layers refuse a crop once the window is full: passes into them pad per product."""
    from transformers import DynamicCache

    target = load_target(tiny_target("mistral", sliding_window=16), device="cpu", dtype="float32")
    pad_linear_rows(target.model, 4)
    assert pass_rows(target.model, DynamicCache(config=target.model.config)) == 1
    assert pass_rows(target.model, decoding_cache(target.model)) == 1  # its layers stay transformers' own
