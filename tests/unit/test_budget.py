"""`auto`: the speculation budget chosen from a cost curve and an acceptance profile, and its cache rules.

- The choice equals a brute-force search over every budget within the caps, on known curves and
  profiles (written out here again, not imported: an independent statement of the model).
- It behaves as the maths says at the extremes: a flat (AMX-like) curve and a good draft give a deep
  tree; a steep curve and a weak draft give no speculation; live rounds that accept nothing turn it off.
- A cost cache measured under another key (foreign or stale) is ignored, never trusted.
- Live timings that are all slower than the curve move its scale, not the per-round overhead, so a slower
  machine does not turn speculation off; a probe is the best budget that speculates.
- Each pass size learns its own ratio to the curve (a size not timed takes its neighbours'), and the planner
  explores a close runner-up of another size, so a curve whose shape is wrong (it underrates the wide tree
  it ran) ends near the budget a brute-force search over the true costs would choose; one stalled pass or
  round moves the learnt costs a bounded step.
"""

from __future__ import annotations

import itertools
import json
import logging

import pytest

from specwire.decode.budget import (KNOWN_PASSES, LEARN_RATE, OUTLIER, AcceptanceModel, Budget, CostModel, Planner,
                                    candidates, choose_budget, evaluate, runner_up, score)

FLAT = {T: 30.0 + 0.2 * T for T in range(1, 18)}  # bf16 on AMX: 16 tokens cost about what 1 does
STEEP = {T: 30.0 * (1 + 0.18 * (T - 1)) for T in range(1, 18)}  # fp32: a 6-token pass ~1.9x a 1-token one
CLIFF = {T: 30.0 if T == 1 else 30.0 * (1.8 + 0.05 * T) for T in range(1, 18)}  # any multi-token pass ~1.8x
GOOD = ([0.75, 0.7, 0.68, 0.66, 0.65, 0.64, 0.63], [0.92, 0.9, 0.88, 0.87, 0.86, 0.85, 0.85])
WEAK = ([0.31, 0.26, 0.23, 0.22, 0.2], [0.53, 0.46, 0.43, 0.4, 0.38])


def brute_force(top1, topk, k, target_ms, draft_ms, overhead, *, max_steps, max_topk, max_tokens, tree):
    """Every budget, scored by its expected tokens per ms; returns the best (ties: first in this order)."""
    def tokens(rates):
        out, run = 1.0, 1.0
        for r in rates:
            run *= r
            out += run
        return out

    def t_ms(T):
        return target_ms[min(T, max(target_ms))] if T <= max(target_ms) else target_ms[max(target_ms)] * T / max(target_ms)

    best, best_rate = None, -1.0
    depth = min(max_steps, len(top1))
    options = [(0, 1, 0)] + [(s, 1, s) for s in range(1, depth + 1)]
    if tree:
        options += [(s, w, n) for s, w, n in itertools.product(range(2, depth + 1), range(2, max_topk + 1),
                                                               range(1, max_tokens + 1)) if n > s]
    for s, w, n in options:
        if s == 0:
            rate = 1.0 / t_ms(1)
        elif w == 1:
            rate = tokens(top1[:s]) / (t_ms(1 + s) + s * draft_ms[1] + overhead)
        else:
            cover = min(1.0, (n - s) / ((w - 1) * s))
            fan = (min(w, k) - 1) / (k - 1)
            rates = [a + (t - a) * fan * cover for a, t in zip(top1[:s], topk[:s])]
            rate = tokens(rates) / (t_ms(1 + n) + draft_ms[1] + (s - 1) * draft_ms[w] + overhead)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = (s, w, n), rate
    return best


@pytest.mark.parametrize("curve", [FLAT, STEEP, CLIFF], ids=["flat", "steep", "cliff"])
@pytest.mark.parametrize("profile", [GOOD, WEAK], ids=["good", "weak"])
@pytest.mark.parametrize("draft_cost", [0.5, 1.7, 6.0])
@pytest.mark.parametrize("tree", [True, False])
def test_auto_matches_brute_force(curve, profile, draft_cost, tree):
    draft_ms = {w: draft_cost * (1 + 0.1 * (w - 1)) for w in (1, 2, 3, 4)}
    acc = AcceptanceModel(list(profile[0]), list(profile[1]), 4)
    choice = choose_budget(acc, CostModel(curve, draft_ms, overhead_ms=2.0), max_steps=7, max_topk=4,
                           max_tokens=16, tree=tree)
    s, w, n = brute_force(*profile, 4, curve, draft_ms, 2.0, max_steps=7, max_topk=4, max_tokens=16, tree=tree)
    b = choice.budget
    assert (b.num_steps, b.topk, b.num_draft_tokens if not b.is_chain else b.num_steps) == (s, w, n)


def test_extremes():
    cheap = {w: 0.5 for w in (1, 2, 3, 4)}
    deep = choose_budget(AcceptanceModel(*GOOD), CostModel(FLAT, cheap), max_steps=7, max_topk=4, max_tokens=16,
                         tree=True).budget
    assert not deep.is_chain and deep.num_steps >= 3 and deep.num_draft_tokens >= 12
    none = choose_budget(AcceptanceModel(*WEAK), CostModel(CLIFF, {w: 1.7 for w in (1, 2, 3, 4)}), max_steps=5,
                         max_topk=4, max_tokens=16, tree=True).budget
    assert none == Budget(0)
    chain = choose_budget(AcceptanceModel(*GOOD), CostModel(STEEP, cheap), max_steps=7, max_topk=4, max_tokens=16,
                          tree=False).budget
    assert chain.is_chain and chain.num_steps >= 1


def test_live_rounds_that_accept_nothing_turn_speculation_off():
    acc = AcceptanceModel(*GOOD)
    cost = CostModel(STEEP, {w: 0.5 for w in (1, 2, 3, 4)})
    b = choose_budget(acc, cost, max_steps=7, max_topk=4, max_tokens=16, tree=True).budget
    assert b.num_steps > 0
    for _ in range(200):  # the request's rounds: position 0 reached every time, never accepted
        acc.observe(b, [1] + [0] * (b.num_steps - 1), [0] * b.num_steps)
    assert choose_budget(acc, cost, max_steps=7, max_topk=4, max_tokens=16, tree=True).budget == Budget(0)
    rates = acc.rates(b)
    assert rates[0] < 0.2 * acc.modelled(b)[0]


def test_caps_are_respected():
    c = choose_budget(AcceptanceModel(*GOOD), CostModel(FLAT, {w: 0.1 for w in (1, 2, 3, 4)}), max_steps=3,
                      max_topk=2, max_tokens=6, tree=True).budget
    assert c.num_steps <= 3 and c.topk <= 2 and c.num_draft_tokens <= 6


# ---- the cost cache ---------------------------------------------------------------------------------

def _curve():
    from specwire.target.hardware import CostCurve

    return CostCurve(kernel="float32/torch", tokens=[1, 2], ms=[10.0, 12.0], min_rows=4, invariant=True)


def test_cache_round_trip_and_foreign_or_stale_cache_is_ignored(tmp_path, caplog):
    from specwire.target.hardware import CacheKey, read_cache, write_cache

    key = CacheKey.here("abc123")
    path = write_cache(key, tmp_path, curves={"float32/torch": _curve()}, min_rows={"float32/torch": {"linear:8x8": 4}})
    got = read_cache(key, tmp_path)
    assert got.curves["float32/torch"].ms == [10.0, 12.0] and got.min_rows == {"float32/torch": {"linear:8x8": 4}}

    data = json.loads(path.read_text())
    data["key"]["torch"] = "1.0.0"  # measured under another torch: stale
    path.write_text(json.dumps(data))
    with caplog.at_level(logging.WARNING, logger="specwire"):
        assert read_cache(key, tmp_path).curves == {}
    assert "another key" in caplog.text and "torch" in caplog.text

    data["key"] = key.to_dict() | {"cpu": "Some Other CPU"}  # copied from another machine: foreign
    path.write_text(json.dumps(data))
    assert read_cache(key, tmp_path).curves == {}
    data["key"] = key.to_dict() | {"kernels": "0" * 16}  # measured with an older compiled kernel: stale
    path.write_text(json.dumps(data))
    assert read_cache(key, tmp_path).curves == {}
    from specwire.target import amx, bf16dot, rowdot

    # this machine's compiled kernels' digests (rowdot and attention, AMX, bf16 rowdot) are part of every key
    assert key.kernels == f"{rowdot.source_digest()}+{amx.source_digest()}+{bf16dot.source_digest()}"
    assert len(key.kernels) == 50
    other = CacheKey.here("abc123")
    other.threads += 1  # another thread count is another file: nothing cached there
    assert read_cache(other, tmp_path).curves == {}
    path.write_text("{not json")
    assert read_cache(key, tmp_path).curves == {}


def test_engine_refuses_a_foreign_cache_and_measures(tiny_target, tmp_path, monkeypatch):
    """cost_curve() re-measures when the cached curve's key is not this machine's."""
    import specwire.decode.kernels as kernels
    from specwire.target.hardware import CacheKey, write_cache
    from specwire.target.load import load_target

    monkeypatch.setenv("SPECWIRE_HOME", str(tmp_path))
    target = load_target(tiny_target("llama"), device="cpu")
    key = CacheKey.here(target.spec.fingerprint)
    fake = _curve()
    fake.ms = [999.0, 999.0]
    path = write_cache(key, tmp_path, curves={"float32/torch": fake})
    data = json.loads(path.read_text())
    data["key"]["cpu"] = "Foreign CPU"
    path.write_text(json.dumps(data))
    curve = kernels.cost_curve(target)
    assert curve.ms[0] != 999.0 and len(curve.ms) == 17

    target2 = load_target(tiny_target("llama"), device="cpu")  # a matching cache is used, not re-measured
    monkeypatch.setattr(kernels, "measure_curve", lambda *a, **k: pytest.fail("re-measured a valid cache"))
    assert kernels.cost_curve(target2).ms == curve.ms


def test_a_uniformly_slower_machine_scales_both_sides_and_keeps_speculating():
    """Live passes and rounds all 1.6x the curve (another job, a slower clock): the learnt scale takes it,
    not the per-round overhead, so the choice is the one over the curve itself (a ratio is unchanged)."""
    acc = AcceptanceModel(*GOOD)
    draft_ms = {w: 1.0 for w in (1, 2, 3, 4)}
    caps = dict(max_steps=7, max_topk=4, max_tokens=16, tree=True)
    reference = choose_budget(acc, CostModel(STEEP, draft_ms), **caps).budget
    assert reference.num_steps > 0
    cost = CostModel(STEEP, draft_ms)
    for _ in range(60):
        b = choose_budget(acc, cost, **caps).budget
        cost.learn_pass(b.pass_tokens, 1.6 * STEEP[b.pass_tokens])
        cost.learn_round(b, 1.6 * STEEP[b.pass_tokens] + b.num_steps * 1.0)  # draft steps at their measured cost
        cost.learn_pass(1, 1.6 * STEEP[1])
    assert cost.scale == pytest.approx(1.6, rel=1e-3) and cost.overhead_ms == pytest.approx(0.0, abs=1e-3)
    assert choose_budget(acc, cost, **caps).budget == reference
    # a true per-round overhead is still learnt as overhead
    for _ in range(60):
        cost.learn_round(reference, cost.round_ms(reference) - cost.overhead_ms + 7.0)
    assert cost.overhead_ms == pytest.approx(7.0, rel=1e-3)


def test_a_probe_is_the_best_budget_that_speculates():
    acc, cost = AcceptanceModel(*WEAK), CostModel(CLIFF, {w: 1.7 for w in (1, 2, 3, 4)})
    caps = dict(max_steps=5, max_topk=4, max_tokens=16, tree=True)
    assert choose_budget(acc, cost, **caps).budget == Budget(0)
    probe = choose_budget(acc, cost, **caps, speculate=True)
    assert probe.budget.num_steps > 0
    best = max((c for c in (evaluate(b, acc, cost) for b in candidates(5, 4, 16, tree=True, depth=acc.depth))
                if c.budget.num_steps), key=lambda c: c.tokens_per_s)
    assert probe.tokens_per_s == pytest.approx(best.tokens_per_s)


def test_carried_counts_keep_the_rate_and_cap_the_rounds():
    """What a request hands the next: the same posterior where few rounds ran; past the cap, the counts are
    scaled down to it (the live rate kept), so the prior and the newest rounds weigh more."""
    acc = AcceptanceModel([0.5, 0.4], [0.7, 0.6], 4)
    for _ in range(40):
        acc.observe(Budget(2), [1, 1], [1, 0])
    few = acc.carried(100)
    assert few == acc.live and few is not acc.live
    capped = acc.carried(10)
    assert [c[1] for c in capped] == [10, 10]
    assert [c[2] / c[1] for c in capped] == [a / r for _, r, a in acc.live]
    again = AcceptanceModel([0.5, 0.4], [0.7, 0.6], 4, live=capped)
    assert 1.0 > again.rates(Budget(2))[0] > 0.5 > again.rates(Budget(2))[1]


def test_each_pass_size_learns_its_ratio_and_a_size_not_timed_takes_its_neighbours():
    cost = CostModel(dict(STEEP), {1: 1.0})
    assert cost.ratio(5) == 1.0 and cost.target(5) == STEEP[5]
    for _ in range(80):
        cost.learn_pass(2, 1.2 * STEEP[2])
        cost.learn_pass(10, 1.6 * STEEP[10])
    assert cost.ratio(2) == pytest.approx(1.2) and cost.ratio(10) == pytest.approx(1.6)
    assert cost.ratio(6) == pytest.approx(1.4)  # between two timed sizes: linear in T
    assert cost.ratio(1) == pytest.approx(1.2) and cost.ratio(16) == pytest.approx(1.6)  # past the ends: the nearest
    assert cost.target(16) == pytest.approx(1.6 * STEEP[16]) and cost.known(10) == 80 and cost.known(6) == 0
    assert 1.2 < cost.scale < 1.6  # the mean over the timed sizes, weighted by passes: what the report gives


def _simulate(acc, curve, true_ms, draft_ms, caps, rounds):
    """The planner's rounds against a machine whose passes cost `true_ms`; returns it and the budgets it ran."""
    plan = Planner(acc, CostModel(dict(curve), draft_ms), **caps)
    ran = []
    for _ in range(rounds):
        b = plan.next()
        ran.append(b)
        plan.cost.learn_pass(b.pass_tokens, true_ms[b.pass_tokens])
        if b.num_steps:
            draft = draft_ms[1] + (b.num_steps - 1) * draft_ms[b.topk] if not b.is_chain else b.num_steps * draft_ms[1]
            plan.cost.learn_round(b, true_ms[b.pass_tokens] + draft)
    return plan, ran


MID = ([0.6, 0.55, 0.5, 0.45, 0.4], [0.8, 0.75, 0.7, 0.65, 0.6])


@pytest.mark.parametrize("profile", [GOOD, MID, WEAK], ids=["good", "mid", "weak"])
@pytest.mark.parametrize("slope", [0.0, 0.04, 0.06, 0.1])
def test_auto_ends_near_the_true_best_when_the_curve_underrates_the_wide_passes(profile, slope):
    """The curve is flat (measured in a quiet moment, say); on the machine a pass over T tokens costs
    1.3 x (1 + slope (T - 1)) x the curve. One scale for every size would keep the wide tree the curve
    prefers; timing each size it runs and exploring close runners-up ends within 3% of the true best, and the
    whole run, exploring included, beats keeping the curve's choice (and costs little where the curve's shape
    was right)."""
    acc = AcceptanceModel(*profile)
    draft_ms = {w: 1.0 for w in (1, 2, 3, 4)}
    caps = dict(max_steps=7, max_topk=4, max_tokens=16, tree=True)
    true_ms = {T: 1.3 * FLAT[T] * (1 + slope * (T - 1)) for T in FLAT}
    true = CostModel(true_ms, draft_ms)
    s, w, n = brute_force(*profile, 4, true_ms, draft_ms, 0.0, max_steps=7, max_topk=4, max_tokens=16, tree=True)
    truth = evaluate(Budget(s) if w == 1 else Budget(s, w, n), acc, true)
    on_curve = evaluate(choose_budget(acc, CostModel(dict(FLAT), draft_ms), **caps).budget, acc, true)
    plan, ran = _simulate(acc, FLAT, true_ms, draft_ms, caps, rounds=400)
    end = evaluate(choose_budget(acc, plan.cost, **caps).budget, acc, true)
    whole = 1000 * sum(evaluate(b, acc, true).tokens_per_round for b in ran) / sum(true.round_ms(b) for b in ran)
    assert end.tokens_per_s >= 0.97 * truth.tokens_per_s
    if slope:
        assert on_curve.tokens_per_s < 0.98 * truth.tokens_per_s  # the curve's own choice is wrong here
        assert whole > on_curve.tokens_per_s and plan.explored >= 1
    else:
        assert end.budget == on_curve.budget and whole >= 0.97 * truth.tokens_per_s


def test_a_runner_up_is_close_of_another_size_and_far_from_the_sizes_timed():
    acc = AcceptanceModel(*GOOD)
    cost = CostModel(dict(FLAT), {w: 1.0 for w in (1, 2, 3, 4)})
    caps = dict(max_steps=7, max_topk=4, max_tokens=16, tree=True)
    best = choose_budget(acc, cost, **caps)
    for _ in range(KNOWN_PASSES):
        cost.learn_pass(best.budget.pass_tokens, FLAT[best.budget.pass_tokens])
    other = runner_up(score(acc, cost, **caps), best, cost)
    assert other is not None and other.budget.pass_tokens != best.budget.pass_tokens
    assert other.tokens_per_s >= 0.85 * best.tokens_per_s
    close = [evaluate(b, acc, cost) for b in candidates(7, 4, 16, tree=True, depth=acc.depth)]
    close = [c for c in close if c.tokens_per_s >= 0.85 * best.tokens_per_s]
    far = max(abs(c.budget.pass_tokens - best.budget.pass_tokens) for c in close)
    assert abs(other.budget.pass_tokens - best.budget.pass_tokens) == far
    # every close size timed enough: nothing left to explore; and plain decoding as the best explores nothing
    for c in close:
        for _ in range(KNOWN_PASSES):
            cost.learn_pass(c.budget.pass_tokens, FLAT[c.budget.pass_tokens])
    assert runner_up(score(acc, cost, **caps), best, cost) is None
    weak = AcceptanceModel(*WEAK)
    steep = CostModel(dict(CLIFF), {w: 1.7 for w in (1, 2, 3, 4)})
    plain = choose_budget(weak, steep, max_steps=5, max_topk=4, max_tokens=16, tree=True)
    assert plain.budget == Budget(0)
    assert runner_up(score(weak, steep, max_steps=5, max_topk=4, max_tokens=16, tree=True), plain, steep) is None


def test_one_stalled_pass_or_round_moves_the_costs_a_bounded_step_and_a_lasting_change_is_followed():
    """A pass or round timed 10x its estimate (a page fault, the garbage collector, another job's burst) moves a
    ratio, the scale or the overhead by a bounded step, so the choice stays; readings that stay 1.5x off are
    followed, as a slower machine should be."""
    acc = AcceptanceModel(*GOOD)
    draft_ms = {w: 1.0 for w in (1, 2, 3, 4)}
    caps = dict(max_steps=7, max_topk=4, max_tokens=16, tree=True)
    cost = CostModel(dict(STEEP), draft_ms)
    b = choose_budget(acc, cost, **caps).budget
    for _ in range(40):  # a steady machine: passes and rounds as modelled, 1 ms of overhead
        cost.learn_pass(b.pass_tokens, STEEP[b.pass_tokens])
        cost.learn_round(b, cost.round_ms(b) - cost.overhead_ms + 1.0)
    ratio, scale, overhead = cost.ratio(b.pass_tokens), cost.scale, cost.overhead_ms
    cost.learn_pass(b.pass_tokens, 10 * STEEP[b.pass_tokens])
    cost.learn_round(b, 10 * cost.round_ms(b))
    assert cost.ratio(b.pass_tokens) <= ratio * (1 + LEARN_RATE * (OUTLIER - 1)) + 1e-9
    assert cost.scale <= scale * (1 + LEARN_RATE * (OUTLIER - 1)) + 1e-9
    assert cost.overhead_ms - overhead <= LEARN_RATE * 0.1 * cost.round_ms(b) + 1e-9
    assert choose_budget(acc, cost, **caps).budget == b
    for _ in range(40):  # a lasting change: every pass 1.5x slower
        cost.learn_pass(b.pass_tokens, 1.5 * STEEP[b.pass_tokens])
    assert cost.ratio(b.pass_tokens) == pytest.approx(1.5, rel=1e-3)
