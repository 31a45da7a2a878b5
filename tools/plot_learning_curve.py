"""Plot a learning curve (held-out accuracy of training snapshots) as a PNG.

    python tools/plot_learning_curve.py                      # version 2: docs/draft-build/learning-curve.png
    python tools/plot_learning_curve.py docs/draft-build/learning-curve-v3.json docs/draft-build/learning-curve-v3.png \\
        --xlabel "self-instruct conversations seen (0: the stage-1 draft)"

The JSON is a list of points, each with `conversations_seen` and, per held-out set, the `specwire eval`
result (`step_accuracy`, `predicted_accept_length`): what `tools/draft/snapshots.py` writes. Left: step-0
accuracy; right: predicted chain accept length; x: conversations the draft had seen.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specwire.safeio import atomic_path  # noqa: E402

BUILD = Path(__file__).resolve().parents[1] / "docs" / "draft-build"
LABELS = {"mtbench": "MT-bench", "humaneval": "HumanEval"}


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
    fig.tight_layout()
    with atomic_path(png) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src", nargs="?", type=Path, default=BUILD / "learning-curve.json")
    ap.add_argument("png", nargs="?", type=Path, default=BUILD / "learning-curve.png")
    ap.add_argument("--xlabel", default="conversations seen (3,160 unique; 2 epochs)")
    ap.add_argument("--vline", type=float, default=None, help="a dotted line at this x (default: 3160 for version 2)")
    args = ap.parse_args(argv)
    vline = args.vline if args.vline is not None or args.src != BUILD / "learning-curve.json" else 3160
    plot(json.loads(args.src.read_text()), args.png, xlabel=args.xlabel, vline=vline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
