"""Hardware-aware defaults: which dtype and linear kernel a decoding target runs, and its cost curve.

Scope: the candidate kernels for this machine (`candidate_kernels`: fp32 always, with `torch`, `pretransposed`
and, where `target.rowdot` runs, `rowdot` linear layers; bf16 only where the CPU has native bf16 arithmetic,
AMX or AVX512-BF16, or on CUDA, with `torch`, `pretransposed`, `onednn` where torch has oneDNN, `rowdot` where
`target.bf16dot` runs and `amx` where `target.amx` runs), profiling a candidate (its linear row
padding, a bitwise check of chain and tree passes against single steps, and its pass-cost curve),
`default_kernel` (the fastest candidate that passed the check, measured once per machine and cached by
`target.hardware`, its leaders measured a second time side by side: `settle`), `resolve_kernel` for `--dtype
auto` / `--linear auto`, and `cost_curve` for a loaded target (cached, or measured on it). Does not load drafts or
choose a speculation budget (`budget`).

How "fastest" is judged: by the tokens per second a workload would expect on each kernel's curve (`Workload`):
  - speculative decoding: what `auto` speculation would expect, with the draft's offline acceptance (the
    shipped draft's when no other is given) and a draft step costing `DRAFT_STEP_FRACTION` of a one-token pass
    on the kernel the served draft runs (`draft_step_basis`: a bf16 target off AMX serves a rowdot draft, so its
    draft costs what it costs beside a rowdot target). With the context lookup on, `COPY_SHARE` of the rounds
    also verify a copy, cut as `auto` cuts it (`decode.lookup.tail_length`, at the lookup's prior acceptance):
    the extra rows favour a flat curve;
  - plain decoding: the cheapest one-token pass (reported by `tools/verify_cost.py`, not chosen by).
The defaults choose by one workload, `REFERENCE`: speculation with the lookup at its default, whatever the
command. One kernel per machine and target is what makes plain decoding the oracle of speculative decoding
across commands: `generate` with and without `--draft`, with and without the lookup, greedy or sampled, all
decode the same bits of the same target, so their greedy texts agree token for token. (Choosing per command
would let `generate` alone run float32 and `generate --draft` bf16 on a machine where the two tie for one
token: two targets, two texts.)
The choice only ranks kernels; the budget a request runs with is chosen later, from the real draft's measured
step cost and live acceptance. The prompt's prefill is not priced: it is the same for every method of a
kernel, and the ranking compares decoding speeds.
"""

from __future__ import annotations

import logging
import sys
import weakref
from dataclasses import dataclass

import torch

from specwire.decode.budget import AcceptanceModel, Budget, Choice, CostModel, DEFAULT_ACCEPTANCE, DEFAULT_ACCEPTANCE_TOPK, score
from specwire.decode.lookup import LookupModel, expected_copied, tail_length
from specwire.target.cpu import cpu_features, native_bf16
from specwire.target.hardware import CacheKey, CostCurve, KernelChoice, PASS_TOKENS, measure_curve, read_cache, write_cache
from specwire.safeio import specwire_home
from specwire.target.load import Target, load_target

log = logging.getLogger("specwire")
DRAFT_STEP_FRACTION = 0.05  # a draft step's cost relative to a one-token pass on its kernel, for ranking kernels only
# The share of speculative rounds in which the context lookup finds a copy, for ranking kernels only: with the
# built-in target and shipped draft (version 10), 14% of the chain's rounds on MT-bench and 36% on HumanEval.
COPY_SHARE = 0.25
INVARIANCE_SIZES = (2, 17)  # pass sizes of the profile's bitwise check (chain and tree)
# The leading candidates of a fresh profile, re-measured side by side (`settle`): at most this many, and only
# those the first measurements put within this share of the best rate.
FINALISTS, FINALIST_MARGIN = 3, 0.25


def kernel_of(target: Target) -> KernelChoice:
    """The kernel a loaded target runs."""
    from specwire.target.fastlinear import linear_kind

    return KernelChoice(str(target.dtype).replace("torch.", ""), linear_kind(target.model))


def candidate_kernels(device: str = "cpu", features: dict[str, bool] | None = None) -> list[KernelChoice]:
    """fp32 always (with the compiled rowdot kernel where it runs); bf16 where the hardware computes it natively."""
    from specwire.target.amx import available as amx_available
    from specwire.target.bf16dot import available as bf16dot_available
    from specwire.target.fastlinear import onednn_available
    from specwire.target.rowdot import available

    if device.startswith("cuda"):
        return [KernelChoice("bfloat16"), KernelChoice("float32")]
    out = [KernelChoice("float32"), KernelChoice("float32", "pretransposed")]
    ok, why = available()
    if ok:
        out.append(KernelChoice("float32", "rowdot"))
    else:
        log.info("float32/rowdot is not a candidate here: %s", why)
    if native_bf16(features):
        out += [KernelChoice("bfloat16"), KernelChoice("bfloat16", "pretransposed")]
        for linear, (ok, why) in (("onednn", onednn_available()), ("rowdot", bf16dot_available()),
                                  ("amx", amx_available())):
            if ok:
                out.append(KernelChoice("bfloat16", linear))
            else:
                log.info("bfloat16/%s is not a candidate here: %s", linear, why)
    return out


def _check(target: Target) -> bool:
    from specwire.decode.invariance import pass_invariance

    prompt = target.encode_chat("Name three rivers and say where each one reaches the sea.")
    return pass_invariance(target, [prompt], sizes=INVARIANCE_SIZES).ok


def profile_kernel(name_or_path: str, kernel: KernelChoice, *, device: str = "cpu", reps: int = 5,
                   tokens=PASS_TOKENS) -> CostCurve:
    """Load the target with `kernel`, check its passes bitwise, measure its curve, and cache the result."""
    target = load_target(name_or_path, device=device, dtype=kernel.dtype, linear=kernel.linear)
    return curve_for_loaded(target, reps=reps, tokens=tokens, check=True)


def curve_for_loaded(target: Target, *, reps: int = 5, tokens=PASS_TOKENS, check: bool = False) -> CostCurve:
    """Measure (and cache) the cost curve of a loaded target; `check` also runs the bitwise pass check."""
    from specwire.target.fastlinear import linear_min_rows

    kernel = kernel_of(target)
    log.info("measuring the pass cost of %s with %s on this machine (once; cached under %s)",
             target.info.name, kernel.name, specwire_home() / "hardware")
    curve = measure_curve(target, kernel, min_rows=linear_min_rows(target.model), tokens=tokens, reps=reps)
    if check:
        curve.invariant = _check(target)
    _remember(target, [curve])
    return curve


def _remember(target: Target, curves: list[CostCurve]) -> None:
    """Cache `curves`, measured on `target`, under this machine's key (a warning where the cache is not writable)."""
    try:
        write_cache(CacheKey.here(target.spec.fingerprint, target.device.type), specwire_home(),
                    curves={c.kernel: c for c in curves})
    except OSError as e:
        log.warning("could not cache the cost curves under %s (%s)", specwire_home(), e)


_curves: "weakref.WeakKeyDictionary[torch.nn.Module, CostCurve]" = weakref.WeakKeyDictionary()


def cost_curve(target: Target) -> CostCurve:
    """The pass-cost curve of the kernel `target` runs: from the cache when measured under exactly this
    machine's key, else measured now on `target` itself (a few seconds) and cached."""
    if target.model in _curves:
        return _curves[target.model]
    key = CacheKey.here(target.spec.fingerprint, target.device.type)
    curve = read_cache(key, specwire_home()).curves.get(kernel_of(target).name)
    if curve is None:
        curve = curve_for_loaded(target)
    _curves[target.model] = curve
    return curve


def reference_acceptance() -> AcceptanceModel:
    """The shipped draft's offline acceptance (a cautious prior when it has none)."""
    from specwire.draft.acceptance import read_acceptance
    from specwire.draft.checkpoint import shipped_draft_dir

    acc = read_acceptance(shipped_draft_dir())
    if acc is None:
        return AcceptanceModel(list(DEFAULT_ACCEPTANCE), list(DEFAULT_ACCEPTANCE_TOPK))
    return AcceptanceModel(acc.step_accuracy, acc.step_accuracy_topk, acc.topk)


@dataclass(frozen=True)
class Workload:
    """What a ranking prices: speculative decoding with a draft (`lookup`: the context lookup's cap on copied
    tokens a round, 0 when off), or plain decoding (`speculative` False)."""

    speculative: bool = True
    lookup: int = 0

    @classmethod
    def of(cls, *, draft: bool, lookup: int = 0) -> "Workload":
        return cls(speculative=draft, lookup=lookup if draft else 0)


REFERENCE = Workload(speculative=True, lookup=8)  # what the defaults choose by: `SpecConfig`'s default lookup


@dataclass
class KernelRanking:
    kernel: KernelChoice
    curve: CostCurve
    expected_tokens_per_s: float  # under `auto`, with the reference acceptance (plain decoding: one pass a token)
    budget: str  # the budget that rate assumes


def draft_step_basis(name: str, curves: dict[str, CostCurve]) -> float:
    """The one-token pass (ms) that a draft step beside a target on kernel `name` is taken as a fraction of: that of
    the kernel the served draft runs (`decode.draft_step.served_draft_kernel`). A bf16 target on a CPU kernel other
    than AMX serves a rowdot draft where rowdot runs (it is then a candidate: float32/rowdot has a curve here);
    every other target's draft runs the target's own kind of kernel."""
    from specwire.decode.draft_step import served_draft_kernel

    kernel = KernelChoice.parse(name)
    rowdot = curves.get(KernelChoice("float32", "rowdot").name)
    served = served_draft_kernel(kernel.dtype, kernel.linear, rowdot_runs=rowdot is not None)
    return rowdot.at(1) if served == "rowdot" else curves[name].at(1)


def with_copies(choice: Choice, cost: CostModel, lookup: int, share: float = COPY_SHARE) -> tuple[float, float, int]:
    """A budget's expected (tokens, ms) per round when `share` of its rounds also verify a copy of up to `lookup`
    tokens, cut as `auto` cuts it (`lookup.tail_length`, at the lookup's prior acceptance), and that cut."""
    if not lookup:
        return choice.tokens_per_round, choice.ms_per_round, 0
    T = choice.budget.pass_tokens
    rates = LookupModel().rates(lookup)
    tail = tail_length(rates, 0, lookup, choice.tokens_per_round, choice.ms_per_round,
                       lambda t: cost.target(T + t) - cost.target(T))
    extra_ms = cost.target(T + tail) - cost.target(T) if tail else 0.0
    return (choice.tokens_per_round + share * expected_copied(rates, 0, tail),
            choice.ms_per_round + share * extra_ms, tail)


def expected_rate(curve: CostCurve, draft_step_ms: float, acceptance: AcceptanceModel,
                  workload: Workload) -> tuple[float, str]:
    """Tokens per second that `workload` would expect on `curve`, and the budget that assumes (plain: 'none')."""
    if not workload.speculative:
        return 1000.0 / curve.at(1), Budget(0).label()
    cost = CostModel(dict(zip(curve.tokens, curve.ms)), {w: draft_step_ms for w in (1, 2, 3, 4)})
    best = (0.0, "")
    for choice in score(acceptance, cost, max_steps=acceptance.depth, max_topk=4, max_tokens=16, tree=True):
        tokens, ms, tail = with_copies(choice, cost, workload.lookup)
        rate = 1000.0 * tokens / ms if ms > 0 else 0.0
        if rate > best[0] * (1 + 1e-9):
            best = (rate, choice.budget.label() + (f", copies up to {tail}" if tail else ""))
    return best


def rank_kernels(curves: dict[str, CostCurve], acceptance: AcceptanceModel,
                 workload: Workload = REFERENCE) -> list[KernelRanking]:
    """Invariant candidates, fastest first (by the tokens/s `workload` would expect: `expected_rate`)."""
    out = []
    for name, curve in curves.items():
        if curve.invariant is False:
            continue
        rate, budget = expected_rate(curve, DRAFT_STEP_FRACTION * draft_step_basis(name, curves), acceptance, workload)
        out.append(KernelRanking(KernelChoice.parse(name), curve, rate, budget))
    return sorted(out, key=lambda r: -r.expected_tokens_per_s)


def default_kernel(name_or_path: str, *, device: str = "cpu",
                   progress: bool = True) -> tuple[KernelChoice, list[KernelRanking]]:
    """The fastest batch-invariant kernel for this target on this machine, by the `REFERENCE` workload (profiling
    missing candidates once, then settling the leaders side by side: `settle`)."""
    from specwire.target.load import target_info

    fingerprint = _fingerprint(name_or_path)
    key = CacheKey.here(fingerprint, device)
    cached = read_cache(key, specwire_home()).curves
    curves, fresh = {}, False
    for kernel in candidate_kernels(device):
        curve = cached.get(kernel.name)
        if curve is None or curve.invariant is None:
            note = (f"profiling {target_info(name_or_path).name} with {kernel.name} on this machine: bitwise check and "
                    f"pass costs (once; cached under {specwire_home() / 'hardware'})")
            if progress and sys.stderr.isatty():
                print(f"specwire: {note}", file=sys.stderr, flush=True)
            log.info(note)
            curve, fresh = profile_kernel(name_or_path, kernel, device=device), True
        curves[kernel.name] = curve
    if fresh:
        curves = settle(name_or_path, curves, device=device, progress=progress)
    ranking = rank_kernels(curves, reference_acceptance(), REFERENCE)
    if not ranking:
        return KernelChoice("float32"), ranking
    return ranking[0].kernel, ranking


def finalists(ranking: list[KernelRanking]) -> list[str]:
    """The kernels worth a second, side-by-side measurement: the first `FINALISTS` of `ranking` that are expected
    within `FINALIST_MARGIN` of the best rate (one or none: nothing to settle)."""
    if not ranking:
        return []
    floor = (1 - FINALIST_MARGIN) * ranking[0].expected_tokens_per_s
    return [r.kernel.name for r in ranking[:FINALISTS] if r.expected_tokens_per_s >= floor]


def settle(name_or_path: str, curves: dict[str, CostCurve], *, device: str = "cpu", reps: int = 5,
           progress: bool = False) -> dict[str, CostCurve]:
    """`curves` with the leaders' (`finalists` under `REFERENCE`) measured again side by side, all loaded at once
    (`hardware.measure_curves`), and cached.

    Why: each candidate is first profiled alone, one after another, and a burst of load on a shared machine
    during one of them bends its curve alone; on a 2-core Zen 4 two busy profiles ranked bfloat16/onednn and
    float32/rowdot first where a quiet one ranks bfloat16/rowdot first. The choice is cached for good, so the
    leaders are measured again interleaved, pass by pass, where a burst bends them all alike. Loads as many of
    them as memory holds (`hardware.memory_available`: each copy needs what the first took, twice over); with
    fewer than two loaded, the curves stay as they were."""
    from specwire.target.fastlinear import linear_min_rows
    from specwire.target.hardware import loaded_bytes, measure_curves, memory_available

    names = finalists(rank_kernels(curves, reference_acceptance(), REFERENCE))
    if len(names) < 2 or all(set(curves[n].beside) >= set(names) - {n} for n in names):
        return curves  # nothing to settle, or settled already
    note = f"measuring the leading kernels again side by side: {', '.join(names)}"
    if progress and sys.stderr.isatty():
        print(f"specwire: {note}", file=sys.stderr, flush=True)
    log.info(note)
    kernels, targets = [KernelChoice.parse(n) for n in names], []
    for kernel in kernels:
        if targets:
            free, need = memory_available(device), 2 * loaded_bytes(targets[0].model)
            if free is None or free < need:
                log.info("not loading %s beside the others: %s", kernel.name, "free memory unknown" if free is None
                         else f"{free / 2**30:.1f} GiB free, {need / 2**30:.1f} GiB wanted")
                break
        targets.append(load_target(name_or_path, device=device, dtype=kernel.dtype, linear=kernel.linear))
    if len(targets) < 2:
        return curves
    measured = measure_curves(targets, kernels[:len(targets)], min_rows=[linear_min_rows(t.model) for t in targets],
                              reps=reps)
    for curve in measured:
        curve.invariant = curves[curve.kernel].invariant
    _remember(targets[0], measured)
    return curves | {c.kernel: c for c in measured}


def _fingerprint(name_or_path: str) -> str:
    """The target fingerprint, remembered per weights file (path, size, mtime) under $SPECWIRE_HOME/hardware, so
    that `--dtype auto` loads the weights a second time only the first time it sees them."""
    import json

    from specwire.safeio import write_json
    from specwire.target.load import resolve_target_path

    folder = resolve_target_path(name_or_path)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    stamp = "|".join(f"{f.resolve()}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    memo_path = specwire_home() / "hardware" / "fingerprints.json"
    try:
        memo = json.loads(memo_path.read_text()) if memo_path.is_file() else {}
    except (OSError, ValueError):
        memo = {}
    if isinstance(memo, dict) and isinstance(memo.get(stamp), str):
        return memo[stamp]
    fingerprint = load_target(name_or_path, device="cpu", dtype="float32", attention="sdpa").spec.fingerprint
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        kept = list((memo if isinstance(memo, dict) else {}).items())[-63:]  # the 64 most recent targets
        write_json(memo_path, {**dict(kept), stamp: fingerprint})
    except OSError as e:
        log.warning("could not remember the target fingerprint under %s (%s)", memo_path.parent, e)
    return fingerprint


def resolve_kernel(name_or_path: str, dtype: str, linear: str, *, device: str | None = None) -> KernelChoice:
    """`--dtype auto` / `--linear auto` -> the default kernel's; explicit values are kept."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype != "auto" and linear != "auto":
        return KernelChoice(dtype, linear)
    best, ranking = default_kernel(name_or_path, device=device)
    if dtype == "auto":
        return KernelChoice(best.dtype, best.linear if linear == "auto" else linear)
    # an explicit dtype: the fastest measured linear of that dtype (the overall best may be another dtype's,
    # such as rowdot, a float32 kernel), else the stock one
    of_dtype = [r.kernel for r in ranking if r.kernel.dtype == dtype]
    return KernelChoice(dtype, of_dtype[0].linear if of_dtype else "torch")


def load_decoding_target(name_or_path: str, *, device: str | None = None, dtype: str = "auto",
                         linear: str = "auto") -> Target:
    """Load a target for decoding: `auto` dtype/linear resolved to this machine's fastest invariant kernel."""
    k = resolve_kernel(name_or_path, dtype, linear, device=device)
    return load_target(name_or_path, device=device, dtype=k.dtype, linear=k.linear)


def describe_features() -> str:
    """'amx_bf16, avx512_bf16' style list of the CPU features that decide kernel speed ('none' if none)."""
    on = [f for f, v in cpu_features().items() if v and f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2")]
    return ", ".join(on) or "none"
