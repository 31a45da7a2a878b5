"""Datagen answer throughput, before and after continuous batching, side by side in one run.

Every configuration answers the same prompts greedily with the same length cap, one after the other in
this process, and is reported in tok/s of finished answers (answer tokens / wall seconds, prefills
included) and as a ratio to the first row:
  - padded-hf: HF `generate` on left-padded batches of --batch (datagen's engine until continuous
    batching, at its old default of 16), with transformers' sdpa attention, in fp32: what datagen ran;
  - the same padded engine in bf16 and with larger batches, to separate the engine from the dtype;
  - continuous: `specwire.data.continuous` (slot cache, refilled rows) in fp32 and bf16.
Agreement, on the first --agree prompts: how many answers are token-identical to unbatched greedy
decoding in the same dtype (one prompt at a time, the kernels plain decoding runs), and what share of
their tokens is the unbatched target's argmax given the answer's own prefix. Batching may flip
near-ties (a batched GEMM row or a masked reduction is not bitwise an unbatched one), and after a flip
the two answers go separate ways; the second measure says whether each token is still the target's
greedy choice, which is what a draft learns from.

    python tools/datagen_speed.py --threads 2 --out docs/bench/datagen

Writes results.md and results.json into --out.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from specwire.data.continuous import Request, generate_continuous
from specwire.data.datagen import generate_batch, plan_batches
from specwire.data.prompts import load_prompts
from specwire.decode.kernels import describe_features
from specwire.safeio import write_json, write_text
from specwire.target.cpu import cpu_model
from specwire.target.load import load_target
from specwire.target.heap import keep_freed_memory

# (name, engine, dtype, rows, attention)
CONFIGS = (
    ("padded-hf fp32 x16 (before)", "padded", "float32", 16, "sdpa"),
    ("padded-hf bf16 x64", "padded", "bfloat16", 64, "sdpa"),
    ("continuous fp32 x64", "continuous", "float32", 64, "invariant"),
    ("continuous bf16 x64", "continuous", "bfloat16", 64, "invariant"),
    ("continuous bf16 x128", "continuous", "bfloat16", 128, "invariant"),
)


def answer(target, engine: str, rows: int, prompts: list[list[int]], new_tokens: int) -> list[tuple[list[int], str]]:
    if engine == "continuous":
        return generate_continuous(target, [Request(tuple(p), new_tokens) for p in prompts], slots=rows)
    out: dict[int, tuple[list[int], str]] = {}
    for batch in plan_batches([(i, len(p)) for i, p in enumerate(prompts)], batch_size=rows, sort_window=8):
        out.update(zip(batch, generate_batch(target, [prompts[i] for i in batch], max_new_tokens=new_tokens,
                                             max_length=4096)))
    return [out[i] for i in range(len(prompts))]


@torch.inference_mode()
def next_token_agreement(target, prompts: list[list[int]], answers: list[tuple[list[int], str]]) -> tuple[int, int]:
    """(tokens, total): answer tokens that are the unbatched target's argmax given the answer's own prefix."""
    same = total = 0
    for prompt, (ids, _) in zip(prompts, answers):
        seq = torch.as_tensor([prompt + ids[:-1]], device=target.device)  # shape: [1, P + A - 1]
        logits = target.model(input_ids=seq).logits[0, len(prompt) - 1:]  # shape: [A, V]
        same += int((logits.argmax(-1).cpu() == torch.as_tensor(ids)).sum())
        total += len(ids)
    return same, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--prompts", default="pool:synthetic", help="any datagen --prompts source (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=128, help="prompts answered by every configuration")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--agree", type=int, default=32, help="prompts also decoded unbatched, for the agreement rate")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="docs/bench/datagen")
    args = ap.parse_args(argv)
    keep_freed_memory()  # the heap the command line runs with (target.heap)
    torch.set_num_threads(args.threads)
    records = load_prompts(args.prompts, limit=args.limit)
    targets: dict[tuple[str, str], object] = {}
    refs: dict[str, list] = {}
    rows = []
    for name, engine, dtype, size, attention in CONFIGS:
        key = (dtype, attention)
        if key not in targets:
            targets[key] = load_target(args.target, dtype=dtype, attention=attention)
        target = targets[key]
        prompts = [target.encode_chat(list(map(dict, r.messages))) for r in records]
        t0 = time.perf_counter()
        answers = answer(target, engine, size, prompts, args.max_new_tokens)
        seconds = time.perf_counter() - t0
        if dtype not in refs:  # unbatched greedy decoding in this dtype, plain decoding's kernels
            plain = targets.get((dtype, "invariant")) or load_target(args.target, dtype=dtype)
            targets[(dtype, "invariant")] = plain
            refs[dtype] = answer(plain, "padded", 1, prompts[:args.agree], args.max_new_tokens)
        agree = sum(a == b for a, b in zip(answers, refs[dtype]))
        tf_same, tf_total = next_token_agreement(targets[(dtype, "invariant")], prompts[:args.agree], answers[:args.agree])
        tokens = sum(len(ids) for ids, _ in answers)
        rows.append({"config": name, "engine": engine, "dtype": dtype, "rows": size, "attention": attention,
                     "answers": len(answers), "tokens": tokens, "seconds": round(seconds, 2),
                     "tok_s": round(tokens / seconds, 1), "agree": agree, "agree_of": min(args.agree, len(answers)),
                     "argmax_tokens": tf_same, "argmax_of": tf_total})
        print(f"{name}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tok/s; "
              f"unbatched-identical {agree}/{rows[-1]['agree_of']}; argmax tokens {tf_same}/{tf_total}", flush=True)
    base = rows[0]["tok_s"]
    machine = {"cpu": cpu_model(), "features": describe_features(), "threads": args.threads, "torch": torch.__version__}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "results.json", {"machine": machine, "prompts": args.prompts, "limit": args.limit,
                                      "max_new_tokens": args.max_new_tokens, "rows": rows})
    lines = [f"# Datagen answer throughput ({machine['cpu']}, {machine['features']}, {args.threads} threads, "
             f"torch {machine['torch']})", "",
             f"{len(records)} prompts from `{args.prompts}`, greedy answers of at most {args.max_new_tokens} tokens. "
             "tok/s counts finished answer tokens over wall time, prefills included; x is the ratio to the first row, "
             "measured in the same run. 'identical' counts answers token-identical to unbatched greedy decoding in "
             f"the same dtype, on the first {rows[0]['agree_of']} prompts; 'argmax' the share of their answer tokens "
             "that are the unbatched target's own argmax given the answer's prefix (one unbatched pass over the "
             "conversation): what distillation needs of each token.", "",
             "| configuration | tok/s | x | identical to unbatched | argmax tokens |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['config']} | {r['tok_s']:.1f} | {r['tok_s'] / base:.2f}x | {r['agree']}/{r['agree_of']} | "
              f"{100 * r['argmax_tokens'] / max(r['argmax_of'], 1):.2f}% |" for r in rows]
    lines += ["", f"Command: `python tools/datagen_speed.py --threads {args.threads} --prompts {args.prompts} "
              f"--limit {args.limit} --max-new-tokens {args.max_new_tokens} --agree {args.agree} --out {args.out}`", ""]
    write_text(out / "results.md", "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
