"""The `specwire` command line: a thin layer over library functions.

Owns: argument parsing, the shared options (`--device`, `--dtype`, `--json`), turning a
`SpecwireError` into one line on stderr and exit code 2 (no traceback for user mistakes), and the
registry of subcommands. Each subcommand's module registers itself with `add_cli(subparsers)` and
its handler calls one library function that tests call too.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from typing import Any

from specwire.cli.options import add_draft_mode_option, add_json_option, add_model_options, emit_json  # noqa: F401 (re-exported)
from specwire.errors import SpecwireError

# Modules that contribute subcommands through `add_cli(subparsers)`, in help order.
COMMAND_MODULES = [
    "specwire.cli.commands",  # info, generate, demo
    "specwire.data.datagen",
    "specwire.training.trainer",
    "specwire.training.evaluate",
    "specwire.bench.run",
    "specwire.interop.formats",  # export, import
    "specwire.interop.launch",
    "specwire.doctor.diagnose",  # doctor, dump-states
    "specwire.server",
]

EPILOG = """\
The wiring contract: every dump, checkpoint and engine carries the hidden-state ids the draft reads
(hs-index convention: 0 = embeddings, i = input of layer i, L = last layer before the final norm),
and refuses a mismatch. `specwire info smollm2-135m` shows them in every tool's convention.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specwire",
        description="EAGLE-3 speculative decoding for any Hugging Face causal LM: capture, train, decode, "
        "benchmark, export to SGLang/vLLM, and a doctor for wiring mismatches.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_cli(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)
    try:
        rc = args.func(args)
    except SpecwireError as e:
        print(f"specwire {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
