"""Where one decoding pass's time goes, and how close its bf16 products run to this CPU's peak.

A pass over T new tokens of the target, loaded as decoding loads it on the bf16 rowdot kernel (`--dtype bfloat16
--linear rowdot`, the default on a CPU with AVX512-BF16 and no AMX), is split into three parts by timing the calls
as they run: the products (every `fastlinear.RowDotLinear`, through `target/bf16dot.c`), the attention (the
registered invariant attention function) and everything else (transformers' module code, the norms, the rotary
embedding, the cache). Each repetition times every T twice, interleaved: once with the timers on (the parts) and
once with them off (the pass as decoding pays it, but for one flag test a call).

The products' cost past the first row is then set against the CPU's peak rate of `VDPBF16PS` (32 multiply-adds an
instruction), measured by a compiled loop of 24 independent chains of it on each of --threads threads, once in
every repetition beside the passes, so that a passing load slows both alike: a row needs sum(N * K / 32)
instructions over the target's products, and the slope of the products' time over T = 2..16 is what a row adds. Near 100%, a verify pass's extra rows cost what this CPU's arithmetic costs, and no kernel
change on it can make them much cheaper; what is left is how many of the rows the target accepts.

    python tools/pass_anatomy.py --threads 2 --out docs/bench/pass-anatomy-zen4

Writes results.md, results.json and results.png (stacked bars of the three parts against T) into --out. Needs AVX512-BF16 (and a C compiler with OpenMP, as the kernel does).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from specwire.decode.kernels import describe_features, kernel_of, load_decoding_target
from specwire.safeio import save_png, write_json, write_text
from specwire.target import bf16dot
from specwire.target.fastlinear import RowDotLinear
from specwire.target.kvcache import decoding_cache
from specwire.target.passes import padded_pass, pass_rows
from specwire.target.rowdot import build_library

PEAK_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
/* seconds for `iters` rounds of peak_chains independent VDPBF16PS chains on each of `threads` threads: each chain
 * its own register, stepped in turn (the empty volatile asm keeps every step) */
#define STEP(a) a = _mm512_dpbf16_ps(a, x, w); __asm__ volatile("" : "+v"(a));
#define EIGHT(p) STEP(p##0) STEP(p##1) STEP(p##2) STEP(p##3) STEP(p##4) STEP(p##5) STEP(p##6) STEP(p##7)
const int peak_chains = 3 * 8; /* EIGHT(a) EIGHT(b) EIGHT(c) below */
double peak_seconds(long iters, int threads) {
    double t0 = omp_get_wtime();
    _Pragma("omp parallel num_threads(threads)")
    {
        const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), w = (__m512bh)_mm512_set1_epi16(0x3c00);
        __m512 a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7, c0, c1, c2, c3, c4, c5, c6, c7;
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = _mm512_setzero_ps();
        c0 = c1 = c2 = c3 = c4 = c5 = c6 = c7 = _mm512_setzero_ps();
        for (long n = 0; n < iters; n++) {
            EIGHT(a) EIGHT(b) EIGHT(c)
        }
        volatile float sink = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, b0), c7));
        (void)sink;
    }
    return omp_get_wtime() - t0;
}
"""
PEAK_FLAGS = ("-O2", "-mavx512f", "-mavx512bf16", "-fopenmp", "-fPIC", "-shared")
PARTS = ("products", "attention", "other")


class PeakLoop:
    """The compiled loop of PEAK_SOURCE, sized to run about `seconds` a call."""

    def __init__(self, threads: int, seconds: float = 0.03):
        self.threads = threads
        with tempfile.TemporaryDirectory() as tmp:  # built as the kernels are (`rowdot.build_library`), cached
            src = Path(tmp, "peak.c")
            src.write_text(PEAK_SOURCE)
            digest = hashlib.sha256("\0".join([PEAK_SOURCE, *PEAK_FLAGS]).encode()).hexdigest()[:16]
            lib, why = build_library((src,), PEAK_FLAGS, digest, "specwire-peak", "the bf16 peak loop")
        if lib is None:
            raise SystemExit(f"pass_anatomy.py: {why}")
        self.chains = ctypes.c_int.in_dll(lib, "peak_chains").value
        self._fn = lib.peak_seconds
        self._fn.argtypes, self._fn.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_double
        self.iters = 10_000
        while self._fn(self.iters, threads) < seconds:
            self.iters *= 2

    def rate(self) -> float:
        """VDPBF16PS instructions a second on all threads, one run."""
        return self.iters * self.chains * self.threads / self._fn(self.iters, self.threads)


class Timers:
    """Seconds spent in the products and in the attention of the passes run while `on`."""

    def __init__(self):
        self.on = False
        self.spent = {"products": 0.0, "attention": 0.0}

    def wrap(self, fn, part: str):
        def run(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            y = fn(*args, **kwargs)
            self.spent[part] += time.perf_counter() - t0
            return y
        return run


def plot(tokens: list[int], med: dict[str, dict[int, float]], peak_row_ms: float, path: Path) -> None:
    """Stacked bars: each pass's products, attention and the rest, against T; the products' cost at the peak rate
    (the intercept at one row, plus `peak_row_ms` a row) dashed beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = [0.0] * len(tokens)
    x = range(len(tokens))
    for part, label in (("products", "products"), ("attention", "attention"), ("other", "everything else")):
        heights = [med[part][T] for T in tokens]
        ax.bar(x, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights)]
    first = med["products"][tokens[0]]
    ax.plot(x, [first + peak_row_ms * (T - tokens[0]) for T in tokens], "k--", lw=1,
            label="products if each further row ran at the bf16 peak")
    ax.set_xticks(list(x), [str(T) for T in tokens])
    ax.set_xlabel("tokens in one target pass (T)")
    ax.set_ylabel("ms per pass (timers on)")
    ax.set_title("Where a pass's time goes (bfloat16/rowdot)")
    ax.legend(fontsize=7)
    save_png(fig, path, dpi=110)
    plt.close(fig)


def slope(xs: list[int], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=256, help="positions already cached (default: %(default)s)")
    ap.add_argument("--tokens", default="1,2,4,8,12,16")
    ap.add_argument("--reps", type=int, default=20, help="interleaved repetitions; medians reported")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    ok, why = bf16dot.available()
    if not ok:
        raise SystemExit(f"pass_anatomy.py: needs the bf16 rowdot kernel: {why}")
    torch.set_num_threads(args.threads)
    tokens = [int(t) for t in args.tokens.split(",")]
    target = load_decoding_target(args.target, device="cpu", dtype="bfloat16", linear="rowdot")
    model, vocab = target.model, target.info.vocab_size

    timers = Timers()
    products = [m for m in model.modules() if isinstance(m, RowDotLinear) and m.bf16 is not None]
    for m in products:
        m.forward = timers.wrap(m.forward, "products")
    name = model.config._attn_implementation
    attention = ALL_ATTENTION_FUNCTIONS[name]
    AttentionInterface.register(name, timers.wrap(attention, "attention"))  # put back below
    per_row = sum(m.out_features * (m.in_features + m.pad_k) // 32 for m in products)  # VDPBF16PS a row

    rows = pass_rows(model, decoding_cache(model))
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, vocab, (1, args.context), generator=g)
    xs = {T: torch.randint(0, vocab, (1, T), generator=g) for T in tokens}
    cache = decoding_cache(model, args.context + max(tokens))
    ms: dict[str, dict[int, list[float]]] = {p: {T: [] for T in tokens} for p in ("pass", "timed pass", *PARTS)}
    peak, rates = PeakLoop(args.threads), []
    with torch.inference_mode():
        model(ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
        for rep in range(args.reps + 2):
            if rep >= 2:
                rates.append(peak.rate())
            for T in tokens:
                for on in (False, True):
                    timers.on, timers.spent = on, {"products": 0.0, "attention": 0.0}
                    t0 = time.perf_counter()
                    padded_pass(model, xs[T], cache, rows, logits_to_keep=T)
                    total = time.perf_counter() - t0
                    cache.crop(args.context)
                    if rep < 2:
                        continue
                    if not on:
                        ms["pass"][T].append(1000 * total)
                        continue
                    ms["timed pass"][T].append(1000 * total)
                    for p, s in timers.spent.items():
                        ms[p][T].append(1000 * s)
                    ms["other"][T].append(1000 * (total - sum(timers.spent.values())))
    AttentionInterface.register(name, attention)
    med = {p: {T: statistics.median(v) for T, v in by_t.items()} for p, by_t in ms.items()}
    rate = statistics.median(rates)
    big = [T for T in tokens if T >= 2]
    row_ms = {p: slope(big, [med[p][T] for T in big]) for p in ("pass", *PARTS)}
    peak_row_ms = 1000 * per_row / rate
    share = peak_row_ms / row_ms["products"]

    kernel = kernel_of(target).name
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "results.json", {
        "target": args.target, "kernel": kernel, "threads": args.threads, "context": args.context, "tokens": tokens,
        "reps": args.reps, "ms": {p: {str(T): round(v, 3) for T, v in by_t.items()} for p, by_t in med.items()},
        "ms_per_row_past_the_first": {p: round(v, 3) for p, v in row_ms.items()},
        "vdpbf16ps_per_row": per_row, "products": len(products), "peak_vdpbf16ps_per_s": rate,
        "peak_ms_per_row": round(peak_row_ms, 3), "products_share_of_peak": round(share, 3),
        "cpu_features": describe_features(), "torch": torch.__version__})
    lines = ["# Where one pass's time goes, and the bf16 products against this CPU's peak", "",
             f"`python tools/pass_anatomy.py --threads {args.threads} --context {args.context} --tokens {args.tokens} "
             f"--reps {args.reps} --out {args.out}`", "",
             f"{args.target} on {kernel}, {args.threads} threads, {args.context} tokens of context, median of "
             f"{args.reps} interleaved passes, ms; CPU features: {describe_features()}; torch {torch.__version__}.", "",
             "| part | " + " | ".join(f"T={T}" for T in tokens) + " | ms a row past the first (slope, T=2..) |",
             "|---|" + "---:|" * (len(tokens) + 1)]
    labels = {"pass": "pass, timers off", "timed pass": "pass, timers on", "products": f"products ({len(products)} calls)",
              "attention": "attention", "other": "everything else"}
    for p, label in labels.items():
        tail = f" {row_ms[p]:.3f} |" if p in row_ms else " |"
        lines.append(f"| {label} | " + " | ".join(f"{med[p][T]:.2f}" for T in tokens) + " |" + tail)
    lines += ["", f"A row needs {per_row / 1e6:.2f} million `VDPBF16PS` over the products; this CPU ran "
              f"{rate / 1e9:.2f} billion a second on {args.threads} threads ({peak.chains} independent chains a thread, the "
              f"median of a run in each repetition), "
              f"{peak_row_ms:.3f} ms a row at that rate. The products add {row_ms['products']:.3f} ms a row: "
              f"**{100 * share:.0f}% of the peak**."]
    lines += ["", "![where a pass's time goes](results.png)"]
    write_text(args.out / "results.md", "\n".join(lines) + "\n")
    plot(tokens, med, peak_row_ms, args.out / "results.png")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
