"""`specwire info`: describe a target from its config (layers, sizes, default wiring in every convention).

Owns the command's arguments and output only; the description is `target.load.target_info` and its
text is `bench.demo.render_info` (the demo prints the same table).
"""

from __future__ import annotations

import argparse

from specwire.cli.options import add_json_option, emit_json


def add_cli(sub) -> None:
    p = sub.add_parser("info", help="describe a target: layers, sizes, default wiring in every convention",
                       description="Describe a target from its config: architecture, layers L, hidden size, vocab, "
                       "tied embeddings, max positions, and the default EAGLE-3 wiring in every tool's convention.")
    p.add_argument("target", nargs="?", default="smollm2-135m", help="built-in name or HF folder (default: %(default)s)")
    add_json_option(p)
    p.set_defaults(func=cmd_info)


def cmd_info(args: argparse.Namespace) -> int:
    from specwire.bench.demo import render_info
    from specwire.target.load import target_info

    info = target_info(args.target)
    if args.json:
        emit_json(info.to_dict())
    else:
        print(render_info(info))
    return 0
