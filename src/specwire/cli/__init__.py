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


def add_model_options(p: argparse.ArgumentParser, *, target: bool = True, draft: bool = False,
                      linear: bool = False) -> None:
    """Options every model-running command shares (`linear`: the decoding commands' --linear too)."""
    if target:
        p.add_argument("--target", default="smollm2-135m", help="built-in target name or HF model folder (default: %(default)s)")
    if draft:
        p.add_argument("--draft", default="smollm2-135m-eagle3",
                       help="draft checkpoint folder or the shipped 'smollm2-135m-eagle3' (default: %(default)s)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="weights dtype (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's choice)")
    if linear:
        p.add_argument("--linear", default="torch", choices=["torch", "pretransposed"],
                       help="the target's linear layers on CPU: 'torch' keeps nn.Linear; 'pretransposed' stores W.T "
                            "contiguously, which made 4- to 32-token passes 4-38%% cheaper at 2 threads on our machines, "
                            "depending on the CPU (docs/BENCHMARKS.md) (default: %(default)s; every method of a bench run shares the same target)")


def add_draft_mode_option(p: argparse.ArgumentParser) -> None:
    """--tree (default) / --chain: how the draft proposes tokens."""
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tree", dest="tree", action="store_true", default=True, help="tree drafting (default)")
    g.add_argument("--chain", dest="tree", action="store_false", help="chain drafting")


def add_json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout instead of text")


def emit_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, default=str))


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
