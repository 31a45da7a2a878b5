"""The compiled row-invariant product (`target.rowdot`, `--linear rowdot`).

Every row of a product is bitwise the row a one-row product gives, for every row count and at every
place among the rows, with and without bias, for widths that do and do not fill its 32-wide steps; the
values are nn.Linear's to float rounding; a bf16 weight gives bitwise the float32 product over its widened
values, and a served draft stored in bf16 reads its weights so (also beside a bf16 target off AMX, losslessly); a model swapped to it gives nn.Linear's logits to rounding and
runs F.linear under autograd, in the stock baseline and for prefills; and where it cannot run, asking for it is
refused with the reason.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import OracleProposer, prompt_of, random_tiny_draft
from specwire.draft.checkpoint import load_draft, save_draft
from specwire.errors import SpecwireError
from specwire.target import amx as amx_mod
from specwire.target import bf16dot as bf16dot_mod
from specwire.target import attention
from specwire.target import rowdot as rowdot_mod
from specwire.target.fastlinear import RowDotLinear, linear_kind
from specwire.target.invariance import rows_needed, stock_kernels
from specwire.target.load import load_target
from specwire.target.rowdot import rowdot


@pytest.mark.parametrize("n,k,bias", [(96, 64, False), (37, 100, True), (5, 7, True), (300, 576, False)])
def test_rows_are_bitwise_independent_of_the_rows_beside_them(n, k, bias):
    g = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(17, k, generator=g) * 3
    single = [rowdot(x[i:i + 1], w, b)[0] for i in range(17)]
    for m in range(1, 18):
        y = rowdot(x[:m], w, b)
        assert all(torch.equal(y[i], single[i]) for i in range(m)), f"M={m}"
    y = rowdot(x[3:11], w, b)  # a row keeps its result wherever it sits
    assert all(torch.equal(y[i], single[3 + i]) for i in range(8))
    torch.testing.assert_close(rowdot(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("n,k,bias", [(96, 64, False), (37, 100, True), (5, 7, True), (300, 576, False)])
def test_a_bf16_weight_gives_bitwise_the_float32_product_over_its_widened_values(n, k, bias):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g).bfloat16()
    b = torch.randn(n, generator=g) if bias else None
    x = torch.randn(17, k, generator=g)
    for m in (1, 2, 5, 17):
        assert torch.equal(rowdot(x[:m], w, b), rowdot(x[:m], w.float(), b)), f"M={m}"


def test_threads_do_not_change_a_row():
    g = torch.Generator().manual_seed(0)
    w, x = torch.randn(257, 96, generator=g), torch.randn(5, 96, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rowdot(x, w)
        torch.set_num_threads(2)
        two = rowdot(x, w)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_batched_and_strided_inputs_keep_their_shape():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(24, 40, generator=g)
    x = torch.randn(2, 3, 80, generator=g)[..., ::2]  # a strided view, [2, 3, 40]
    y = rowdot(x, w)
    assert y.shape == (2, 3, 24)
    torch.testing.assert_close(y, x @ w.T, rtol=1e-5, atol=1e-5)
    assert rowdot(torch.empty(0, 40), w).shape == (0, 24)
    with pytest.raises(SpecwireError, match="expected inputs of width 40, found 39"):
        rowdot(torch.randn(2, 39), w)
    with pytest.raises(SpecwireError, match="expected float32"):
        rowdot(x.bfloat16(), w)


def test_a_rowdot_model_matches_nn_linear_and_needs_no_padding(tiny_target):
    path = tiny_target("llama")
    ref = load_target(path, device="cpu", dtype="float32", attention="sdpa")
    fast = load_target(path, device="cpu", dtype="float32", linear="rowdot")
    assert linear_kind(fast.model) == "rowdot" and linear_kind(ref.model) == "torch"
    assert rows_needed(fast.model) == {k: 1 for k in rows_needed(fast.model)}
    assert all(k.startswith("rowdot:") for k in rows_needed(fast.model))
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        a, b = ref.model(input_ids=ids).logits, fast.model(input_ids=ids).logits
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        layer = next(m for m in fast.model.modules() if isinstance(m, RowDotLinear))
        x = torch.randn(3, layer.in_features)
        with stock_kernels(fast.model):  # the hf-generate baseline runs F.linear
            assert layer.stock and torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
        assert not layer.stock
    from specwire.target.attention import MAX_INVARIANT_QUERIES

    x = torch.randn(MAX_INVARIANT_QUERIES + 1, layer.in_features)  # a prefill: outside the contract, the BLAS
    assert torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
    assert torch.equal(layer(x[:MAX_INVARIANT_QUERIES]), rowdot(x[:MAX_INVARIANT_QUERIES], layer.weight, layer.bias))
    x = torch.randn(2, layer.in_features, requires_grad=True)
    layer(x).sum().backward()  # autograd: F.linear's backward
    assert x.grad is not None


def test_refused_with_the_reason_where_it_cannot_run(tiny_target, monkeypatch):
    path = tiny_target("llama")
    with pytest.raises(SpecwireError, match="float32 and bf16 CPU kernel; found dtype float16"):
        load_target(path, device="cpu", dtype="float16", linear="rowdot")
    monkeypatch.setattr(rowdot_mod, "compiler", lambda: None)
    rowdot_mod._library.cache_clear()
    amx_mod._library.cache_clear()  # (they build with the same compiler)
    bf16dot_mod._library.cache_clear()
    try:
        assert rowdot_mod.available() == (False, "no C compiler was found (set CC, or install gcc)")
        with pytest.raises(SpecwireError, match="cannot run here: no C compiler was found"):
            load_target(path, device="cpu", dtype="float32", linear="rowdot")
        from specwire.decode.kernels import candidate_kernels
        assert all(k.linear != "rowdot" for k in candidate_kernels("cpu"))
        plain = load_target(path, device="cpu", dtype="float32")  # the attention falls back to its torch form
        spy = []
        monkeypatch.setattr(attention, "compiled_attention", lambda *a, **kw: spy.append(1))
        with torch.no_grad():
            logits = plain.model(input_ids=torch.tensor([[1, 5, 9, 2]])).logits
        assert not spy and torch.isfinite(logits).all()
    finally:
        monkeypatch.undo()
        rowdot_mod._library.cache_clear()
        amx_mod._library.cache_clear()  # a kernel found missing under the patch must be looked for again
        bf16dot_mod._library.cache_clear()
    assert rowdot_mod.available()[0]


def test_the_engine_draft_takes_the_targets_kernel(tiny_target, tmp_path):
    """With a rowdot target the served draft's products run rowdot too (speed); its exact form's logits stay
    nn.Linear's. Where the CPU has AVX512-BF16 the default form reads the nearest q8_0 codes instead (lossy for the
    draft only), and says so."""
    from specwire.decode.draft_step import draft_products
    from specwire.decode.engine import load_engine_draft

    path = tiny_target("llama")
    fast = load_target(path, device="cpu", dtype="float32", linear="rowdot")
    ref = load_target(path, device="cpu", dtype="float32")
    ckpt = random_tiny_draft(ref, tmp_path / "d")
    a, b = load_engine_draft(ckpt, ref), load_engine_draft(ckpt, fast, weights="exact")
    assert linear_kind(a) == "torch" and linear_kind(b) == "rowdot"
    q8 = bf16dot_mod.available()[0]
    default = load_engine_draft(ckpt, fast)
    assert draft_products(default) == ("q8_0 weights, int16 inputs" if q8 else "rowdot, float32")
    assert draft_products(b) == "rowdot, float32"
    with pytest.raises(SpecwireError, match="draft weights: expected one of q8_0, exact, found 'int4'"):
        load_engine_draft(ckpt, fast, weights="int4")
    h = torch.randn(1, 3, a.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(b.lm_head(h), a.lm_head(h), rtol=1e-5, atol=1e-5)
    # exactly, float32 weights that are not bf16 numbers are read as they are; a draft stored in bf16 is read as
    # bf16: where the CPU has AVX512-BF16, through the three-part bf16 products (float32 products as exact, summed
    # in another fixed order), elsewhere through rowdot, with bitwise the products of its float32 form
    assert all(m.compact is None and m.split3 is None for m in b.modules() if isinstance(m, RowDotLinear))
    stored = save_draft(load_draft(ckpt), tmp_path / "d16", dtype=torch.bfloat16)
    c = load_engine_draft(stored, fast, weights="exact")
    layers = [m for m in c.modules() if isinstance(m, RowDotLinear)]
    assert layers and all(m.compact is not None and m.compact.form == "bf16" for m in layers)
    split3 = bf16dot_mod.available()[0]
    assert all((m.split3 is not None) == split3 for m in layers)
    with torch.no_grad():
        for m in layers:
            x = torch.randn(3, m.in_features)
            exact = rowdot(x, m.weight, m.bias)
            if split3:
                assert torch.equal(m(x), bf16dot_mod.split3dot(x, m.weight.detach().bfloat16(), m.bias))
                torch.testing.assert_close(m(x), exact, rtol=1e-5, atol=1e-5)
            else:
                assert torch.equal(m(x), exact)



@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_a_bf16_target_off_amx_serves_a_rowdot_draft_and_stays_lossless(tiny_target, tmp_path, tree):
    """A bf16 target on nn.Linear (oneDNN or pre-transposed alike) serves its draft on rowdot: float32
    arithmetic over the draft's bf16 weights, read as bf16, or on AVX512-BF16 the bf16 kernel over their nearest
    q8_0 codes (speed only: the draft needs no invariance). Its inputs come from the bf16 target and its proposals
    are token ids: decoding stays the target's greedy."""
    from specwire.decode.draft_step import draft_kernel
    from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
    from specwire.decode.plain import plain_generate

    path = tiny_target("llama")
    target = load_target(path, device="cpu", dtype="bfloat16")
    stored = save_draft(load_draft(random_tiny_draft(load_target(path, device="cpu", dtype="float32"), tmp_path / "d")),
                        tmp_path / "d16", dtype=torch.bfloat16)
    draft = load_engine_draft(stored, target)
    assert draft_kernel(target) == "rowdot" and linear_kind(draft) == "rowdot"
    assert draft.fc.weight.dtype == torch.float32 and draft.served is not None
    layers = [m for m in draft.modules() if isinstance(m, RowDotLinear)]
    assert all(m.compact is not None and m.compact.form == "bf16" for m in layers)
    assert all((m.q8 is not None) == bf16dot_mod.available()[0] for m in layers)  # on AVX512-BF16: q8_0 codes
    fp32 = load_target(path, device="cpu", dtype="float32")
    assert draft_kernel(fp32) == "torch"  # a float32 target on nn.Linear keeps the reference module draft
    for n_prompt in (3, 40):
        prompt = prompt_of(n_prompt, seed=n_prompt)
        ref = plain_generate(target, prompt, max_new_tokens=24, stop_on_eos=False).output_ids
        got = speculative_generate(target, draft, prompt, max_new_tokens=24, tree=tree, stop_on_eos=False,
                                   spec=SpecConfig(budget="fixed"))
        assert got.output_ids == ref
        oracle = OracleProposer(prompt, ref, target.spec.vocab_size)  # multi-token verify passes in bf16
        res = speculative_generate(target, oracle, prompt, max_new_tokens=24, tree=tree, stop_on_eos=False,
                                   spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref and res.extra["accept_length"] > 2

def _builds_here() -> list[str]:
    return [b for b in rowdot_mod.ISA_FLAGS if rowdot_mod._cpu_ok(b) is None]


def test_the_default_build_is_the_widest_this_cpu_runs_and_can_be_named(monkeypatch):
    builds = _builds_here()
    assert builds[0] == "avx2" and rowdot_mod.isa() == builds[-1]
    monkeypatch.setenv(rowdot_mod.ISA_ENV, "avx2")
    assert rowdot_mod.isa() == "avx2" and rowdot_mod.source_digest() == rowdot_mod.source_digest("avx2")
    monkeypatch.setenv(rowdot_mod.ISA_ENV, "sse9")
    with pytest.raises(SpecwireError, match=r"SPECWIRE_ROWDOT_ISA: expected one of avx2, avx512, found 'sse9'"):
        rowdot_mod.isa()
    assert rowdot_mod.source_digest("avx2") != rowdot_mod.source_digest("avx512")  # cost caches never mix builds


@pytest.mark.parametrize("form", ["float32", "bf16", "q4_1", "q8_0"])
def test_every_build_this_cpu_runs_gives_bitwise_the_avx2_builds_products(form):
    """The AVX-512 build holds two outputs' chains in one register: the same operations in the same order, so
    the same bits, for every row count (its one-row, few-row and decoded-strip paths), odd column counts (the
    leftover column takes the AVX2 tile) and widths with a tail. Every build's rows are also each bitwise its
    one-row product, so on a CPU without AVX-512 (only avx2 runs there) the paths are still checked."""
    from helpers import gguf_dequantized
    from specwire.target.compact import pack

    builds = _builds_here()
    g = torch.Generator().manual_seed(7)
    for n, k in [(1, 32), (7, 64), (17, 96), (67, 160), (300, 576)] + ([(13, 100), (5, 7)] if form in ("float32", "bf16") else []):
        w = torch.randn(n, k, generator=g) * 0.05
        weight = w if form == "float32" else w.bfloat16() if form == "bf16" else pack(gguf_dequantized(w, form),
                                                                                      forms=(form,))
        assert weight is not None and (form == "float32" or form == "bf16" or weight.form == form)
        x, b = torch.randn(17, k, generator=g), torch.randn(n, generator=g)
        for bias in (None, b):
            single = torch.cat([rowdot(x[i:i + 1], weight, bias, build="avx2") for i in range(17)])
            for m in range(1, 18):
                ref = rowdot(x[:m], weight, bias, build="avx2")
                assert torch.equal(ref, single[:m]), f"avx2: {n}x{k}, M={m}: a row depends on the rows beside it"
                for build in builds:
                    assert torch.equal(rowdot(x[:m], weight, bias, build=build), ref), f"{build}: {n}x{k}, M={m}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_compiled_argmax_is_torch_argmax(dtype):
    """The greedy pick (`argmax_rows`, behind `decode.sampling.greedy_token`): the first index of the maximum, on
    ties, signed zeros, infinities, short rows and strided views; a row with a NaN is left to torch (None)."""
    from specwire.decode.sampling import greedy_token
    from specwire.target.rowdot import argmax_rows

    g = torch.Generator().manual_seed(0)
    for rows, V in ((1, 7), (2, 8), (9, 49152), (17, 8195)):
        x = (torch.randn(rows, V, generator=g) * 2).round().to(dtype)  # many ties
        assert torch.equal(argmax_rows(x), x.argmax(-1))
        assert torch.equal(argmax_rows(x.t().contiguous().t()), x.argmax(-1))  # a strided view
        x[0] = 0.0
        x[0, min(3, V - 1)] = -0.0  # +0 and -0 are equal: the first wins
        x[-1, V // 2] = float("inf")
        assert torch.equal(argmax_rows(x), x.argmax(-1))
        x[-1, V - 1] = float("nan")
        assert argmax_rows(x) is None
        assert torch.equal(greedy_token(x), x.argmax(-1))  # NaN wins, as in torch
    assert torch.equal(argmax_rows(torch.zeros(2, 3, 5, dtype=dtype)), torch.zeros(2, 3, dtype=torch.long))
    assert argmax_rows(torch.zeros(4, 5, dtype=torch.float16)) is None
