"""`specwire bench`: side-by-side speed, acceptance and losslessness of decoding methods.

Owns the command's arguments (generated from `bench.config.BenchConfig` and, for the speculation
knobs, `SpecConfig` through `cli.spec`) and its output (the summary text or the report's `--json`
object). The run is `bench.run.run_bench`; the text is `bench.report.render_summary`.
"""

from __future__ import annotations

import argparse

from specwire.bench.config import BenchConfig
from specwire.cli.options import add_config_options, add_json_option, add_model_options, config_from_args, emit_json
from specwire.cli.spec import add_spec_options, spec_from_args


def add_cli(sub) -> None:
    p = sub.add_parser(
        "bench", help="side-by-side speed, acceptance and losslessness of decoding methods",
        description="Run hf-generate, hf-prompt-lookup, plain, eagle3-chain and eagle3-tree on the same prompts in one "
        "run (same dtype and threads, prompt-major interleaving, warm-up first). Every output is compared with plain "
        "greedy decoding (lossless column); speed-ups are given over hf-generate and over plain. Writes results.md, "
        "results.png and results.json into the run folder, and records every finished prompt in runs.jsonl there: "
        "rerunning an interrupted command resumes it (same settings and machine only).")
    add_model_options(p, draft=True, linear=True)
    add_config_options(p, BenchConfig, only=("prompts", "limit", "max_new_tokens", "methods"))
    add_spec_options(p)
    add_config_options(p, BenchConfig, only=("warmup_tokens", "out_dir"), flags={"out_dir": "--out"},
                       helps={"out_dir": "run folder (default: runs/bench-<prompts>-<timestamp>/). A run interrupted "
                              "there resumes when the same command is rerun; a larger --limit extends a finished one"})
    p.add_argument("--fresh", action="store_true", help="measure every prompt again, ignoring what --out has recorded")
    add_config_options(p, BenchConfig, only=("progress",))
    add_json_option(p)
    p.set_defaults(func=cmd_bench)


def bench_config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig the flags ask for; results.md records the equivalent command with every setting explicit."""
    return config_from_args(BenchConfig, args, spec=spec_from_args(args), resume=not args.fresh, command=None)


def cmd_bench(args: argparse.Namespace) -> int:
    from specwire.bench.report import render_summary
    from specwire.bench.run import run_bench

    report = run_bench(bench_config_from_args(args))
    if args.json:
        emit_json(report.to_dict())
    else:
        print(render_summary(report))
    return 0
