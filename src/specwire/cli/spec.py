"""The speculation options every decoding command shares: `--num-steps`, `--topk`, `--num-draft-tokens`
and (optionally) `--tree` / `--chain`, generated from `specwire.decode.engine.SpecConfig`.

Owns: adding those flags to a parser and building the `SpecConfig` back from the parsed arguments.
Each flag's default and help come from the SpecConfig field (its trailing comment), so they are the
same in `bench`, `generate`, `serve`, `launch-cmd` and `doctor`. Does not own any command.
"""

from __future__ import annotations

import argparse
from typing import Any

from specwire.cli.options import add_config_options, add_draft_mode_option, config_from_args
from specwire.decode.engine import SpecConfig

SPEC_FLAGS = ("num_steps", "topk", "num_draft_tokens")  # the SpecConfig fields that become flags


def add_spec_options(p: argparse.ArgumentParser, *, mode: bool = False) -> None:
    """--num-steps, --topk, --num-draft-tokens; with `mode`, also --tree (default) / --chain."""
    add_config_options(p, SpecConfig, only=SPEC_FLAGS)
    if mode:
        add_draft_mode_option(p)


def spec_from_args(args: argparse.Namespace, **overrides: Any) -> SpecConfig:
    """The `SpecConfig` the flags ask for; `tree` from --tree/--chain when the parser has them."""
    return config_from_args(SpecConfig, args, **overrides)
