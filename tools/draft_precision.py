"""What the served draft's precision does to its proposals: its weights and activations, exact or rounded.

A draft needs no invariance (the target's verify pass decides every token), so rounding its weights or its
activations does not change a single output token; it changes what the draft proposes, so how many of its
tokens the target accepts, and what a draft step costs. This measures both, on the target's own greedy answers,
with the draft served three ways beside the same target (loaded as decoding loads it, `--dtype auto --linear
auto` by default):

  - served: what `decode.engine.load_engine_draft` serves by default (where the CPU has AVX512-BF16: the bf16
    kernel's int16 product over the q8_0 codes nearest the draft's weights, `bf16dot.q8i16dot`; float32 elsewhere);
  - exact: `load_engine_draft(..., weights="exact")`, the weights as stored and float32 activations (three-part
    bf16 products on AVX512-BF16, rowdot over the bf16 weights elsewhere);
  - bf16 throughout: the draft loaded in bf16, its products nn.Linear in bf16, served by the same lean pass
    (`decode.draft_step.ServedStep`): norms, attention and the residual stream in bf16 too. This is the
    arithmetic an AMX-served draft runs (bf16 inputs, float32 sums, bf16 outputs), through another kernel.

Both run the same fixed chain (`--num-steps`, no context lookup, so every accepted token is the draft's), prompt
by prompt with the order rotated, and every output is checked against plain greedy decoding. Reported for each:
tokens per verify pass (the accept length), acceptance per draft position, draft ms a round and tokens per second.

    python tools/draft_precision.py --prompts mt-bench --threads 2 --out docs/bench/draft-precision-mt-bench

Writes results.md and results.json into --out.
"""

from __future__ import annotations

import argparse
import time

import torch

from specwire.data.prompts import load_prompts
from specwire.decode.draft_step import ServedStep, draft_products
from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
from specwire.decode.kernels import describe_features, kernel_of
from specwire.decode.plain import plain_generate
from specwire.draft.checkpoint import load_draft
from specwire.safeio import write_json, write_text

from draft_step_cost import add_pair_options, decoding_target  # tools/, beside this script


def drafts(name: str, target) -> dict:
    """form -> a loaded draft: the served one, the exact one, and the same draft in bf16 throughout."""
    served, exact = load_engine_draft(name, target), load_engine_draft(name, target, weights="exact")
    bf16 = load_draft(name, device=target.device, dtype=torch.bfloat16)
    bf16.attach_embeddings(target.parts.embed)
    bf16.served = ServedStep.build(bf16)
    return {f"served ({draft_products(served)})": served, f"exact ({draft_products(exact)})": exact,
            f"bf16 throughout ({draft_products(bf16)}, lean pass)": bf16}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_options(ap)
    ap.add_argument("--prompts", default="mt-bench", help="a prompt set, as `specwire bench --prompts` takes it")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=4, help="the fixed chain depth (default: %(default)s)")
    args = ap.parse_args(argv)
    target = decoding_target(args)
    forms = drafts(args.draft, target)
    records = load_prompts(args.prompts, limit=args.limit)
    spec = SpecConfig(tree=False, num_steps=args.num_steps, budget="fixed", lookup=0)
    sums = {f: {"tokens": 0, "passes": 0, "draft_s": 0.0, "seconds": 0.0, "differ": 0,
                "accept": [0] * args.num_steps, "reach": [0] * args.num_steps} for f in forms}
    names = list(forms)
    with torch.inference_mode():
        for i, rec in enumerate(records):
            ids = target.encode_chat(list(rec.messages))
            ref = plain_generate(target, ids, max_new_tokens=args.max_new_tokens).output_ids
            for form in names[i % len(names):] + names[: i % len(names)]:  # order rotated prompt by prompt
                t0 = time.perf_counter()
                res = speculative_generate(target, forms[form], ids, max_new_tokens=args.max_new_tokens, tree=False,
                                           spec=spec)
                s = sums[form]
                s["seconds"] += time.perf_counter() - t0
                s["tokens"] += len(res.output_ids)
                s["passes"] += res.extra["num_verify_passes"]
                s["draft_s"] += res.extra["draft_s"]
                s["differ"] += res.output_ids != ref
                for k, (a, r) in enumerate(zip(res.extra["accept_counts"], res.extra["reach_counts"])):
                    s["accept"][k] += a
                    s["reach"][k] += r
            print(f"{i + 1}/{len(records)} {rec.id}", flush=True)
    n = len(records)
    kernel = kernel_of(target).name
    lines = [f"# The served draft's precision and its acceptance ({args.draft} on {args.target})", "",
             f"- machine: {describe_features()}; {args.threads} threads; target kernel {kernel}",
             f"- prompts: `{args.prompts}`, {n}; {args.max_new_tokens} new tokens, greedy; a fixed chain of "
             f"{args.num_steps}, no context lookup; forms rotated prompt by prompt", "",
             "| draft | tokens per verify pass | " + " | ".join(f"pos {k}" for k in range(args.num_steps))
             + " | draft ms / round | tok/s | identical to plain |", "|---|---:|" + "---:|" * (args.num_steps + 3)]
    table = {}
    for form, s in sums.items():
        per_pos = [a / r if r else 0.0 for a, r in zip(s["accept"], s["reach"])]
        table[form] = {"tokens_per_pass": s["tokens"] / s["passes"], "accept_per_position": per_pos,
                       "draft_ms_per_round": 1000 * s["draft_s"] / s["passes"], "tokens_per_s": s["tokens"] / s["seconds"],
                       "identical": n - s["differ"], "prompts": n}
        t = table[form]
        lines.append(f"| {form} | {t['tokens_per_pass']:.3f} | " + " | ".join(f"{p:.3f}" for p in per_pos)
                     + f" | {t['draft_ms_per_round']:.2f} | {t['tokens_per_s']:.1f} | {t['identical']}/{n} |")
    lines += ["", "Acceptance per position k: among the passes that reached k (every position before it accepted), "
              "the share that accepted the draft's token at k.", "",
              f"Command: `python tools/draft_precision.py --prompts {args.prompts}"
              + (f" --limit {args.limit}" if args.limit else "")
              + f" --max-new-tokens {args.max_new_tokens} --num-steps {args.num_steps} --threads {args.threads} "
              f"--dtype {args.dtype} --linear {args.linear} --out {args.out}`", ""]
    args.out.mkdir(parents=True, exist_ok=True)
    write_text(args.out / "results.md", "\n".join(lines))
    write_json(args.out / "results.json", {"machine": describe_features(), "kernel": kernel, "threads": args.threads,
                                           "prompts": args.prompts, "limit": args.limit, "num_steps": args.num_steps,
                                           "max_new_tokens": args.max_new_tokens, "forms": table})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
