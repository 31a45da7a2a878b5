"""The native draft checkpoint on disk: where the shipped draft lives, writing a draft, loading one.

Owns: finding a draft from a `--draft` argument (`locate_draft`, `resolve_draft_path`: the shipped
draft's name, a draft folder, or a `specwire train --out` run folder, whose `draft/` is used), the native config.json
(`native_config_json`: speculators' eagle3 fields plus a `specwire` block holding the DraftConfig and
its Wiring), `save_draft` (atomic), and `load_draft`. Does not own the module or its maths
(`draft.model`), nor reading a folder: `load_draft` goes through the one reader,
`specwire.draft.reader`, so a native checkpoint is held to the same consistency check as every
other draft (every record of the hidden-state ids, the widths, the vocabulary sizes).

Layout (a folder): speculators' key layout (`layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`) in
`model.safetensors` and the config described above. vLLM reads the same layout; `interop.convert`
writes SGLang's.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specwire.draft.model import (
    NATIVE_FORMAT, NATIVE_FORMAT_VERSION, SHIPPED_DRAFT, DraftConfig, Eagle3Draft, check_vocab_map,
)
from specwire.draft.reader import read_checkpoint  # the one reader: every load passes its consistency check
from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, check_tensors, load_tensors, save_tensors

WEIGHTS_FILE = "model.safetensors"


def shipped_draft_dir() -> Path:
    """Where the shipped draft (`smollm2-135m-eagle3`) is installed."""
    return Path(__file__).parent.parent / "assets" / SHIPPED_DRAFT


# A `specwire train --out OUT` folder: the finished draft in OUT/draft/, resumable state in OUT/checkpoint/
# (`training.rundir.RunPaths` names the same folders from these constants).
RUN_DRAFT_DIR = "draft"
RUN_CHECKPOINT_DIR = "checkpoint"
RUN_STATE_FILE = "state.json"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraftLocation:
    """Where a `--draft` argument points."""

    path: Path  # the draft folder (holds config.json)
    note: str | None  # one line for the user when the argument was reinterpreted (a run folder), else None


def locate_draft(name_or_path: str | os.PathLike) -> DraftLocation:
    """The folder of a draft given by name ('smollm2-135m-eagle3'), folder, or `train --out` run folder.

    A folder without config.json whose draft/ holds one is a run folder: its draft/ is used, with a note.
    A SpecwireError when the draft is absent, when the run has not finished, or when the folder is
    neither a draft nor a run (naming both expected layouts).
    """
    if str(name_or_path) == SHIPPED_DRAFT:
        p = shipped_draft_dir()
        if not (p / "config.json").is_file():
            raise SpecwireError(f"the shipped draft '{SHIPPED_DRAFT}' is not installed at {p}.")
        return DraftLocation(p, None)
    p = Path(name_or_path).expanduser()
    if not p.exists():
        raise SpecwireError(f"draft '{name_or_path}' not found: not '{SHIPPED_DRAFT}' nor an existing folder.")
    if p.is_dir() and (p / "config.json").is_file():
        return DraftLocation(p, None)
    run_draft, run_state = p / RUN_DRAFT_DIR, p / RUN_CHECKPOINT_DIR / RUN_STATE_FILE
    if p.is_dir() and (run_draft / "config.json").is_file():
        return DraftLocation(run_draft, f"using {run_draft}, the draft that `specwire train --out {p}` wrote")
    if p.is_dir() and run_state.is_file():
        raise SpecwireError(
            f"draft '{p}': a training run that has not finished ({run_state.parent} holds its state, {run_draft} "
            f"does not exist yet).",
            fix=f"rerun the same `specwire train --out {p}` command to finish it, then pass {run_draft}.")
    found = "a file" if not p.is_dir() else describe_folder(p)
    raise SpecwireError(
        f"draft '{p}': expected a draft folder (config.json + {WEIGHTS_FILE}) or a `specwire train --out` folder "
        f"(with {RUN_DRAFT_DIR}/config.json); found {found}.",
        fix=f"pass the folder that holds config.json, a `specwire train --out` folder, or the shipped '{SHIPPED_DRAFT}'.")


def describe_folder(p: Path, limit: int = 5) -> str:
    """What a folder holds, for an error message: 'an empty folder' or 'a folder holding a, b/ (no config.json)'."""
    names = sorted(c.name + ("/" if c.is_dir() else "") for c in p.iterdir())
    if not names:
        return "an empty folder"
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"a folder holding {shown} (no config.json)"


def resolve_draft_path(name_or_path: str | os.PathLike) -> Path:
    """`locate_draft`'s folder; a run folder's note goes to stderr as a logging warning.

    Every consumer of a `--draft` argument (load_draft, export, launch-cmd, doctor) resolves through here.
    """
    where = locate_draft(name_or_path)
    if where.note:
        log.warning("%s", where.note)
    return where.path


def native_config_json(config: DraftConfig, *, extra: dict | None = None) -> dict[str, Any]:
    """The config.json of a native checkpoint: speculators' eagle3 fields + a `specwire` block."""
    w = config.wiring
    layer = config.llama_layer_config().to_diff_dict()
    layer.pop("transformers_version", None)
    layer["model_type"] = "llama"
    layer["architectures"] = ["LlamaForCausalLM"]
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": config.norm_before_residual,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": w.in_convention("speculators"),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 5}],
            "verifier": {"name_or_path": None, "architectures": [w.target.architecture]},
        },
        "specwire": specwire_block(config, extra),
    }


def specwire_block(config: DraftConfig, extra: dict | None = None) -> dict[str, Any]:
    """The `specwire` block every export carries: the DraftConfig (with its Wiring) plus `extra` fields."""
    return {"format": NATIVE_FORMAT, "format_version": NATIVE_FORMAT_VERSION, "draft_config": config.to_dict(), **(extra or {})}


def save_draft(draft: Eagle3Draft, out_dir: str | os.PathLike, *, dtype: torch.dtype | None = None,
               extra: dict | None = None, verifier_path: str | None = None) -> Path:
    """Write a native checkpoint folder atomically (config.json + model.safetensors)."""
    out_dir = Path(out_dir)
    sd = {k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).cpu() for k, v in draft.state_dict().items()}
    cfg = native_config_json(draft.config, extra=extra)
    if verifier_path:
        cfg["speculators_config"]["verifier"]["name_or_path"] = verifier_path
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        save_tensors(tmp / WEIGHTS_FILE, sd, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out_dir


def read_native_config(path: str | os.PathLike) -> tuple[DraftConfig, dict]:
    """The DraftConfig of a native checkpoint and its raw config.json, after the reader's consistency check."""
    info = read_checkpoint(Path(path)).require_consistent()
    config = info.draft_config()
    if config is None:
        raise SpecwireError(
            f"{info.config_path}: no 'specwire' block; this is not a native specwire checkpoint.",
            fix=f"convert it first: specwire import {info.path} --out DIR",
        )
    return config, info.config


def load_draft(name_or_path: str | os.PathLike, *, device: str | torch.device = "cpu",
               dtype: torch.dtype | None = torch.float32) -> Eagle3Draft:
    """Load a native checkpoint: the reader's consistency check, then every tensor's name, shape and dtype."""
    path = resolve_draft_path(name_or_path)
    config, _ = read_native_config(path)
    draft = Eagle3Draft(config)
    weights = path / WEIGHTS_FILE
    tensors = load_tensors(weights)
    check_tensors(weights, tensors, draft.expected_shapes())
    if tensors["d2t"].dtype != torch.long:
        raise SpecwireError(f"{weights}: tensor 'd2t' has dtype {tensors['d2t'].dtype}, expected int64.")
    tensors["t2d"] = tensors["t2d"].bool()
    check_vocab_map(tensors["d2t"], tensors["t2d"], vocab_size=config.vocab_size, source=str(weights))
    draft.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()}, strict=True)
    draft.to(device=device)
    if dtype is not None:
        draft.to(dtype=dtype)
    from specwire.draft.acceptance import read_acceptance

    draft.acceptance = read_acceptance(path)  # measured acceptance per position (acceptance.json), or None
    return draft.eval()
