"""`specwire generate`: one reply to one prompt, streamed to the terminal.

Owns the command's arguments (generated from `GenerateConfig`, `SamplingParams` and `SpecConfig`) and
its output: the reply's text on stdout as it is decoded, one line of numbers on stderr. The work is
`decode.generate.generate_reply`: plain decoding without --draft, speculative decoding with one.
"""

from __future__ import annotations

import argparse
import sys

from specwire.cli.options import add_config_options, add_model_options, config_from_args
from specwire.cli.spec import add_spec_options, spec_from_args
from specwire.decode.generate import GenerateConfig
from specwire.decode.sampling import SamplingParams


def add_cli(sub) -> None:
    p = sub.add_parser("generate", help="one generation, streamed to the terminal",
                       description="Generate a reply to one prompt (the target's chat template is applied). "
                       "Without --draft it decodes plainly; with one it decodes speculatively.")
    add_model_options(p, linear=True)
    add_config_options(p, GenerateConfig, only=("draft", "prompt", "max_new_tokens"))
    add_config_options(p, SamplingParams)
    add_config_options(p, GenerateConfig, only=("seed", "raw"))
    add_spec_options(p, mode=True)
    p.set_defaults(func=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from specwire.decode.generate import generate_reply

    config = config_from_args(GenerateConfig, args, sampling=config_from_args(SamplingParams, args),
                              spec=spec_from_args(args))

    def write(piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    res = generate_reply(config, on_text=write).result
    write("\n")
    extra = f", accept length {res.extra['accept_length']:.2f}" if res.extra.get("accept_length") else ""
    used = (res.extra.get("budget_used") or {}).get("budgets_used")
    budget = (f", budget {res.extra['budget']}: " + ", ".join(f"{k} x{v}" for k, v in used.items())) if used else ""
    copies = res.extra.get("lookup") or {}
    copied = f", {copies['accepted']} copied tokens accepted" if copies.get("rounds") else ""
    print(f"[{len(res.output_ids)} tokens, {res.tokens_per_s:.1f} tok/s, stop: {res.stop_reason}{extra}, "
          f"{res.extra.get('kernel')}{budget}{copied}]", file=sys.stderr)
    return 0
