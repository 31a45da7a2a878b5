"""The `specwire` command line: the top of the stack, and nothing but a front end.

Owns: the `specwire` parser, the registry of command modules, and turning a `SpecwireError` into
one line on stderr and exit code 2 (no traceback for a user mistake). Each command group lives in
its own module here (`cli/<group>.py`, with `add_cli(subparsers)`); each handler parses, makes one
library call that a test can make too, and prints. Options shared by several commands, and the
flags generated from config dataclasses, live in `cli/options.py` and `cli/spec.py`. No library
module imports this package (`tests/unit/test_architecture.py`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from specwire.errors import SpecwireError

# Modules that contribute subcommands through `add_cli(subparsers)`, in help order.
COMMAND_MODULES = [
    "specwire.cli.info",
    "specwire.cli.generate",
    "specwire.cli.demo",
    "specwire.cli.datagen",
    "specwire.cli.selfinstruct",
    "specwire.cli.train",
    "specwire.cli.eval",
    "specwire.cli.bench",
    "specwire.cli.convert",  # export, import
    "specwire.cli.launch",  # launch-cmd
    "specwire.cli.doctor",  # doctor, dump-states
    "specwire.cli.serve",
]

# Batch commands whose passes allocate and free tensors of megabytes, where reusing freed heap blocks measured
# faster (datagen 1.14x, train 1.22x; `target.heap`). Decoding and serving gained nothing measurable, so they keep
# glibc's defaults and the memory a long-lived process would otherwise hold.
REUSE_HEAP_COMMANDS = frozenset({"datagen", "selfinstruct", "train"})

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


def main(argv: list[str] | None = None, *, process: bool = False) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if process and args.command in REUSE_HEAP_COMMANDS:
        from specwire.target.heap import keep_freed_memory

        keep_freed_memory()  # before the command's first large tensor
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


def run() -> int:
    """The process's entry point (the `specwire` script, `python -m specwire`): `main`, with the process-wide
    settings only a whole process may make. Tests call `main` and keep their own."""
    return main(process=True)


if __name__ == "__main__":
    sys.exit(run())
