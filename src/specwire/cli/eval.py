"""`specwire eval`: offline per-step accuracy of a draft, one call to `training.evaluate.evaluate`.

Owns the `eval` subcommand's parser and its text/JSON output only. `--draft` may name a `train --out`
folder: `training.rundir.resolve_draft_arg` picks its draft/ and the note goes to stderr.
"""

from __future__ import annotations

import sys

from specwire.cli.options import add_json_option, emit_json
from specwire.training.config import DEFAULT_TTT_STEPS


def add_cli(sub) -> None:
    p = sub.add_parser(
        "eval", help="offline per-step accuracy of a draft and the accept length it predicts",
        description="Teacher-forced top-1 accuracy of each unrolled draft step on stored target states "
        "(the dump's validation split by default), and the chain accept length it predicts: "
        "1 + sum_k prod_{j<k} a_j. Validates the draft, not the serving wiring (see `specwire doctor`).")
    p.add_argument("--draft", default="smollm2-135m-eagle3",
                   help="draft folder, a `train --out` folder, or the shipped draft (default: %(default)s)")
    p.add_argument("--data", required=True, help="dump folder from `specwire datagen`")
    p.add_argument("--target", default=None, help="target name or folder (default: the one the dump names)")
    p.add_argument("--ttt-steps", type=int, default=DEFAULT_TTT_STEPS, help="unrolled steps K (default: %(default)s)")
    p.add_argument("--split", choices=["val", "train", "all"], default="val")
    p.add_argument("--max-samples", type=int, default=None)
    p.add_argument("--batch-tokens", type=int, default=8192)
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype of the target (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--record", action="store_true",
                   help="store the per-step top-1 and top-k accuracy in the draft folder's acceptance.json, where "
                        "decoding's `--budget auto` starts from (eval on prompts like the ones you will serve)")
    add_json_option(p)
    p.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    from specwire.training.evaluate import evaluate
    from specwire.training.rundir import resolve_draft_arg

    where = resolve_draft_arg(args.draft)
    if where.note:
        print(f"specwire eval: {where.note}", file=sys.stderr)
    r = evaluate(where.path, args.data, target=args.target, ttt_steps=args.ttt_steps, split=args.split,
                 max_samples=args.max_samples, batch_tokens=args.batch_tokens, device=args.device,
                 dtype=args.dtype)
    if args.record:
        from specwire.draft.acceptance import DraftAcceptance, write_acceptance
        from specwire.draft.checkpoint import locate_draft
        from specwire.training.ttt import TOPK_STAT

        path = write_acceptance(locate_draft(where.path).path, DraftAcceptance(
            step_accuracy=[round(a, 4) for a in r.step_accuracy],
            step_accuracy_topk=[round(a, 4) for a in r.step_accuracy_topk], topk=TOPK_STAT,
            source=f"specwire eval --data {args.data} --split {r.split}", n_tokens=r.n_tokens))
        print(f"specwire eval: wrote {path}", file=sys.stderr)
    if args.json:
        emit_json(r.to_dict())
        return 0
    print(f"draft {where.path} on {args.data} ({r.split}: {r.n_samples} samples, {r.n_tokens} tokens)")
    print("step  accuracy  top-4 acc  draft-vocab acc  KL")
    for j, (a, a4, ad, kl) in enumerate(zip(r.step_accuracy, r.step_accuracy_topk, r.step_accuracy_draft_vocab, r.step_kl)):
        print(f"{j:>4}  {a:8.3f}  {a4:9.3f}  {ad:15.3f}  {kl:.3f}")
    print(f"predicted chain accept length: {r.predicted_accept_length:.2f}")
    print(f"draft vocab covers {100 * r.draft_vocab_coverage:.1f}% of the target's choices")
    return 0
