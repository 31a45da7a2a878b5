"""Recipe ablations at a fixed budget: the same data, the same number of steps, one change per row.

Every row trains a draft online (`specwire train --online`) on the same conversations in the same order
for --steps optimizer steps of --batch-size conversations, from the `BASE` recipe with one setting
changed, then scores it offline (`specwire eval`'s loop) on:
  - the data's own validation split (in-domain, what `--select best` uses; never a benchmark);
  - held-out MT-bench and HumanEval answers of the target (never trained on), when --eval-* is given.
Training throughput (loss tokens per second of the training loop) and seconds per step (the whole
training call, loading and final validation included, over the steps it ran) are reported beside the scores,
so a change that costs compute (a longer TTT unroll, an fp32 draft) shows what it costs. The rows run
one after another in this process: compare them with each other, not with figures from other runs.

    python tools/draft/ablate.py --data tools/draft/data/selfinstruct --steps 80 \
        --eval-mt-bench runs/acc/eval-mt-bench --eval-humaneval runs/acc/eval-humaneval --out runs/ablate

Each row's run folder is kept under --out and resumes (a rerun skips finished rows). Writes
--out/ablation.json and --out/ablation.md (the table for docs/MODEL_CARD.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from specwire.decode.kernels import describe_features
from specwire.safeio import write_json, write_text
from specwire.target.cpu import cpu_model
from specwire.training.config import TrainConfig
from specwire.training.evaluate import evaluate
from specwire.training.trainer import train

# The recipe every row starts from (CLI flags of `specwire train`), then one change per row.
BASE = dict(online=True, target="smollm2-135m", target_dtype="bfloat16", draft_vocab_size=8192, ttt_steps=5, lr=1e-3,
            batch_size=8, autocast=True, loss="kl", noise_std=0.0, init_layer="random", select="last")
ROWS: tuple[tuple[str, dict], ...] = (
    ("base: random init, KL, lr 1e-3 cosine, TTT 5, vocab 8192, bf16 autocast", {}),
    ("init from the target's last layer", {"init_layer": "target"}),
    ("hidden-state noise, std 0.05", {"noise_std": 0.05}),
    ("lr 3e-4", {"lr": 3e-4}),
    ("lr 3e-3", {"lr": 3e-3}),
    ("TTT 3", {"ttt_steps": 3}),
    ("TTT 7", {"ttt_steps": 7}),
    ("top-1 loss (cross-entropy on the target's argmax)", {"loss": "top1"}),
    ("draft vocab 16384", {"draft_vocab_size": 16384}),
    ("draft vocab 4096", {"draft_vocab_size": 4096}),
    ("2 epochs over half the conversations", {"epochs_half": True}),
    ("fp32 draft (no autocast)", {"autocast": False}),
)
EVAL_STEPS = 5  # every row is scored with the same unroll length, whatever it trained with


def run_row(i: int, name: str, change: dict, args) -> dict:
    out = Path(args.out) / f"row{i:02d}"
    cfg = {**BASE, **{k: v for k, v in change.items() if k != "epochs_half"}}
    max_steps = args.steps
    data = args.data
    if change.get("epochs_half"):
        cfg["epochs"] = 2.0
        cfg["max_conversations"] = args.steps * cfg["batch_size"] // 2
    else:
        cfg["max_conversations"] = args.steps * cfg["batch_size"]
    limit = cfg.pop("max_conversations")
    config = TrainConfig(data=data, out=str(out), max_steps=max_steps, max_train_samples=limit, progress=args.progress,
                         eval_max_samples=args.val_samples, log_every=10, save_every=20, **cfg)
    t0 = time.perf_counter()
    result = train(config)
    seconds = time.perf_counter() - t0
    row = {"row": i, "name": name, "change": change, "config": config.to_dict(), "steps": result.steps,
           "train_seconds": round(seconds, 1), "resumed_from": result.resumed_from,
           "seconds_per_step": round(seconds / max(1, result.steps - result.resumed_from), 2),
           "tokens_per_s": round(result.tokens_per_s, 1)}
    for key, path, split in (("val", str(out), None), ("mt_bench", args.eval_mt_bench, "all"),
                             ("humaneval", args.eval_humaneval, "all")):
        if key == "val":
            v = result.val or {}
            row[key] = {"step_accuracy": v.get("step_accuracy"), "predicted_accept_length": v.get("predicted_accept_length")}
            continue
        if not path:
            continue
        ev = evaluate(result.draft_dir, path, ttt_steps=EVAL_STEPS, split=split, device="cpu", dtype="float32")
        row[key] = {"step_accuracy": ev.step_accuracy, "predicted_accept_length": ev.predicted_accept_length}
    return row


def table(rows: list[dict], args) -> str:
    head = ("| # | change from the base | s/step | tok/s | val step-0 | val AL | MT-bench step-0 | MT-bench AL "
            "| HumanEval step-0 | HumanEval AL |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in rows:
        cells = []
        for key in ("val", "mt_bench", "humaneval"):
            v = r.get(key) or {}
            acc, al = v.get("step_accuracy"), v.get("predicted_accept_length")
            cells += [f"{acc[0]:.3f}" if acc else "-", f"{al:.3f}" if al else "-"]
        lines.append(f"| {r['row']} | {r['name']} | {r['seconds_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", required=True, help="selfinstruct or datagen folders (online training)")
    p.add_argument("--steps", type=int, default=80, help="optimizer steps per row (the fixed budget)")
    p.add_argument("--val-samples", type=int, default=96, help="validation conversations (the data's own val split)")
    p.add_argument("--eval-mt-bench", help="dump of the target's MT-bench answers (held out)")
    p.add_argument("--eval-humaneval", help="dump of the target's HumanEval answers (held out)")
    p.add_argument("--rows", help="comma-separated row numbers (default: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--progress", action="store_true")
    p.add_argument("--out", default="runs/ablate")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    wanted = None if not args.rows else {int(x) for x in args.rows.split(",")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    done_path = out / "ablation.json"
    done = {r["row"]: r for r in json.loads(done_path.read_text())["rows"]} if done_path.is_file() else {}
    for i, (name, change) in enumerate(ROWS):
        if (wanted is not None and i not in wanted) or i in done:
            continue
        print(f"[{i}] {name}", flush=True)
        done[i] = run_row(i, name, change, args)
        rows = [done[k] for k in sorted(done)]
        meta = {"command": "python tools/draft/ablate.py " + " ".join(
                    f"--{k.replace('_', '-')} {' '.join(v) if isinstance(v, list) else v}" for k, v in vars(args).items()
                    if v not in (None, False) and k != "progress"),
                "cpu": cpu_model(), "features": describe_features(), "threads": args.threads,
                "base": BASE, "steps": args.steps}
        write_json(done_path, {**meta, "rows": rows})
        write_text(out / "ablation.md", f"CPU: {meta['cpu']} ({meta['features']}), {args.threads} threads. "
                   f"{args.steps} steps of {BASE['batch_size']} conversations per row.\n\n{table(rows, args)}\n")
        print(table(rows, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
