"""`specwire doctor` and `specwire dump-states`: diagnose a draft's wiring; capture states for it elsewhere.

Owns the two subcommands' flags (doctor's are generated from `doctor.diagnose.DoctorConfig`) and their
output only; the work is `doctor.diagnose.diagnose` and `doctor.states.dump_states`. Exit codes:
doctor 0 when no error is found, 1 when one is, 2 for a usage mistake or a folder it cannot read.
"""

from __future__ import annotations

import argparse

from specwire.cli.options import add_config_options, add_json_option, add_model_options, config_from_args, emit_json
from specwire.doctor.diagnose import DTYPES, DoctorConfig, diagnose, render_report
from specwire.doctor.states import CALIBRATION_PROMPTS, dump_states
from specwire.interop.engines import ENGINES
from specwire.wiring import SGLANG_VERSIONS, num_hs_indices


def add_cli(sub) -> None:
    p = sub.add_parser("doctor", help="diagnose wiring, format and flag problems; find the wiring a draft was trained on",
                       description="Static checks of a draft against a target and a serving configuration (including "
                       "every copy of the ids, widths and vocabulary sizes the draft folder holds), an empirical "
                       "search over every ordered triple of hidden states, and live acceptance against offline accuracy. "
                       "Exit code 1 when an error is found, 2 for a usage mistake.")
    p.add_argument("draft", help="draft folder (native, speculators or SGLang layout) or 'smollm2-135m-eagle3'")
    p.add_argument("--target", default="smollm2-135m", help="built-in name, HF folder, or a folder with only config.json")
    add_config_options(p, DoctorConfig, choices={"engine": ENGINES, "engine_version": SGLANG_VERSIONS, "dtype": DTYPES})
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    add_json_option(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("dump-states", help="write all-layer target states of calibration text (for `doctor --states`)",
                       description="Run the target on calibration prompts (plus greedy continuations) and write every hs "
                       "index 0..L, the token embeddings, and the target's greedy next tokens (docs/DOCTOR.md).")
    p.add_argument("--target", required=True, help="built-in name or HF folder with weights")
    p.add_argument("--prompts", default="builtin", help="'builtin' (the doctor's prompts), mt-bench, humaneval, pool or a JSONL file")
    p.add_argument("--limit", type=int, default=12, help="calibration prompts to use (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=40,
                   help="greedy continuation tokens per prompt, so the states cover the target's own text (default: %(default)s)")
    p.add_argument("--out", required=True, help="folder to write the states dump into (replaced atomically)")
    p.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16"],
                   help="dtype of the stored states; bfloat16 halves the size (default: %(default)s)")
    add_model_options(p, target=False)
    p.set_defaults(func=cmd_dump_states)


def cmd_doctor(args: argparse.Namespace) -> int:
    rep = diagnose(args.draft, args.target, config_from_args(DoctorConfig, args))
    if args.json:
        emit_json(rep.to_dict())
    else:
        print(render_report(rep))
    return 0 if rep.ok else 1


def cmd_dump_states(args: argparse.Namespace) -> int:
    from specwire.target.load import load_target

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    if args.prompts == "builtin":
        prompts = list(CALIBRATION_PROMPTS[: args.limit])
    else:
        from specwire.data.prompts import load_prompts

        prompts = load_prompts(args.prompts, limit=args.limit)
    out = dump_states(target, prompts, args.out, max_new_tokens=args.max_new_tokens, dtype=args.state_dtype,
                      target_name=args.target)
    print(f"wrote {len(prompts)} samples of {num_hs_indices(target.num_layers)} states each to {out}")
    return 0
