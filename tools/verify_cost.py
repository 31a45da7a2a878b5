"""The cost of one target pass over T new tokens, for every candidate kernel, and which one the defaults pick.

Speculation pays when verifying T drafted tokens costs little more than decoding one. This measures that
curve on the machine at hand, T = 1..17, for each kernel `--dtype auto` considers (fp32 always, bf16 where
the CPU computes it natively; nn.Linear, pre-transposed weights, or the compiled rowdot kernel where it
builds), each in two forms (rowdot only in the first: its stock form is nn.Linear's):
  - invariant: the batch-invariant attention and the linear row padding measured for this machine
    (what decoding runs: passes bitwise equal to single steps);
  - stock: transformers' sdpa and no padding (what `hf-generate` runs; not invariant).
It then measures the leading kernels again side by side, interleaved pass by pass, as `--dtype auto` does
(`decode.kernels.settle`: rows "side by side"), ranks the invariant kernels by those curves as `--dtype auto`
does (speculation with the context lookup: one choice for every command, `decode.kernels.REFERENCE`), says which
it chose and why, shows how speculation without the lookup and plain decoding alone would rank them, and caches
the invariant curves where `--dtype auto` looks for them. Where the rowdot kernel reads weights in an exact
compact form (`target.compact`: the built-in target's GGUF block codes), the same kernel reading them as
float32 is measured beside it, as a reference, and so is the AVX2 build of the kernel where the default
build is another (AVX-512: bitwise the same products, and checked so).

    python tools/verify_cost.py --threads 2 --out docs/bench/verify-cost

Writes results.md, results.json and results.png into --out. Median of --reps passes after two warm-ups;
the cache is cropped back after every pass, so each pass sees the same --context tokens of history.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specwire.decode.kernels import (COPY_SHARE, REFERENCE, Workload, candidate_kernels, describe_features, rank_kernels,
                                     reference_acceptance, settle)
from specwire.safeio import save_png, write_json, write_text
from specwire.target.fastlinear import RowDotLinear, linear_min_rows
from specwire.target.hardware import KernelChoice, measure_curve
from specwire.target import rowdot
from specwire.target.load import load_target

SHOWN = (1, 2, 4, 6, 8, 12, 16, 17)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256, help="tokens already in the cache (default: %(default)s)")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default="docs/bench/verify-cost")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    curves, rows = {}, {}
    for kernel in candidate_kernels("cpu"):
        for form in ("invariant",) if kernel.linear == "rowdot" else ("invariant", "stock"):
            attention = "invariant" if form == "invariant" else "sdpa"
            t = load_target(args.target, device="cpu", dtype=kernel.dtype, linear=kernel.linear, attention=attention,
                            min_rows=None if form == "invariant" else 1)
            c = measure_curve(t, kernel, min_rows=linear_min_rows(t.model), context=args.context, reps=args.reps)
            name = f"{kernel.name} {form}"
            rows[name] = c
            if form == "invariant":  # what `--dtype auto` would measure: cache it for the decoding commands
                from specwire.decode.kernels import _check
                from specwire.target.hardware import CacheKey, write_cache
                from specwire.safeio import specwire_home

                c.invariant = _check(t)
                curves[kernel.name] = c
                write_cache(CacheKey.here(t.spec.fingerprint), specwire_home(), curves={kernel.name: c})
            print(name, [round(c.at(T), 1) for T in SHOWN], flush=True)
            if kernel.name == "float32/rowdot" and rowdot.isa() != "avx2":  # before the reference below drops the codes
                rows[f"{kernel.name} invariant, the AVX2 build"] = _avx2_build_curve(t, kernel, args)
            packed = [m for m in t.model.modules() if isinstance(m, RowDotLinear) and m.compact is not None]
            if packed:  # a reference, not a candidate: the same kernel reading every weight as float32
                for m in packed:
                    m.compact = None
                name = f"{kernel.name} invariant, weights read as float32"
                rows[name] = measure_curve(t, kernel, min_rows=1, context=args.context, reps=args.reps)
                rows[name].invariant = curves[kernel.name].invariant
                print(name, [round(rows[name].at(T), 1) for T in SHOWN], flush=True)
            del t
    alone = dict(curves)
    curves = settle(args.target, curves, device="cpu", reps=args.reps)  # the leaders again, side by side
    for name, c in curves.items():
        if c is not alone[name]:
            rows[f"{name} invariant, side by side"] = c
            print(f"{name} invariant, side by side", [round(c.at(T), 1) for T in SHOWN], flush=True)
    workloads = {"speculation": REFERENCE, "speculation without the lookup": Workload.of(draft=True, lookup=0),
                 "plain": Workload.of(draft=False)}
    rankings = {w: rank_kernels(curves, reference_acceptance(), workload) for w, workload in workloads.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = f"python tools/verify_cost.py --threads {args.threads} --context {args.context} --reps {args.reps} --out {args.out}"
    from specwire.target.cpu import cpu_model

    cpu = f"{cpu_model()} ({describe_features()}; rowdot build: {rowdot.isa()})"
    write_json(out / "results.json", {"tokens": SHOWN, "curves": {n: c.to_dict() for n, c in rows.items()},
                                      "ranking": {w: [{"kernel": r.kernel.name, "expected_tokens_per_s": r.expected_tokens_per_s,
                                                       "budget": r.budget} for r in ranking]
                                                  for w, ranking in rankings.items()},
                                      "cpu": cpu, "threads": args.threads, "torch": torch.__version__,
                                      "context": args.context, "command": command})
    base = rows[next(iter(rows))].at(1)
    lines = ["| kernel | row padding | bitwise invariant | " + " | ".join(f"T={T}" for T in SHOWN) + " | T=17 / T=1 |",
             "|---|---:|:---:|" + "---:|" * (len(SHOWN) + 1)]
    for name, c in rows.items():
        inv = {True: "yes", False: "no", None: "no (stock)"}[c.invariant]
        lines.append(f"| {name} | {c.min_rows} | {inv} | " + " | ".join(f"{c.at(T):.1f}" for T in SHOWN)
                     + f" | {c.at(17) / c.at(1):.2f}x |")
    why = "\n\n".join(_why(w, workloads[w], ranking) for w, ranking in rankings.items())
    md = (f"# Cost of one target pass over T tokens, per kernel\n\n`{command}`\n\n{args.target}, {args.threads} threads, "
          f"{args.context} tokens of context, median of {args.reps} passes, ms, on {cpu}, torch {torch.__version__}.\n\n"
          + "\n".join(lines) + "\n\n" + why + "\n")
    write_text(out / "results.md", md)
    _plot(rows, base, out / "results.png")
    print(md)
    return 0


def _why(name: str, workload: Workload, ranking) -> str:
    """What the defaults (`--dtype auto --linear auto`) chose and why (the `REFERENCE` workload), or how another
    workload would rank the kernels."""
    if not ranking:
        return "No kernel passed the bitwise check on this machine: decoding falls back to fp32 and the bench says so."
    best = ranking[0]
    if not workload.speculative:
        basis = "the cheapest one-token pass"
    else:
        basis = ("the most tokens per second that `--budget auto` expects with the shipped draft's acceptance"
                 + (f" and the context lookup's copies (up to {workload.lookup} tokens, in a "
                    f"{COPY_SHARE:.0%} share of rounds)" if workload.lookup else ""))
    verdict = ("the defaults (`--dtype auto --linear auto`, for every command) chose" if workload == REFERENCE
               else "the defaults do not choose by this; it would rank first")
    settled = [r.kernel.name for r in ranking if r.curve.beside]
    beside = (f" (by the curves of {', '.join(settled)}, measured side by side; the others' measured alone)"
              if settled else "")
    return (f"**{name.capitalize()}:** {verdict} **{best.kernel.name}**{beside}: of the kernels whose passes were "
            f"bitwise equal to single steps, it gives {basis} ({best.expected_tokens_per_s:.1f} tok/s, {best.budget}); "
            + "; ".join(f"{r.kernel.name}: {r.expected_tokens_per_s:.1f} tok/s ({r.budget})" for r in ranking[1:]) + ".")


def _avx2_build_curve(t, kernel: KernelChoice, args):
    """A reference, not a candidate: the same rowdot kernel from the AVX2 build (bitwise the same products, one
    output's chain a register instead of two), loaded for this measurement only."""
    import os

    os.environ[rowdot.ISA_ENV] = "avx2"
    rowdot._library.cache_clear()
    try:
        from specwire.decode.kernels import _check

        c = measure_curve(t, kernel, min_rows=1, context=args.context, reps=args.reps)
        c.invariant = _check(t)
    finally:
        del os.environ[rowdot.ISA_ENV]
        rowdot._library.cache_clear()
    print(f"{kernel.name} invariant, the AVX2 build", [round(c.at(T), 1) for T in SHOWN], flush=True)
    return c


def _plot(rows, base: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, c in rows.items():
        ax.plot(c.tokens, c.ms, marker="o", ms=3, ls="-" if "invariant" in name else ":", label=name)
    ax.set_xlabel("tokens in one target pass (T)")
    ax.set_ylabel("ms per pass")
    ax.set_title("Target pass cost against T (solid: bitwise invariant)")
    ax.legend(fontsize=7)
    save_png(fig, path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
