"""Swapped linear layers (pre-transposed, oneDNN-packed, rowdot, rowdot over GGUF-like compact weights): the same
maths as nn.Linear, and lossless decoding on a swapped target. (The AMX kernel: `test_amx`.)"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
from specwire.errors import SpecwireError
from specwire.target.fastlinear import (PretransposedLinear, RowDotLinear, is_pretransposed, linear_kind,
                                        pretranspose_linears)
from specwire.decode.plain import plain_generate
from specwire.target.load import load_target

from helpers import (OracleProposer, make_draft_dir, make_gguf_like_target_dir, make_tiny_model, make_tiny_target_dir,
                     prompt_of)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 6, 16])
def test_module_computes_what_nn_linear_computes(bias, rows):
    torch.manual_seed(rows)
    lin = nn.Linear(48, 80, bias=bias)
    pt = PretransposedLinear(lin)
    assert pt.weight_t.shape == (48, 80) and pt.weight_t.is_contiguous()
    assert torch.equal(pt.weight, lin.weight)  # the [out, in] view code written for nn.Linear reads
    for shape in [(rows, 48), (2, rows, 48)]:
        x = torch.randn(shape)
        torch.testing.assert_close(pt(x), lin(x), rtol=1e-5, atol=1e-5)
    assert not any(p.requires_grad for p in pt.parameters())


def test_swap_covers_every_linear_keeps_embeddings_and_logits():
    model = make_tiny_model("llama").eval()
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    x = torch.randint(0, 256, (2, 11))
    with torch.no_grad():
        before = model(x).logits
        emb = model.get_input_embeddings().weight.clone()
        assert pretranspose_linears(model, skip=("lm_head",)) == n_linear - 1
        assert isinstance(model.lm_head, nn.Linear) and is_pretransposed(model)
        assert pretranspose_linears(model) == 1  # then the head too
        assert not any(isinstance(m, nn.Linear) for m in model.modules())
        torch.testing.assert_close(model(x).logits, before, rtol=1e-5, atol=1e-5)
        assert torch.equal(model.get_input_embeddings().weight, emb)


@pytest.fixture(scope="module", params=["pretransposed", "onednn", "rowdot", "rowdot-gguf"])
def swapped(tmp_path_factory, request):
    """(plain, swapped, scratch folder). rowdot-gguf: a target whose weights were dequantized from GGUF block
    codes, which the kernel reads in their compact forms (`target.compact`)."""
    gguf = request.param == "rowdot-gguf"
    folder = (make_gguf_like_target_dir if gguf else make_tiny_target_dir)(tmp_path_factory.mktemp("fl-target"))
    plain_t = load_target(folder, device="cpu")
    fast_t = load_target(folder, device="cpu", linear=request.param.removesuffix("-gguf"))
    compact = [m.compact is not None for m in fast_t.model.modules() if isinstance(m, RowDotLinear)]
    assert all(compact) if gguf else not any(compact)
    return plain_t, fast_t, tmp_path_factory.mktemp("fl-draft")


def test_swapped_target_keeps_its_identity_and_greedy_text(swapped):
    plain_t, fast_t, _ = swapped
    kind = linear_kind(fast_t.model)
    assert kind in ("pretransposed", "onednn", "rowdot") and linear_kind(plain_t.model) == "torch"
    assert is_pretransposed(fast_t.model) == (kind == "pretransposed")
    assert fast_t.spec == plain_t.spec  # same fingerprint: no weight changed
    assert fast_t.parts.lm_head is fast_t.model.lm_head
    prompt = prompt_of(40, seed=1)
    assert plain_generate(fast_t, prompt, max_new_tokens=24).output_ids == \
        plain_generate(plain_t, prompt, max_new_tokens=24).output_ids


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_speculation_on_a_swapped_target_is_lossless(swapped, tree):
    _, target, tmp = swapped
    draft = load_engine_draft(make_draft_dir(target, tmp / f"d-{tree}"), target)
    for n_prompt in (3, 60):
        prompt = prompt_of(n_prompt, seed=n_prompt)
        ref = plain_generate(target, prompt, max_new_tokens=40, stop_on_eos=False).output_ids
        assert speculative_generate(target, draft, prompt, max_new_tokens=40, tree=tree,
                                    stop_on_eos=False, spec=SpecConfig(budget="fixed")).output_ids == ref
        oracle = OracleProposer(prompt, ref, target.spec.vocab_size)  # multi-token verify passes
        res = speculative_generate(target, oracle, prompt, max_new_tokens=40, tree=tree, stop_on_eos=False, spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref and res.extra["accept_length"] > 2


def test_unknown_linear_kind_is_refused(tmp_path):
    with pytest.raises(SpecwireError, match="linear: expected one of torch, pretransposed, onednn, rowdot, amx, found 'packed'"):
        load_target(make_tiny_target_dir(tmp_path), device="cpu", linear="packed")


def test_hf_generate_and_prompt_lookup_run_on_a_swapped_target(swapped, tmp_path):
    """The bench shares one swapped target among all methods: HF's own loops must run on it, losslessly."""
    import json

    from specwire.bench.run import BenchConfig, run_bench

    _, target, _ = swapped
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "abc abc abc abc abc abc"}) + "\n")
    cfg = BenchConfig(target=str(target.info.path), draft=None, prompts=str(prompts), max_new_tokens=12,
                      methods=("hf-generate", "hf-prompt-lookup", "plain"), warmup_tokens=0, out_dir="", progress=False)
    rep = run_bench(cfg, target=target)
    assert [r.method for r in rep.results] == ["hf-generate", "hf-prompt-lookup", "plain"]
    assert all(r.lossless and r.tokens == 12 for r in rep.results), [(r.method, r.first_mismatch) for r in rep.results]


def test_verify_cost_script_writes_its_tables(swapped, tmp_path):
    """tools/verify_cost.py (the curve in docs/BENCHMARKS.md) runs end to end on a tiny target."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "tools" / "verify_cost.py"
    spec = importlib.util.spec_from_file_location("verify_cost", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    _, target, _ = swapped
    assert mod.main(["--target", str(target.info.path), "--threads", "1", "--context", "8", "--reps", "1",
                     "--out", str(tmp_path / "vc")]) == 0
    data = json.loads((tmp_path / "vc" / "results.json").read_text())
    assert {"float32/torch invariant", "float32/torch stock", "float32/pretransposed invariant"} <= set(data["curves"])
    assert all(len(c["ms"]) == 17 and min(c["ms"]) > 0 for c in data["curves"].values())
    assert all(c["invariant"] for name, c in data["curves"].items() if name.endswith("invariant"))
    md = (tmp_path / "vc" / "results.md").read_text()
    assert "| float32/torch invariant |" in md
    assert "**Speculation:** the defaults (`--dtype auto --linear auto`, for every command) chose **" in md
    for workload in ("Speculation without the lookup", "Plain"):  # how the others would rank, for the reader
        assert f"**{workload}:** the defaults do not choose by this; it would rank first **" in md
    assert set(data["ranking"]) == {"speculation", "speculation without the lookup", "plain"}
    assert (tmp_path / "vc" / "results.png").read_bytes()[:4] == b"\x89PNG"
