"""The bf16 rowdot kernel of another commit against this one, on the same loaded target, pass by pass.

Builds `src/specwire/target/bf16dot.c` as it was at --before (with this source's flags), loads the target once on
`--dtype bfloat16 --linear rowdot`, and times a pass over T new tokens after --context cached ones with each library
in turn, interleaved pass by pass so that a burst of load falls on both alike; the logits of the two are checked
bitwise equal (a kernel change that keeps its chains keeps every output). The two libraries must share the entry
points' signatures (`specwire_bf16dot_abi`).

    python tools/bf16dot_ab.py --before de7079c --threads 2 --reps 25

Prints a Markdown table of median ms per pass.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specwire.decode.kernels import describe_features, load_decoding_target
from specwire.target import bf16dot
from specwire.target.kvcache import decoding_cache
from specwire.target.passes import padded_pass, pass_rows

ENTRIES = ("specwire_bf16dot_bf16", "specwire_bf16dot_q4_1", "specwire_bf16dot_q8_0", "specwire_bf16dot_split3")


def build_before(commit: str, tmp: Path) -> ctypes.CDLL:
    """The kernel's source at `commit`, built with this source's flags, its entry points typed as this one's."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    rel = bf16dot.SOURCE.resolve().relative_to(root)
    src = subprocess.run(["git", "show", f"{commit}:{rel}"], capture_output=True, text=True, check=True, cwd=root).stdout
    (tmp / "before.c").write_text(src)
    subprocess.run([os.environ.get("CC", "cc"), *bf16dot.FLAGS, str(tmp / "before.c"), "-o", str(tmp / "before.so")],
                   check=True)
    lib, now = ctypes.CDLL(str(tmp / "before.so")), bf16dot.library()
    if lib.specwire_bf16dot_abi() != now.specwire_bf16dot_abi():
        raise SystemExit(f"bf16dot_ab.py: {commit}'s kernel has ABI {lib.specwire_bf16dot_abi()}, this one "
                         f"{now.specwire_bf16dot_abi()}: their calls differ")
    for name in ENTRIES:
        getattr(lib, name).argtypes = getattr(now, name).argtypes
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit whose kernel source to compare with")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", default="1,2,4,6,8,12,16")
    ap.add_argument("--reps", type=int, default=25)
    args = ap.parse_args()
    ok, why = bf16dot.available()
    if not ok:
        raise SystemExit(f"bf16dot_ab.py: needs the bf16 rowdot kernel: {why}")
    torch.set_num_threads(args.threads)
    tokens = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        libs = {args.before: build_before(args.before, Path(tmp)), "this tree": bf16dot.library()}
        target = load_decoding_target(args.target, device="cpu", dtype="bfloat16", linear="rowdot")
        model, vocab = target.model, target.info.vocab_size
        g = torch.Generator().manual_seed(0)
        ctx = torch.randint(0, vocab, (1, args.context), generator=g)
        xs = {T: torch.randint(0, vocab, (1, T), generator=g) for T in tokens}
        cache = decoding_cache(model, args.context + max(tokens))
        rows = pass_rows(model, cache)
        times = {(k, T): [] for k in libs for T in tokens}
        logits = {}
        library = bf16dot.library
        try:
            with torch.inference_mode():
                model(ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
                for rep in range(args.reps + 2):
                    for T in tokens:
                        for k, lib in libs.items():
                            bf16dot.library = lambda lib=lib: lib  # what `bf16dot.bf16dot` calls
                            t0 = time.perf_counter()
                            logits[(k, T)] = padded_pass(model, xs[T], cache, rows, logits_to_keep=T)
                            if rep >= 2:
                                times[(k, T)].append(time.perf_counter() - t0)
                            cache.crop(args.context)
        finally:
            bf16dot.library = library
    same = all(torch.equal(logits[(args.before, T)], logits[("this tree", T)]) for T in tokens)
    med = {key: 1000 * statistics.median(v) for key, v in times.items()}
    lines = [f"`python tools/bf16dot_ab.py --before {args.before} --threads {args.threads} --context {args.context} "
             f"--tokens {args.tokens} --reps {args.reps}`", "",
             f"{args.target} on bfloat16/rowdot, {args.threads} threads, {args.context} tokens of context, median of "
             f"{args.reps} interleaved passes, ms; CPU features: {describe_features()}; torch {torch.__version__}.", "",
             "| kernel | " + " | ".join(f"T={T}" for T in tokens) + " |", "|---|" + "---:|" * len(tokens)]
    for k in libs:
        lines.append(f"| {k} | " + " | ".join(f"{med[(k, T)]:.2f}" for T in tokens) + " |")
    lines.append("| this tree / before | " + " | ".join(
        f"{med[('this tree', T)] / med[(args.before, T)]:.3f}" for T in tokens) + " |")
    lines += ["", f"Logits bitwise equal for every T: **{'yes' if same else 'NO'}**."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
