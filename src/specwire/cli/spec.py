"""The speculation options every decoding command shares: `--budget`, `--num-steps`, `--topk`,
`--num-draft-tokens`, `--lookup` and (optionally) `--tree` / `--chain`, generated from
`specwire.decode.engine.SpecConfig`.

Owns: adding those flags to a parser and building the `SpecConfig` back from the parsed arguments.
Each flag's default and help come from the SpecConfig field (its trailing comment), so they are the
same in `bench`, `generate`, `serve`, `launch-cmd` and `doctor`. Does not own any command.

`--budget auto` is the default. Giving any of --num-steps / --topk / --num-draft-tokens without --budget
means those exact values (`--budget fixed`); with `--budget auto` they are the caps auto searches within.
"""

from __future__ import annotations

import argparse
from typing import Any

from specwire.cli.options import add_config_options, add_draft_mode_option
from specwire.decode.engine import BUDGET_MODES, SpecConfig

SPEC_FLAGS = ("num_steps", "topk", "num_draft_tokens")  # the SpecConfig fields that become flags


def add_spec_options(p: argparse.ArgumentParser, *, mode: bool = False, budget: bool = True) -> None:
    """--budget (with `budget`), --num-steps, --topk, --num-draft-tokens, --lookup; with `mode`, also --tree /
    --chain."""
    add_config_options(p, SpecConfig, only=SPEC_FLAGS + ("lookup",) + (("budget",) if budget else ()),
                       choices={"budget": BUDGET_MODES})
    for action in p._actions:  # None marks "not given", so an explicit number can mean a fixed budget
        if action.dest in SPEC_FLAGS + ("budget",) and action.default is not None:
            action.help = (action.help or "").replace("%(default)s", str(action.default))
            action.default = None
    if mode:
        add_draft_mode_option(p)


def spec_from_args(args: argparse.Namespace, **overrides: Any) -> SpecConfig:
    """The `SpecConfig` the flags ask for; `tree` from --tree/--chain when the parser has them."""
    given = [f for f in SPEC_FLAGS if getattr(args, f, None) is not None]
    values = {f: getattr(args, f) for f in given}
    if hasattr(args, "budget"):
        values["budget"] = args.budget or ("fixed" if given else "auto")
    else:
        values["budget"] = "fixed"
    if hasattr(args, "tree"):
        values["tree"] = args.tree
    if getattr(args, "lookup", None) is not None:
        values["lookup"] = args.lookup
    values.update(overrides)
    return SpecConfig(**values)
