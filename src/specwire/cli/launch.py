"""`specwire launch-cmd`: a checked SGLang or vLLM launch line for a draft.

Owns the subcommand's flags and text output only; the checks and the argv are
`interop.launch.launch_command`, which opens the draft through the one reader (`draft.reader`).
"""

from __future__ import annotations

import argparse

from specwire.cli.options import add_json_option, emit_json
from specwire.interop.engines import ENGINES
from specwire.interop.launch import launch_command
from specwire.wiring import SGLANG_VERSIONS


def add_cli(sub) -> None:
    p = sub.add_parser("launch-cmd", help="a checked launch command for SGLang or vLLM",
                       description="Print the command that serves TARGET with draft D on SGLang or vLLM, after checking "
                       "everything the engine would get wrong silently: checkpoint layout, layer ids in the engine's "
                       "convention, norm_before_residual, the topk=1 override, the tree size, max_position_embeddings, "
                       "vocabulary and hidden sizes. Each refusal says the fix.")
    p.add_argument("draft", help="draft folder (sglang export for SGLang; native or speculators for vLLM)")
    p.add_argument("--engine", required=True, choices=ENGINES)
    p.add_argument("--target", default="smollm2-135m", help="built-in target name or HF folder (config only; default: %(default)s)")
    p.add_argument("--num-steps", type=int, default=None, help="draft depth (default: 5)")
    p.add_argument("--topk", type=int, default=None, help="SGLang: branching per step (default: 4)")
    p.add_argument("--num-draft-tokens", type=int, default=None, help="SGLang: tokens verified per pass (default: 16, or steps+1 with topk 1)")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (default: 1)")
    p.add_argument("--port", type=int, default=None)
    p.add_argument("--sglang-version", default=None, choices=SGLANG_VERSIONS,
                   help="the SGLang id rule of the server (default: the one the export was written for)")
    add_json_option(p)
    p.set_defaults(func=cmd_launch)


def cmd_launch(args: argparse.Namespace) -> int:
    r = launch_command(args.draft, engine=args.engine, target=args.target, num_steps=args.num_steps, topk=args.topk,
                       num_draft_tokens=args.num_draft_tokens, tp=args.tp, port=args.port, sglang_version=args.sglang_version)
    if args.json:
        emit_json(r.to_dict())
        return 0
    print(r.command)
    for c in r.checks:
        print(f"# ok: {c}")
    for n in r.notes:
        print(f"# note: {n}")
    return 0
