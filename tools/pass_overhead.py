"""What the in-place KV cache, the compiled RMS norm and the padded pass save on a decoding pass, side by side.

A decoding pass of a small target is partly framework: tensor ops of microseconds each around the products.
Three of those were removed from the decoding path: transformers' cache copies every layer's keys and values
onto a new tensor each pass (`target.kvcache` writes them in place); its RMS norm module is eight tensor ops a
call (`target.rownorm` runs one compiled call); and where a kernel's products pad their rows to a multiple,
each product pads on its own (`target.passes.padded_pass` pads the pass once, with filler tokens). This loads
the target as decoding does (`--dtype`, `--linear`; default: this machine's choice) and times one pass over T
new tokens after --context cached ones in five forms, interleaved pass by pass so that a burst of load spreads
over all of them:

  - before: transformers' `DynamicCache`, each norm's own module, each product padding its own rows (what
    decoding ran until these changes);
  - each change alone: in-place cache, compiled norm, padded pass;
  - after: all three (what decoding runs now).

The logits are checked bitwise where they must agree: the cache and the padded pass change no number, so the
forms without the compiled norm must equal each other, and so must the forms with it.

    python tools/pass_overhead.py --threads 2 --dtype float32 --linear rowdot --out docs/bench/pass-overhead-fp32

Writes results.md and results.json into --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from specwire.decode.kernels import load_decoding_target, kernel_of, describe_features
from specwire.safeio import write_json, write_text
from specwire.target.kvcache import decoding_cache
from specwire.target.passes import padded_pass, pass_rows
from specwire.target.rownorm import RowRMSNorm

FORMS = {"before": (False, False, False), "in-place cache": (True, False, False), "compiled norm": (False, True, False),
         "padded pass": (False, False, True), "after": (True, True, True)}  # name -> (cache, norm, padded pass)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--linear", default="auto")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tokens = [int(t) for t in args.tokens.split(",")]
    target = load_decoding_target(args.target, device="cpu", dtype=args.dtype, linear=args.linear)
    model, vocab = target.model, target.info.vocab_size
    norms = [m for m in model.modules() if isinstance(m, RowRMSNorm)]
    rows = pass_rows(model, decoding_cache(model))
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (1, args.context), generator=g)
    xs = {T: torch.randint(0, vocab, (1, T), generator=g) for T in tokens}
    caches = {}
    times: dict[tuple[str, int], list[float]] = {(f, T): [] for f in FORMS for T in tokens}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    with torch.inference_mode():
        for name, (in_place, compiled, _) in FORMS.items():
            for m in norms:
                m.stock = not compiled
            caches[name] = decoding_cache(model) if in_place else DynamicCache(config=model.config)
            model(ctx, past_key_values=caches[name], use_cache=True, logits_to_keep=1)
        for rep in range(args.reps + 2):
            for T in tokens:
                for name, (in_place, compiled, padded) in FORMS.items():
                    for m in norms:
                        m.stock = not compiled
                    t0 = time.perf_counter()
                    out = padded_pass(model, xs[T], caches[name], rows if padded else 1, logits_to_keep=T)
                    if rep >= 2:
                        times[(name, T)].append(time.perf_counter() - t0)
                    logits[(name, T)] = out
                    caches[name].crop(-T)
        for m in norms:
            m.stock = False
    bitwise = all(torch.equal(logits[("before", T)], logits[("in-place cache", T)])
                  and torch.equal(logits[("before", T)], logits[("padded pass", T)])
                  and torch.equal(logits[("compiled norm", T)], logits[("after", T)]) for T in tokens)
    ms = {f: [round(1000 * statistics.median(times[(f, T)]), 2) for T in tokens] for f in FORMS}
    kernel = kernel_of(target).name
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"target": args.target, "kernel": kernel, "threads": args.threads,
                                      "context": args.context, "tokens": tokens, "reps": args.reps, "ms": ms,
                                      "cache_and_padding_change_no_logit": bitwise, "norms_swapped": len(norms), "row_multiple": rows,
                                      "cpu_features": describe_features(), "torch": torch.__version__})
    lines = ["# One pass over T new tokens, before and after the in-place cache, the compiled norm and the padded pass",
             "",
             f"`python tools/pass_overhead.py --threads {args.threads} --dtype {args.dtype} --linear {args.linear} "
             f"--context {args.context} --reps {args.reps} --out {args.out}`", "",
             f"{args.target} on {kernel}, {args.threads} threads, {args.context} tokens of context, median of "
             f"{args.reps} passes, ms; CPU features: {describe_features()}; torch {torch.__version__}; "
             f"{len(norms)} norms compiled; the products pad to a multiple of {rows} rows.", "",
             "| form | " + " | ".join(f"T={T}" for T in tokens) + " |",
             "|---|" + "---:|" * len(tokens)]
    for f in FORMS:
        lines.append(f"| {f} | " + " | ".join(f"{v:.2f}" for v in ms[f]) + " |")
    lines.append("| after / before | " + " | ".join(f"{a / b:.3f}" for a, b in zip(ms["after"], ms["before"])) + " |")
    lines += ["", f"The in-place cache and the padded pass changed no logit, bitwise: **{'yes' if bitwise else 'NO'}**."]
    write_text(out / "results.md", "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
