"""The layout of a training run folder (`specwire train --out OUT`), and finding the draft inside one.

Owns: where a run keeps its files (`RunPaths`: OUT/checkpoint/, OUT/draft/, OUT/metrics.jsonl) and
`resolve_draft_arg`, which turns any `--draft` argument into something `draft.checkpoint.load_draft` reads
and returns the note instead of logging it (for `specwire eval`, which prints it). The rule itself (a run
folder becomes its `draft/`, an unfinished run is refused with what to do) lives once in
`draft.checkpoint.locate_draft`, so every command that loads a draft accepts a run folder. Does not read
checkpoints (`training.checkpoint`, `draft.checkpoint`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specwire.draft.checkpoint import RUN_CHECKPOINT_DIR, RUN_DRAFT_DIR, locate_draft
from specwire.draft.model import SHIPPED_DRAFT

CHECKPOINT_DIR = RUN_CHECKPOINT_DIR  # resumable state, rewritten every save_every steps
DRAFT_DIR = RUN_DRAFT_DIR  # the final draft, a native checkpoint folder
BEST_DIR = "best"  # the draft at the best periodic validation so far (TrainConfig.select)
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

    `draft.checkpoint.locate_draft` decides (and raises for a missing draft, an unfinished run, or a
    folder that is neither a draft nor a run); the note comes back instead of being logged.
    """
    text = str(name_or_path)
    if text == SHIPPED_DRAFT:
        return DraftArg(path=text, note=None)
    where = locate_draft(text)
    return DraftArg(path=text if where.note is None else str(where.path), note=where.note)
