"""What one draft step costs against one target step, for each way the served draft can run its products.

The draft runs once per drafted depth, so its step is paid k times per round: issue 16 asks for at most
0.04 of a target step. This loads the target as decoding does (`--dtype auto --linear auto`), then the draft
the ways it can run its products: nn.Linear, and where the served draft runs rowdot (`draft_step.draft_kernel`:
a float32 rowdot target, or a bf16 one off AMX), rowdot reading float32 weights, rowdot reading its bf16
weights (bitwise the same products), and that through `decode.draft_step.ServedStep` (q|k|v and gate|up
packed into one product each, no module calls: what `load_engine_draft` serves; bitwise the same again), and
for a bf16 target nn.Linear in bf16 served the same lean way (what such a draft ran before), and where the CPU has
AVX512-BF16 the lean pass's products through `bf16dot.split3dot` (each float32 input row split exactly into three
bf16 rows: `load_engine_draft(..., weights="exact")`; float32 products summed in another order) and through the
kernel's int16 product over the q8_0 codes nearest the weights (`bf16dot.q8i16dot`: what `load_engine_draft` serves there
by default: lossy for the draft, see `tools/draft_precision.py` for what it does to acceptance); where the target
runs the AMX kernel (bf16), that kernel through the modules and served; elsewhere nn.Linear served. It times
`decode.engine.draft_step_ms` (one step over w rows after --context cached positions) beside one target
pass over 1 token after the same context. The forms are interleaved round by round, so a burst of load
on a shared machine spreads over all of them.

Those steps run back to back, so the draft's weights (about 18 MB in bf16 for the shipped draft) stay in the
CPU's caches. In decoding they do not: each round's target pass streams the target's weights through the
caches first. So the served form (and where it runs q8_0, the exact three-part pass beside it) is also timed as the
loop runs it (`in_loop_ms`): a one-token target pass, then k one-row draft steps, the draft steps timed, for
k = 1..5 (a chain of depth k drafts k steps a round), and each of the five steps alone against the warm step: the
first after a target pass costs the most, whatever it computes (`docs/BENCHMARKS.md` says why).

    python tools/draft_step_cost.py --threads 2 --dtype float32 --linear rowdot --out docs/bench/draft-step

Writes results.md and results.json into --out.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from specwire.decode import engine
from specwire.decode import proposer as proposer_module
from specwire.decode.draft_step import ServedStep, draft_kernel
from specwire.decode.engine import draft_step_ms, load_engine_draft
from specwire.decode.kernels import describe_features, load_decoding_target
from specwire.draft.checkpoint import load_draft
from specwire.safeio import write_json, write_text
from specwire.target.fastlinear import RowDotLinear, linear_kind, rowdot_linears
from specwire.target.hardware import measure_pass_ms

WIDTHS = (1, 2, 3, 4)
CHAIN_STEPS = (1, 2, 3, 4, 5)


@torch.inference_mode()
def in_loop_ms(draft, target, *, context: int, reps: int = 15) -> tuple[dict[int, float], dict[int, float]]:
    """({k: median ms of k one-row draft steps right after a one-token target pass}, {i: median ms of the i-th of
    those steps alone, in the runs of the most steps}), all after `context` cached positions: the draft's cost per
    round as decoding pays it, everything it touches evicted by the target pass."""
    from transformers import DynamicCache

    c, w0 = draft.config, draft.fc.weight
    proposer, ids = proposer_module.primed_proposer(draft, context, room=max(CHAIN_STEPS))
    cache = DynamicCache(config=target.model.config)
    ctx = torch.zeros(1, context, dtype=torch.long, device=target.device)
    target.model(ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
    h = torch.zeros(1, 1, c.hidden_size, device=w0.device, dtype=w0.dtype)
    out, each = {}, {i: [] for i in range(1, max(CHAIN_STEPS) + 1)}
    for k in CHAIN_STEPS:
        times = []
        for r in range(reps + 1):
            target.model(ctx[:, :1], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.crop(context)
            t0 = t = time.perf_counter()
            for i in range(1, k + 1):
                logits, _ = proposer._step(h, ids[:, :1], proposer._rope(context - 1, 1, repeat=True), None,
                                           last_only=True)
                torch.log_softmax(logits.float(), -1).topk(min(4, logits.shape[-1]))
                if r and k == max(CHAIN_STEPS):
                    each[i].append(time.perf_counter() - t)
                t = time.perf_counter()
            if r:
                times.append(time.perf_counter() - t0)
            proposer.cache.crop(context)
        out[k] = 1000 * statistics.median(times)
    return out, {i: 1000 * statistics.median(v) for i, v in each.items()}


def forms(draft_name: str, target) -> dict:
    """name -> a draft ready to step: the same weights, each way of computing its products that applies. The
    last is what `load_engine_draft` serves (`draft_step.draft_kernel`)."""
    def module_draft(dtype):
        d = load_draft(draft_name, device=target.device, dtype=dtype)
        d.attach_embeddings(target.parts.embed)
        return d

    def rowdot_draft():  # what the engine served before the bf16 kernel: rowdot over the bf16 weights
        d = load_engine_draft(draft_name, target, weights="exact")
        for m in d.modules():
            if isinstance(m, RowDotLinear):
                m.split3, m.pad_k = None, 0
        return d

    out = {"nn.Linear": module_draft(target.dtype)}
    kernel = draft_kernel(target)
    if kernel == "rowdot":
        f32 = module_draft(torch.float32)
        rowdot_linears(f32)
        out["rowdot, float32 weights"] = f32
        modules = rowdot_draft()
        modules.served = None  # the proposer runs Eagle3Draft.step
        out["rowdot, bf16 weights, through the modules"] = modules
        if target.dtype != torch.float32:  # a bf16 target off AMX: its own dtype's lean pass, for comparison
            lean = module_draft(target.dtype)
            lean.served = ServedStep.build(lean)
            out[f"nn.Linear in {str(target.dtype).removeprefix('torch.')}, packed, lean pass"] = lean
        served = load_engine_draft(draft_name, target)
        if any(isinstance(m, RowDotLinear) and m.q8 is not None for m in served.modules()):
            lean = rowdot_draft()
            lean.served = ServedStep.build(lean)
            out["rowdot, bf16 weights, packed, lean pass"] = lean
            out["three-part bf16 products, packed, lean pass (exact)"] = load_engine_draft(draft_name, target,
                                                                                         weights="exact")
            out["q8_0 weights, int16 inputs, packed, lean pass (served)"] = served
        else:
            out["rowdot, bf16 weights, packed, lean pass (served)"] = served
    elif kernel == "amx":
        modules = load_engine_draft(draft_name, target)
        modules.served = None  # the proposer runs Eagle3Draft.step
        out["amx, through the modules"] = modules
        out["amx, packed, lean pass (served)"] = load_engine_draft(draft_name, target)
    else:
        out["nn.Linear, packed, lean pass (served)"] = load_engine_draft(draft_name, target)
    return out


def add_pair_options(ap: argparse.ArgumentParser) -> None:
    """The options of a tool that loads a target as decoding does and a draft beside it (shared with
    `tools/draft_precision.py`)."""
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--draft", default="smollm2-135m-eagle3")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="auto", help="the target's, as in decoding (default: %(default)s)")
    ap.add_argument("--linear", default="auto", help="the target's, as in decoding (default: %(default)s)")
    ap.add_argument("--out", type=Path, required=True)


def decoding_target(args: argparse.Namespace):
    """The target of `add_pair_options`'s arguments, loaded as decoding loads it, on --threads threads."""
    torch.set_num_threads(args.threads)
    return load_decoding_target(args.target, dtype=args.dtype, linear=args.linear)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_options(ap)
    ap.add_argument("--context", type=int, default=300, help="positions already cached (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds; the median is reported")
    args = ap.parse_args(argv)
    target = decoding_target(args)
    drafts = forms(args.draft, target)
    step: list[float] = []
    draft_ms: dict[str, dict[int, list[float]]] = {name: {w: [] for w in WIDTHS} for name in drafts}
    # in the loop: the served form (the last), and the exact three-part pass beside it where it runs q8_0
    looped = dict(list(drafts.items())[-2 if "q8_0" in list(drafts)[-1] else -1:])
    loop_ms: dict[str, dict[int, list[float]]] = {name: {k: [] for k in CHAIN_STEPS} for name in looped}
    step_ms: dict[str, dict[int, list[float]]] = {name: {k: [] for k in CHAIN_STEPS} for name in looped}
    for _ in range(args.rounds):
        for name, d in looped.items():
            totals, each = in_loop_ms(d, target, context=args.context)
            for k in CHAIN_STEPS:
                loop_ms[name][k].append(totals[k])
                step_ms[name][k].append(each[k])
        step.append(measure_pass_ms(target.model, [1], context=args.context, reps=5)[0])
        for name, d in drafts.items():
            engine._draft_costs.pop(d, None)  # measure again every round
            for w, ms in draft_step_ms(d, WIDTHS, context=args.context, reps=15).items():
                draft_ms[name][w].append(ms)
    target_ms = statistics.median(step)
    rows = {name: {w: statistics.median(v) for w, v in by_w.items()} for name, by_w in draft_ms.items()}
    loop = {name: {k: statistics.median(v) for k, v in by_k.items()} for name, by_k in loop_ms.items()}
    alone = {name: {i: statistics.median(v) for i, v in by_i.items()} for name, by_i in step_ms.items()}
    kernel = f"{str(target.dtype).removeprefix('torch.')}/{linear_kind(target.model)}"
    lines = [f"# One draft step against one target step ({args.draft} on {args.target})", "",
             f"- machine: {describe_features()}; {args.threads} threads; target kernel {kernel}",
             f"- {args.context} positions cached; median of {args.rounds} interleaved rounds",
             f"- target pass over 1 token: **{target_ms:.1f} ms**", "",
             "| draft products | " + " | ".join(f"{w} row{'s' if w > 1 else ''} (ms)" for w in WIDTHS)
             + " | 1 row / target step |", "|---|" + "---:|" * (len(WIDTHS) + 1)]
    for name, by_w in rows.items():
        lines.append(f"| {name} | " + " | ".join(f"{by_w[w]:.2f}" for w in WIDTHS) + f" | {by_w[1] / target_ms:.3f} |")
    lines += ["", "In the decoding loop: k one-row steps right after a one-token target pass, which evicts the draft's "
              "weights from the caches (the steps above run back to back, warm); forms interleaved round by round.", "",
              "| form | draft steps per round (k) | " + " | ".join(str(k) for k in CHAIN_STEPS) + " |",
              "|---|---|" + "---:|" * len(CHAIN_STEPS)]
    for name, by_k in loop.items():
        lines += [f"| {name} | ms for the k steps | " + " | ".join(f"{by_k[k]:.2f}" for k in CHAIN_STEPS) + " |",
                  f"| {name} | ms per step | " + " | ".join(f"{by_k[k] / k:.2f}" for k in CHAIN_STEPS) + " |",
                  f"| {name} | per step / target step | "
                  + " | ".join(f"{by_k[k] / k / target_ms:.3f}" for k in CHAIN_STEPS) + " |",
                  f"| {name} | the k-th step alone, ms (x the warm one-row step) | "
                  + " | ".join(f"{alone[name][k]:.2f} ({alone[name][k] / rows[name][1]:.1f}x)" for k in CHAIN_STEPS)
                  + " |"]
    lines += ["", f"Command: `python tools/draft_step_cost.py --threads {args.threads} --dtype {args.dtype} "
              f"--linear {args.linear} --context {args.context} --rounds {args.rounds} --out {args.out}`", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "results.md", "\n".join(lines))
    write_json(args.out / "results.json", {"target_ms": target_ms, "target_ms_rounds": step, "kernel": kernel,
                                           "threads": args.threads, "context": args.context,
                                           "machine": describe_features(), "draft_ms": rows,
                                           "in_loop_ms": loop, "in_loop_step_ms": alone})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
