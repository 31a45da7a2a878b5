"""The native draft checkpoint on disk: where the shipped draft lives, writing a draft, loading one.

Owns: the shipped draft's location (`shipped_draft_dir`, `resolve_draft_path`), the native config.json
(`native_config_json`: speculators' eagle3 fields plus a `specwire` block holding the DraftConfig and
its Wiring), `save_draft` (atomic), and `load_draft`. Does not own the module or its maths
(`draft.model`), nor reading a folder: `load_draft` goes through the one reader,
`specwire.interop.inspect`, so a native checkpoint is held to the same consistency check as every
other draft (every record of the hidden-state ids, the widths, the vocabulary sizes).

Layout (a folder): speculators' key layout (`layers.0.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`) in
`model.safetensors` and the config described above. vLLM reads the same layout; `interop.convert`
writes SGLang's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from specwire.draft.model import NATIVE_FORMAT, NATIVE_FORMAT_VERSION, SHIPPED_DRAFT, DraftConfig, Eagle3Draft, check_vocab_map
from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, check_tensors, load_tensors, save_tensors

WEIGHTS_FILE = "model.safetensors"


def shipped_draft_dir() -> Path:
    """Where the shipped draft (`smollm2-135m-eagle3`) is installed."""
    return Path(__file__).parent.parent / "assets" / SHIPPED_DRAFT


def resolve_draft_path(name_or_path: str | os.PathLike) -> Path:
    """The folder of a draft given by name ('smollm2-135m-eagle3') or path; a SpecwireError when absent."""
    if str(name_or_path) == SHIPPED_DRAFT:
        p = shipped_draft_dir()
        if not (p / "config.json").is_file():
            raise SpecwireError(f"the shipped draft '{SHIPPED_DRAFT}' is not installed at {p}.")
        return p
    p = Path(name_or_path).expanduser()
    if not p.exists():
        raise SpecwireError(f"draft '{name_or_path}' not found: not '{SHIPPED_DRAFT}' nor an existing folder.")
    if not p.is_dir() or not (p / "config.json").is_file():
        raise SpecwireError(f"draft '{p}': expected a folder with config.json and model.safetensors.")
    return p


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
    from specwire.interop.inspect import read_checkpoint  # the one reader (lazy: it imports draft.model)

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
    return draft.eval()
