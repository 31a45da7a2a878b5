"""The layout of a training run folder (`specwire train --out OUT`), and finding the draft inside one.

Owns: where a run keeps its files (`RunPaths`: OUT/checkpoint/, OUT/draft/, OUT/metrics.jsonl) and
`resolve_draft_arg`, which turns any `--draft` argument into something `draft.checkpoint.load_draft` reads:
a run folder becomes its `draft/` (with a note for stderr), an unfinished run is refused with what to
do. Does not read checkpoints (`training.checkpoint`, `draft.checkpoint`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specwire.errors import SpecwireError

CHECKPOINT_DIR = "checkpoint"  # resumable state, rewritten every save_every steps
DRAFT_DIR = "draft"  # the final draft, a native checkpoint folder
METRICS_FILE = "metrics.jsonl"  # one JSON record per log/validation event


@dataclass(frozen=True)
class RunPaths:
    """The files of one run folder."""

    out: Path  # the run folder itself

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / CHECKPOINT_DIR

    @property
    def draft_dir(self) -> Path:
        return self.out / DRAFT_DIR

    @property
    def metrics_path(self) -> Path:
        return self.out / METRICS_FILE


@dataclass(frozen=True)
class DraftArg:
    """A resolved `--draft` argument."""

    path: str  # what to pass on to load_draft: a draft folder or the shipped draft's name
    note: str | None  # one line for stderr when the argument was reinterpreted (a run folder), else None


def resolve_draft_arg(name_or_path: str | os.PathLike) -> DraftArg:
    """A draft folder or name passes through; a `train --out` folder resolves to its `draft/`.

    Refuses a run folder whose run has not finished (it holds only checkpoint/), and a folder that is
    neither a draft nor a run, naming both expected layouts.
    """
    text = str(name_or_path)
    p = Path(text).expanduser()
    if not p.is_dir() or (p / "config.json").is_file():
        return DraftArg(path=text, note=None)  # a draft folder, a name, or a missing path: load_draft decides
    run = RunPaths(p)
    if (run.draft_dir / "config.json").is_file():
        return DraftArg(path=str(run.draft_dir), note=f"using {run.draft_dir}, the draft that `specwire train --out {p}` wrote")
    if (run.checkpoint_dir / "state.json").is_file():
        raise SpecwireError(
            f"draft '{p}': a training run that has not finished ({run.checkpoint_dir} holds its state, {run.draft_dir} "
            f"does not exist yet).",
            fix=f"rerun the same `specwire train --out {p}` command to finish it, then pass {run.draft_dir}.")
    raise SpecwireError(
        f"draft '{p}': expected a draft folder (config.json + model.safetensors) or a `specwire train --out` folder "
        f"(with {DRAFT_DIR}/config.json); found neither.",
        fix="pass the folder that holds config.json, or the shipped 'smollm2-135m-eagle3'.")
