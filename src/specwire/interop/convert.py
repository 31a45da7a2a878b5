"""Export (native -> SGLang | speculators) and import (any -> native), each read through the one reader.

Owns: `export_draft` and `import_draft`, their result records, the tensor checks of a conversion (every
name and shape of the native layout, `native_shapes`; dtypes; the vocabulary map) and what is dropped
on import (tensors other tools save that a specwire draft does not hold). Every folder is opened with
`draft.reader.read_checkpoint` and must pass its consistency check before anything is converted.
Does not know either layout's config details (`interop.sglang`, `interop.speculators`) and has no CLI
(`specwire.cli.convert`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specwire.draft.checkpoint import load_draft, native_config_json, resolve_draft_path
from specwire.draft.model import DraftConfig, check_vocab_map
from specwire.errors import SpecwireError
from specwire.draft.fields import block_draft_config
from specwire.draft.reader import (
    FORMAT_NATIVE, FORMAT_SGLANG, NATIVE_LAYER_PREFIX, WEIGHTS_FILE, CheckpointInfo, read_checkpoint,
)
from specwire.interop.sglang import check_sglang_compatible, config_from_sglang, remap_keys, sglang_config_json
from specwire.interop.speculators import config_from_speculators, speculators_config_json
from specwire.safeio import atomic_path, check_tensors, load_tensors, save_tensors
from specwire.wiring import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS, TargetSpec, Wiring

EXPORT_FORMATS: tuple[str, ...] = (FORMAT_SGLANG, "speculators")
# Tensors other tools save that a specwire draft does not hold (it shares the target's embedding).
FOREIGN_TENSORS = {
    "embed_tokens.weight": "the target's token embedding (specwire drafts share the target's, frozen)",
    "verifier_lm_head.weight": "speculators' training-only copy of the target lm_head",
    "verifier_norm.weight": "speculators' training-only copy of the target final norm",
}


def native_shapes(c: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a native checkpoint and its shape, from the config alone (no weights allocated)."""
    H, I, d = c.hidden_size, c.intermediate_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    p = NATIVE_LAYER_PREFIX
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (H, c.fc_in_features),
        p + "input_layernorm.weight": (H,),
        p + "hidden_norm.weight": (H,),
        p + "self_attn.q_proj.weight": (q, 2 * H),
        p + "self_attn.k_proj.weight": (kv, 2 * H),
        p + "self_attn.v_proj.weight": (kv, 2 * H),
        p + "self_attn.o_proj.weight": (H, q),
        p + "post_attention_layernorm.weight": (H,),
        p + "mlp.gate_proj.weight": (I, H),
        p + "mlp.up_proj.weight": (I, H),
        p + "mlp.down_proj.weight": (H, I),
        "norm.weight": (H,),
        "lm_head.weight": (c.draft_vocab_size, H),
        "d2t": (c.draft_vocab_size,),
        "t2d": (c.vocab_size,),
    }
    if c.attention_bias:
        shapes.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,)})
    return shapes


# ---- tensors ------------------------------------------------------------------------------------

def load_all_tensors(info: CheckpointInfo) -> dict[str, torch.Tensor]:
    """Every tensor of a folder the reader has opened (its first read error otherwise)."""
    if info.read_errors:
        raise SpecwireError(info.read_errors[0])
    tensors: dict[str, torch.Tensor] = {}
    for name in info.files:
        tensors.update(load_tensors(info.path / name))
    return tensors


def check_dtypes(tensors: dict[str, torch.Tensor], source: str, notes: list[str] | None = None) -> dict[str, torch.Tensor]:
    """Weights floating point; d2t int64 (int32 converted); t2d bool (0/1 integers converted)."""
    out = dict(tensors)
    for name, t in tensors.items():
        if name == "d2t":
            if t.dtype == torch.int32 and notes is not None:
                out[name] = t.long()
                notes.append("d2t stored as int32; converted to int64.")
            elif t.dtype != torch.long:
                raise SpecwireError(f"{source}: tensor 'd2t' has dtype {t.dtype}, expected int64 (draft id -> target id offsets).")
        elif name == "t2d":
            if t.dtype != torch.bool:
                if notes is not None and not t.is_floating_point() and bool(((t == 0) | (t == 1)).all()):
                    out[name] = t.bool()
                    notes.append(f"t2d stored as {t.dtype}; converted to bool.")
                else:
                    raise SpecwireError(f"{source}: tensor 't2d' has dtype {t.dtype}, expected bool (target vocab mask).")
        elif not t.is_floating_point():
            raise SpecwireError(f"{source}: tensor '{name}' has dtype {t.dtype}, expected a floating-point weight.")
    return out


def _write_checkpoint(out: str | os.PathLike, cfg: dict, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_path(out) as tmp:
        tmp.mkdir()
        save_tensors(tmp / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def _weights_dtype(tensors: dict[str, torch.Tensor]) -> str:
    dts = {str(v.dtype).replace("torch.", "") for v in tensors.values() if v.is_floating_point()}
    return dts.pop() if len(dts) == 1 else "float32"


def _block_extras(block: dict | None, *, keep_version: bool = True) -> dict:
    skip = ("format", "format_version", "draft_config") + (() if keep_version else ("sglang_version",))
    return {k: v for k, v in (block or {}).items() if k not in skip}


# ---- export -------------------------------------------------------------------------------------

@dataclass
class ExportResult:
    out: Path
    format: str
    wiring: Wiring
    layer_ids: list[int]  # the ids written to the config, in that format's convention
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "format": self.format, "layer_ids": self.layer_ids,
                "hs_ids": list(self.wiring.hs_ids), "wiring": self.wiring.to_dict(), "warnings": self.warnings}


def export_draft(draft: str | os.PathLike, out: str | os.PathLike, *, fmt: str,
                 sglang_version: str = DEFAULT_SGLANG_VERSION, verifier: str | None = None,
                 num_speculative_tokens: int | None = None, max_position_embeddings: int | None = None,
                 embeddings_from: str | None = None) -> ExportResult:
    """Convert a native checkpoint to `fmt` ("sglang" or "speculators") in `out` (written atomically).

    `embeddings_from` (a target) also writes `embed_tokens.weight`, for tools that do not take the
    embedding from the target themselves; the target must be the one the draft was trained for.
    """
    if fmt not in EXPORT_FORMATS:
        raise SpecwireError(f"unknown export format '{fmt}'; expected one of {list(EXPORT_FORMATS)}.")
    src = resolve_draft_path(draft)
    info = read_checkpoint(src)
    if info.format != FORMAT_NATIVE:
        raise SpecwireError(
            f"'{src}' is not a native specwire checkpoint (detected: {info.format or 'unknown'}). " + " ".join(info.problems),
            fix=f"convert it first: specwire import {src} --out DIR",
        )
    info.require_consistent()
    config = info.draft_config()
    tensors = load_all_tensors(info)
    check_tensors(info.weights_path, tensors, native_shapes(config))
    tensors = check_dtypes(tensors, str(info.weights_path))
    check_vocab_map(tensors["d2t"], tensors["t2d"], vocab_size=config.vocab_size, source=str(info.weights_path))
    if max_position_embeddings is not None:
        if not isinstance(max_position_embeddings, int) or max_position_embeddings <= 0:
            raise SpecwireError(f"--max-position-embeddings must be a positive integer, found {max_position_embeddings!r}.")
        if config.rope_parameters.get("rope_type", "default") != "default":
            raise SpecwireError(
                f"the draft uses rope_type '{config.rope_parameters.get('rope_type')}', where max_position_embeddings can "
                "change the rope frequencies; refusing to change it after training.")
        config = dataclasses.replace(config, max_position_embeddings=max_position_embeddings)
    extra = _block_extras(info.specwire)
    warnings: list[str] = []
    if embeddings_from is not None:
        tensors["embed_tokens.weight"] = _target_embedding(embeddings_from, config, dtype=tensors["fc.weight"].dtype)
    if fmt == FORMAT_SGLANG:
        warnings += check_sglang_compatible(config)
        cfg = sglang_config_json(config, sglang_version=sglang_version, torch_dtype=_weights_dtype(tensors), extra=extra)
        tensors = remap_keys(tensors, to=FORMAT_SGLANG)
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    else:
        cfg, warnings = speculators_config_json(config, info.raw, extra=extra, verifier=verifier,
                                                num_speculative_tokens=num_speculative_tokens)
        ids = cfg["eagle_aux_hidden_state_layer_ids"]
    _write_checkpoint(out, cfg, tensors)
    return ExportResult(out=Path(out), format=fmt, wiring=config.wiring, layer_ids=list(ids), warnings=warnings)


def _target_embedding(target: str, config: DraftConfig, *, dtype: torch.dtype) -> torch.Tensor:
    from specwire.target.load import load_target

    t = load_target(target, device="cpu", dtype="float32")
    config.wiring.check_compatible(config.wiring.replace(target=t.spec), expected_from="the draft's wiring",
                                   found_in=f"target '{target}'")
    w = t.parts.embed.weight.detach()
    if tuple(w.shape) != (config.vocab_size, config.hidden_size):
        raise SpecwireError(f"target '{target}' embedding has shape {tuple(w.shape)}; the draft needs ({config.vocab_size}, {config.hidden_size}).")
    return w.to(dtype).contiguous().clone()


# ---- import -------------------------------------------------------------------------------------

@dataclass
class ImportResult:
    out: Path
    source_format: str
    wiring: Wiring
    notes: list[str] = field(default_factory=list)  # what was converted, dropped or assumed, and why

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), "source_format": self.source_format, "hs_ids": list(self.wiring.hs_ids),
                "wiring": self.wiring.to_dict(), "notes": self.notes}


@dataclass
class TargetFacts:
    """What import knows of the target a foreign draft is read for."""

    spec: TargetSpec
    tokenizer_fingerprint: str | None
    chat_template_hash: str | None
    embedding: torch.Tensor | None  # the target's embedding matrix, when its weights could be loaded
    max_position_embeddings: int | None


def target_facts(target: str, notes: list[str]) -> TargetFacts:
    from specwire.target.load import chat_template_hash, load_target, target_info, tokenizer_fingerprint

    info = target_info(target)
    try:
        t = load_target(target, device="cpu", dtype="float32")
    except SpecwireError as e:
        notes.append(f"target weights not loadable ({e}); the wiring has no target fingerprint.")
        spec = TargetSpec(architecture=info.architecture, num_layers=info.num_layers, hidden_size=info.hidden_size,
                          vocab_size=info.vocab_size)
        return TargetFacts(spec, None, None, None, info.max_position_embeddings)
    tok = t.tokenizer
    return TargetFacts(
        t.spec, tokenizer_fingerprint(tok) if tok is not None else None, chat_template_hash(tok) if tok is not None else None,
        t.parts.embed.weight.detach().float().cpu(), info.max_position_embeddings,
    )


def parse_bool_flag(value: str | bool | None) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise SpecwireError(f"--norm-before-residual expects true or false, found {value!r}.")


def import_draft(src: str | os.PathLike, out: str | os.PathLike, *, sglang_version: str | None = None,
                 norm_before_residual: bool | str | None = None, target: str | None = None) -> ImportResult:
    """Convert a draft in any known format to a native checkpoint in `out` (written atomically, then verified)."""
    notes: list[str] = []
    nbr_flag = parse_bool_flag(norm_before_residual)
    if sglang_version is not None and sglang_version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{sglang_version}'; expected one of {list(SGLANG_VERSIONS)}.")
    info = read_checkpoint(src)
    if info.format is None or info.config is None:
        raise SpecwireError(f"cannot import '{info.path}': " + " ".join(info.problems))
    if info.read_errors:
        raise SpecwireError(info.read_errors[0])
    cfg, source = info.config, str(info.config_path)
    facts = target_facts(target, notes) if target is not None else None
    if info.specwire is not None:
        info.require_consistent()
        config = block_draft_config(info.specwire, source=source)
        if nbr_flag is not None and nbr_flag != config.norm_before_residual:
            raise SpecwireError(f"{source}: the specwire block says norm_before_residual={config.norm_before_residual}, "
                                f"--norm-before-residual says {nbr_flag}.")
        if facts is not None:
            found = config.wiring.replace(target=facts.spec)
            config.wiring.check_compatible(found, expected_from=f"{source} (specwire block)", found_in=f"target '{target}'")
        notes.append("wiring taken from the checkpoint's specwire block.")
        extras = _block_extras(info.specwire, keep_version=False)
    else:
        if facts is None:
            raise SpecwireError(
                f"'{info.path}' ({info.format} format) carries no specwire block, so the target it was trained for is unknown.",
                fix=f"pass the target: specwire import {info.path} --out DIR --target TARGET",
            )
        if info.format == FORMAT_SGLANG:
            config = config_from_sglang(cfg, info.shapes, facts, source=source, sglang_version=sglang_version,
                                        norm_before_residual=nbr_flag, notes=notes)
        else:
            config = config_from_speculators(cfg, info.shapes, facts, source=source, norm_before_residual=nbr_flag, notes=notes)
        inconsistent = info.check_consistency(facts.spec.num_layers)
        if inconsistent:
            raise inconsistent[0].error()
        extras = {"imported_from": {"format": info.format, "path": str(info.path)}}
    tensors = load_all_tensors(info)
    weights_src = str(info.weights_path)
    tensors = remap_keys(tensors, to=FORMAT_NATIVE) if info.format == FORMAT_SGLANG else dict(tensors)
    tensors = _drop_foreign(tensors, facts, notes, source=weights_src)
    if "d2t" not in tensors and "t2d" not in tensors:
        if config.draft_vocab_size != config.vocab_size:
            raise SpecwireError(f"{weights_src}: no d2t / t2d tensors but draft_vocab_size {config.draft_vocab_size} < target vocab "
                                f"{config.vocab_size}; the draft-to-target vocabulary map is missing.")
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
        tensors["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
        notes.append("no d2t / t2d: the draft vocabulary is the target's; identity map written.")
    check_tensors(weights_src, tensors, native_shapes(config))
    tensors = check_dtypes(tensors, weights_src, notes)
    check_vocab_map(tensors["d2t"], tensors["t2d"], vocab_size=config.vocab_size, source=weights_src)
    native = native_config_json(config, extra=extras)
    sc = cfg.get("speculators_config") if isinstance(cfg.get("speculators_config"), dict) else {}
    verifier = sc.get("verifier") if isinstance(sc.get("verifier"), dict) else {}
    if isinstance(verifier.get("name_or_path"), str):
        native["speculators_config"]["verifier"]["name_or_path"] = verifier["name_or_path"]
    _write_checkpoint(out, native, tensors)
    load_draft(out)  # the result must load with every check of the native loader
    return ImportResult(out=Path(out), source_format=info.format, wiring=config.wiring, notes=notes)


def _drop_foreign(tensors: dict[str, torch.Tensor], facts: TargetFacts | None, notes: list[str], *,
                  source: str) -> dict[str, torch.Tensor]:
    out = dict(tensors)
    for name, why in FOREIGN_TENSORS.items():
        if name not in out:
            continue
        t = out.pop(name)
        if name == "embed_tokens.weight" and facts is not None and facts.embedding is not None:
            if tuple(t.shape) != tuple(facts.embedding.shape) or not torch.equal(t.float(), facts.embedding):
                raise SpecwireError(
                    f"{source}: tensor 'embed_tokens.weight' differs from the target's embedding; this draft was trained "
                    "with its own embeddings, and specwire drafts share the target's.")
            notes.append("embed_tokens.weight dropped: identical to the target's embedding, which the draft shares.")
        else:
            notes.append(f"{name} dropped: {why}.")
    return out
