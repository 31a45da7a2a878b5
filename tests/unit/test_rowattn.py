"""The compiled row-invariant attention (`rowattn.c`, `attention.compiled_attention`).

Its values are sdpa's to float rounding, for grouped-query heads and head sizes that do and do not fill
its 8-wide steps; every row of a pass, chain or tree-masked, is bitwise the row that attending with that
row's visible keys alone gives (a one-token step on its path), whatever the rows beside it, the hidden
keys between its keys, or the thread count; bf16 inputs are computed in fp32; and the model's attention
goes through it on this machine.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specwire.target.attention import ATTENTION_NAME, compiled_attention, kernels_available
from specwire.target.load import load_target


def _qkv(g, tq, tk, dk, dv=None, heads=6, kv_heads=2):
    q = torch.randn(1, tq, heads, dk, generator=g).transpose(1, 2) * 2  # a strided view, as transformers gives
    k = torch.randn(1, kv_heads, tk, dk, generator=g) * 2
    v = torch.randn(1, kv_heads, tk, dv or dk, generator=g)
    return q, k, v


def _sdpa(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    out = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), attn_mask=mask)
    return out.transpose(1, 2)


@pytest.mark.parametrize("tq,tk,dk,dv", [(1, 301, 64, 64), (16, 316, 64, 64), (5, 5, 12, 12), (7, 40, 20, 9),
                                         (3, 130, 128, 72)])
def test_values_are_sdpa_to_rounding(tq, tk, dk, dv):
    g = torch.Generator().manual_seed(tq * tk)
    q, k, v = _qkv(g, tq, tk, dk, dv)
    causal = torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq)
    torch.testing.assert_close(compiled_attention(q, k, v, None), _sdpa(q, k, v, causal), rtol=1e-5, atol=1e-5)
    tree = torch.rand(tq, tq, generator=g) < 0.5  # any mask over this pass's own keys
    tree |= torch.eye(tq, dtype=torch.bool)
    mask = torch.cat([torch.ones(tq, tk - tq, dtype=torch.bool), tree], dim=1)
    torch.testing.assert_close(compiled_attention(q, k, v, tree.to(torch.uint8)), _sdpa(q, k, v, mask),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dk", [64, 20])
def test_every_row_is_bitwise_its_keys_alone(dk):
    """Row i of a tree-masked pass of 17 rows = a one-row pass over the prefix and row i's visible keys only."""
    g = torch.Generator().manual_seed(dk)
    tq, past = 17, 83
    q, k, v = _qkv(g, tq, past + tq, dk)
    tree = torch.rand(tq, tq, generator=g) < 0.4
    tree = (tree.tril(-1) | torch.eye(tq, dtype=torch.bool))
    out = compiled_attention(q, k, v, tree.to(torch.uint8))
    for i in range(tq):
        keys = torch.cat([torch.arange(past), past + tree[i].nonzero()[:, 0]])
        alone = compiled_attention(q[:, :, i:i + 1], k[:, :, keys], v[:, :, keys], None)
        assert torch.equal(out[0, i], alone[0, 0]), f"row {i}"
    for m in (1, 2, 6, 16):  # a chain pass of m rows: each row is its single step's
        chain = compiled_attention(q[:, :, :m], k[:, :, :past + m], v[:, :, :past + m], None)
        for i in range(m):
            step = compiled_attention(q[:, :, i:i + 1], k[:, :, :past + i + 1], v[:, :, :past + i + 1], None)
            assert torch.equal(chain[0, i], step[0, 0]), f"chain {m}, row {i}"


def test_threads_and_bf16():
    g = torch.Generator().manual_seed(3)
    q, k, v = _qkv(g, 9, 140, 64)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = compiled_attention(q, k, v, None)
        torch.set_num_threads(2)
        two = compiled_attention(q, k, v, None)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    out = compiled_attention(qb, kb, vb, None)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, compiled_attention(qb.float(), kb.float(), vb.float(), None).bfloat16())


@pytest.mark.parametrize("dk,dv", [(64, 64), (128, 128), (40, 40), (64, 72)])
def test_every_build_this_cpu_runs_gives_bitwise_the_avx2_builds_attention(dk, dv):
    """Every build of the kernels this CPU runs (the AVX-512 build compiles the attention with wider flags) gives
    bitwise the AVX2 build's attention: odd and even visible-key counts, tree masks, head sizes with a tail
    and value sizes that do not fill 64 lanes, from float32 and from bf16 caches (read as bf16, widened as
    they are loaded)."""
    from specwire.target import rowdot

    builds = [b for b in rowdot.ISA_FLAGS if rowdot._cpu_ok(b) is None]
    g = torch.Generator().manual_seed(dk + dv)
    for tq, tk in [(1, 1), (1, 2), (1, 131), (5, 70), (17, 200)]:
        q, k, v = _qkv(g, tq, tk, dk, dv)
        tail = (torch.rand(tq, tq, generator=g) < 0.5).to(torch.uint8).tril()
        tail.fill_diagonal_(1)
        for mask in (None, tail):
            for cast in (lambda t: t, lambda t: t.bfloat16()):
                ref = compiled_attention(cast(q), cast(k), cast(v), mask, build="avx2")
                for build in builds:
                    out = compiled_attention(cast(q), cast(k), cast(v), mask, build=build)
                    assert torch.equal(out, ref), f"{build}: tq={tq} tk={tk} dk={dk} dv={dv}"


def test_the_model_runs_it_here(tiny_target, monkeypatch):
    """On this machine the compiled kernels build, so the invariant attention takes the compiled path."""
    import specwire.target.attention as attention

    assert kernels_available()
    target = load_target(tiny_target("llama"), device="cpu", dtype="float32")
    assert target.model.config._attn_implementation == ATTENTION_NAME
    calls = []
    real = attention.compiled_attention
    monkeypatch.setattr(attention, "compiled_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        target.model(input_ids=torch.tensor([[1, 5, 9, 2]]))
    assert calls, "the invariant attention did not call the compiled kernel"
