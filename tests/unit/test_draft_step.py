"""The served draft's step: packed products, the lean pass, the rope table and the fused norm change no numbers.

`load_engine_draft` gives a served draft its decoding pass (`decode.draft_step.ServedStep`: q|k|v and gate|up
packed into one product each, no module calls), the proposer slices rope from a table, a float32 RMSNorm runs
torch's fused op, and beside rowdot the compiled norm in both passes: each is there only to make a draft step cheaper (issue 16: a draft step at most 0.04 of a
target step), so each must leave the proposals as they were. With rowdot, whose rows are independent of the
rows beside them, that is bitwise, over the draft's exact weights and over the q8_0 codes it reads by default alike.
`tools/draft_precision.py`, which measures what those codes do to acceptance, and `tools/draft_step_cost.py`, which
times the steps, run end to end here too.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

from helpers import load_tool, random_tiny_draft
from specwire.decode.draft_step import ServedStep, draft_products
from specwire.decode.engine import SpecConfig, load_engine_draft
from specwire.decode.proposer import EagleProposer, causal_prefix_mask
from specwire.decode.sampling import SamplingParams
from specwire.draft.checkpoint import load_draft, save_draft
from specwire.draft.model import Eagle3Draft, RMSNorm
from specwire.target import bf16dot
from specwire.target.fastlinear import RowDotLinear, concat_linears, rowdot_linears
from specwire.target.load import load_target
from specwire.target.rownorm import RowRMSNorm


def through_modules(draft: Eagle3Draft) -> Eagle3Draft:
    draft.served = None  # the proposer then runs Eagle3Draft.step, the definition
    return draft


def proposals(draft: Eagle3Draft, *, tree: bool, seed: int = 0) -> list[torch.Tensor]:
    """The trees a proposer makes over three feeds (a prompt, then two short accepted runs)."""
    c = draft.config
    g = torch.Generator().manual_seed(seed)
    states = torch.randn(30, c.fc_in_features, generator=g)
    tokens = torch.randint(0, c.vocab_size, (30,), generator=g)
    spec = SpecConfig(num_steps=4, topk=3 if tree else 1, num_draft_tokens=8 if tree else 4)
    proposer = EagleProposer(draft, capacity=4)  # small: the cache and the rope table grow on the way
    out = []
    for start, n in ((0, 20), (20, 3), (23, 7)):
        t = proposer.propose(states[start:start + n], tokens[start:start + n], start, steps=4, spec=spec, tree=tree,
                             params=SamplingParams(), generator=None)
        out.append(t.tokens)
    return out


@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("linear", ["rowdot", "torch"])
def test_the_served_pass_proposes_what_the_modules_do(tiny_target, tmp_path, linear, tree):
    target = load_target(tiny_target("llama"), device="cpu", dtype="float32", linear=linear)
    ckpt = random_tiny_draft(target, tmp_path / "d", draft_vocab_size=64)
    served = load_engine_draft(ckpt, target)
    assert served.served is not None
    with torch.no_grad():
        a, b = proposals(served, tree=tree), proposals(through_modules(load_engine_draft(ckpt, target)), tree=tree)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


@pytest.mark.parametrize("linear, dtype, stored, weights", [
    ("rowdot", "float32", "float32", "exact"), ("rowdot", "float32", "bfloat16", "exact"),
    ("rowdot", "float32", "bfloat16", "q8_0"), ("torch", "float32", "float32", "q8_0"),
    ("torch", "bfloat16", "float32", "q8_0")])
def test_the_served_pass_is_bitwise_the_modules_pass(tiny_target, tmp_path, linear, dtype, stored, weights):
    """Prompt rows under a causal mask, one chain row, tree rows under an ancestry mask: logits and hidden. Beside a
    rowdot target, where the CPU has AVX512-BF16, a draft runs the bf16 kernel over the q8_0 codes nearest its
    weights by default, and exactly (stored in bf16) the three-part bf16 products (`bf16dot.split3dot`); the rows of
    both are independent of the rows beside them, and their packed products are bitwise the separate ones."""
    target = load_target(tiny_target("llama"), device="cpu", dtype=dtype, linear=linear)
    ckpt = random_tiny_draft(target, tmp_path / "d", draft_vocab_size=64)
    if stored == "bfloat16":
        ckpt = save_draft(load_draft(ckpt), tmp_path / "d16", dtype=torch.bfloat16)
    draft = load_engine_draft(ckpt, target, weights=weights)
    layers = [m for m in draft.modules() if isinstance(m, RowDotLinear)]
    runs = bf16dot.available()[0]
    if linear == "rowdot" and weights == "q8_0":
        assert layers and all((m.q8 is not None) == runs for m in layers)
        assert draft_products(draft) == ("q8_0 weights, int16 inputs" if runs else "rowdot, bf16 weights")
    elif stored == "bfloat16":
        assert layers and all((m.split3 is not None) == runs for m in layers)
        assert draft_products(draft) == ("three-part bf16" if runs else "rowdot, bf16 weights")
    elif linear == "rowdot":  # float32 weights that are not bf16 numbers, exactly: rowdot over them as they are
        assert draft_products(draft) == "rowdot, float32"
    if linear == "rowdot":  # beside rowdot its norms run the compiled kernel, in both passes alike
        assert isinstance(draft.layers[0].input_layernorm, RowRMSNorm) and isinstance(draft.norm, RowRMSNorm)
    c = draft.config
    served = EagleProposer(draft, capacity=4)
    modules = EagleProposer(through_modules(load_engine_draft(ckpt, target, weights=weights)), capacity=4)
    g = torch.Generator().manual_seed(3)
    tree_mask = torch.cat([torch.ones(3, 10, dtype=torch.bool), torch.eye(3, dtype=torch.bool)], 1)[None, None]
    w = draft.fc.weight
    feeds = [(draft.fuse(torch.randn(1, 9, c.fc_in_features, generator=g).to(w.dtype)), (0, 9, False),
              causal_prefix_mask(9, 0, "cpu"), True),
             (torch.randn(1, 1, c.hidden_size, generator=g).to(w.dtype), (8, 1, False), None, True),
             (torch.randn(1, 3, c.hidden_size, generator=g).to(w.dtype), (8, 3, True), tree_mask, False)]
    with torch.no_grad():
        for hidden, (first, count, repeat), mask, last_only in feeds:
            ids = torch.randint(0, c.vocab_size, (1, hidden.shape[1]), generator=g)
            outs = [p._step(hidden, ids, p._rope(first, count, repeat=repeat), mask, last_only=last_only)
                    for p in (served, modules)]
            assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
            assert served.cache.length == modules.cache.length
            assert torch.equal(served.cache.k[:, :, :served.cache.length], modules.cache.k[:, :, :modules.cache.length])
            assert torch.equal(served.cache.v[:, :, :served.cache.length], modules.cache.v[:, :, :modules.cache.length])


def test_packed_rowdot_products_are_bitwise_the_separate_ones_with_and_without_bias():
    torch.manual_seed(0)
    for bias in (False, True):
        layers = [nn.Linear(40, n, bias=bias) for n in (24, 8, 8)]
        rowdot_linears(container := nn.ModuleList(layers))
        separate = list(container)
        packed = concat_linears(separate)
        assert isinstance(packed, RowDotLinear)
        with torch.no_grad():
            for rows in (1, 3, 5):
                x = torch.randn(rows, 40)
                assert torch.equal(packed(x), torch.cat([m(x) for m in separate], dim=-1))


def test_packing_takes_bf16_copies_only_where_every_part_has_one():
    parts = [nn.Linear(16, 8, bias=False) for _ in range(2)]
    with torch.no_grad():
        for m in parts:
            m.weight.copy_(m.weight.to(torch.bfloat16).float())  # bf16 numbers
    both = concat_linears([RowDotLinear(m, forms=("bf16",)) for m in parts])
    assert both.compact is not None and both.compact.form == "bf16"
    one = concat_linears([RowDotLinear(parts[0], forms=("bf16",)), RowDotLinear(parts[1])])
    assert one.compact is None


def test_products_of_other_kinds_or_mixed_kinds_are_not_packed():
    a, b = nn.Linear(8, 4), nn.Linear(8, 4, bias=False)
    assert concat_linears([a, b]) is None  # biased and unbiased
    assert concat_linears([a, RowDotLinear(nn.Linear(8, 4))]) is None  # two kinds
    assert concat_linears([nn.Conv1d(8, 4, 1)]) is None


def test_a_biased_draft_layer_packs_its_biases(tiny_target, tmp_path):

    target = load_target(tiny_target("llama"), device="cpu", dtype="float32", linear="rowdot")
    base = load_draft(random_tiny_draft(target, tmp_path / "d", draft_vocab_size=64))
    torch.manual_seed(1)
    draft = Eagle3Draft(dataclasses.replace(base.config, attention_bias=True)).attach_embeddings(target.parts.embed)
    rowdot_linears(draft)
    attn = draft.layers[0].self_attn
    assert concat_linears([attn.q_proj, attn.k_proj, attn.v_proj]).bias is not None
    with torch.no_grad():  # as decoding runs: rowdot serves only without autograd
        ref = proposals(draft, tree=True)  # through the modules
        draft.served = ServedStep.build(draft)
        assert draft.served is not None
        for x, y in zip(proposals(draft, tree=True), ref):
            assert torch.equal(x, y)


def test_the_rope_table_gives_the_drafts_own_rope_as_it_grows(tiny_target, tmp_path):
    target = load_target(tiny_target("llama"), device="cpu", dtype="float32")
    draft = load_engine_draft(random_tiny_draft(target, tmp_path / "d", draft_vocab_size=64), target)
    proposer = EagleProposer(draft, capacity=4)
    like = proposer.cache.k
    for first, count, repeat in ((0, 3, False), (2, 9, False), (40, 5, True), (100, 1, False), (7, 4, True)):
        cos, sin = proposer._rope(first, count, repeat=repeat)
        positions = torch.full((1, count), first) if repeat else torch.arange(first, first + count)[None]
        want_cos, want_sin = draft.rope(positions, like)
        assert cos.shape == (1, count, draft.config.head_dim)
        assert torch.equal(cos, want_cos) and torch.equal(sin, want_sin)


def test_the_float32_norm_is_bitwise_the_formula_and_bf16_keeps_the_formula():
    torch.manual_seed(0)
    norm = RMSNorm(96, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96))

    def formula(x):
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + norm.eps)
        return norm.weight.to(x.dtype) * y.to(x.dtype)

    for shape in ((1, 1, 96), (2, 7, 96), (5, 96)):
        x = torch.randn(shape) * 4
        with torch.no_grad():
            assert torch.equal(norm(x), formula(x))
    x = torch.randn(3, 96)
    loss = norm(x.requires_grad_()).square().sum()
    loss.backward()  # the fused op trains too
    assert x.grad is not None and norm.weight.grad is not None
    half = RMSNorm(96, 1e-5).to(torch.bfloat16)
    xb = torch.randn(4, 96).to(torch.bfloat16)
    with torch.no_grad():
        y = xb.float()
        want = half.weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + half.eps)).to(torch.bfloat16)
        assert torch.equal(half(xb), want)


def _stored_in_bf16(target_path, tmp_path):
    """A random tiny draft for the target at `target_path`, saved in bf16 as the shipped one is."""
    ckpt = random_tiny_draft(load_target(target_path, device="cpu", dtype="float32"), tmp_path / "d",
                             draft_vocab_size=64)
    return save_draft(load_draft(ckpt), tmp_path / "d16", dtype=torch.bfloat16)


def test_the_draft_precision_tool_compares_the_served_draft_with_the_exact_one(tiny_target, tmp_path, monkeypatch):
    """tools/draft_precision.py (the acceptance table in docs/BENCHMARKS.md) runs end to end on a tiny target: every
    form of the draft decodes every prompt exactly as plain greedy decoding does, and the served form is named as
    the engine serves it."""
    import json
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "tools"))  # it imports draft_step_cost
    mod = load_tool("draft_precision")
    path = tiny_target("llama")
    stored = _stored_in_bf16(path, tmp_path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("say hello", "count to five", "why?")))
    assert mod.main(["--target", str(path), "--draft", str(stored), "--prompts", str(prompts), "--max-new-tokens",
                     "12", "--num-steps", "3", "--threads", "1", "--dtype", "float32", "--linear", "rowdot",
                     "--out", str(tmp_path / "out")]) == 0
    forms = json.loads((tmp_path / "out" / "results.json").read_text())["forms"]
    served = "q8_0 weights, int16 inputs" if bf16dot.available()[0] else "rowdot, bf16 weights"
    assert list(forms) == [f"served ({served})", f"exact ({'three-part bf16' if bf16dot.available()[0] else served})",
                           "bf16 throughout (torch, bfloat16, lean pass)"]
    for form in forms.values():
        assert form["identical"] == form["prompts"] == 3
        assert form["tokens_per_pass"] >= 1 and len(form["accept_per_position"]) == 3
    assert "| draft | tokens per verify pass |" in (tmp_path / "out" / "results.md").read_text()


def test_the_draft_step_cost_tool_times_each_step_after_a_target_pass(tiny_target, tmp_path):
    """tools/draft_step_cost.py (the draft-step tables in docs/BENCHMARKS.md) runs end to end on a tiny target: every
    form it can serve is timed warm at each width, and the served one in the loop, for k steps and each step alone."""
    import json

    mod = load_tool("draft_step_cost")
    path = tiny_target("llama")
    stored = _stored_in_bf16(path, tmp_path)
    assert mod.main(["--target", str(path), "--draft", str(stored), "--threads", "1", "--dtype", "float32",
                     "--linear", "rowdot", "--context", "16", "--rounds", "1", "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "results.json").read_text())
    served = [name for name in got["draft_ms"] if name.endswith("(served)")]
    assert len(served) == 1 and served[0] in got["in_loop_ms"]
    for name, by_k in got["in_loop_ms"].items():
        alone = got["in_loop_step_ms"][name]
        assert sorted(by_k, key=int) == sorted(alone, key=int) == [str(k) for k in mod.CHAIN_STEPS]
        assert all(ms > 0 for ms in alone.values())
    assert "the k-th step alone" in (tmp_path / "out" / "results.md").read_text()
