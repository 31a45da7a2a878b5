"""Resumable training checkpoints: `OUT/checkpoint/`, and recovery after a kill.

Owns: writing a checkpoint atomically (`save_checkpoint`: `draft.safetensors`, `optimizer.safetensors`
with the AdamW moments and step counts keyed by parameter name, `state.json` with the step, the config
and the optimizer hyper-parameters), reading it back and refusing another run's (`load_checkpoint`),
and putting a run folder back in order after a SIGKILL (`recover_run_folder`). Does not own the loop
(`training.trainer`) or the final draft (`draft.checkpoint` writes OUT/draft).

The data order is a pure function of (seed, epoch) and the learning rate a pure function of the step,
so the step number is the whole data position: a rerun of the same command resumes and reproduces the
uninterrupted run step for step (tests/integration/test_kill.py kills `specwire train` with SIGKILL to check it).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import torch

from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, check_tensors, load_tensors, read_json, save_tensors
from specwire.training.config import RESUME_FREE_FIELDS, TrainConfig

log = logging.getLogger("specwire")

CHECKPOINT_FORMAT = "specwire-train-checkpoint"
CHECKPOINT_VERSION = 1


def _resume_view(cfg: dict) -> dict:
    """The settings a resumed run must share; a field that an older checkpoint lacks counts as its default."""
    defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig) if f.default is not dataclasses.MISSING}
    return {k: v for k, v in {**defaults, **cfg}.items() if k not in RESUME_FREE_FIELDS}


def save_checkpoint(path: Path, *, draft, optimizer: torch.optim.Optimizer, step: int, config: TrainConfig,
                    total_steps: int) -> None:
    """Atomically write draft weights, AdamW state (safetensors) and scalars (JSON)."""
    names = {id(p): n for n, p in draft.named_parameters()}
    opt_tensors: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for k, v in st.items():
                t = v if isinstance(v, torch.Tensor) else torch.tensor(float(v))
                opt_tensors[f"{names[id(p)]}::{k}"] = t.detach().cpu()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in optimizer.param_groups]
    state = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION, "step": step,
             "total_steps": total_steps, "config": config.to_dict(), "param_groups": groups,
             "param_names": [names[id(p)] for g in optimizer.param_groups for p in g["params"]]}
    with atomic_path(path) as tmp:
        tmp.mkdir()
        save_tensors(tmp / "draft.safetensors", {k: v.detach().cpu() for k, v in draft.state_dict().items()})
        save_tensors(tmp / "optimizer.safetensors", opt_tensors)
        (tmp / "state.json").write_text(json.dumps(state, indent=2) + "\n")


def load_checkpoint(path: Path, *, draft, optimizer: torch.optim.Optimizer, config: TrainConfig) -> int:
    """Restore a checkpoint written by `save_checkpoint`; returns its step. Refuses another run's."""
    state = read_json(path / "state.json", what="training checkpoint state")
    if state.get("format") != CHECKPOINT_FORMAT or state.get("format_version") != CHECKPOINT_VERSION:
        raise SpecwireError(f"{path / 'state.json'}: not a specwire training checkpoint (version {CHECKPOINT_VERSION}).")
    saved, now = _resume_view(state.get("config") or {}), _resume_view(config.to_dict())
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in sorted(set(saved) | set(now))
             if saved.get(k) != now.get(k)]
    if diffs:
        raise SpecwireError(
            f"{path}: the checkpoint belongs to a run with other settings ({'; '.join(diffs)}).",
            fix="rerun with the original options to resume, or pass a new --out folder to start afresh.",
        )
    tensors = load_tensors(path / "draft.safetensors")
    check_tensors(path / "draft.safetensors", tensors, draft.expected_shapes())
    draft.load_state_dict({k: v.to(draft.fc.weight.device) for k, v in tensors.items()}, strict=True)
    opt = load_tensors(path / "optimizer.safetensors")
    params = dict(draft.named_parameters())
    order = state["param_names"]
    per: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in opt.items():
        name, _, field_ = key.partition("::")
        if name not in params or name not in order:
            raise SpecwireError(f"{path / 'optimizer.safetensors'}: state for unknown parameter '{name}'.")
        per.setdefault(order.index(name), {})[field_] = t
    groups, a = [], 0
    for g, live in zip(state["param_groups"], optimizer.param_groups):
        n = len(live["params"])
        groups.append({**g, "betas": tuple(g["betas"]), "params": list(range(a, a + n))})
        a += n
    optimizer.load_state_dict({"state": per, "param_groups": groups})
    return int(state["step"])


def recover_run_folder(out: Path, names: tuple[str, ...]) -> None:
    """Undo what a SIGKILL during an atomic write (`safeio.atomic_path`) can leave in run folder `out`.

    A folder is replaced by renaming the old one to `.NAME.old-PID`, then the new one into place; a kill
    between the two renames leaves no `NAME`: the old, complete copy is renamed back (the run then
    resumes from that earlier step). Temporaries (`.NAME.*`) left by a kill are removed. Call it on one
    rank, before reading the folder.
    """
    if not out.is_dir():
        return
    for name in names:
        target = out / name
        olds = sorted(out.glob(f".{name}.old-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        if not target.exists():
            for old in olds:
                if (old / "state.json").is_file() or (old / "config.json").is_file():
                    old.rename(target)
                    log.warning("%s: restored from %s, left by an interrupted write", target, old.name)
                    break
        for stale in out.glob(f".{name}.*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)
