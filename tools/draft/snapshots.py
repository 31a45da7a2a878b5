"""Held-out accuracy of a training run's checkpoints: the learning curve against data size.

    python tools/draft/snapshots.py --run runs/draft/train-si --snaps runs/draft/snaps \\
        --eval mtbench=runs/draft/eval-mtbench --eval humaneval=runs/draft/eval-humaneval \\
        --batch-size 8 --out docs/draft-build/learning-curve-v3.json

A training run keeps only its latest checkpoint (OUT/checkpoint) and its best validation (OUT/best). To
draw accuracy against the number of conversations seen, copy `checkpoint/draft.safetensors` and
`state.json` to SNAPS/step-N each time the checkpoint changes (tools/draft/build.sh does), then run this:
each snapshot's weights are loaded into the run's draft geometry and scored with `specwire eval`'s own
`evaluate` on every held-out dump; the run's starting draft (`init_draft`, if any, or `--init`) is the step-0 point.
The JSON is resumable (a snapshot already scored is kept) and written atomically;
`tools/plot_learning_curve.py JSON PNG` draws it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from specwire.draft.checkpoint import load_draft
from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, load_tensors, read_json
from specwire.training.evaluate import evaluate


def snapshot_draft(run: Path, weights: Path):
    """The run's draft geometry (OUT/draft, or OUT/best of a run stopped early) holding a checkpoint's weights."""
    draft = load_draft(run / "draft" if (run / "draft").is_dir() else run / "best")
    tensors = load_tensors(weights)
    draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, strict=True)
    return draft.eval()


def score(draft, evals: dict[str, Path], target, ttt_steps: int, max_samples: int | None) -> dict:
    return {name: evaluate(draft, path, target=target, ttt_steps=ttt_steps, split="all", max_samples=max_samples,
                           device="cpu").to_dict()
            for name, path in evals.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, required=True, help="the training run folder (train --out)")
    ap.add_argument("--snaps", type=Path, required=True, help="folder of step-N snapshots")
    ap.add_argument("--eval", action="append", required=True, metavar="NAME=DUMP", help="held-out dump(s)")
    ap.add_argument("--batch-size", type=int, default=8, help="the run's samples per step (x axis)")
    ap.add_argument("--ttt-steps", type=int, default=5, help="unrolled steps scored (default: 5, as `eval`)")
    ap.add_argument("--max-samples", type=int, default=None, help="score the first N answers of each dump only")
    ap.add_argument("--out", type=Path, required=True, help="learning-curve JSON (resumable)")
    ap.add_argument("--init", default=None, metavar="DRAFT",
                    help="the draft scored as step 0 (default: the run's --init-draft). Pass its folder when that was "
                         "a name that now means another draft, as the shipped name does once a newer draft ships")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specwire.target.load import load_target

    evals = dict(e.split("=", 1) for e in args.eval)
    config = read_json(args.run / "checkpoint" / "state.json", what="training checkpoint state")["config"]
    target = load_target(config.get("target") or "smollm2-135m", device="cpu", dtype="float32")
    curve = {p["step"]: p for p in (json.loads(args.out.read_text()) if args.out.exists() else [])}
    points = []
    init = args.init or config.get("init_draft")
    if init:
        points.append((0, None))
    for d in sorted(args.snaps.glob("step-*"), key=lambda p: int(p.name[5:])):
        points.append((int(d.name[5:]), d / "draft.safetensors"))
    if not points:
        raise SpecwireError(f"{args.snaps}: no step-N snapshots.")
    for step, weights in points:
        if step in curve:
            continue
        draft = load_draft(init) if weights is None else snapshot_draft(args.run, weights)
        curve[step] = {"step": step, "conversations_seen": step * args.batch_size,
                       **score(draft, evals, target, args.ttt_steps, args.max_samples)}
        print(step, {k: round(curve[step][k]["predicted_accept_length"], 3) for k in evals}, flush=True)
        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps([curve[s] for s in sorted(curve)], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
