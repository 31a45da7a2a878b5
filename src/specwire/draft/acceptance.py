"""A draft's measured acceptance per draft position, stored beside its weights: `acceptance.json`.

Scope: `DraftAcceptance` (per-step top-1 and top-k accuracy from `specwire eval`, where it was measured)
and reading/writing it in a draft folder. `specwire eval --record` writes it; the engine's `auto` budget
(`decode.budget`) starts from it. Does not measure anything (`training.evaluate`) nor choose a budget.

The file is a sidecar, not part of config.json, so exports to SGLang and vLLM stay exactly their formats.
A draft without it still decodes: `auto` then starts from a cautious prior and learns from live rounds.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from specwire.errors import SpecwireError
from specwire.safeio import write_json

ACCEPTANCE_FILE = "acceptance.json"


@dataclass
class DraftAcceptance:
    step_accuracy: list[float]  # P(draft token j is the target's | tokens 0..j-1 were), top-1, per step
    step_accuracy_topk: list[float]  # P(the target's token is among the draft's `topk` best), per step
    topk: int  # k of step_accuracy_topk
    source: str = ""  # what it was measured on (the eval data folder and split)
    n_tokens: int = 0  # scored tokens at step 0

    def __post_init__(self):
        for name in ("step_accuracy", "step_accuracy_topk"):
            v = getattr(self, name)
            if not isinstance(v, list) or not v or not all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in v):
                raise SpecwireError(f"{ACCEPTANCE_FILE}: field '{name}': expected a non-empty list of probabilities, "
                                    f"found {v!r}.")
        if len(self.step_accuracy) != len(self.step_accuracy_topk):
            raise SpecwireError(f"{ACCEPTANCE_FILE}: 'step_accuracy' has {len(self.step_accuracy)} steps, "
                                f"'step_accuracy_topk' {len(self.step_accuracy_topk)}; expected the same count.")
        if not isinstance(self.topk, int) or self.topk < 1:
            raise SpecwireError(f"{ACCEPTANCE_FILE}: field 'topk': expected a positive integer, found {self.topk!r}.")

    def to_dict(self) -> dict:
        return asdict(self)


def read_acceptance(draft_dir: str | Path) -> DraftAcceptance | None:
    """The acceptance stored in a draft folder, or None when it has none. A malformed file is an error."""
    path = Path(draft_dir) / ACCEPTANCE_FILE
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise SpecwireError(f"{path}: not readable JSON ({e}).") from None
    if not isinstance(raw, dict):
        raise SpecwireError(f"{path}: expected a JSON object, found {type(raw).__name__}.")
    fields = DraftAcceptance.__dataclass_fields__
    missing = [k for k in ("step_accuracy", "step_accuracy_topk", "topk") if k not in raw]
    if missing:
        raise SpecwireError(f"{path}: field '{missing[0]}' is missing.", fix="rewrite it with `specwire eval --record`.")
    try:
        return DraftAcceptance(**{k: raw[k] for k in fields if k in raw})
    except SpecwireError as e:
        raise SpecwireError(f"{path}: {str(e).split(': ', 1)[1]}") from None


def write_acceptance(draft_dir: str | Path, acceptance: DraftAcceptance) -> Path:
    path = Path(draft_dir) / ACCEPTANCE_FILE
    write_json(path, acceptance.to_dict())
    return path
