"""Plot a learning curve (held-out accuracy of training snapshots, or of every shipped version) as a PNG.

    python tools/plot_learning_curve.py                      # version 2: docs/draft-build/learning-curve.png
    python tools/plot_learning_curve.py docs/draft-build/learning-curve-v3.json docs/draft-build/learning-curve-v3.png \\
        --xlabel "self-instruct conversations seen (0: the stage-1 draft)"
    python tools/plot_learning_curve.py docs/draft-build/versions.json docs/draft-build/versions.png

A stage's JSON is a list of points, each with `conversations_seen` and, per held-out set, the `specwire eval`
result (`step_accuracy`, `predicted_accept_length`): what `tools/draft/snapshots.py` writes. Left: step-0
accuracy; right: predicted chain accept length; x: conversations the draft had seen.

Each stage's curve starts from the version before it. `versions.json` joins them: `{"versions": [...]}`, one
record per shipped version, `{"version", "distinct_conversations", "conversations_seen", "mtbench":
{"accept_length", "step0"}, "humaneval": {...}, "source"}`, its figures copied from the `specwire eval` JSON
named in `source`. Its plot has one point per version at the conversations seen over all its stages, labelled
with the distinct training conversations in their data, and the accept-length goals drawn across.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specwire.errors import SpecwireError  # noqa: E402
from specwire.safeio import save_png  # noqa: E402

BUILD = Path(__file__).resolve().parents[1] / "docs" / "draft-build"
LABELS = {"mtbench": "MT-bench", "humaneval": "HumanEval"}
GOALS = {"mtbench": 2.2, "humaneval": 2.4}  # the draft issue's held-out accept-length bars


def plot(curve: list[dict], png: Path, *, xlabel: str, vline: float | None = None,
         title: str = "smollm2-135m-eagle3: held-out accuracy during training") -> None:
    seen = [p["conversations_seen"] for p in curve]
    sets = [k for k in curve[0] if isinstance(curve[0][k], dict) and "step_accuracy" in curve[0][k]]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(9, 3.4))
    for key in sets:
        a0.plot(seen, [p[key]["step_accuracy"][0] for p in curve], marker="o", label=LABELS.get(key, key))
        a1.plot(seen, [p[key]["predicted_accept_length"] for p in curve], marker="o", label=LABELS.get(key, key))
    a0.set_ylabel("step-0 accuracy (held out)")
    a1.set_ylabel("predicted chain accept length")
    for ax in (a0, a1):
        ax.set_xlabel(xlabel)
        if vline is not None:
            ax.axvline(vline, color="grey", lw=0.8, ls=":")
        ax.legend()
    fig.suptitle(title)
    save_png(fig, png, dpi=110)


def check_versions(doc: dict, where: Path) -> list[dict]:
    """The version records of a versions.json, each with every field the plot reads (else a clear error)."""
    records = doc.get("versions")
    if not isinstance(records, list) or not records:
        raise SpecwireError(f"{where}: field 'versions': expected a non-empty list of records, found "
                            f"{type(records).__name__}.")
    for i, r in enumerate(records):
        for key in ("version", "distinct_conversations", "conversations_seen", *GOALS):
            if key not in r:
                raise SpecwireError(f"{where}: record {i} has no field {key!r}.")
        for key in GOALS:
            if not isinstance(r[key].get("accept_length"), (int, float)):
                raise SpecwireError(f"{where}: record {i} ({r['version']}): {key}.accept_length is not a number.")
    return records


def plot_versions(records: list[dict], png: Path) -> None:
    x = [r["conversations_seen"] for r in records]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    for key, goal in GOALS.items():
        line, = ax.plot(x, [r[key]["accept_length"] for r in records], marker="o", label=f"{LABELS[key]} (goal {goal})")
        ax.axhline(goal, color=line.get_color(), lw=0.8, ls="--")
    for r, xi in zip(records, x):  # one label per version, above its higher point
        top = max(r[key]["accept_length"] for key in GOALS)
        ax.annotate(f"{r['version']}\n{r['distinct_conversations'] / 1000:.1f}k", (xi, top), textcoords="offset points",
                    xytext=(0, 8), ha="center", fontsize=8)
    ax.set_xlabel("conversations seen in training, all stages (label: distinct conversations in its data)")
    ax.set_ylabel("predicted chain accept length (5 steps, held out)")
    ax.set_title("smollm2-135m-eagle3: held-out accept length by version")
    highest = max(r[key]["accept_length"] for r in records for key in GOALS)
    ax.set_ylim(top=max(*GOALS.values(), highest) + 0.2)  # room for the labels above the highest point
    ax.set_xlim(right=max(x) * 1.06)
    ax.legend(loc="lower right")
    save_png(fig, png, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", type=Path, default=BUILD / "learning-curve.json")
    ap.add_argument("png", nargs="?", type=Path, default=BUILD / "learning-curve.png")
    ap.add_argument("--xlabel", default="conversations seen (3,160 unique; 2 epochs)")
    ap.add_argument("--vline", type=float, default=None, help="a dotted line at this x (default: 3160 for version 2)")
    args = ap.parse_args(argv)
    vline = args.vline if args.vline is not None or args.src != BUILD / "learning-curve.json" else 3160
    doc = json.loads(args.src.read_text())
    try:
        if isinstance(doc, dict):
            plot_versions(check_versions(doc, args.src), args.png)
        else:
            plot(doc, args.png, xlabel=args.xlabel, vline=vline)
    except SpecwireError as e:
        raise SystemExit(f"error: {e}") from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
