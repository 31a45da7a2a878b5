"""Training throughput: the draft in fp32 against bf16 autocast, side by side in one run.

Both configurations train online (target states captured per batch) on the same conversations in the
same order, from the same seed, for --steps optimizer steps of 8 conversations, one after the other in
this process, alternating --rounds times so that a change in the machine's load hits both alike. The
figure is loss tokens per second of the training loop (`TrainResult.tokens_per_s`); the target's
capture is inside it, as in a real run.

    python tools/train_speed.py --data tools/draft/data/selfinstruct --threads 2 --out docs/bench/train-speed

Writes results.md and results.json into --out.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from specwire.decode.kernels import describe_features
from specwire.safeio import write_json, write_text
from specwire.target.cpu import cpu_model
from specwire.training.config import TrainConfig
from specwire.training.trainer import train
from specwire.target.heap import keep_freed_memory

CONFIGS = (("draft fp32", {"autocast": False}), ("draft bf16 autocast", {"autocast": True}))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", nargs="+", required=True, help="selfinstruct or datagen folders")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--target-dtype", default="bfloat16")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    keep_freed_memory()  # the heap the command line runs with (target.heap)
    torch.set_num_threads(args.threads)
    rates: dict[str, list[float]] = {name: [] for name, _ in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, change in CONFIGS:
                cfg = TrainConfig(data=args.data, out=str(Path(tmp) / f"{r}-{len(rates[name])}-{change['autocast']}"),
                                  online=True, target="smollm2-135m", target_dtype=args.target_dtype,
                                  draft_vocab_size=8192, lr=1e-3, max_steps=args.steps, max_train_samples=8 * args.steps,
                                  eval_max_samples=1, progress=False, **change)
                rates[name].append(train(cfg).tokens_per_s)
                print(f"round {r}: {name}: {rates[name][-1]:.1f} tok/s", flush=True)
    base = statistics.median(rates[CONFIGS[0][0]])
    rows = [{"config": name, "tokens_per_s": rates[name], "median": statistics.median(rates[name]),
             "ratio": statistics.median(rates[name]) / base} for name, _ in CONFIGS]
    meta = {"cpu": cpu_model(), "features": describe_features(), "threads": args.threads, "steps": args.steps,
            "rounds": args.rounds, "target_dtype": args.target_dtype,
            "command": f"python tools/train_speed.py --data {' '.join(args.data)} --steps {args.steps} --rounds "
                       f"{args.rounds} --threads {args.threads} --out {args.out}"}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {**meta, "rows": rows})
    lines = [f"CPU: {meta['cpu']} ({meta['features']}), {args.threads} threads; target states in {args.target_dtype}; "
             f"{args.steps} steps of 8 conversations per run, {args.rounds} runs each, alternating.", "",
             f"`{meta['command']}`", "",
             "| draft | loss tok/s (median) | runs | x |", "|---|---:|---|---:|"]
    lines += [f"| {r['config']} | {r['median']:.0f} | {', '.join(f'{x:.0f}' for x in r['tokens_per_s'])} | {r['ratio']:.2f}x |"
              for r in rows]
    write_text(out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
