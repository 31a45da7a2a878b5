"""The summary maths of a bench run (pure functions, no models): from raw runs to per-method results.

Owns: the first difference between two outputs (the lossless check), tokens per second, accept length
weighted by verify passes, acceptance per draft position (pooled counts), the draft/verify/other time
split, the speed-ups over `hf-generate` and over `plain`, and the same per prompt category. Does not run
anything (`bench.run`) or format anything (`bench.report`).
"""

from __future__ import annotations

from typing import Sequence

from specwire.bench.config import BASELINE, DRAFT_METHODS, REFERENCE, MethodResult, PromptRun
from specwire.errors import SpecwireError


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two id lists differ (length counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def weighted_positions(rows: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """Per-position mean of rate rows of possibly different lengths, each row weighted (by its passes)."""
    width = max((len(r) for r in rows), default=0)
    out = []
    for i in range(width):
        num = sum(r[i] * w for r, w in zip(rows, weights) if i < len(r))
        den = sum(w for r, w in zip(rows, weights) if i < len(r))
        out.append(num / den if den > 0 else 0.0)
    return out


def _sum_rows(rows: Sequence[Sequence[float]]) -> list[float]:
    width = max((len(r) for r in rows), default=0)
    return [float(sum(r[i] for r in rows if i < len(r))) for i in range(width)]


def summarize_method(method: str, runs: Sequence[PromptRun], reference: dict[str, list[int]]) -> MethodResult:
    """Aggregate one method's runs; `reference` maps prompt id -> plain greedy output ids."""
    tokens = sum(len(r.output_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    fwd = None if any(r.target_forwards is None for r in runs) else sum(r.target_forwards for r in runs)
    mismatches, first = 0, None
    for r in runs:
        pos = first_difference(r.output_ids, reference[r.prompt_id])
        if pos is not None:
            mismatches += 1
            first = first or {"prompt_id": r.prompt_id, "position": pos}
    accept = per_pos = split = lookup = None
    if method in DRAFT_METHODS:
        # Weight each request by its verify passes so the aggregate keeps the engine's definition.
        passes = [float(r.extra.get("num_verify_passes") or 0) for r in runs]
        if all("accept_length" in r.extra for r in runs) and sum(passes) > 0:
            accept = sum(float(r.extra["accept_length"]) * p for r, p in zip(runs, passes)) / sum(passes)
        elif fwd:
            accept = tokens / fwd
        if all("accept_counts" in r.extra and "reach_counts" in r.extra for r in runs):
            # exact: accepted / reached, summed over requests
            acc, reach = _sum_rows([r.extra["accept_counts"] for r in runs]), _sum_rows([r.extra["reach_counts"] for r in runs])
            # positions no pass reached (deeper than any budget drafted) have no rate: left out, not shown as 0
            per_pos = [a / n for a, n in zip(acc, reach) if n > 0]
        else:
            rows = [r.extra.get("accept_per_position") or [] for r in runs]
            per_pos = weighted_positions(rows, passes if sum(passes) > 0 else [1.0] * len(rows))
        split = {k: sum(float(r.extra.get(k) or 0.0) for r in runs) for k in ("draft_s", "verify_s", "plain_s", "other_s")}
        split["verify_passes"] = int(sum(passes))
        budgets: dict[str, int] = {}
        for r in runs:  # rounds per speculation budget ("none" counts plain steps under --budget auto)
            for label, n in ((r.extra.get("budget_used") or {}).get("budgets_used") or {}).items():
                budgets[label] = budgets.get(label, 0) + int(n)
        copies = [r.extra["lookup"] for r in runs if r.extra.get("lookup")]  # runs recorded before lookup have none
        lookup = {k: sum(int(c.get(k) or 0) for c in copies) for k in ("rounds", "tokens", "accepted")} if copies else None
    return MethodResult(
        method=method, tokens=tokens, seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else float("nan"),
        target_forwards=fwd, tokens_per_forward=(tokens / fwd) if fwd else None,
        accept_length=accept, accept_per_position=per_pos,
        lossless=mismatches == 0, mismatches=mismatches, first_mismatch=first, time_split=split,
        budgets=budgets if method in DRAFT_METHODS else None, lookup=lookup if method in DRAFT_METHODS else None,
    )


def add_speedups(results: Sequence[MethodResult]) -> None:
    """Fill speedup_vs_hf and speedup_vs_plain from the tok/s of the same run (None when a baseline is absent)."""
    by = {r.method: r for r in results}
    for r in results:
        for attr, base in (("speedup_vs_hf", BASELINE), ("speedup_vs_plain", REFERENCE)):
            b = by.get(base)
            ok = b is not None and b.tokens_per_s > 0 and r.tokens_per_s == r.tokens_per_s
            setattr(r, attr, r.tokens_per_s / b.tokens_per_s if ok else None)


def summarize(runs: Sequence[PromptRun], methods: Sequence[str]) -> list[MethodResult]:
    """All methods' results from the raw runs (reference = `plain`), speed-ups included."""
    reference = {r.prompt_id: r.output_ids for r in runs if r.method == REFERENCE}
    if not reference:
        raise SpecwireError("bench: no plain reference run; the lossless check needs `plain`.")
    results = [summarize_method(m, [r for r in runs if r.method == m], reference) for m in methods]
    add_speedups(results)
    return results


def summarize_by_category(runs: Sequence[PromptRun], methods: Sequence[str],
                          categories: dict[str, str]) -> dict[str, list[MethodResult]]:
    """`summarize` over each prompt category's runs alone, categories in first-run order.

    `categories` maps prompt id -> category ("" when unknown; such prompts join no category). Returns {} unless
    the run holds at least two categories: one category is the whole run, already summarised.
    """
    order = list(dict.fromkeys(categories[r.prompt_id] for r in runs if categories.get(r.prompt_id)))
    if len(order) < 2:
        return {}
    return {cat: summarize([r for r in runs if categories.get(r.prompt_id) == cat], methods) for cat in order}
