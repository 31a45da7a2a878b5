"""The cost of one target pass over T new tokens (with a KV cache), nn.Linear against pre-transposed layers.

Speculation pays when verifying T drafted tokens costs little more than decoding one; this measures that
curve on the machine at hand, for both ways of computing the target's linear layers (`specwire.target.fastlinear`).

    python tools/verify_cost.py --threads 2 --out docs/bench/verify-cost

Writes results.md, results.json and results.png (ms per pass against T, and the ratio to T=1) into --out.
Median of --reps passes after a warm-up; the cache is cropped back after every pass, so each pass sees the
same --context tokens of history.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specwire.bench.run import cpu_model
from specwire.safeio import atomic_path, write_json, write_text
from specwire.target.load import load_target

TOKENS = (1, 2, 4, 6, 8, 12, 16, 24, 32)


def pass_ms(model, context: torch.Tensor, T: int, *, reps: int) -> float:
    """Median wall time (ms) of one forward of T new tokens after `context`, cache cropped back each time."""
    from transformers import DynamicCache

    with torch.no_grad():
        cache = DynamicCache()
        model(context, past_key_values=cache, use_cache=True)
        n = context.shape[1]
        x = torch.randint(0, model.config.vocab_size, (1, T), generator=torch.Generator().manual_seed(T))
        times = []
        for r in range(reps + 2):  # two warm-up passes
            t0 = time.perf_counter()
            model(x, past_key_values=cache, use_cache=True, position_ids=torch.arange(n, n + T)[None])
            if r >= 2:
                times.append(time.perf_counter() - t0)
            cache.crop(n)
    return 1000 * statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256, help="tokens already in the cache (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default="docs/bench/verify-cost")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, list[float]] = {}
    for linear in ("torch", "pretransposed"):
        target = load_target(args.target, device="cpu", dtype="float32", linear=linear)
        ctx = torch.randint(0, target.spec.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0))
        results[linear] = [round(pass_ms(target.model, ctx, T, reps=args.reps), 2) for T in TOKENS]
        print(linear, results[linear], flush=True)
        del target
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = f"python tools/verify_cost.py --threads {args.threads} --context {args.context} --reps {args.reps} --out {args.out}"
    meta = {"target": args.target, "threads": args.threads, "context": args.context, "reps": args.reps,
            "torch": torch.__version__, "cpu": cpu_model(), "command": command}
    write_json(out / "results.json", {"tokens": list(TOKENS), "ms": results, **meta})
    base = results["torch"][0]
    rows = ["| tokens in the pass | " + " | ".join(map(str, TOKENS)) + " |", "|---|" + "---:|" * len(TOKENS)]
    for linear, ms in results.items():
        rows.append(f"| {linear}, ms | " + " | ".join(f"{v:.1f}" for v in ms) + " |")
        rows.append(f"| {linear}, x torch T=1 | " + " | ".join(f"{v / base:.2f}" for v in ms) + " |")
    md = (f"# Cost of one target pass over T tokens\n\n`{command}`\n\n{args.target}, fp32, {args.threads} threads, "
          f"{args.context} tokens of context, median of {args.reps} passes, on {cpu_model()}.\n\n" + "\n".join(rows) + "\n")
    write_text(out / "results.md", md)
    _plot(results, base, out / "results.png")
    print(md)
    return 0


def _plot(results: dict[str, list[float]], base: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for linear, ms in results.items():
        ax.plot(TOKENS, [v / base for v in ms], marker="o", label=linear)
    ax.axhline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("tokens in one target pass (T)")
    ax.set_ylabel("time / one-token pass (nn.Linear)")
    ax.set_title("Target pass cost against T")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
