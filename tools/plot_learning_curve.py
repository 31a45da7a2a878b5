"""Plot docs/draft-build/learning-curve.json (held-out accuracy of training snapshots) as learning-curve.png.

    python tools/plot_learning_curve.py

Each point is a snapshot of the shipped draft's training run, evaluated with `specwire eval` on the held-out
MT-bench and HumanEval answers; x is the number of conversations the draft had seen (steps x batch 8).
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specwire.safeio import atomic_path  # noqa: E402

BUILD = Path(__file__).resolve().parents[1] / "docs" / "draft-build"


def main() -> int:
    curve = json.loads((BUILD / "learning-curve.json").read_text())
    seen = [p["conversations_seen"] for p in curve]
    fig, (a0, a1) = plt.subplots(1, 2, figsize=(9, 3.4))
    for key, label in (("mtbench", "MT-bench"), ("humaneval", "HumanEval")):
        a0.plot(seen, [p[key]["step_accuracy"][0] for p in curve], marker="o", label=label)
        a1.plot(seen, [p[key]["predicted_accept_length"] for p in curve], marker="o", label=label)
    a0.set_ylabel("step-0 accuracy (held out)")
    a1.set_ylabel("predicted chain accept length")
    for ax in (a0, a1):
        ax.set_xlabel("conversations seen (3,160 unique; 2 epochs)")
        ax.axvline(3160, color="grey", lw=0.8, ls=":")
        ax.legend()
    fig.suptitle("smollm2-135m-eagle3: held-out accuracy during training")
    fig.tight_layout()
    with atomic_path(BUILD / "learning-curve.png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
