"""`--dtype` / `--linear auto`: the kernel a decoding target runs, from this machine's measured curves.

- `--dtype auto --linear auto` takes the fastest invariant candidate of any dtype.
- An explicit `--dtype` with `--linear auto` takes the fastest candidate *of that dtype*: a float32 kernel
  (rowdot) that won overall is never handed to a bf16 target; with no candidate of that dtype measured on
  this machine (bf16 on a CPU without native bf16) it is the stock linear layers.
- A candidate whose passes were not bitwise invariant is never chosen.
The curves are written into a real cache under this machine's key, so the choice reads them as `specwire
bench` and `generate` do, without profiling.
"""

from __future__ import annotations

import math

import pytest

from specwire.decode import kernels
from specwire.decode.budget import AcceptanceModel
from specwire.target.hardware import CacheKey, CostCurve, KernelChoice, read_cache, write_cache

TOKENS = list(range(1, 18))


def _curve(name: str, one_ms: float, invariant: bool = True) -> CostCurve:
    return CostCurve(kernel=name, tokens=TOKENS, ms=[one_ms * (1 + 0.05 * (t - 1)) for t in TOKENS], min_rows=1,
                     invariant=invariant)


@pytest.fixture
def measured(tiny_target, tmp_path, monkeypatch):
    """A tiny target whose every candidate here has a cached curve: float32/rowdot fastest overall, then
    bfloat16/pretransposed, bfloat16/rowdot, bfloat16/torch, bfloat16/onednn, bfloat16/amx, float32/pretransposed, float32/torch."""
    monkeypatch.setenv("SPECWIRE_HOME", str(tmp_path))
    folder = str(tiny_target("llama"))
    speeds = {"float32/rowdot": 5.0, "bfloat16/pretransposed": 8.0, "bfloat16/rowdot": 8.5, "bfloat16/torch": 9.0,
              "bfloat16/onednn": 9.5, "bfloat16/amx": 10.0, "float32/pretransposed": 11.0, "float32/torch": 12.0}
    here = {k.name for k in kernels.candidate_kernels("cpu")}
    assert here <= set(speeds), f"a candidate without a curve here would be profiled for real: {here - set(speeds)}"
    key = CacheKey.here(kernels._fingerprint(folder), "cpu")
    write_cache(key, tmp_path, curves={n: _curve(n, ms) for n, ms in speeds.items() if n in here})
    return folder, here


def test_auto_takes_the_fastest_candidate_of_any_dtype(measured):
    folder, here = measured
    best = kernels.resolve_kernel(folder, "auto", "auto", device="cpu")
    expected = "float32/rowdot" if "float32/rowdot" in here else "bfloat16/pretransposed" \
        if "bfloat16/pretransposed" in here else "float32/pretransposed"
    assert best.name == expected


def test_an_explicit_dtype_takes_the_fastest_linear_of_that_dtype(measured):
    folder, here = measured
    bf16 = kernels.resolve_kernel(folder, "bfloat16", "auto", device="cpu")
    assert bf16.name == ("bfloat16/pretransposed" if "bfloat16/pretransposed" in here else "bfloat16/torch")
    f32 = kernels.resolve_kernel(folder, "float32", "auto", device="cpu")
    assert f32.name == ("float32/rowdot" if "float32/rowdot" in here else "float32/pretransposed")
    assert kernels.resolve_kernel(folder, "bfloat16", "torch", device="cpu").name == "bfloat16/torch"  # kept as given


def test_a_kernel_that_failed_the_bitwise_check_is_never_chosen(measured, tmp_path):
    folder, here = measured
    key = CacheKey.here(kernels._fingerprint(folder), "cpu")
    write_cache(key, tmp_path, curves={n: _curve(n, 1.0, invariant=False) for n in here if n != "float32/torch"})
    assert kernels.resolve_kernel(folder, "auto", "auto", device="cpu").name == "float32/torch"
    assert kernels.resolve_kernel(folder, "bfloat16", "auto", device="cpu").name == "bfloat16/torch"


def test_a_bf16_kernel_off_amx_is_ranked_with_the_rowdot_draft_it_serves():
    """The ranking prices a draft step as a fraction of a one-token pass on the kernel the served draft runs: a
    bf16 target off AMX serves a rowdot draft, so its draft costs what it does beside float32/rowdot; an AMX
    target's draft runs AMX, and without a rowdot curve (rowdot does not run here) a target's own kernel."""
    from specwire.decode.budget import CostModel, choose_budget

    curves = {n: _curve(n, ms) for n, ms in {"float32/rowdot": 10.0, "bfloat16/onednn": 40.0, "bfloat16/amx": 30.0,
                                               "float32/torch": 50.0}.items()}
    assert kernels.draft_step_basis("bfloat16/onednn", curves) == 10.0
    assert kernels.draft_step_basis("bfloat16/amx", curves) == 30.0
    assert kernels.draft_step_basis("float32/torch", curves) == 50.0
    without_rowdot = {n: c for n, c in curves.items() if n != "float32/rowdot"}
    assert kernels.draft_step_basis("bfloat16/onednn", without_rowdot) == 40.0
    acc = kernels.reference_acceptance()
    ranked = {r.kernel.name: r for r in kernels.rank_kernels(curves, acc, kernels.Workload.of(draft=True))}  # no copies
    for name, basis in (("bfloat16/onednn", 10.0), ("bfloat16/amx", 30.0)):
        c = curves[name]
        step = kernels.DRAFT_STEP_FRACTION * basis
        best = choose_budget(acc, CostModel(dict(zip(c.tokens, c.ms)), {w: step for w in (1, 2, 3, 4)}),
                             max_steps=acc.depth, max_topk=4, max_tokens=16, tree=True)
        assert ranked[name].expected_tokens_per_s == pytest.approx(best.tokens_per_s)


WIDE = list(range(1, 33))  # a 17-token tree with an 8-token copy is a 25-token pass: measured, not extrapolated


def _shaped(name: str, one_ms: float, slope: float) -> CostCurve:
    """A curve costing one_ms for one token and `slope` of that more for each further token."""
    return CostCurve(kernel=name, tokens=WIDE, ms=[one_ms * (1 + slope * (t - 1)) for t in WIDE], min_rows=1,
                     invariant=True)


# a fixed acceptance profile (the shipped draft version 10's offline one), so that a new shipped draft moves no test
ACCEPTANCE = dict(top1=[0.5975, 0.5537, 0.5166, 0.4553, 0.4036], topk=[0.7885, 0.7485, 0.718, 0.6674, 0.6148], k=4)

# float32/torch: the cheaper one-token pass, steep; float32/pretransposed: dearer for one token, flat
STEEP_AND_FLAT = {"float32/torch": (20.0, 0.12), "float32/pretransposed": (24.0, 0.01)}


def test_plain_decoding_takes_the_cheapest_one_token_pass_and_speculation_the_flatter_curve():
    curves = {n: _shaped(n, *shape) for n, shape in STEEP_AND_FLAT.items()}
    acc = AcceptanceModel(**ACCEPTANCE)
    plain = kernels.rank_kernels(curves, acc, kernels.Workload.of(draft=False))
    assert [r.kernel.name for r in plain] == ["float32/torch", "float32/pretransposed"]
    assert plain[0].expected_tokens_per_s == pytest.approx(1000 / 20.0) and plain[0].budget == "none"
    spec = kernels.rank_kernels(curves, acc, kernels.Workload.of(draft=True))
    assert spec[0].kernel.name == "float32/pretransposed"


def _brute_force_with_copies(curve: CostCurve, step_ms: float, acc, lookup: int) -> float:
    """Every budget within the ranking's caps, every copy length 0..lookup, priced from first principles: a copy in
    COPY_SHARE of the rounds adds the rows it verifies and, per position along it, the chance that it and every
    copied token before it are accepted."""
    from specwire.decode.budget import candidates, expected_tokens
    from specwire.decode.lookup import PRIOR_RATES

    ms = dict(zip(curve.tokens, curve.ms))
    share = kernels.COPY_SHARE
    best = 0.0
    for b in candidates(acc.depth, 4, 16, tree=True, depth=acc.depth):
        E = expected_tokens(acc.rates(b) if b.num_steps else [])
        C = ms[b.pass_tokens] + b.num_steps * step_ms  # every draft step costs the same here, whatever its width
        rates = [PRIOR_RATES[min(j, len(PRIOR_RATES) - 1)] for j in range(lookup)]
        # auto cuts each copy at the length of best tokens per ms for that round
        tails = [(E + sum(math.prod(rates[:j + 1]) for j in range(t))) / (C + ms[b.pass_tokens + t] - ms[b.pass_tokens])
                 for t in range(lookup + 1)]
        t = max(range(lookup + 1), key=lambda i: (tails[i], -i))
        copied = sum(math.prod(rates[:j + 1]) for j in range(t))
        best = max(best, 1000 * (E + share * copied) / (C + share * (ms[b.pass_tokens + t] - ms[b.pass_tokens])))
    return best


@pytest.mark.parametrize("lookup", [0, 3, 8])
@pytest.mark.parametrize("shape", [(20.0, 0.12), (24.0, 0.01), (30.0, 0.05)])
def test_the_ranking_with_copies_is_a_brute_force_search(shape, lookup):
    name = "float32/torch"
    curve = _shaped(name, *shape)
    acc = AcceptanceModel(**ACCEPTANCE)
    ranked = kernels.rank_kernels({name: curve}, acc, kernels.Workload.of(draft=True, lookup=lookup))
    step = kernels.DRAFT_STEP_FRACTION * curve.at(1)
    assert ranked[0].expected_tokens_per_s == pytest.approx(_brute_force_with_copies(curve, step, acc, lookup))
    assert ("copies" in ranked[0].budget) == (lookup > 0)


def test_copies_favour_a_curve_that_stays_flat_past_the_drafts_budget():
    """Two curves the draft alone ranks one way (its deepest useful trees fit where both climb): a curve that
    flattens past 12 rows verifies the lookup's copies for little, and the ranking with copies turns the order
    (by 2.4% each way)."""
    steep = _shaped("float32/torch", 20.0, 0.12)
    knee = [23.0 * (1 + 0.06 * (min(t, 12) - 1) + 0.01 * max(0, t - 12)) for t in WIDE]
    curves = {"float32/torch": steep,
              "float32/pretransposed": CostCurve("float32/pretransposed", WIDE, knee, min_rows=1, invariant=True)}
    acc = AcceptanceModel(**ACCEPTANCE)
    without = kernels.rank_kernels(curves, acc, kernels.Workload.of(draft=True, lookup=0))
    with_copies = kernels.rank_kernels(curves, acc, kernels.Workload.of(draft=True, lookup=8))
    assert without[0].kernel.name == "float32/torch"
    assert with_copies[0].kernel.name == "float32/pretransposed"


def test_generate_with_and_without_a_draft_decodes_the_same_kernel(tiny_target, tmp_path, monkeypatch):
    """One kernel per machine and target, whatever the command: `generate` without a draft gets the kernel that
    speculation ranks first even where plain decoding alone would rank another first, so its greedy text is the
    oracle of `generate --draft`'s. Real curves in a real cache; the target really loads and decodes."""
    from specwire.decode.generate import GenerateConfig, generate_reply

    monkeypatch.setenv("SPECWIRE_HOME", str(tmp_path))
    folder = str(tiny_target("llama"))
    here = {k.name for k in kernels.candidate_kernels("cpu")}
    slow = {n: _shaped(n, 200.0, 0.1) for n in here if n not in STEEP_AND_FLAT}  # never in the running
    curves = {**slow, **{n: _shaped(n, *shape) for n, shape in STEEP_AND_FLAT.items()}}
    write_cache(CacheKey.here(kernels._fingerprint(folder), "cpu"), tmp_path, curves=curves)
    acc = kernels.reference_acceptance()
    assert kernels.rank_kernels(curves, acc, kernels.Workload.of(draft=False))[0].kernel.name == "float32/torch"
    assert kernels.rank_kernels(curves, acc, kernels.REFERENCE)[0].kernel.name == "float32/pretransposed"
    plain = generate_reply(GenerateConfig("hello", target=folder, max_new_tokens=2))
    assert plain.result.extra["kernel"] == "float32/pretransposed"
    assert kernels.resolve_kernel(folder, "auto", "auto", device="cpu").name == "float32/pretransposed"


def test_the_defaults_rank_by_speculation_with_the_default_lookup():
    from specwire.decode.engine import SpecConfig

    assert kernels.REFERENCE == kernels.Workload.of(draft=True, lookup=SpecConfig().lookup)



def test_the_finalists_are_the_first_three_within_the_margin_of_the_best():
    def ranked(rates):
        return [kernels.KernelRanking(KernelChoice.parse(n), _curve(n, 1.0), r, "chain 2") for n, r in rates.items()]

    four = ranked({"bfloat16/rowdot": 100.0, "float32/rowdot": 90.0, "bfloat16/onednn": 76.0, "float32/torch": 75.5})
    assert kernels.finalists(four) == ["bfloat16/rowdot", "float32/rowdot", "bfloat16/onednn"]  # three at most
    assert kernels.finalists(ranked({"bfloat16/rowdot": 100.0, "float32/rowdot": 74.0})) == ["bfloat16/rowdot"]
    assert kernels.finalists([]) == []


LEADERS = ("float32/torch", "float32/pretransposed")  # candidates on every machine


@pytest.fixture
def two_leaders(tiny_target, tmp_path, monkeypatch):
    """A tiny target whose cached curves (measured alone) put two kernels within the margin, every other
    candidate far behind."""
    monkeypatch.setenv("SPECWIRE_HOME", str(tmp_path))
    folder = str(tiny_target("llama"))
    here = {k.name for k in kernels.candidate_kernels("cpu")}
    curves = {n: _curve(n, 5.0 if n in LEADERS else 500.0) for n in here}
    curves["float32/torch"].invariant = None  # as profiled: the check's outcome is carried over
    return folder, curves


def test_settle_measures_the_leaders_again_side_by_side_and_caches_them(two_leaders):
    """The leaders are loaded together and timed pass by pass in turn (`hardware.measure_passes_ms`): their new
    curves name each other, keep the bitwise check's outcome, and are what the cache holds; a settled set is not
    measured again."""
    folder, curves = two_leaders
    settled = kernels.settle(folder, curves, reps=1)
    for name in LEADERS:
        assert settled[name] is not curves[name] and settled[name].ms != curves[name].ms
        assert settled[name].beside == [n for n in LEADERS if n != name]
        assert settled[name].invariant == curves[name].invariant and len(settled[name].ms) == 17
    assert all(settled[n] is curves[n] for n in curves if n not in LEADERS)
    cached = read_cache(CacheKey.here(kernels._fingerprint(folder), "cpu"), kernels.specwire_home()).curves
    assert {n: cached[n].ms for n in LEADERS} == {n: settled[n].ms for n in LEADERS}
    assert kernels.settle(folder, settled, reps=1) == settled  # settled already: nothing is loaded


def test_settle_loads_no_copy_that_memory_cannot_hold(two_leaders, monkeypatch):
    from specwire.target import hardware

    folder, curves = two_leaders
    # a machine with no room for a second copy
    monkeypatch.setattr(hardware, "memory_available", lambda device="cpu": 1024)
    assert kernels.settle(folder, curves, reps=1) == curves


def test_passes_side_by_side_alternate_the_models_at_every_size(tiny_target):
    """`measure_passes_ms`: for every repetition and every pass size, each model runs once, in turn, so a burst
    of load falls on all of them alike."""
    from specwire.target.hardware import measure_passes_ms
    from specwire.target.load import load_target

    folder = tiny_target("llama")
    models = [load_target(folder, device="cpu", dtype=d).model for d in ("float32", "bfloat16")]
    order = []
    for i, m in enumerate(models):
        m.register_forward_pre_hook(
            lambda mod, args, kw, i=i: order.append((i, (args[0] if args else kw["input_ids"]).shape[1])),
            with_kwargs=True)
    ms = measure_passes_ms(models, [4, 8], context=5, reps=2)  # sizes every kernel's row padding divides
    assert [len(m) for m in ms] == [2, 2] and all(v > 0 for m in ms for v in m)
    assert order[:2] == [(0, 5), (1, 5)]  # each model's context first
    assert order[2:] == [(0, 4), (1, 4), (0, 8), (1, 8)] * 4  # two warm-up rounds, two timed
