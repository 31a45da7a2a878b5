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

import pytest

from specwire.decode import kernels
from specwire.target.hardware import CacheKey, CostCurve, write_cache

TOKENS = list(range(1, 18))


def _curve(name: str, one_ms: float, invariant: bool = True) -> CostCurve:
    return CostCurve(kernel=name, tokens=TOKENS, ms=[one_ms * (1 + 0.05 * (t - 1)) for t in TOKENS], min_rows=1,
                     invariant=invariant)


@pytest.fixture
def measured(tiny_target, tmp_path, monkeypatch):
    """A tiny target whose every candidate here has a cached curve: float32/rowdot fastest overall, then
    bfloat16/pretransposed, bfloat16/torch, bfloat16/onednn, bfloat16/amx, float32/pretransposed, float32/torch."""
    monkeypatch.setenv("SPECWIRE_HOME", str(tmp_path))
    folder = str(tiny_target("llama"))
    speeds = {"float32/rowdot": 5.0, "bfloat16/pretransposed": 8.0, "bfloat16/torch": 9.0, "bfloat16/onednn": 9.5,
              "bfloat16/amx": 10.0, "float32/pretransposed": 11.0, "float32/torch": 12.0}
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
    ranked = {r.kernel.name: r for r in kernels.rank_kernels(curves, acc)}
    for name, basis in (("bfloat16/onednn", 10.0), ("bfloat16/amx", 30.0)):
        c = curves[name]
        step = kernels.DRAFT_STEP_FRACTION * basis
        best = choose_budget(acc, CostModel(dict(zip(c.tokens, c.ms)), {w: step for w in (1, 2, 3, 4)}),
                             max_steps=acc.depth, max_topk=4, max_tokens=16, tree=True)
        assert ranked[name].expected_tokens_per_s == pytest.approx(best.tokens_per_s)
