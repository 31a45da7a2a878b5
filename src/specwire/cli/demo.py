"""`specwire demo`: the main job on built-in defaults.

Owns the command's arguments (generated from `bench.demo.DemoConfig`) and where its lines go (stdout).
The demo itself is `bench.demo.run_demo`.
"""

from __future__ import annotations

import argparse

from specwire.bench.demo import DemoConfig
from specwire.cli.options import add_config_options, add_model_options, config_from_args


def add_cli(sub) -> None:
    p = sub.add_parser("demo", help="the main job on built-in defaults",
                       description="Load the built-in target and its shipped draft, print the wiring table, stream a few "
                       "answers with tree speculation, benchmark hf-generate / plain / eagle3-chain / eagle3-tree on "
                       "MT-bench prompts, one of each category in turn (lossless check included), and print the "
                       "doctor's verdict. Without "
                       "an installed draft it decodes plainly and says so.")
    add_model_options(p, draft=True, linear=True)
    add_config_options(p, DemoConfig, only=("max_new_tokens", "bench_prompts", "bench_tokens", "out"))
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from specwire.bench.demo import run_demo

    run_demo(config_from_args(DemoConfig, args))
    return 0
