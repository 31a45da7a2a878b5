"""`specwire train`: flags generated from `TrainConfig`, one call to `training.trainer.train`, a report.

Owns the `train` subcommand's parser and its text/JSON output only. Every flag except --threads and
--json is a `TrainConfig` field (`cli.options.add_config_options`), so each default and help line lives
once, in `training/config.py`.
"""

from __future__ import annotations

import os

from specwire.cli.options import add_config_options, add_json_option, config_from_args, emit_json
from specwire.training.config import TrainConfig

DTYPES = ("float32", "bfloat16", "float16")


def add_cli(sub) -> None:
    p = sub.add_parser(
        "train", help="train an EAGLE-3 draft with training-time test (resumable; works under torchrun)",
        description="Train an EAGLE-3 draft on a hidden-state dump (from `specwire datagen`) with K-step "
        "training-time test. Rerunning the same command resumes from OUT/checkpoint. Under "
        "`torchrun --nproc-per-node N` the data is sharded by rank. The final draft goes to OUT/draft.")
    add_config_options(p, TrainConfig, skip=("betas",), flags={"target_dtype": "--dtype"},
                       choices={"init_lm_head": ("target", "random"), "target_dtype": DTYPES})
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    add_json_option(p)
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from specwire.training.trainer import train

    result = train(config_from_args(TrainConfig, args))
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    if args.json:
        emit_json(result.to_dict())
        return 0
    if not result.finished:
        print(f"stopped at step {result.steps} of {result.total_steps}; rerun the same command to resume "
              f"(checkpoint: {result.checkpoint_dir})")
        return 0
    print(f"trained {result.steps} steps -> {result.draft_dir}")
    if result.val:
        acc = ", ".join(f"{a:.3f}" for a in result.val["step_accuracy"])
        print(f"validation step accuracy: [{acc}]  predicted accept length {result.val['predicted_accept_length']:.2f}")
    print(f"metrics: {result.metrics_path}")
    return 0
