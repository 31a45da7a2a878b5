"""Capture throughput of `specwire datagen` against the bare target's prefill, on the same batches.

Measures, alternating the two in every repeat so that machine load hits both alike:
  bare     model.base_model(input_ids) on right-padded batches, no hooks, no lm_head: the floor;
  capture  datagen's capture path (`specwire.target.capture.capture_packed`, which `capture_batch` splits):
           the same forward with hs hooks, fusing the states, casting them to the dump dtype, and
           moving them to host memory (a no-op on CPU);
and prints tokens/s of each and capture / bare (the requirement: >= 0.90).

The batches are real: the conversations (prompt + the target's own answer) of a datagen dump
(--conversations DIR/conversations.jsonl), or the templated prompts of a prompt source
(--prompts mt-bench), batched as datagen batches them (similar lengths, --batch-size rows).

  python tools/capture_throughput.py --conversations /tmp/dg-mt/conversations.jsonl --repeats 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specwire.data.datagen import plan_capture_batches
from specwire.data.dump import DUMP_DTYPES, read_conversations
from specwire.target.capture import capture_packed
from specwire.target.load import BUILTIN_TARGET, load_target
from specwire.wiring import default_hs_ids
from specwire.target.heap import keep_freed_memory


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=BUILTIN_TARGET)
    ap.add_argument("--conversations", default=None, help="conversations.jsonl of a dump (prompt + answer ids)")
    ap.add_argument("--prompts", default="mt-bench", help="prompt source when --conversations is not given")
    ap.add_argument("--n", type=int, default=16, help="number of sequences (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--capture-batch-tokens", type=int, default=16384)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--dtype-dump", default="bfloat16", choices=sorted(DUMP_DTYPES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    keep_freed_memory()  # the heap the command line runs with (target.heap)
    if args.threads:
        torch.set_num_threads(args.threads)

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    if args.conversations:
        seqs = [r["input_ids"] for r in sorted(read_conversations(args.conversations), key=lambda r: r["index"])][: args.n]
        what = f"{len(seqs)} conversations of {args.conversations}"
    else:
        from specwire.data.prompts import load_prompts

        seqs = [target.encode_chat([dict(m) for m in p.messages]) for p in load_prompts(args.prompts, limit=args.n)]
        what = f"{len(seqs)} templated '{args.prompts}' prompts"
    hs_ids = list(default_hs_ids(target.num_layers))
    plan = plan_capture_batches([len(s) for s in seqs], batch_size=args.batch_size, max_tokens=args.capture_batch_tokens)
    batches = []
    for b in plan:
        rows = [seqs[p] for p in b]
        T = max(map(len, rows))
        ids = torch.zeros(len(rows), T, dtype=torch.long)  # shape: [B, T], right-padded
        for r, s in enumerate(rows):
            ids[r, : len(s)] = torch.tensor(s)
        batches.append((rows, ids.to(target.device)))
    n_tokens = sum(map(len, seqs))
    dump_dtype = DUMP_DTYPES[args.dtype_dump]
    device = target.device

    @torch.inference_mode()
    def bare() -> None:
        for _, ids in batches:
            target.model.base_model(input_ids=ids, use_cache=False)
        sync(device)

    @torch.inference_mode()
    def capture() -> None:
        for rows, _ in batches:
            cap = capture_packed(target, rows, hs_ids, dtype=dump_dtype)
            cap.hidden.to("cpu"), cap.last_hidden.to("cpu")
        sync(device)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return n_tokens / (time.perf_counter() - t0)

    bare(), capture()  # warm-up
    runs = {"bare": [], "capture": []}
    for r in range(args.repeats):
        order = ("bare", "capture") if r % 2 == 0 else ("capture", "bare")
        for name in order:
            runs[name].append(timed(bare if name == "bare" else capture))
    med = {k: statistics.median(v) for k, v in runs.items()}
    pair_ratios = [c / b for b, c in zip(runs["bare"], runs["capture"])]
    report = {
        "target": args.target, "device": str(device), "dtype": args.dtype, "dtype_dump": args.dtype_dump,
        "threads": torch.get_num_threads(), "data": what, "tokens": n_tokens, "batches": len(batches),
        "hs_ids": hs_ids, "repeats": args.repeats,
        "bare_tokens_per_s": [round(x, 1) for x in runs["bare"]],
        "capture_tokens_per_s": [round(x, 1) for x in runs["capture"]],
        "bare_median": round(med["bare"], 1), "capture_median": round(med["capture"], 1),
        "ratio_of_medians": round(med["capture"] / med["bare"], 3),
        "median_pair_ratio": round(statistics.median(pair_ratios), 3),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"target {args.target} on {device} ({args.dtype}, {report['threads']} threads), dump dtype {args.dtype_dump}")
    print(f"data: {what}: {n_tokens} tokens in {len(batches)} batches; hs ids {hs_ids} + L")
    print(f"bare prefill  tok/s: {report['bare_tokens_per_s']}  median {report['bare_median']}")
    print(f"capture path  tok/s: {report['capture_tokens_per_s']}  median {report['capture_median']}")
    print(f"capture / bare: {report['ratio_of_medians']:.3f} (ratio of medians), "
          f"{report['median_pair_ratio']:.3f} (median of paired repeats); requirement >= 0.90")


if __name__ == "__main__":
    main()
