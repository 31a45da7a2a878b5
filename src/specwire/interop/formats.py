"""Checkpoint formats: the SGLang/EAGLE/SpecForge layout and the speculators (vLLM) layout, both ways.

Owns: reading any EAGLE-3 draft folder leniently (`read_checkpoint`: raw config + tensor headers +
the problems seen, for the doctor), telling the formats apart (`detect_format`), the key remaps
(`layers.0.*` <-> `midlayer.*`), the SGLang-version-aware id writing (`hs_to_sglang_ids`), what each
engine would make of a checkpoint (`engine_reading`), `export_draft` (native -> sglang | speculators)
and `import_draft` (any -> native), and the `export` / `import` subcommands. Does not own the draft
module or the native checkpoint itself (`draft`), nor launch flags (`launch`).

Formats (FIELD-NOTES section 3):
  native       speculators' key layout + speculators-style config + a `specwire` block (DraftConfig,
               Wiring). vLLM and the speculators package read it as is; the speculators export *is*
               a native checkpoint whose verifier / proposal fields are filled in.
  sglang       `midlayer.*` keys, a Llama config with `architectures: ["LlamaForCausalLMEagle3"]` and
               `eagle_config.eagle_aux_hidden_state_layer_ids` in SGLang's layer-output convention.
               SpecForge and SafeAILab/EAGLE write and read the same layout.
  speculators  `layers.0.*` keys, `speculators_model_type: "eagle3"`, hs-index layer ids, no `specwire`
               block (a checkpoint trained elsewhere).
A field whose meaning differs between tools is never guessed on import: vLLM assumes
`norm_before_residual=True` when it is missing, and SGLang versions read the same ids two ways
(`wiring.SGLANG_VERSIONS`); when a checkpoint does not say, import asks for a flag.
Untrusted folders stay data: safetensors and JSON only, headers validated before any tensor is read.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specwire.draft.model import (
    NATIVE_FORMAT,
    NATIVE_FORMAT_VERSION,
    DraftConfig,
    check_vocab_map,
    load_draft,
    native_config_json,
    read_native_config,
    resolve_draft_path,
)
from specwire.errors import SpecwireError, WiringMismatch
from specwire.safeio import atomic_path, check_tensors, load_tensors, read_json, safetensors_header, save_tensors
from specwire.wiring import (
    DEFAULT_SGLANG_VERSION,
    SGLANG_VERSIONS,
    TargetSpec,
    Wiring,
    default_hs_ids,
    sglang_to_hs,
    validate_hs_ids,
)

FORMAT_NATIVE, FORMAT_SGLANG, FORMAT_SPECULATORS = "native", "sglang", "speculators"
FORMATS: tuple[str, ...] = (FORMAT_NATIVE, FORMAT_SGLANG, FORMAT_SPECULATORS)
EXPORT_FORMATS: tuple[str, ...] = (FORMAT_SGLANG, FORMAT_SPECULATORS)
ENGINES: tuple[str, ...] = ("sglang", "vllm")
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURES: tuple[str, ...] = ("Eagle3Speculator", "Eagle3DraftModel")
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
NATIVE_LAYER_PREFIX, SGLANG_LAYER_PREFIX = "layers.0.", "midlayer."
# SGLang's and SpecForge's LlamaForCausalLMEagle3 (and vLLM's Eagle3LlamaForCausalLM) build fc as
# Linear(3 * target_hidden_size, H).
SGLANG_NUM_FUSED = 3
# Tensors other tools save that a specwire draft does not hold (it shares the target's embedding).
FOREIGN_TENSORS = {
    "embed_tokens.weight": "the target's token embedding (specwire drafts share the target's, frozen)",
    "verifier_lm_head.weight": "speculators' training-only copy of the target lm_head",
    "verifier_norm.weight": "speculators' training-only copy of the target final norm",
}
_FLOAT_DTYPES = {"F32", "F16", "BF16"}
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


# ---- key remaps (pure) ---------------------------------------------------------------------------

def _layer_index(name: str) -> int | None:
    m = re.match(r"^layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def native_to_sglang_key(name: str) -> str:
    """`layers.0.X` -> `midlayer.X`; fc, norm, lm_head, d2t, t2d keep their names."""
    if name.startswith(SGLANG_LAYER_PREFIX):
        raise SpecwireError(f"tensor '{name}' is already in SGLang's layout (midlayer.*), not the native one.")
    i = _layer_index(name)
    if i is not None and i != 0:
        raise SpecwireError(f"tensor '{name}': SGLang's LlamaForCausalLMEagle3 holds one draft layer; layer {i} has no SGLang name.")
    return SGLANG_LAYER_PREFIX + name[len(NATIVE_LAYER_PREFIX):] if i == 0 else name


def sglang_to_native_key(name: str) -> str:
    """`midlayer.X` -> `layers.0.X`; the inverse of `native_to_sglang_key`."""
    if _layer_index(name) is not None:
        raise SpecwireError(f"tensor '{name}' is already in the native layout (layers.N.*), not SGLang's midlayer.*.")
    return NATIVE_LAYER_PREFIX + name[len(SGLANG_LAYER_PREFIX):] if name.startswith(SGLANG_LAYER_PREFIX) else name


def remap_keys(tensors: dict[str, Any], *, to: str) -> dict[str, Any]:
    """Rename a state dict's keys to `to` ("sglang" or "native"); values are passed through untouched."""
    if to not in (FORMAT_SGLANG, FORMAT_NATIVE, FORMAT_SPECULATORS):
        raise SpecwireError(f"unknown key layout '{to}'; expected one of {list(FORMATS)}.")
    fn = native_to_sglang_key if to == FORMAT_SGLANG else sglang_to_native_key
    out = {fn(k): v for k, v in tensors.items()}
    if len(out) != len(tensors):
        raise SpecwireError(f"key remap to {to} made two tensors collide; the state dict mixes both layouts.")
    return out


def layer_layout(names) -> str:
    """'midlayer' (SGLang), 'layers' (native/speculators), 'mixed', or 'none' for a set of tensor names."""
    has_mid = any(n.startswith(SGLANG_LAYER_PREFIX) for n in names)
    has_layers = any(_layer_index(n) is not None for n in names)
    return "mixed" if has_mid and has_layers else "midlayer" if has_mid else "layers" if has_layers else "none"


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


# ---- SGLang id writing per version (pure) --------------------------------------------------------

def hs_to_sglang_ids(hs_ids, num_layers: int, *, sglang_version: str = DEFAULT_SGLANG_VERSION) -> list[int]:
    """The `eagle_config` ids that SGLang `sglang_version` reads back as exactly `hs_ids`.

    classic: id = hs - 1 (hs 0 -> -1). shift-if-one: the +1 applies only when the first id is 1, so
    hs lists starting at 2 are written classically, others as plain hs indices; a list starting at
    hs 1 cannot be expressed on that version.
    """
    if sglang_version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{sglang_version}'; expected one of {list(SGLANG_VERSIONS)}.")
    hs = [int(i) for i in hs_ids]
    validate_hs_ids(hs, num_layers)
    if sglang_version == "classic" or (hs and hs[0] == 2):
        ids = [i - 1 for i in hs]
    elif hs and hs[0] == 1:
        raise SpecwireError(
            f"hs ids {hs} cannot be written for SGLang '{sglang_version}': an id list starting with 1 is shifted "
            "(read as hs 2...), and any other first id is read unshifted, so hs 1 first is unreachable.",
            fix="reorder is not possible (fc weights are tied to the order); serve on a 'classic' SGLang or retrain with another wiring.",
        )
    else:
        ids = list(hs)
    assert sglang_to_hs(ids, num_layers, sglang_version=sglang_version) == hs
    return ids


def sglang_readings(ids, num_layers: int) -> dict[str, list[int] | None]:
    """How each SGLang version rule reads `ids` (None where that reading is out of range)."""
    out: dict[str, list[int] | None] = {}
    for v in SGLANG_VERSIONS:
        try:
            out[v] = sglang_to_hs(ids, num_layers, sglang_version=v)
        except SpecwireError:
            out[v] = None
    return out


# ---- lenient reading (for import and the doctor) -------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its safetensors header describes it (nothing loaded)."""

    dtype: str  # safetensors dtype name: F32, BF16, F16, I64, I32, BOOL, U8, ...
    shape: tuple[int, ...]
    file: str  # file name inside the checkpoint folder


@dataclass
class CheckpointInfo:
    """What a draft folder holds, read without judging it. `problems` lists everything odd, in words."""

    path: Path
    config: dict | None  # raw config.json (None when missing or not a JSON object)
    tensors: dict[str, TensorInfo]  # name -> header info, over all weight files
    files: list[str]  # weight files read (names inside `path`)
    format: str | None  # "native" | "sglang" | "speculators" | None when it cannot be told
    specwire: dict | None  # the `specwire` block of config.json when present
    problems: list[str] = field(default_factory=list)  # everything odd, including read_errors
    read_errors: list[str] = field(default_factory=list)  # files that could not be read at all

    @property
    def layout(self) -> str:
        """'midlayer' (SGLang names), 'layers' (native/speculators names), 'mixed' or 'none'."""
        return layer_layout(self.tensors)

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    def draft_config(self) -> DraftConfig | None:
        """The DraftConfig of the `specwire` block; None when there is no block, SpecwireError when it is invalid."""
        if not isinstance(self.specwire, dict):
            return None
        return block_draft_config(self.specwire, source=str(self.config_path))

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "format": self.format, "layout": self.layout, "files": self.files,
            "tensors": {k: {"dtype": v.dtype, "shape": list(v.shape)} for k, v in self.tensors.items()},
            "has_specwire_block": self.specwire is not None, "problems": list(self.problems),
        }


def block_draft_config(block: dict, *, source: str) -> DraftConfig:
    """The DraftConfig stored in a `specwire` block; errors name the file and the field."""
    where = f"{source}: specwire.draft_config"
    if block.get("format_version") != NATIVE_FORMAT_VERSION:
        raise SpecwireError(f"{source}: field 'specwire.format_version' is {block.get('format_version')!r}, expected {NATIVE_FORMAT_VERSION}.")
    if not isinstance(block.get("draft_config"), dict):
        raise SpecwireError(f"{where}: must be a JSON object, found {type(block.get('draft_config')).__name__}.")
    try:
        return DraftConfig.from_dict(block["draft_config"], source=where)
    except SpecwireError as e:
        if where in str(e):
            raise
        raise SpecwireError(f"{where}: {e}") from None


def _weight_files(path: Path, problems: list[str]) -> list[str]:
    if (path / WEIGHTS_FILE).is_file():
        return [WEIGHTS_FILE]
    if (path / WEIGHTS_INDEX).is_file():
        try:
            index = read_json(path / WEIGHTS_INDEX, what="safetensors index")
            wm = index.get("weight_map")
            if not isinstance(wm, dict) or not wm:
                raise SpecwireError(f"{path / WEIGHTS_INDEX}: field 'weight_map' must be a non-empty object.")
            names = sorted({str(v) for v in wm.values()})
            bad = [n for n in names if Path(n).name != n or not n.endswith(".safetensors")]
            if bad:
                raise SpecwireError(f"{path / WEIGHTS_INDEX}: weight_map names {bad} are not plain .safetensors file names in the folder.")
            return names
        except SpecwireError as e:
            problems.append(str(e))
            return []
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        problems.append(
            f"{path}: weights only in pickle files {pickles}; specwire never unpickles untrusted files. "
            "Fix: convert them to safetensors with the tool that wrote them."
        )
    else:
        problems.append(f"{path}: no {WEIGHTS_FILE} (nor {WEIGHTS_INDEX}).")
    return []


def _classify(config: dict | None, tensors: dict[str, TensorInfo], problems: list[str], cfg_path: Path) -> tuple[str | None, dict | None]:
    block = config.get("specwire") if isinstance(config, dict) else None
    if block is not None and not (isinstance(block, dict) and block.get("format") == NATIVE_FORMAT):
        problems.append(f"{cfg_path}: field 'specwire' is not a specwire block (expected an object with format '{NATIVE_FORMAT}').")
        block = None
    layout = layer_layout(tensors)
    archs = config.get("architectures") if isinstance(config, dict) else None
    archs = archs if isinstance(archs, list) else []
    says_sglang = SGLANG_ARCHITECTURE in archs or (isinstance(config, dict) and "eagle_config" in config)
    says_spec = isinstance(config, dict) and "speculators_model_type" in config
    if layout == "mixed":
        problems.append(f"{cfg_path.parent}: tensors mix SGLang names (midlayer.*) and native names (layers.N.*).")
        return None, block
    if layout == "midlayer":
        if says_spec:
            problems.append(
                f"{cfg_path}: config is speculators-style (speculators_model_type) but the tensors use SGLang names "
                "(midlayer.*); vLLM maps them, but the speculators package would load a random layer."
            )
        return FORMAT_SGLANG, block
    if layout == "layers":
        if says_sglang and not says_spec:
            problems.append(
                f"{cfg_path}: config is SGLang-style ({SGLANG_ARCHITECTURE}) but the tensors use layers.0.* names; "
                "SGLang silently skips names it does not know and would run a randomly initialised layer. "
                "Fix: rename layers.0.* to midlayer.* (specwire import, then specwire export --format sglang)."
            )
        if block is not None:
            return FORMAT_NATIVE, block
        return FORMAT_SPECULATORS, None
    if says_sglang:
        return FORMAT_SGLANG, block
    if says_spec:
        return (FORMAT_NATIVE if block is not None else FORMAT_SPECULATORS), block
    problems.append(f"{cfg_path.parent}: neither the tensor names nor config.json look like an EAGLE-3 draft.")
    return None, block


def read_checkpoint(path: str | os.PathLike) -> CheckpointInfo:
    """Read a draft folder leniently: raw config, tensor headers, detected format and problems.

    Raises only when `path` is not a folder; everything else (unreadable JSON, a truncated or corrupt
    safetensors file, pickle-only weights, mixed layouts) is recorded in `problems`.
    """
    path = Path(path).expanduser()
    if not path.is_dir():
        raise SpecwireError(f"draft '{path}': expected a folder with config.json and {WEIGHTS_FILE}.")
    errors: list[str] = []
    config: dict | None = None
    try:
        config = read_json(path / "config.json", what="draft config")
    except SpecwireError as e:
        errors.append(str(e))
    files = _weight_files(path, errors)
    tensors: dict[str, TensorInfo] = {}
    for name in files:
        try:
            header = safetensors_header(path / name)
        except SpecwireError as e:
            errors.append(str(e))
            continue
        for k, v in header.items():
            if k == "__metadata__":
                continue
            if k in tensors:
                errors.append(f"{path / name}: tensor '{k}' also appears in {tensors[k].file}.")
            tensors[k] = TensorInfo(dtype=str(v["dtype"]), shape=tuple(int(s) for s in v["shape"]), file=name)
    problems = list(errors)
    fmt, block = _classify(config, tensors, problems, path / "config.json")
    return CheckpointInfo(path=path, config=config, tensors=tensors, files=files, format=fmt, specwire=block,
                          problems=problems, read_errors=errors)


def detect_format(path: str | os.PathLike) -> str:
    """'native', 'sglang' or 'speculators'; a SpecwireError naming what was seen when it cannot tell."""
    info = read_checkpoint(path)
    if info.format is None:
        raise SpecwireError(f"cannot tell the format of '{info.path}': " + " ".join(info.problems))
    return info.format


# ---- what an engine makes of a checkpoint ---------------------------------------------------------

@dataclass(frozen=True)
class EngineReading:
    """How an engine would wire and run a checkpoint (for the versions read; FIELD-NOTES 1-3)."""

    engine: str  # "sglang" | "vllm"
    hs_ids: tuple[int, ...] | None  # hs indices the engine captures for this draft (None: cannot tell)
    ids_source: str  # where those ids come from
    norm_before_residual: bool  # what the engine's draft layer does
    layer_weights_loaded: bool  # False when the engine silently skips the layer's tensor names
    notes: tuple[str, ...] = ()


def engine_reading(info: CheckpointInfo, engine: str, num_layers: int, *,
                   sglang_version: str = DEFAULT_SGLANG_VERSION) -> EngineReading:
    """What `engine` would capture and run for the checkpoint `info` on a target with `num_layers` layers."""
    cfg = info.config or {}
    notes: list[str] = []
    if engine == "sglang":
        ec = cfg.get("eagle_config")
        ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
        if ids is None:
            hs, src = tuple(default_hs_ids(num_layers)), "SGLang default (no eagle_config ids)"
        else:
            try:
                hs, src = tuple(sglang_to_hs(ids, num_layers, sglang_version=sglang_version)), f"eagle_config ids {list(ids)} read by SGLang '{sglang_version}'"
            except (SpecwireError, TypeError, ValueError) as e:
                hs, src = None, f"eagle_config ids {ids!r} unreadable ({e})"
        if hs is not None and 0 in hs:
            notes.append("hs 0 (SGLang id -1, the embedding output) cannot be captured by stock SGLang.")
        if cfg.get("norm_before_residual") is True:
            notes.append("config says norm_before_residual=true but SGLang's draft layer always adds the un-normed residual.")
        loaded = info.layout == "midlayer"
        if not loaded:
            notes.append("SGLang silently skips tensor names it does not know: the draft layer would stay randomly initialised.")
        return EngineReading("sglang", hs, src, False, loaded, tuple(notes))
    if engine == "vllm":
        spec_style = "speculators_model_type" in cfg
        ids = cfg.get("eagle_aux_hidden_state_layer_ids")
        if ids:
            try:
                hs, src = tuple(int(i) for i in ids), "eagle_aux_hidden_state_layer_ids (hs indices)"
                validate_hs_ids(hs, num_layers, what="eagle_aux_hidden_state_layer_ids")
            except (SpecwireError, TypeError, ValueError) as e:
                hs, src = None, f"eagle_aux_hidden_state_layer_ids {ids!r} unreadable ({e})"
        elif spec_style:
            hs, src = tuple(default_hs_ids(num_layers)), "vLLM default (no eagle_aux_hidden_state_layer_ids)"
        else:
            hs, src = None, "SGLang-style config: which ids vLLM takes depends on the vLLM version"
            notes.append("vLLM versions differ on reading eagle_config ids; export --format speculators to be explicit.")
        if "norm_before_residual" in cfg:
            nbr = bool(cfg["norm_before_residual"])
        else:
            nbr = spec_style  # speculators configs: vLLM assumes True when missing; others: False
            notes.append(f"norm_before_residual missing: vLLM assumes {nbr} for this config style.")
        if "d2t" not in info.tensors and isinstance(cfg.get("draft_vocab_size"), int):
            notes.append("no d2t tensor: vLLM treats the draft vocabulary as the target's (shared vocab).")
        return EngineReading("vllm", hs, src, nbr, info.layout in ("layers", "midlayer"), tuple(notes))
    raise SpecwireError(f"unknown engine '{engine}'; expected one of {list(ENGINES)}.")


# ---- typed config fields -------------------------------------------------------------------------

_KINDS = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string",
          "dict": "a JSON object", "list": "a list", "int_list": "a list of integers"}


def _typed(value: Any, kind: str) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "dict":
        return isinstance(value, dict)
    if kind == "list":
        return isinstance(value, list)
    if kind == "int_list":
        return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)
    raise AssertionError(kind)


_MISSING = object()


def get_field(cfg: dict, name: str, kind: str, *, source: str, prefix: str = "", default: Any = _MISSING,
              nullable: bool = False) -> Any:
    """cfg[name] checked to be of `kind`; a SpecwireError naming the file and field otherwise."""
    label = f"{prefix}{name}"
    if name not in cfg or (cfg[name] is None and not nullable and default is not _MISSING):
        if default is _MISSING:
            raise SpecwireError(f"{source}: field '{label}' is missing; expected {_KINDS[kind]}.")
        return default
    v = cfg[name]
    if v is None and nullable:
        return None
    if not _typed(v, kind):
        raise SpecwireError(f"{source}: field '{label}' must be {_KINDS[kind]}, found {v!r} ({type(v).__name__}).")
    if kind == "int" and v <= 0 and name not in ("pad_token_id",):
        raise SpecwireError(f"{source}: field '{label}' must be a positive integer, found {v}.")
    return v


def _rope_from_config(cfg: dict, *, source: str, prefix: str = "") -> dict:
    """rope settings as `rope_parameters` (transformers 5), from either style of config."""
    rp = get_field(cfg, "rope_parameters", "dict", source=source, prefix=prefix, default=None, nullable=True)
    if rp is not None:
        if "sliding_attention" in rp or "full_attention" in rp:
            raise SpecwireError(f"{source}: field '{prefix}rope_parameters' is per layer type; a one-layer Llama draft needs one rope setting.")
        rope = dict(rp)
    else:
        theta = get_field(cfg, "rope_theta", "number", source=source, prefix=prefix, default=10000.0)
        scaling = get_field(cfg, "rope_scaling", "dict", source=source, prefix=prefix, default=None, nullable=True)
        rope = dict(scaling or {})
        rope.setdefault("rope_theta", theta)
    legacy = rope.pop("type", "default")  # transformers 4 configs sometimes name it "type"
    rope_type = rope.setdefault("rope_type", legacy)
    if not _typed(rope.get("rope_theta"), "number"):
        raise SpecwireError(f"{source}: field '{prefix}rope_theta' must be a number, found {rope.get('rope_theta')!r}.")
    rope["rope_theta"] = float(rope["rope_theta"])
    if not isinstance(rope_type, str):
        raise SpecwireError(f"{source}: field '{prefix}rope_scaling.rope_type' must be a string, found {rope_type!r}.")
    return rope


def _rope_for_sglang(rope: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) as SGLang/SpecForge configs write them (transformers 4 style)."""
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return float(rope["rope_theta"]), (None if scaling.get("rope_type", "default") == "default" else scaling)


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


def _specwire_block(config: DraftConfig, extra: dict | None) -> dict:
    return {"format": NATIVE_FORMAT, "format_version": NATIVE_FORMAT_VERSION, "draft_config": config.to_dict(), **(extra or {})}


def _block_extras(raw: dict) -> dict:
    block = raw.get("specwire") or {}
    return {k: v for k, v in block.items() if k not in ("format", "format_version", "draft_config")}


def _weights_dtype(tensors: dict[str, torch.Tensor]) -> str:
    dts = {str(v.dtype).replace("torch.", "") for v in tensors.values() if v.is_floating_point()}
    return dts.pop() if len(dts) == 1 else "float32"


def sglang_config_json(config: DraftConfig, *, sglang_version: str = DEFAULT_SGLANG_VERSION,
                       torch_dtype: str = "float32", extra: dict | None = None) -> dict[str, Any]:
    """config.json of the SGLang/SpecForge layout (a Llama config that SGLang's llama_eagle3 reads)."""
    w = config.wiring
    theta, scaling = _rope_for_sglang(config.rope_parameters)
    cfg: dict[str, Any] = {
        "architectures": [SGLANG_ARCHITECTURE],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": config.hidden_act,
        "rms_norm_eps": config.rms_norm_eps,
        "attention_bias": config.attention_bias,
        "max_position_embeddings": config.max_position_embeddings,
        "rope_theta": theta,  # SGLang and SpecForge (transformers 4 style) read these two ...
        "rope_scaling": scaling,
        "rope_parameters": dict(config.rope_parameters),  # ... transformers 5 reads this one
        "vocab_size": config.vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "tie_word_embeddings": False,  # True would make SGLang use embed_tokens as lm_head
        "norm_before_residual": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": hs_to_sglang_ids(w.hs_ids, w.target.num_layers, sglang_version=sglang_version),
            "use_aux_hidden_state": True,
        },
        "torch_dtype": torch_dtype,
    }
    if config.target_hidden_size != config.hidden_size:
        cfg["target_hidden_size"] = config.target_hidden_size
    cfg["specwire"] = _specwire_block(config, {**(extra or {}), "sglang_version": sglang_version})
    return cfg


def check_sglang_compatible(config: DraftConfig) -> list[str]:
    """Refuse drafts SGLang's LlamaForCausalLMEagle3 cannot run; return warnings for what it runs with a patch."""
    w = config.wiring
    if config.num_fused != SGLANG_NUM_FUSED:
        raise SpecwireError(
            f"the draft fuses {config.num_fused} target states; SGLang's and SpecForge's LlamaForCausalLMEagle3 build "
            f"fc for exactly {SGLANG_NUM_FUSED} (fc input = 3 x target hidden size).",
            fix="serve it with vLLM: specwire export D --format speculators --out DIR",
        )
    if config.norm_before_residual:
        raise SpecwireError(
            "the draft was trained with norm_before_residual=true; SGLang's draft layer always adds the un-normed "
            "residual, so it would run a different function.", fix="serve it with vLLM (specwire export D --format speculators --out DIR).",
        )
    if config.hidden_act != "silu" or config.attention_bias:
        raise SpecwireError(
            f"the draft layer uses hidden_act={config.hidden_act!r}, attention_bias={config.attention_bias}; SGLang's "
            "llama_eagle3 supports silu without attention bias only.")
    if 0 in w.hs_ids:
        return ["hs 0 (the embedding output, SGLang id -1) is in the wiring: stock SGLang cannot capture it "
                "(it needs a patched target model)."]
    return []


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
    config, raw = read_native_config(src)
    tensors = _load_native_tensors(src, info, config)
    if max_position_embeddings is not None:
        if not isinstance(max_position_embeddings, int) or max_position_embeddings <= 0:
            raise SpecwireError(f"--max-position-embeddings must be a positive integer, found {max_position_embeddings!r}.")
        if config.rope_parameters.get("rope_type", "default") != "default":
            raise SpecwireError(
                f"the draft uses rope_type '{config.rope_parameters.get('rope_type')}', where max_position_embeddings can "
                "change the rope frequencies; refusing to change it after training.")
        config = dataclasses.replace(config, max_position_embeddings=max_position_embeddings)
    extra = _block_extras(raw)
    warnings: list[str] = []
    w = config.wiring
    if embeddings_from is not None:
        tensors["embed_tokens.weight"] = _target_embedding(embeddings_from, config, dtype=tensors["fc.weight"].dtype)
    if fmt == FORMAT_SGLANG:
        warnings += check_sglang_compatible(config)
        cfg = sglang_config_json(config, sglang_version=sglang_version, torch_dtype=_weights_dtype(tensors), extra=extra)
        tensors = remap_keys(tensors, to=FORMAT_SGLANG)
        ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    else:
        cfg = native_config_json(config, extra=extra)
        verifier_cfg = cfg["speculators_config"]["verifier"]
        verifier_cfg["name_or_path"] = verifier if verifier is not None else (raw.get("speculators_config") or {}).get("verifier", {}).get("name_or_path")
        if num_speculative_tokens is not None:
            if not isinstance(num_speculative_tokens, int) or num_speculative_tokens <= 0:
                raise SpecwireError(f"--num-speculative-tokens must be a positive integer, found {num_speculative_tokens!r}.")
            cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = num_speculative_tokens
        if config.num_fused != SGLANG_NUM_FUSED:
            warnings.append(f"the draft fuses {config.num_fused} states: the speculators package loads it, but vLLM's "
                            f"Eagle3LlamaForCausalLM builds fc for exactly {SGLANG_NUM_FUSED}.")
        if config.target_hidden_size != config.hidden_size:
            warnings.append("target_hidden_size differs from hidden_size: vLLM reads it, but the speculators 0.9 "
                            "Eagle3DraftModel builds fc from the draft width and cannot load this checkpoint.")
        ids = cfg["eagle_aux_hidden_state_layer_ids"]
    _write_checkpoint(out, cfg, tensors)
    return ExportResult(out=Path(out), format=fmt, wiring=w, layer_ids=list(ids), warnings=warnings)


def _target_embedding(target: str, config: DraftConfig, *, dtype: torch.dtype) -> torch.Tensor:
    from specwire.target.load import load_target

    t = load_target(target, device="cpu", dtype="float32")
    config.wiring.check_compatible(config.wiring.replace(target=t.spec), expected_from="the draft's wiring",
                                   found_in=f"target '{target}'")
    w = t.parts.embed.weight.detach()
    if tuple(w.shape) != (config.vocab_size, config.hidden_size):
        raise SpecwireError(f"target '{target}' embedding has shape {tuple(w.shape)}; the draft needs ({config.vocab_size}, {config.hidden_size}).")
    return w.to(dtype).contiguous().clone()


def _write_checkpoint(out: str | os.PathLike, cfg: dict, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_path(out) as tmp:
        tmp.mkdir()
        save_tensors(tmp / WEIGHTS_FILE, tensors, metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def _load_all(info: CheckpointInfo) -> dict[str, torch.Tensor]:
    if info.read_errors:
        raise SpecwireError(info.read_errors[0])
    tensors: dict[str, torch.Tensor] = {}
    for name in info.files:
        tensors.update(load_tensors(info.path / name))
    return tensors


def _check_dtypes(tensors: dict[str, torch.Tensor], source: str, notes: list[str] | None = None) -> dict[str, torch.Tensor]:
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


def _load_native_tensors(src: Path, info: CheckpointInfo, config: DraftConfig) -> dict[str, torch.Tensor]:
    tensors = _load_all(info)
    where = src / (info.files[0] if len(info.files) == 1 else WEIGHTS_INDEX)
    check_tensors(where, tensors, native_shapes(config))
    tensors = _check_dtypes(tensors, str(where))
    check_vocab_map(tensors["d2t"], tensors["t2d"], vocab_size=config.vocab_size, source=str(where))
    return tensors


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
class _TargetFacts:
    spec: TargetSpec
    tokenizer_fingerprint: str | None
    chat_template_hash: str | None
    embedding: torch.Tensor | None  # the target's embedding matrix, when its weights could be loaded
    max_position_embeddings: int | None


def _target_facts(target: str, notes: list[str]) -> _TargetFacts:
    from specwire.target.load import chat_template_hash, load_target, target_info, tokenizer_fingerprint

    info = target_info(target)
    try:
        t = load_target(target, device="cpu", dtype="float32")
    except SpecwireError as e:
        notes.append(f"target weights not loadable ({e}); the wiring has no target fingerprint.")
        spec = TargetSpec(architecture=info.architecture, num_layers=info.num_layers, hidden_size=info.hidden_size,
                          vocab_size=info.vocab_size)
        return _TargetFacts(spec, None, None, None, info.max_position_embeddings)
    tok = t.tokenizer
    return _TargetFacts(
        t.spec, tokenizer_fingerprint(tok) if tok is not None else None, chat_template_hash(tok) if tok is not None else None,
        t.parts.embed.weight.detach().float().cpu(), info.max_position_embeddings,
    )


def _parse_bool_flag(value: str | bool | None) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    v = str(value).strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise SpecwireError(f"--norm-before-residual expects true or false, found {value!r}.")


def _layer_geometry(lc: dict, *, source: str, prefix: str) -> dict[str, Any]:
    """DraftConfig geometry fields from a Llama-style (layer) config dict."""
    H = get_field(lc, "hidden_size", "int", source=source, prefix=prefix)
    heads = get_field(lc, "num_attention_heads", "int", source=source, prefix=prefix)
    layers = get_field(lc, "num_hidden_layers", "int", source=source, prefix=prefix, default=1)
    if layers != 1:
        raise SpecwireError(f"{source}: field '{prefix}num_hidden_layers' is {layers}; specwire drafts have exactly one layer.")
    act = get_field(lc, "hidden_act", "str", source=source, prefix=prefix, default="silu")
    if act != "silu":
        raise SpecwireError(f"{source}: field '{prefix}hidden_act' is {act!r}; EAGLE-3 Llama draft layers use 'silu'.")
    return dict(
        hidden_size=H,
        intermediate_size=get_field(lc, "intermediate_size", "int", source=source, prefix=prefix),
        num_attention_heads=heads,
        num_key_value_heads=get_field(lc, "num_key_value_heads", "int", source=source, prefix=prefix, default=heads),
        head_dim=get_field(lc, "head_dim", "int", source=source, prefix=prefix, default=H // heads),
        vocab_size=get_field(lc, "vocab_size", "int", source=source, prefix=prefix),
        max_position_embeddings=get_field(lc, "max_position_embeddings", "int", source=source, prefix=prefix),
        rms_norm_eps=float(get_field(lc, "rms_norm_eps", "number", source=source, prefix=prefix, default=1e-6)),
        rope_parameters=_rope_from_config(lc, source=source, prefix=prefix),
        attention_bias=get_field(lc, "attention_bias", "bool", source=source, prefix=prefix, default=False),
        hidden_act=act,
    )


def _sglang_hs_ids(ids: list[int], num_layers: int, *, sglang_version: str | None, source: str, notes: list[str]) -> list[int]:
    readings = sglang_readings(ids, num_layers)
    if sglang_version is not None:
        hs = readings[sglang_version]
        if hs is None:
            raise SpecwireError(f"{source}: eagle_config ids {ids} are out of range for a {num_layers}-layer target "
                                f"when read by SGLang '{sglang_version}'.")
        notes.append(f"eagle_config ids {ids} read as hs {hs} (SGLang '{sglang_version}', as given).")
        return hs
    valid = {v: hs for v, hs in readings.items() if hs is not None}
    if not valid:
        raise SpecwireError(f"{source}: eagle_config ids {ids} are out of range for a {num_layers}-layer target under every SGLang version rule.")
    distinct = {tuple(hs) for hs in valid.values()}
    if len(distinct) == 1:
        hs = next(iter(valid.values()))
        why = "every SGLang version reads them the same way" if len(valid) == len(readings) else \
            f"only the '{next(iter(valid))}' reading is in range"
        notes.append(f"eagle_config ids {ids} read as hs {hs} ({why}).")
        return hs
    raise SpecwireError(
        f"{source}: field 'eagle_config.eagle_aux_hidden_state_layer_ids' = {ids} means hs {readings['classic']} on "
        f"classic SGLang (id k = output of layer k) but hs {readings['shift-if-one']} on newer SGLang (+1 only when "
        "the first id is 1); the checkpoint does not say which.",
        fix="pass --sglang-version classic or --sglang-version shift-if-one (the SGLang the draft was trained for).",
    )


def _config_from_sglang(cfg: dict, tensors: dict[str, torch.Tensor], facts: _TargetFacts, *, source: str,
                        sglang_version: str | None, norm_before_residual: bool | None, notes: list[str]) -> DraftConfig:
    geo = _layer_geometry(cfg, source=source, prefix="")
    L = facts.spec.num_layers
    ec = get_field(cfg, "eagle_config", "dict", source=source, default=None, nullable=True)
    if ec is None:
        hs = list(default_hs_ids(L))
        notes.append(f"no eagle_config: SGLang captures its default hs {hs}; recorded as the wiring.")
    else:
        if get_field(ec, "use_aux_hidden_state", "bool", source=source, prefix="eagle_config.", default=True) is not True:
            raise SpecwireError(f"{source}: field 'eagle_config.use_aux_hidden_state' is false; that is an EAGLE-1/2 draft, not EAGLE-3.")
        ids = get_field(ec, "eagle_aux_hidden_state_layer_ids", "int_list", source=source, prefix="eagle_config.", default=None, nullable=True)
        if ids is None:
            hs = list(default_hs_ids(L))
            notes.append(f"no eagle_config ids: SGLang captures its default hs {hs}; recorded as the wiring.")
        else:
            hs = _sglang_hs_ids(ids, L, sglang_version=sglang_version, source=source, notes=notes)
    stated = get_field(cfg, "norm_before_residual", "bool", source=source, default=None, nullable=True)
    if norm_before_residual is not None and stated is not None and norm_before_residual != stated:
        raise SpecwireError(f"{source}: field 'norm_before_residual' is {stated} but --norm-before-residual says {norm_before_residual}.")
    nbr = stated if stated is not None else (norm_before_residual if norm_before_residual is not None else False)
    if nbr:
        notes.append("norm_before_residual=true: SGLang itself would ignore it (its layer adds the un-normed residual).")
    if get_field(cfg, "tie_word_embeddings", "bool", source=source, default=False):
        notes.append("tie_word_embeddings=true in the config: SGLang would use the embedding as lm_head; lm_head.weight imported as stored.")
    return _finish_config(geo, cfg, tensors, facts, hs=hs, nbr=nbr, source=source)


def _config_from_speculators(cfg: dict, tensors: dict[str, torch.Tensor], facts: _TargetFacts, *, source: str,
                             norm_before_residual: bool | None, notes: list[str]) -> DraftConfig:
    stype = get_field(cfg, "speculators_model_type", "str", source=source)
    if stype != "eagle3":
        raise SpecwireError(f"{source}: field 'speculators_model_type' is {stype!r}; only 'eagle3' checkpoints are EAGLE-3 drafts.")
    lc = get_field(cfg, "transformer_layer_config", "dict", source=source)
    mt = lc.get("model_type", "llama")
    if mt != "llama":
        raise SpecwireError(f"{source}: field 'transformer_layer_config.model_type' is {mt!r}; specwire drafts are Llama layers "
                            "(a qwen3 draft layer has q/k norms that this draft does not).")
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        if get_field(cfg, flag, "bool", source=source, default=False):
            raise SpecwireError(f"{source}: field '{flag}' is true; specwire drafts do not implement that variant.")
    geo = _layer_geometry(lc, source=source, prefix="transformer_layer_config.")
    ids = get_field(cfg, "eagle_aux_hidden_state_layer_ids", "int_list", source=source, default=None, nullable=True)
    if ids is None:
        hs = list(default_hs_ids(facts.spec.num_layers))
        notes.append(f"no eagle_aux_hidden_state_layer_ids: vLLM and speculators use their default hs {hs}; recorded as the wiring.")
    else:
        hs = list(ids)
        validate_hs_ids(hs, facts.spec.num_layers, what=f"{source}: eagle_aux_hidden_state_layer_ids")
    stated = get_field(cfg, "norm_before_residual", "bool", source=source, default=None, nullable=True)
    if stated is None:
        if norm_before_residual is None:
            raise SpecwireError(
                f"{source}: field 'norm_before_residual' is missing. vLLM assumes true when it is missing, the speculators "
                "package and SGLang use false; the checkpoint does not say which one it was trained with.",
                fix="pass --norm-before-residual true or --norm-before-residual false.",
            )
        stated = norm_before_residual
        notes.append(f"norm_before_residual missing; set to {stated} as given.")
    elif norm_before_residual is not None and norm_before_residual != stated:
        raise SpecwireError(f"{source}: field 'norm_before_residual' is {stated} but --norm-before-residual says {norm_before_residual}.")
    return _finish_config(geo, cfg, tensors, facts, hs=hs, nbr=stated, source=source)


def _finish_config(geo: dict, cfg: dict, tensors: dict[str, torch.Tensor], facts: _TargetFacts, *, hs: list[int],
                   nbr: bool, source: str) -> DraftConfig:
    spec = facts.spec
    lm = tensors.get("lm_head.weight")
    dvs = get_field(cfg, "draft_vocab_size", "int", source=source, default=None, nullable=True)
    if dvs is None:
        dvs = geo["vocab_size"]
    if lm is not None and lm.shape[0] != dvs:
        raise SpecwireError(f"{source}: field 'draft_vocab_size' is {dvs} but lm_head.weight has {lm.shape[0]} rows.")
    ths = get_field(cfg, "target_hidden_size", "int", source=source, default=None, nullable=True) or geo["hidden_size"]
    if geo["vocab_size"] != spec.vocab_size:
        raise SpecwireError(f"{source}: vocab_size {geo['vocab_size']} differs from the target's {spec.vocab_size}; "
                            "this draft was trained for another target (or another tokenizer).")
    if ths != spec.hidden_size:
        raise SpecwireError(f"{source}: target hidden size {ths} differs from the target's {spec.hidden_size}.")
    fc = tensors.get("fc.weight")
    if fc is not None and fc.shape[-1] != len(hs) * ths:
        raise SpecwireError(f"{source}: fc.weight takes {fc.shape[-1]} inputs but {len(hs)} layer ids x target hidden size {ths} "
                            f"= {len(hs) * ths}; the layer ids do not fit the weights.")
    wiring = Wiring(hs_ids=tuple(hs), target=spec, norm_before_residual=nbr, draft_vocab_size=dvs,
                    tokenizer_fingerprint=facts.tokenizer_fingerprint, chat_template_hash=facts.chat_template_hash)
    return DraftConfig(wiring=wiring, draft_vocab_size=dvs, norm_before_residual=nbr, target_hidden_size=ths, **geo)


def _check_block_against_config(fmt: str, config: DraftConfig, cfg: dict, block: dict, *, source: str) -> None:
    """A config edited after export must not silently disagree with the specwire block it carries."""
    w = config.wiring
    if fmt == FORMAT_SGLANG:
        ec = cfg.get("eagle_config")
        ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
        version = block.get("sglang_version", DEFAULT_SGLANG_VERSION)
        if version not in SGLANG_VERSIONS:
            raise SpecwireError(f"{source}: field 'specwire.sglang_version' is {version!r}; expected one of {list(SGLANG_VERSIONS)}.")
        want = hs_to_sglang_ids(w.hs_ids, w.target.num_layers, sglang_version=version)
        if ids != want:
            raise WiringMismatch(
                f"{source}: eagle_config ids {ids!r} disagree with the specwire block (hs {list(w.hs_ids)} = SGLang "
                f"'{version}' ids {want}); the config was edited after export.",
                fix="re-export from the native checkpoint, or remove the 'specwire' block and import with --target.")
        checks = {"hidden_size": config.hidden_size, "draft_vocab_size": config.draft_vocab_size, "vocab_size": config.vocab_size}
    else:
        ids = cfg.get("eagle_aux_hidden_state_layer_ids")
        if ids != list(w.hs_ids):
            raise WiringMismatch(f"{source}: eagle_aux_hidden_state_layer_ids {ids!r} disagree with the specwire block "
                                 f"(hs {list(w.hs_ids)}); the config was edited after export.")
        if cfg.get("norm_before_residual") != config.norm_before_residual:
            raise WiringMismatch(f"{source}: norm_before_residual {cfg.get('norm_before_residual')!r} disagrees with the "
                                 f"specwire block ({config.norm_before_residual}).")
        checks = {"draft_vocab_size": config.draft_vocab_size}
    for name, want_v in checks.items():
        if cfg.get(name) != want_v:
            raise WiringMismatch(f"{source}: field '{name}' is {cfg.get(name)!r} but the specwire block says {want_v}.")


def import_draft(src: str | os.PathLike, out: str | os.PathLike, *, sglang_version: str | None = None,
                 norm_before_residual: bool | str | None = None, target: str | None = None) -> ImportResult:
    """Convert a draft in any known format to a native checkpoint in `out` (written atomically, then verified)."""
    notes: list[str] = []
    nbr_flag = _parse_bool_flag(norm_before_residual)
    if sglang_version is not None and sglang_version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{sglang_version}'; expected one of {list(SGLANG_VERSIONS)}.")
    info = read_checkpoint(src)
    if info.format is None or info.config is None:
        raise SpecwireError(f"cannot import '{info.path}': " + " ".join(info.problems))
    cfg, source = info.config, str(info.config_path)
    tensors = _load_all(info)
    weights_src = str(info.path / (info.files[0] if len(info.files) == 1 else WEIGHTS_INDEX))
    tensors = remap_keys(tensors, to=FORMAT_NATIVE) if info.format == FORMAT_SGLANG else dict(tensors)
    facts = _target_facts(target, notes) if target is not None else None
    if info.specwire is not None:
        config = block_draft_config(info.specwire, source=source)
        _check_block_against_config(info.format, config, cfg, info.specwire, source=source)
        if nbr_flag is not None and nbr_flag != config.norm_before_residual:
            raise SpecwireError(f"{source}: the specwire block says norm_before_residual={config.norm_before_residual}, "
                                f"--norm-before-residual says {nbr_flag}.")
        if facts is not None:
            found = config.wiring.replace(target=facts.spec)
            config.wiring.check_compatible(found, expected_from=f"{source} (specwire block)", found_in=f"target '{target}'")
        notes.append("wiring taken from the checkpoint's specwire block.")
        extras = {k: v for k, v in info.specwire.items() if k not in ("format", "format_version", "draft_config", "sglang_version")}
    else:
        if facts is None:
            raise SpecwireError(
                f"'{info.path}' ({info.format} format) carries no specwire block, so the target it was trained for is unknown.",
                fix=f"pass the target: specwire import {info.path} --out DIR --target TARGET",
            )
        if info.format == FORMAT_SGLANG:
            config = _config_from_sglang(cfg, tensors, facts, source=source, sglang_version=sglang_version,
                                         norm_before_residual=nbr_flag, notes=notes)
        else:
            config = _config_from_speculators(cfg, tensors, facts, source=source, norm_before_residual=nbr_flag, notes=notes)
        extras = {"imported_from": {"format": info.format, "path": str(info.path)}}
    tensors = _drop_foreign(tensors, config, facts, notes, source=weights_src)
    if "d2t" not in tensors and "t2d" not in tensors:
        if config.draft_vocab_size != config.vocab_size:
            raise SpecwireError(f"{weights_src}: no d2t / t2d tensors but draft_vocab_size {config.draft_vocab_size} < target vocab "
                                f"{config.vocab_size}; the draft-to-target vocabulary map is missing.")
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
        tensors["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
        notes.append("no d2t / t2d: the draft vocabulary is the target's; identity map written.")
    check_tensors(weights_src, tensors, native_shapes(config))
    tensors = _check_dtypes(tensors, weights_src, notes)
    check_vocab_map(tensors["d2t"], tensors["t2d"], vocab_size=config.vocab_size, source=weights_src)
    native = native_config_json(config, extra=extras)
    verifier = ((cfg.get("speculators_config") or {}).get("verifier") or {}) if isinstance(cfg.get("speculators_config"), dict) else {}
    if isinstance(verifier, dict) and isinstance(verifier.get("name_or_path"), str):
        native["speculators_config"]["verifier"]["name_or_path"] = verifier["name_or_path"]
    _write_checkpoint(out, native, tensors)
    load_draft(out)  # the result must load with every check of the native loader
    return ImportResult(out=Path(out), source_format=info.format, wiring=config.wiring, notes=notes)


def _drop_foreign(tensors: dict[str, torch.Tensor], config: DraftConfig, facts: _TargetFacts | None, notes: list[str], *,
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


# ---- command line -------------------------------------------------------------------------------

def add_cli(sub) -> None:
    from specwire.cli import add_json_option

    p = sub.add_parser("export", help="convert a native draft to the SGLang or speculators (vLLM) layout",
                       description="Write a native specwire draft in another tool's checkpoint format. sglang: midlayer.* "
                       "keys and a LlamaForCausalLMEagle3 config with SGLang-convention eagle_config ids (SpecForge reads "
                       "it too). speculators: layers.0.* keys and a speculators eagle3 config with hs-index ids (vLLM and "
                       "the speculators package read it). Both keep a 'specwire' block so import is lossless.")
    p.add_argument("draft", help="native draft folder or 'smollm2-135m-eagle3'")
    p.add_argument("--format", dest="fmt", required=True, choices=EXPORT_FORMATS)
    p.add_argument("--out", required=True, help="output folder (replaced atomically)")
    p.add_argument("--sglang-version", default=DEFAULT_SGLANG_VERSION, choices=SGLANG_VERSIONS,
                   help="which SGLang id rule to write for (default: %(default)s)")
    p.add_argument("--verifier", default=None, help="speculators: verifier name_or_path written to speculators_config")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="speculators: default speculative_tokens")
    p.add_argument("--max-position-embeddings", type=int, default=None,
                   help="raise the draft's max_position_embeddings to the target's (default rope only)")
    p.add_argument("--embeddings-from", default=None, metavar="TARGET",
                   help="also write embed_tokens.weight from this target (for tools that do not share it themselves)")
    add_json_option(p)
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("import", help="convert an SGLang/SpecForge/EAGLE or speculators draft to a native one",
                       description="Detect the format of a draft folder (native, sglang, speculators) and write a native "
                       "checkpoint. Fields whose meaning differs between tools are never guessed: pass --sglang-version "
                       "or --norm-before-residual when asked. Without a specwire block, --target is required.")
    p.add_argument("src", help="draft folder to import")
    p.add_argument("--out", required=True, help="output folder (replaced atomically)")
    p.add_argument("--sglang-version", default=None, choices=SGLANG_VERSIONS, help="how SGLang read the eagle_config ids")
    p.add_argument("--norm-before-residual", default=None, choices=["true", "false"],
                   help="what the draft was trained with, when its config does not say")
    p.add_argument("--target", default=None, help="the target the draft was trained for (built-in name or HF folder)")
    add_json_option(p)
    p.set_defaults(func=_cmd_import)


def _cmd_export(args: argparse.Namespace) -> int:
    from specwire.cli import emit_json

    r = export_draft(args.draft, args.out, fmt=args.fmt, sglang_version=args.sglang_version, verifier=args.verifier,
                     num_speculative_tokens=args.num_speculative_tokens, max_position_embeddings=args.max_position_embeddings,
                     embeddings_from=args.embeddings_from)
    if args.json:
        emit_json(r.to_dict())
        return 0
    conv = "SGLang layer-output ids" if r.format == FORMAT_SGLANG else "hs indices"
    print(f"wrote {r.format} checkpoint to {r.out}")
    print(f"  layer ids {r.layer_ids} ({conv}) = hs {list(r.wiring.hs_ids)}")
    for w in r.warnings:
        print(f"  warning: {w}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    from specwire.cli import emit_json

    r = import_draft(args.src, args.out, sglang_version=args.sglang_version, norm_before_residual=args.norm_before_residual,
                     target=args.target)
    if args.json:
        emit_json(r.to_dict())
        return 0
    print(f"imported {r.source_format} checkpoint into {r.out} (hs {list(r.wiring.hs_ids)})")
    for n in r.notes:
        print(f"  note: {n}")
    return 0
