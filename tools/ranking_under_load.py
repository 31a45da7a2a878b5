"""Why `--dtype auto` measures its leading kernels side by side: the ranking under a burst of outside load.

`--dtype auto` profiles each candidate kernel once per machine and caches the curves for good, so a burst of
load during the profile would fix a wrong default. This loads the given kernels (the leaders on this machine by
default) at once and measures their pass-cost curves three ways, then ranks each set as the defaults do
(`decode.kernels.rank_kernels`, the `REFERENCE` workload):
  - quiet, side by side (`hardware.measure_curves`): the reference;
  - alone, one after another (`hardware.measure_curve`, as each candidate is first profiled), with a busy
    process on one core while the --burst'th kernel is measured;
  - side by side, with the same busy process for the middle third of the run (`decode.kernels.settle`'s way).

    python tools/ranking_under_load.py --threads 2 --out docs/bench/v25/ranking-under-load

Writes results.md and results.json into --out. The kernels are assumed to pass the bitwise check (this measures
speed only); run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from specwire.decode.kernels import REFERENCE, describe_features, rank_kernels, reference_acceptance
from specwire.safeio import write_json, write_text
from specwire.target.cpu import cpu_model
from specwire.target.fastlinear import linear_min_rows
from specwire.target.hardware import KernelChoice, measure_curve, measure_curves
from specwire.target.load import load_target

SHOWN = (1, 4, 8, 16)


class Burst:
    """A busy process on one core between `start` and `stop` (outside load, as another job would bring)."""

    proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "Burst":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--kernels", default="bfloat16/rowdot,float32/rowdot,bfloat16/onednn",
                    help="kernels to compare, comma-separated (default: %(default)s)")
    ap.add_argument("--burst", type=int, default=0,
                    help="which kernel (0-based) the burst falls on when measured alone (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="docs/bench/ranking-under-load")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels = [KernelChoice.parse(n) for n in args.kernels.split(",")]
    if not 0 <= args.burst < len(kernels):
        ap.error(f"--burst: expected a kernel index from 0 to {len(kernels) - 1}, found {args.burst}")
    targets = [load_target(args.target, device="cpu", dtype=k.dtype, linear=k.linear) for k in kernels]
    rows = [linear_min_rows(t.model) for t in targets]

    def side_by_side():
        return measure_curves(targets, kernels, min_rows=rows, reps=args.reps)

    runs = {}  # label -> curves in `kernels`' order
    t0 = time.perf_counter()
    runs["quiet, side by side"] = side_by_side()
    quiet_s = time.perf_counter() - t0
    alone = []
    for i, (t, k, r) in enumerate(zip(targets, kernels, rows)):
        if i == args.burst:
            with Burst():
                alone.append(measure_curve(t, k, min_rows=r, reps=args.reps))
        else:
            alone.append(measure_curve(t, k, min_rows=r, reps=args.reps))
    name_alone = f"alone, one after another; the burst on {kernels[args.burst].name}"
    runs[name_alone] = alone
    third, burst = quiet_s / 3, Burst()  # quiet, busy, quiet: a third of the run each
    timers = [threading.Timer(third, burst.start), threading.Timer(2 * third, burst.stop)]
    for timer in timers:
        timer.start()
    try:
        runs["side by side; the burst in the middle third"] = side_by_side()
    finally:
        for timer in timers:
            timer.cancel()
        burst.stop()

    acc = reference_acceptance()
    table = ["| measured | " + " | ".join(f"{k.name}: T=" + "/".join(str(T) for T in SHOWN) + " ms, tok/s"
                                         for k in kernels) + " | ranked first |",
             "|---|" + "---|" * (len(kernels) + 1)]
    record = {}
    for label, curves in runs.items():
        for c in curves:
            c.invariant = True  # speed only: the kernels' bitwise check is the profile's, not this tool's
        ranking = {r.kernel.name: r for r in rank_kernels({c.kernel: c for c in curves}, acc, REFERENCE)}
        first = max(ranking.values(), key=lambda r: r.expected_tokens_per_s).kernel.name
        cells = [" / ".join(f"{c.at(T):.1f}" for T in SHOWN) + f", **{ranking[c.kernel].expected_tokens_per_s:.1f}**"
                 for c in curves]
        table.append(f"| {label} | " + " | ".join(cells) + f" | {first} |")
        record[label] = {"curves": [c.to_dict() for c in curves], "first": first,
                         "expected_tokens_per_s": {n: r.expected_tokens_per_s for n, r in ranking.items()}}
    command = (f"python tools/ranking_under_load.py --kernels {args.kernels} --burst {args.burst} --threads "
               f"{args.threads} --reps {args.reps} --out {args.out}")
    md = (f"# The kernel ranking under a burst of outside load\n\n`{command}`\n\n{args.target} on {cpu_model()} "
          f"({describe_features()}), {args.threads} threads, torch {torch.__version__}; median of {args.reps} passes "
          f"after 256 tokens of context. The burst: one process spinning on one core. tok/s: what the defaults "
          f"expect with the shipped draft and the context lookup (`decode.kernels.REFERENCE`).\n\n"
          + "\n".join(table) + "\n")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"command": command, "cpu": cpu_model(), "features": describe_features(),
                                      "threads": args.threads, "torch": torch.__version__, "runs": record})
    write_text(out / "results.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
