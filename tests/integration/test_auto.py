"""`--budget auto` in the engine: lossless, within its caps, reported, and fed by acceptance.json.

Tiny targets with random drafts (whose live acceptance is near zero) and an acceptance.json that
claims a good draft: auto starts by speculating, learns from the rounds, and the output stays plain
greedy decoding's. Once it has gone plain it probes again after `PROBE_AFTER` plain steps, and the draft
then reads exactly the target states of the positions it skipped; what it learnt of the machine's speed
and of the draft's live acceptance is carried to the next request. Slow: the built-in target with the shipped draft in bf16, where auto's output must
equal plain decoding's bit for bit on real prompts.
"""

from __future__ import annotations

import pytest
import torch

from helpers import make_draft_dir, prompt_of
from specwire.decode import engine, kernels, proposer
from specwire.decode.budget import PROBE_AFTER, Budget
from specwire.decode.engine import AutoBudget, SpecConfig, load_engine_draft, speculative_generate
from specwire.decode.plain import plain_generate
from specwire.draft.acceptance import DraftAcceptance, read_acceptance, write_acceptance
from specwire.errors import SpecwireError
from specwire.target.capture import capture_hooks
from specwire.target.hardware import CostCurve
from specwire.target.load import load_target

CLAIMED = DraftAcceptance(step_accuracy=[0.9] * 5, step_accuracy_topk=[0.97] * 5, topk=4, source="test")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_auto_is_lossless_reports_its_budgets_and_learns(tiny_target, tmp_path, dtype):
    target = load_target(tiny_target("llama"), device="cpu", dtype=dtype)
    folder = make_draft_dir(target, tmp_path / "draft")
    write_acceptance(folder, CLAIMED)
    draft = load_engine_draft(folder, target)
    assert draft.acceptance == CLAIMED
    for n in (5, 40):
        prompt = prompt_of(n, seed=n)
        ref = plain_generate(target, prompt, max_new_tokens=48, stop_on_eos=False)
        res = speculative_generate(target, draft, prompt, max_new_tokens=48, spec=SpecConfig(), stop_on_eos=False)
        assert res.output_ids == ref.output_ids
        used = res.extra["budget_used"]["budgets_used"]
        assert res.extra["budget"] == "auto" and sum(used.values()) >= 1
        assert any(label != "none" for label in used), used  # the claimed acceptance makes it speculate first
        assert res.extra["budget_used"]["draft_ms"][1] > 0 and res.extra["budget_used"]["target_ms"][1] > 0
        # plain steps are timed apart from verify passes (a round's measured cost must not include them)
        assert (res.extra["plain_s"] > 0) == (res.extra["plain_steps"] > 0)
        assert res.extra["verify_s"] > 0 and res.extra["other_s"] >= 0


@pytest.mark.parametrize("lookup", [0, 8], ids=["plain-steps", "copied-tokens-too"])
def test_auto_probes_after_plain_steps_and_the_draft_reads_the_skipped_positions(tiny_target, tmp_path, monkeypatch,
                                                                                 lookup):
    """Under auto's plain steps the draft reads nothing; when it speculates again it reads every skipped position,
    whether a plain step or a round of copied tokens alone (`decode.lookup`, which this tiny target's looping
    answer takes often) produced it."""
    target = load_target(tiny_target("llama"), device="cpu")
    folder = make_draft_dir(target, tmp_path / "draft")
    write_acceptance(folder, CLAIMED)
    draft = load_engine_draft(folder, target)
    fed = []  # (states, tokens, start) of every proposal: a spy around the real proposer
    real = proposer.EagleProposer.propose

    def spy(self, states, tokens, start, **kw):
        fed.append((states.clone(), tokens.clone(), start))
        return real(self, states, tokens, start, **kw)

    monkeypatch.setattr(proposer.EagleProposer, "propose", spy)
    # a machine on which a multi-token pass costs 2x a plain step: the curve says so and every timed pass is
    # learnt at the curve's figure (a tiny target's own passes cost about the same at any size, and `auto` would
    # learn that), so the random draft's low acceptance sends auto to plain steps, whatever else runs here
    steep = CostCurve("float32/torch", list(range(1, 18)), [10.0] + [20.0] * 16, min_rows=1, invariant=True)
    monkeypatch.setattr(kernels, "cost_curve", lambda target: steep)
    timed = engine.AutoBudget.observe_pass
    monkeypatch.setattr(engine.AutoBudget, "observe_pass", lambda self, T, ms: timed(self, T, self.cost.curve(T)))
    prompt = prompt_of(6, seed=3)
    n = 4 * PROBE_AFTER if not lookup else 240  # copied tokens end the answer in fewer rounds: a longer one
    ref = plain_generate(target, prompt, max_new_tokens=n, stop_on_eos=False)
    res = speculative_generate(target, draft, prompt, max_new_tokens=n, spec=SpecConfig(tree=False, lookup=lookup),
                               stop_on_eos=False)
    assert res.output_ids == ref.output_ids
    report = res.extra["budget_used"]
    if lookup:
        assert res.extra["lookup"]["alone"] >= 1 and res.extra["lookup"]["accepted"] >= 1, res.extra["lookup"]
    else:
        assert report["probes"] >= 1 and res.extra["plain_steps"] >= PROBE_AFTER, report
    # every proposal after the first reads the target's own states at positions start.., whatever ran before
    seq = torch.tensor([prompt + res.output_ids])
    with capture_hooks(target.parts, draft.config.wiring.hs_ids) as store:
        target.model(input_ids=seq)
        full = torch.cat([store[i] for i in draft.config.wiring.hs_ids], dim=-1)[0]  # shape: [len, n*H]
    backlogs = [t.shape[0] for _, t, _ in fed[1:]]
    assert max(backlogs) > (PROBE_AFTER if not lookup else 2)  # a probe's first round reads the skipped positions
    for states, tokens, start in fed[1:]:
        T = tokens.shape[0]
        assert tokens.tolist() == seq[0, start + 1:start + 1 + T].tolist()
        torch.testing.assert_close(states, full[start:start + T], rtol=1e-4, atol=1e-4)


def test_auto_carries_what_it_learnt_of_the_machine_to_the_next_request(tiny_target, tmp_path):
    target = load_target(tiny_target("llama"), device="cpu")
    folder = make_draft_dir(target, tmp_path / "draft")
    write_acceptance(folder, CLAIMED)
    draft = load_engine_draft(folder, target)
    fresh = AutoBudget(target, draft, SpecConfig(), tree=True)
    assert (fresh.cost.scale, fresh.cost.overhead_ms) == (1.0, 0.0)
    res = speculative_generate(target, draft, prompt_of(8), max_new_tokens=24, spec=SpecConfig(), stop_on_eos=False)
    learnt = res.extra["budget_used"]
    assert learnt["scale"] != 1.0
    carried = AutoBudget(target, draft, SpecConfig(), tree=True)
    assert round(carried.cost.scale, 3) == learnt["scale"] and round(carried.cost.overhead_ms, 3) == learnt["overhead_ms"]
    assert learnt["pass_ratio"] and {T: round(r, 3) for T, (r, _) in carried.cost.passes.items()} == learnt["pass_ratio"]
    assert all(n >= 1 for _, n in carried.cost.passes.values())  # sizes timed in the first request, with their counts
    other = load_engine_draft(folder, target)  # another draft object: its own costs, learnt afresh
    assert AutoBudget(target, other, SpecConfig(), tree=True).cost.scale == 1.0


def test_auto_carries_the_live_acceptance_to_the_next_request_of_the_same_mode(tiny_target, tmp_path):
    """The random draft's live acceptance (near zero) against the claimed 0.9: the next request of the same
    target, draft and mode starts from the rounds the first one ran; a chain request does not take a tree's."""
    target = load_target(tiny_target("llama"), device="cpu")
    folder = make_draft_dir(target, tmp_path / "draft")
    write_acceptance(folder, CLAIMED)
    draft = load_engine_draft(folder, target)
    fresh = AutoBudget(target, draft, SpecConfig(), tree=True)
    assert fresh.acceptance.live == [] and fresh.report()["carried_rounds"] == 0
    res = speculative_generate(target, draft, prompt_of(8), max_new_tokens=24, spec=SpecConfig(), stop_on_eos=False)
    assert res.extra["budget_used"]["carried_rounds"] == 0
    carried = AutoBudget(target, draft, SpecConfig(), tree=True)
    rounds = carried.acceptance.live[0][1]  # every round with draft tokens reaches position 0
    assert 0 < rounds <= res.extra["num_verify_passes"] and carried.report()["carried_rounds"] == rounds
    assert carried.acceptance.rates(Budget(1))[0] < fresh.acceptance.rates(Budget(1))[0]
    assert AutoBudget(target, draft, SpecConfig(tree=False), tree=False).acceptance.live == []
    other = load_engine_draft(folder, target)  # another draft object: its own acceptance, learnt afresh
    assert AutoBudget(target, other, SpecConfig(), tree=True).acceptance.live == []


def test_auto_stays_within_its_caps(tiny_target, tmp_path):
    target = load_target(tiny_target("llama"), device="cpu")
    folder = make_draft_dir(target, tmp_path / "draft")
    write_acceptance(folder, CLAIMED)
    draft = load_engine_draft(folder, target)
    spec = SpecConfig(num_steps=2, topk=2, num_draft_tokens=3)
    res = speculative_generate(target, draft, prompt_of(9), max_new_tokens=40, spec=spec, stop_on_eos=False)
    allowed = {"none", "chain 1", "chain 2", "tree 2x2, 3 tokens"}
    assert set(res.extra["budget_used"]["budgets_used"]) <= allowed
    assert res.output_ids == plain_generate(target, prompt_of(9), max_new_tokens=40, stop_on_eos=False).output_ids


def test_a_draft_without_acceptance_json_uses_a_prior_and_a_broken_one_is_refused(tiny_target, tmp_path):
    target = load_target(tiny_target("llama"), device="cpu")
    folder = make_draft_dir(target, tmp_path / "draft")
    assert load_engine_draft(folder, target).acceptance is None
    res = speculative_generate(target, load_engine_draft(folder, target), prompt_of(7), max_new_tokens=12,
                               spec=SpecConfig())
    assert res.output_ids == plain_generate(target, prompt_of(7), max_new_tokens=12).output_ids
    (folder / "acceptance.json").write_text('{"step_accuracy": [1.5], "step_accuracy_topk": [0.5], "topk": 4}')
    with pytest.raises(SpecwireError, match="acceptance.json: field 'step_accuracy'"):
        read_acceptance(folder)


@pytest.mark.slow
def test_builtin_auto_is_lossless_in_bf16():
    target = load_target("smollm2-135m", device="cpu", dtype="bfloat16")
    draft = load_engine_draft("smollm2-135m-eagle3", target)
    assert draft.acceptance is not None  # the shipped draft carries its measured acceptance
    for text in ("Explain how a hash map works, with an example in Python.",
                 "Write a short story about a robot who learns to paint."):
        prompt = target.encode_chat(text)
        ref = plain_generate(target, prompt, max_new_tokens=48)
        for tree in (True, False):
            res = speculative_generate(target, draft, prompt, max_new_tokens=48, spec=SpecConfig(tree=tree))
            assert res.output_ids == ref.output_ids, (text, tree)
