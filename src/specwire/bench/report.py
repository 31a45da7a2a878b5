"""How benchmark results look: the Markdown table, the run's results.md, the terminal summary, the PNG.

Owns rendering only; the numbers come ready-made in a `bench.config.BenchReport` (this module
computes nothing but formatting). Does not run or summarise anything (`bench.run`, `bench.summary`).
The plot uses matplotlib's Agg backend (no display needed).
"""

from __future__ import annotations

from pathlib import Path

from specwire.bench.config import BenchReport


def _num(x, fmt: str = "{:.1f}", none: str = "–") -> str:
    if x is None or x != x:  # None or NaN
        return none
    return fmt.format(x)


def render_table(report: BenchReport) -> str:
    """The results as one Markdown table (one row per method)."""
    rows = [
        "| method | tok/s | vs hf-generate | vs plain | accept length | tokens/forward | lossless | draft / verify / plain / other (s) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in report.results:
        lossless = "yes" if r.lossless else f"**no** ({r.mismatches}/{len(report.prompt_ids)} differ)"
        split = "–"
        if r.time_split:
            s = r.time_split
            split = f"{s['draft_s']:.1f} / {s['verify_s']:.1f} / {s.get('plain_s', 0.0):.1f} / {s['other_s']:.1f}"
        rows.append(
            f"| {r.method} | {_num(r.tokens_per_s)} | {_num(r.speedup_vs_hf, '{:.2f}x')} | {_num(r.speedup_vs_plain, '{:.2f}x')} "
            f"| {_num(r.accept_length, '{:.2f}')} | {_num(r.tokens_per_forward, '{:.2f}')} | {lossless} | {split} |"
        )
    return "\n".join(rows)


def render_positions(report: BenchReport) -> str:
    """Acceptance per draft position for the draft methods, as a Markdown table ('' when none)."""
    rows = [r for r in report.results if r.accept_per_position]
    if not rows:
        return ""
    width = max(len(r.accept_per_position) for r in rows)
    out = ["| method | " + " | ".join(f"pos {i}" for i in range(width)) + " |",
           "|---|" + "---:|" * width]
    for r in rows:
        cells = [f"{v:.2f}" for v in r.accept_per_position] + ["–"] * (width - len(r.accept_per_position))
        out.append(f"| {r.method} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def render_profile(report: BenchReport, *, goal: float = 2.5) -> str:
    """Where a draft method's time goes, in units of one plain decoding step ('' without draft methods).

    Per verify round (one target pass plus the draft steps before it): ms in verify, draft and the rest, and
    the round's cost over plain's ms per token. The plain steps that `--budget auto` took instead of rounds are
    timed apart (`plain_s`) and left out, so they do not inflate the cost of a round. That cost is the accept length at which the method breaks
    even with plain; `goal` times the round's cost over hf-generate's ms per token is the accept length a
    `goal`x speed-up over hf-generate needs.
    """
    plain, hf = report.result("plain"), report.result("hf-generate")
    rows = [r for r in report.results if r.time_split and r.time_split.get("verify_passes")]
    if not rows or plain is None or not plain.tokens:
        return ""
    plain_ms = 1000 * plain.seconds / plain.tokens
    hf_ms = 1000 * hf.seconds / hf.tokens if hf is not None and hf.tokens else None
    out = [f"| method | verify ms / round | draft ms / round | other ms / round | round / plain step "
           f"| accept length: break-even | accept length: {goal:g}x hf-generate | reached |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        s, n = r.time_split, r.time_split["verify_passes"]
        v, d, o = (1000 * s[k] / n for k in ("verify_s", "draft_s", "other_s"))
        round_ms = v + d + o
        need = goal * round_ms / hf_ms if hf_ms else None
        out.append(f"| {r.method} | {v:.1f} | {d:.1f} | {o:.1f} | {round_ms / plain_ms:.2f}x | {round_ms / plain_ms:.2f} "
                   f"| {_num(need, '{:.2f}')} | {_num(r.accept_length, '{:.2f}')} |")
    return "\n".join(out) + f"\n\nplain: {plain_ms:.1f} ms per token" + (f"; hf-generate: {hf_ms:.1f} ms" if hf_ms else "")


def speedup_sentence(report: BenchReport) -> str:
    """One line stating the best draft method's speed-up over both baselines (or why there is none)."""
    best = report.best_draft_method
    if best is None:
        plain, hf = report.result("plain"), report.result("hf-generate")
        if plain and hf and plain.speedup_vs_hf:
            return f"plain decoding runs at {plain.speedup_vs_hf:.2f}x hf-generate (no draft method in this run)."
        return "no draft method in this run."
    parts = []
    if best.speedup_vs_hf is not None:
        parts.append(f"{best.speedup_vs_hf:.2f}x hf-generate")
    if best.speedup_vs_plain is not None:
        parts.append(f"{best.speedup_vs_plain:.2f}x plain")
    acc = f", accept length {best.accept_length:.2f}" if best.accept_length is not None else ""
    loss = "output identical to greedy" if best.lossless else f"OUTPUT DIFFERS from greedy on {best.mismatches} prompt(s)"
    return f"best: {best.method} at {best.tokens_per_s:.1f} tok/s = {' and '.join(parts)}{acc}; {loss}."


def render_categories(report: BenchReport) -> str:
    """Per prompt category: prompts, plain's tok/s, and each draft method's speed-up over plain, accept length and
    position-0 acceptance ('' unless the prompts hold two or more categories and a draft method ran)."""
    if not report.by_category:
        return ""
    drafts = [r.method for r in next(iter(report.by_category.values())) if r.accept_length is not None]
    if not drafts:
        return ""
    rows = ["| category | prompts | plain tok/s | " + " | ".join(f"{m}: vs plain, accept length, pos 0" for m in drafts) + " |",
            "|---|---:|---:|" + "---:|" * len(drafts)]
    for cat, results in report.by_category.items():
        by = {r.method: r for r in results}
        plain = by.get("plain")
        cells = [f"{_num(by[m].speedup_vs_plain, '{:.2f}x')}, {_num(by[m].accept_length, '{:.2f}')}, "
                 f"{_num((by[m].accept_per_position or [None])[0], '{:.2f}')}" for m in drafts]
        rows.append(f"| {cat} | {report.prompts_in(cat)} | {_num(plain.tokens_per_s if plain else None)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_budgets(report: BenchReport) -> str:
    """One line per draft method: the speculation budgets its rounds ran with, most used first."""
    lines = []
    for r in report.results:
        if r.budgets:
            used = ", ".join(f"{label} x{n}" for label, n in sorted(r.budgets.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {r.method:<14} {used}")
    return "\n".join(lines)


def render_lookup(report: BenchReport) -> str:
    """One line per draft method that verified copied tokens (`decode.lookup`): how often, and what they gave."""
    lines = []
    for r in report.results:
        c = r.lookup
        if c and c["rounds"]:
            passes = (r.time_split or {}).get("verify_passes") or 0
            per = f", {c['accepted'] / passes:.2f} a verify pass" if passes else ""
            lines.append(f"  {r.method:<14} {c['rounds']} rounds verified {c['tokens']} copied tokens; "
                         f"{c['accepted']} accepted beyond the draft's{per}")
    return "\n".join(lines)


def render_summary(report: BenchReport) -> str:
    """What `specwire bench` prints: the table, per-position acceptance, the speed-up line, the folder."""
    c = report.config
    head = (f"{report.config.prompts}: {len(report.prompt_ids)} prompts, {c.max_new_tokens} new tokens, "
            f"{report.machine.get('dtype')}, {report.machine.get('threads')} threads on {report.machine.get('device')}")
    parts = [head, "", render_table(report)]
    pos = render_positions(report)
    if pos:
        parts += ["", "acceptance per draft position:", pos]
    budgets = render_budgets(report)
    if budgets:
        parts += ["", f"speculation budget ({report.config.spec.budget}), rounds per choice ('none': plain steps):",
                  budgets]
    copies = render_lookup(report)
    if copies:
        parts += ["", f"context lookup (up to {report.config.spec.lookup} copied tokens a round):", copies]
    parts += ["", speedup_sentence(report)]
    parts += [f"note: {n}" for n in report.notes]
    if report.run_dir:
        parts.append(f"written: {report.run_dir}/results.md, results.png, results.json")
    return "\n".join(parts)


def render_markdown(report: BenchReport) -> str:
    """The full results.md of a run: table, acceptance, command, settings, machine."""
    c, m = report.config, report.machine
    lines = [f"# specwire bench: {c.prompts}", "", render_table(report), ""]
    pos = render_positions(report)
    if pos:
        lines += ["Acceptance per draft position k: among verify passes that reached k (positions before it all "
                  "accepted), the fraction that accepted a draft token at k ('–': no pass drafted that deep).", "", pos, ""]
    budgets = render_budgets(report)
    if budgets:
        lines += [f"Speculation budget ({c.spec.budget}): verify rounds run with each choice ('none': plain steps).", "",
                  "```", budgets, "```", ""]
    copies = render_lookup(report)
    if copies:
        lines += [f"Context lookup (up to {c.spec.lookup} tokens a round copied from where the text's last words "
                  "occurred before, verified beside the draft's; the accept length includes the copied tokens "
                  "accepted, the acceptance per position only the draft's):", "", "```", copies, "```", ""]
    lines += [speedup_sentence(report), ""]
    cats = render_categories(report)
    if cats:
        lines += ["## By prompt category", "",
                  "The same runs, summed over each category's prompts alone (speed-up over plain on those prompts; "
                  "pos 0: the share of rounds whose first draft token was accepted).", "", cats, ""]
    prof = render_profile(report)
    if prof:
        lines += ["## Where the time goes", "",
                  "Per verify round (one target pass and the draft steps before it), from the engine's timers. A round "
                  "costing c plain steps pays off when it yields more than c tokens: c is the break-even accept length. "
                  "The prompt's prefill counts in verify, as it counts in plain's time per token.",
                  "", prof, ""]
    for n in report.notes:
        lines.append(f"Note: {n}")
    if report.notes:
        lines.append("")
    lines += ["## Command", "", "```", c.command or c.cli_command(), "```", "",
              "## Settings", ""]
    lines += [
        f"- target: `{c.target}`",
        f"- draft: `{c.draft}`" if c.needs_draft else "- draft: none (no eagle3 method)",
        f"- prompts: `{c.prompts}`, {len(report.prompt_ids)} prompts (first: {', '.join(report.prompt_ids[:3])}"
        f"{', ...' if len(report.prompt_ids) > 3 else ''})",
        f"- max new tokens: {c.max_new_tokens}; greedy; batch 1; warm-up {c.warmup_tokens} tokens per method",
        "- order: prompt-major, method order rotated per prompt",
    ]
    if report.spec:
        lines.append("- speculation: " + ", ".join(f"{k}={v}" for k, v in report.spec.items()))
    lines += ["", "## Machine", ""]
    lines += [f"- {k}: {v}" for k, v in m.items()]
    lines += ["", "tok/s = generated tokens / generation seconds, summed over prompts (prefill included, model loading "
              "and warm-up excluded). Accept length = mean tokens per verify pass (accepted draft tokens + the bonus "
              "token); tokens/forward also counts the prefill pass. Lossless = output identical to plain greedy "
              "decoding on every prompt. Draft / verify / other: wall time summed over prompts, as the engine splits it.",
              ""]
    return "\n".join(lines)


def save_plot(report: BenchReport, path: str | Path) -> Path:
    """Two panels: tok/s per method (bars), and acceptance per draft position (eagle3 methods)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    from specwire.safeio import save_png

    fig = Figure(figsize=(11, 4.2), dpi=110)
    ax1, ax2 = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1.2, 1]})
    names = [r.method for r in report.results]
    speeds = [r.tokens_per_s if r.tokens_per_s == r.tokens_per_s else 0.0 for r in report.results]
    colors = ["#4c72b0" if r.method.startswith("hf-") else "#55a868" if r.method == "plain" else "#dd8452"
              for r in report.results]
    bars = ax1.bar(names, speeds, color=colors)
    for b, r in zip(bars, report.results):
        label = f"{r.tokens_per_s:.1f}" + ("" if r.lossless else "\nnot lossless")
        ax1.annotate(label, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax1.set_ylabel("tokens / s")
    n = len(report.prompt_ids)
    ax1.set_title(f"{Path(report.config.prompts).name}, {n} prompt{'s' if n != 1 else ''}, "
                  f"{report.config.max_new_tokens} new tokens, {report.machine.get('dtype')}")
    ax1.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax1.set_ylim(0, max(speeds + [1.0]) * 1.2)

    drawn, width = False, 0
    for r in report.results:
        if r.accept_per_position:
            xs = list(range(len(r.accept_per_position)))
            ax2.plot(xs, r.accept_per_position, marker="o", label=r.method)
            drawn, width = True, max(width, len(xs))
    if drawn:
        ax2.set_xticks(list(range(width)))
        ax2.set_xlabel("draft position (0 = first drafted token)")
        ax2.set_ylabel("acceptance rate")
        ax2.set_ylim(0, 1.05)
        ax2.legend(fontsize=8)
    else:
        ax2.text(0.5, 0.5, "no draft method in this run", ha="center", va="center", transform=ax2.transAxes)
        ax2.set_xticks([])
        ax2.set_yticks([])
    ax2.set_title("acceptance per draft position")
    return save_png(fig, path)
