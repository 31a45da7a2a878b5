"""The compiled kernels of another commit against this tree's, on the same loaded target, pass by pass.

Builds the two C libraries behind the decoding kernels as they were at --before, with this tree's flags: the bf16
products (`src/specwire/target/bf16dot.c`) and the float32 products, attention, greedy pick and norm
(`rowdot.c`, `rowattn.c`, `argmax.c`, `rownorm.c` and their header, this machine's build). Then it loads the target
once on `--dtype` (bfloat16 or float32) with `--linear rowdot`, and times a pass over T new tokens after --context
cached ones with each pair of libraries in turn, interleaved pass by pass so that a burst of load falls on both
alike; the logits of the two are checked bitwise equal (a kernel change that keeps its chains keeps every output).
The libraries of the two commits must share their entry points' signatures (their `*_abi` versions). A norm
module binds its kernel when the target loads, so the norms run this tree's kernel in both columns.

    python tools/kernel_ab.py --before de7079c --threads 2 --reps 25

Prints a Markdown table of median ms per pass.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from specwire.decode.kernels import describe_features, load_decoding_target
from specwire.target import bf16dot, rowdot
from specwire.target.kvcache import decoding_cache
from specwire.target.passes import padded_pass, pass_rows
from specwire.target.rowdot import build_library


def build_before(commit: str, sources: tuple[Path, ...], headers: tuple[Path, ...], flags, now: ctypes.CDLL,
                 abi: str, tmp: Path) -> ctypes.CDLL:
    """The library of `sources` (and the `headers` they include) as they were at `commit`, built with `flags`, its
    entry points typed as they are in `now`, this tree's library."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    out = tmp / f"{sources[0].stem}-before"
    out.mkdir()
    for path in sources + headers:
        rel = path.resolve().relative_to(root)
        text = subprocess.run(["git", "show", f"{commit}:{rel}"], capture_output=True, text=True, check=True,
                              cwd=root).stdout
        (out / path.name).write_text(text)
    texts = [(out / p.name).read_text() for p in sources + headers]
    digest = hashlib.sha256("\0".join([*texts, *flags]).encode()).hexdigest()[:16]
    lib, why = build_library(tuple(out / p.name for p in sources), tuple(flags), digest,  # as the kernels build
                             f"specwire-ab-{sources[0].stem}", f"{commit}'s {sources[0].name}")
    if lib is None:
        raise SystemExit(f"kernel_ab.py: {why}")
    if getattr(lib, abi)() != getattr(now, abi)():
        raise SystemExit(f"kernel_ab.py: {commit}'s {sources[0].name} has ABI {getattr(lib, abi)()}, this tree's "
                         f"{getattr(now, abi)()}: their calls differ")
    for name, fn in vars(now).items():  # the entry points this tree's loader typed (`_library` types them all)
        if isinstance(fn, ctypes._CFuncPtr):
            getattr(lib, name).argtypes, getattr(lib, name).restype = fn.argtypes, fn.restype
    return lib


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the commit whose kernel sources to compare with")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--tokens", default="1,2,4,6,8,12,16")
    ap.add_argument("--reps", type=int, default=25)
    args = ap.parse_args(argv)
    ok, why = (bf16dot if args.dtype == "bfloat16" else rowdot).available()
    if not ok:
        raise SystemExit(f"kernel_ab.py: needs the {args.dtype} rowdot kernel: {why}")
    torch.set_num_threads(args.threads)
    tokens = [int(t) for t in args.tokens.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        target = load_decoding_target(args.target, device="cpu", dtype=args.dtype, linear="rowdot")
        now = {"bf16dot": bf16dot.library() if args.dtype == "bfloat16" else None, "rowdot": rowdot.library()}
        before = {"rowdot": build_before(args.before, rowdot.SOURCES, rowdot.HEADERS, rowdot.ISA_FLAGS[rowdot.isa()],
                                         now["rowdot"], "specwire_rowdot_abi", Path(tmp)),
                  "bf16dot": None if now["bf16dot"] is None else build_before(
                      args.before, (bf16dot.SOURCE,), (), bf16dot.FLAGS, now["bf16dot"], "specwire_bf16dot_abi",
                      Path(tmp))}
        libs = {args.before: before, "this tree": now}
        model, vocab = target.model, target.info.vocab_size
        g = torch.Generator().manual_seed(0)
        ctx = torch.randint(0, vocab, (1, args.context), generator=g)
        xs = {T: torch.randint(0, vocab, (1, T), generator=g) for T in tokens}
        cache = decoding_cache(model, args.context + max(tokens))
        rows = pass_rows(model, cache)
        times = {(k, T): [] for k in libs for T in tokens}
        logits = {}
        library = {"bf16dot": bf16dot.library, "rowdot": rowdot.library}
        try:
            with torch.inference_mode():
                model(ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
                for rep in range(args.reps + 2):
                    for T in tokens:
                        for k, pair in libs.items():
                            # what the products and the attention call (`bf16dot.bf16dot`, `rowdot.rowdot`,
                            # `attention.compiled_attention`)
                            bf16dot.library = lambda lib=pair["bf16dot"]: lib
                            rowdot.library = lambda build=None, lib=pair["rowdot"]: lib
                            t0 = time.perf_counter()
                            logits[(k, T)] = padded_pass(model, xs[T], cache, rows, logits_to_keep=T)
                            if rep >= 2:
                                times[(k, T)].append(time.perf_counter() - t0)
                            cache.crop(args.context)
        finally:
            bf16dot.library, rowdot.library = library["bf16dot"], library["rowdot"]
    same = all(torch.equal(logits[(args.before, T)], logits[("this tree", T)]) for T in tokens)
    med = {key: 1000 * statistics.median(v) for key, v in times.items()}
    lines = [f"`python tools/kernel_ab.py --before {args.before} --dtype {args.dtype} --threads {args.threads} "
             f"--context {args.context} "
             f"--tokens {args.tokens} --reps {args.reps}`", "",
             f"{args.target} on {args.dtype}/rowdot, {args.threads} threads, {args.context} tokens of context, median of "
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
