"""The one reader of draft folders, and the one consistency check built into it.

Owns: reading any EAGLE-3 draft folder leniently (`read_checkpoint`: raw config, safetensors headers,
the detected format and layout, every record of the hidden-state ids, the problems seen; it never
raises on a bad file, so the doctor can read broken checkpoints), and the consistency check built into
that read (`CheckpointInfo.inconsistencies`, `find_inconsistencies`, `require_consistent`). Typed config
fields, rope parsing and rebuilding a `DraftConfig` from a foreign config live beside it (`draft.fields`).
Does not write checkpoints (`interop.convert`, `draft.checkpoint`), load weights, say how an engine
reads a draft (`interop.engines`), or judge a draft against a target beyond its recorded identity (the
doctor and the engine do that).

Formats (`docs/CONVENTIONS.md` section 3):
  native       speculators' key layout (`layers.0.*`) + speculators-style config + a `specwire` block
               (DraftConfig, Wiring). vLLM and the speculators package read it as is.
  sglang       `midlayer.*` keys, a Llama config with `architectures: ["LlamaForCausalLMEagle3"]` and
               `eagle_config.eagle_aux_hidden_state_layer_ids` in SGLang's layer-output convention.
               SpecForge and SafeAILab/EAGLE write and read the same layout.
  speculators  `layers.0.*` keys, `speculators_model_type: "eagle3"`, hs-index layer ids, no block.

The consistency check: a folder can say the same thing several times (the ids in the specwire block,
in `eagle_aux_hidden_state_layer_ids` for vLLM and speculators, in `eagle_config` for SGLang; the widths
in the block, in the layer config and in the tensors' shapes; the draft vocabulary in the config, in
`d2t` and in `lm_head`). Each tool reads a different copy, so a disagreement means two tools run two
different drafts. Every copy is translated through `specwire.wiring` and compared; any disagreement
is an `Inconsistency` naming both values, which tool reads which, and the fix. Every command that
opens a draft (generate, bench, serve, eval, export, import, launch-cmd, doctor) goes through here,
because `draft.checkpoint.load_draft` does.
Untrusted folders stay data: safetensors and JSON only, headers validated before any tensor is read.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specwire.draft.model import NATIVE_FORMAT, DraftConfig
from specwire.errors import SpecwireError, WiringMismatch
from specwire.draft.fields import block_draft_config, is_int, layer_geometry, rope_or_none
from specwire.safeio import read_json, safetensors_header
from specwire.wiring import (
    DEFAULT_SGLANG_VERSION,
    SGLANG_VERSIONS,
    hs_to_sglang_ids,
    sglang_readings,
    sglang_to_hs,
    vllm_to_hs,
)

FORMAT_NATIVE, FORMAT_SGLANG, FORMAT_SPECULATORS = "native", "sglang", "speculators"
FORMATS: tuple[str, ...] = (FORMAT_NATIVE, FORMAT_SGLANG, FORMAT_SPECULATORS)
SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
SPECULATORS_ARCHITECTURES: tuple[str, ...] = ("Eagle3Speculator", "Eagle3DraftModel")
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
NATIVE_LAYER_PREFIX, SGLANG_LAYER_PREFIX = "layers.0.", "midlayer."
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")

# Who reads which copy of a fact (for messages).
READ_BY_SPECWIRE = "specwire's generate, bench, serve, eval, export and launch-cmd"
READ_BY_VLLM = "vLLM and the speculators package"
READ_BY_SGLANG = "SGLang and SpecForge"
AUX_IDS = "eagle_aux_hidden_state_layer_ids"
EAGLE_CONFIG_IDS = "eagle_config.eagle_aux_hidden_state_layer_ids"


# ---- key layouts (pure) --------------------------------------------------------------------------

def layer_index(name: str) -> int | None:
    """N of a `layers.N.*` tensor name, else None."""
    m = re.match(r"^layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def layer_layout(names) -> str:
    """'midlayer' (SGLang), 'layers' (native/speculators), 'mixed', or 'none' for a set of tensor names."""
    has_mid = any(n.startswith(SGLANG_LAYER_PREFIX) for n in names)
    has_layers = any(layer_index(n) is not None for n in names)
    return "mixed" if has_mid and has_layers else "midlayer" if has_mid else "layers" if has_layers else "none"


# ---- the view -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its safetensors header describes it (nothing loaded)."""

    dtype: str  # safetensors dtype name: F32, BF16, F16, I64, I32, BOOL, U8, ...
    shape: tuple[int, ...]
    file: str  # file name inside the checkpoint folder


@dataclass(frozen=True)
class IdsRecord:
    """One place where the folder records the hidden-state ids, as written, and who reads it."""

    field: str  # where in config.json
    written: tuple[int, ...]  # as written, in `convention`
    convention: str  # "hs" (hs indices) or "sglang" (SGLang layer-output ids)
    read_by: str  # the tools that read this copy
    sglang_version: str | None = None  # the SGLang id rule it was written for (sglang convention)

    def hs(self, num_layers: int) -> list[int]:
        """The hs indices this record means for a `num_layers`-layer target (SpecwireError when out of range)."""
        if self.convention == "sglang":
            return sglang_to_hs(self.written, num_layers, sglang_version=self.sglang_version or DEFAULT_SGLANG_VERSION)
        return vllm_to_hs(self.written, num_layers)

    def written_for(self, hs_ids, num_layers: int) -> list[int]:
        """What this field must say for the ids to mean `hs_ids`."""
        if self.convention == "sglang":
            return hs_to_sglang_ids(hs_ids, num_layers, sglang_version=self.sglang_version or DEFAULT_SGLANG_VERSION)
        return [int(i) for i in hs_ids]


@dataclass(frozen=True)
class Inconsistency:
    """Two copies of one fact in a draft folder that disagree."""

    kind: str  # "ids" | "ids-range" | "width" | "vocab" | "geometry" | "norm-before-residual"
    message: str  # both values, where each is, and which tool reads which
    fix: str

    def error(self) -> SpecwireError:
        cls = WiringMismatch if self.kind in ("ids", "ids-range", "norm-before-residual") else SpecwireError
        return cls(self.message, fix=self.fix)


@dataclass
class CheckpointInfo:
    """What a draft folder holds and says about itself, read without judging it."""

    path: Path
    config: dict | None  # raw config.json (None when missing or not a JSON object)
    tensors: dict[str, TensorInfo]  # name -> header info, over all weight files
    files: list[str]  # weight files read (names inside `path`)
    format: str | None  # "native" | "sglang" | "speculators" | None when it cannot be told
    specwire: dict | None  # the `specwire` block of config.json when present
    problems: list[str] = field(default_factory=list)  # everything odd, including read_errors
    read_errors: list[str] = field(default_factory=list)  # files that could not be read at all
    inconsistencies: list[Inconsistency] = field(default_factory=list)  # copies of one fact that disagree

    # -- where things are
    @property
    def layout(self) -> str:
        """'midlayer' (SGLang names), 'layers' (native/speculators names), 'mixed' or 'none'."""
        return layer_layout(self.tensors)

    @property
    def layer_prefix(self) -> str | None:
        return {"layers": NATIVE_LAYER_PREFIX, "midlayer": SGLANG_LAYER_PREFIX}.get(self.layout)

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def weights_path(self) -> Path:
        return self.path / (self.files[0] if len(self.files) == 1 else WEIGHTS_INDEX)

    def shape(self, name: str) -> tuple[int, ...] | None:
        t = self.tensors.get(name)
        return t.shape if t is not None else None

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in self.tensors.items()}

    # -- what the config says (lenient: None when absent or of the wrong type)
    @property
    def raw(self) -> dict:
        return self.config if isinstance(self.config, dict) else {}

    @property
    def layer_config(self) -> dict:
        """The dict holding the layer geometry: `transformer_layer_config` (speculators style) or the top level."""
        lc = self.raw.get("transformer_layer_config")
        return lc if isinstance(lc, dict) else self.raw

    @property
    def layer_prefix_in_config(self) -> str:
        return "transformer_layer_config." if isinstance(self.raw.get("transformer_layer_config"), dict) else ""

    @property
    def config_readers(self) -> str:
        """Which tools read the top-level config fields of this folder."""
        return READ_BY_SGLANG if self.format == FORMAT_SGLANG else READ_BY_VLLM

    def geo_int(self, name: str) -> int | None:
        v = self.layer_config.get(name)
        return v if is_int(v) else None

    def top_int(self, name: str) -> int | None:
        v = self.raw.get(name)
        return v if is_int(v) else None

    @property
    def hidden_size(self) -> int | None:
        return self.geo_int("hidden_size")

    @property
    def target_hidden_size(self) -> int | None:
        return self.top_int("target_hidden_size")

    @property
    def vocab_size(self) -> int | None:
        return self.geo_int("vocab_size")

    @property
    def draft_vocab_size(self) -> int | None:
        v = self.top_int("draft_vocab_size")
        return v if v is not None else self.geo_int("draft_vocab_size")

    @property
    def max_position_embeddings(self) -> int | None:
        return self.geo_int("max_position_embeddings")

    @property
    def rms_norm_eps(self) -> float | None:
        v = self.layer_config.get("rms_norm_eps")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    @property
    def rope(self) -> dict | None:
        return rope_or_none(self.layer_config)

    @property
    def norm_before_residual(self) -> bool | None:
        v = self.raw.get("norm_before_residual")
        return v if isinstance(v, bool) else None

    # -- the specwire block (the training record)
    @property
    def block_config(self) -> dict | None:
        dc = (self.specwire or {}).get("draft_config")
        return dc if isinstance(dc, dict) else None

    @property
    def recorded_wiring(self) -> dict | None:
        w = (self.block_config or {}).get("wiring")
        return w if isinstance(w, dict) else None

    @property
    def recorded_target(self) -> dict | None:
        t = (self.recorded_wiring or {}).get("target")
        return t if isinstance(t, dict) else None

    @property
    def recorded_num_layers(self) -> int | None:
        v = (self.recorded_target or {}).get("num_layers")
        return v if is_int(v) and v > 0 else None

    @property
    def sglang_version(self) -> str:
        v = (self.specwire or {}).get("sglang_version", DEFAULT_SGLANG_VERSION)
        return v if v in SGLANG_VERSIONS else DEFAULT_SGLANG_VERSION

    def draft_config(self) -> DraftConfig | None:
        """The DraftConfig of the `specwire` block; None when there is no block, SpecwireError when it is invalid."""
        if not isinstance(self.specwire, dict):
            return None
        return block_draft_config(self.specwire, source=str(self.config_path))

    def geometry(self) -> dict[str, Any]:
        """The layer geometry of the config, strictly typed (SpecwireError naming the field otherwise)."""
        return layer_geometry(self.layer_config, source=str(self.config_path), prefix=self.layer_prefix_in_config)

    # -- the records of the hidden-state ids
    def ids_records(self) -> list[IdsRecord]:
        """Every record of the ids in config.json that is a list of integers, the specwire block's first."""
        out: list[IdsRecord] = []
        w = self.recorded_wiring or {}
        if isinstance(w.get("hs_ids"), list) and all(is_int(i) for i in w["hs_ids"]):
            out.append(IdsRecord("specwire.draft_config.wiring.hs_ids", tuple(w["hs_ids"]), "hs", READ_BY_SPECWIRE))
        aux = self.raw.get(AUX_IDS)
        if isinstance(aux, list) and aux and all(is_int(i) for i in aux):
            out.append(IdsRecord(AUX_IDS, tuple(aux), "hs", READ_BY_VLLM))
        ec = self.raw.get("eagle_config")
        ids = ec.get("eagle_aux_hidden_state_layer_ids") if isinstance(ec, dict) else None
        if isinstance(ids, list) and ids and all(is_int(i) for i in ids):
            out.append(IdsRecord(EAGLE_CONFIG_IDS, tuple(ids), "sglang", READ_BY_SGLANG, self.sglang_version))
        return out

    def trained_hs(self, num_layers: int) -> tuple[list[int] | None, str]:
        """The hs ids the draft was trained on, and where that came from."""
        records = self.ids_records()
        if not records:
            return None, "no layer ids in the config"
        rec = records[0]
        if rec.field.startswith("specwire."):
            return list(rec.written), "the specwire block of config.json (recorded at training)"
        if rec.convention == "sglang":  # SGLang/SpecForge training writes layer-output ids
            try:
                return sglang_to_hs(rec.written, num_layers, sglang_version="classic"), \
                    "eagle_config.eagle_aux_hidden_state_layer_ids (SpecForge convention, hs = id + 1)"
            except SpecwireError:
                return None, "eagle_config ids out of range"
        return list(rec.written), "eagle_aux_hidden_state_layer_ids (hs indices)"

    # -- the check
    def check_consistency(self, num_layers: int | None = None) -> list[Inconsistency]:
        """Every disagreement between copies of one fact (ids read for `num_layers`, else the recorded count)."""
        return find_inconsistencies(self, num_layers)

    def require_consistent(self) -> "CheckpointInfo":
        """Raise the first read error or inconsistency as one SpecwireError; return self otherwise."""
        if self.read_errors:
            raise SpecwireError(self.read_errors[0])
        if self.inconsistencies:
            raise self.inconsistencies[0].error()
        return self

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path), "format": self.format, "layout": self.layout, "files": self.files,
            "tensors": {k: {"dtype": v.dtype, "shape": list(v.shape)} for k, v in self.tensors.items()},
            "has_specwire_block": self.specwire is not None, "problems": list(self.problems),
            "inconsistencies": [{"kind": i.kind, "message": i.message, "fix": i.fix} for i in self.inconsistencies],
        }


# ---- reading -------------------------------------------------------------------------------------

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
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
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
        return (FORMAT_NATIVE if block is not None else FORMAT_SPECULATORS), block
    if says_sglang:
        return FORMAT_SGLANG, block
    if says_spec:
        return (FORMAT_NATIVE if block is not None else FORMAT_SPECULATORS), block
    problems.append(f"{cfg_path.parent}: neither the tensor names nor config.json look like an EAGLE-3 draft.")
    return None, block


def read_checkpoint(path: str | os.PathLike) -> CheckpointInfo:
    """Read a draft folder leniently: raw config, tensor headers, detected format, problems, inconsistencies.

    Raises only when `path` is not a folder; everything else (unreadable JSON, a truncated or corrupt
    safetensors file, pickle-only weights, mixed layouts, copies that disagree) is recorded.
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
    info = CheckpointInfo(path=path, config=config, tensors=tensors, files=files, format=fmt, specwire=block,
                          problems=problems, read_errors=errors)
    info.inconsistencies = find_inconsistencies(info)
    info.problems += [i.message for i in info.inconsistencies]
    return info


def detect_format(path: str | os.PathLike) -> str:
    """'native', 'sglang' or 'speculators'; a SpecwireError naming what was seen when it cannot tell."""
    info = read_checkpoint(path)
    if info.format is None:
        raise SpecwireError(f"cannot tell the format of '{info.path}': " + " ".join(info.problems))
    return info.format


# ---- the consistency check -----------------------------------------------------------------------

def _fix_reexport(info: CheckpointInfo) -> str:
    if info.specwire is None:
        return ("export the draft again from the tool that trained it; `specwire import DIR --out NATIVE --target TARGET` "
                "shows which copy fits the weights")
    return (f"restore the field, or export again from the native checkpoint (specwire export NATIVE_DRAFT --format "
            f"{'sglang' if info.format == FORMAT_SGLANG else 'speculators'} --out DIR)")


def _ids_inconsistencies(info: CheckpointInfo, L: int | None) -> list[Inconsistency]:
    out: list[Inconsistency] = []
    src = info.config_path
    records = info.ids_records()
    block = records[0] if records and records[0].read_by == READ_BY_SPECWIRE else None
    others = [r for r in records if r is not block]
    if L is None:  # neither recorded nor given: SGLang ids cannot be translated
        return out
    want = None
    if block is not None:
        try:
            want = block.hs(L)
        except SpecwireError as e:
            out.append(Inconsistency("ids-range", f"{src}: the specwire block's {e} (the recorded target has {L} layers).",
                                     "pair the draft with the target it was trained on; re-export from the training run."))
    for rec in others:
        rule = f" (SGLang '{rec.sglang_version}' rule)" if rec.convention == "sglang" else ""
        try:
            hs = rec.hs(L)
        except SpecwireError as e:
            also = f"; the specwire block (read by {READ_BY_SPECWIRE}) says hs {want}" if want else ""
            out.append(Inconsistency("ids-range", (
                f"{src}: field '{rec.field}' is {list(rec.written)}, which {rec.read_by} read{rule} as ids a {L}-layer "
                f"target does not have ({e}){also}."),
                f"set '{rec.field}' to {rec.written_for(want, L)} (= hs {want}); " + _fix_reexport(info) if want else
                _fix_reexport(info)))
            continue
        if want is None and rec.convention == "sglang":  # no block: the copies must agree under some SGLang rule
            aux = next((r for r in others if r.convention == "hs"), None)
            readings = sglang_readings(rec.written, L)
            if aux is not None and list(aux.written) not in readings.values():
                out.append(Inconsistency("ids", (
                    f"{src}: field '{AUX_IDS}' is {list(aux.written)} (hs indices, read by {READ_BY_VLLM}) but field "
                    f"'{EAGLE_CONFIG_IDS}' is {list(rec.written)} (read by {READ_BY_SGLANG} as hs {readings}): the two "
                    "engines would feed different states."), _fix_reexport(info)))
        if want is not None and hs != want:
            out.append(Inconsistency("ids", (
                f"{src}: field '{rec.field}' is {list(rec.written)}, which {rec.read_by} read{rule} as hs {hs}: they "
                f"would feed the draft hs {hs}, but the specwire block (read by {READ_BY_SPECWIRE}) says it was trained on hs "
                f"{want}; the config was edited after export."),
                f"set '{rec.field}' back to {rec.written_for(want, L)} (= hs {want} in that convention), or " + _fix_reexport(info)))
    return out


def _width_inconsistencies(info: CheckpointInfo) -> list[Inconsistency]:
    """Widths and sizes stated in the config (block and top level) against the tensors' shapes."""
    out: list[Inconsistency] = []
    src, weights = info.config_path, info.weights_path
    dc = info.block_config or {}
    pre = info.layer_prefix_in_config
    fix = _fix_reexport(info)

    def claims(name: str, *, top: bool = False, geo: bool = False) -> list[tuple[str, str, int]]:
        found = []
        if is_int(dc.get(name)):
            found.append((f"specwire.draft_config.{name}", READ_BY_SPECWIRE, dc[name]))
        if top and info.top_int(name) is not None:
            found.append((name, info.config_readers, info.top_int(name)))
        if geo and info.geo_int(name) is not None:
            found.append((f"{pre}{name}", info.config_readers, info.geo_int(name)))
        return found

    def tensor_says(label: str, readers: str, value: int, tname: str, got: str) -> Inconsistency:
        return Inconsistency("width", (
            f"{src}: field '{label}' is {value} ({readers} read it) but {weights}: tensor '{tname}' has shape "
            f"{list(info.shape(tname) or ())} ({got}); the config and the weights describe different drafts."), fix)

    fc = info.shape("fc.weight")
    norm = info.shape("norm.weight")
    for label, readers, H in claims("hidden_size", geo=True):
        if fc is not None and len(fc) == 2 and fc[0] != H:
            out.append(tensor_says(label, readers, H, "fc.weight", f"{fc[0]} rows, the draft width"))
        elif norm is not None and norm != (H,):
            out.append(tensor_says(label, readers, H, "norm.weight", "the draft width"))
    if fc is not None and len(fc) == 2:
        n_ids = {r.field: len(r.written) for r in info.ids_records()}
        ths = claims("target_hidden_size", top=True)
        if not any(label == "target_hidden_size" for label, _, _ in ths) and info.format == FORMAT_SGLANG \
                and info.geo_int("hidden_size") is not None:  # SGLang: fc width = 3 x hidden_size unless stated
            ths.append((f"{pre}hidden_size", info.config_readers, info.geo_int("hidden_size")))
        for label, readers, Ht in ths:
            for rec_field, n in n_ids.items():
                if fc[1] != n * Ht:
                    out.append(Inconsistency("width", (
                        f"{src}: field '{label}' is {Ht} ({readers} read it) and field '{rec_field}' lists {n} ids, so fc "
                        f"takes {n} x {Ht} = {n * Ht} inputs; but {weights}: tensor 'fc.weight' has shape {list(fc)}: "
                        f"fc.weight takes {fc[1]} inputs."), fix))
                    break
    lm, d2t = info.shape("lm_head.weight"), info.shape("d2t")
    for label, readers, dv in claims("draft_vocab_size", top=True):
        if lm is not None and len(lm) == 2 and lm[0] != dv:
            out.append(Inconsistency("vocab", (
                f"{src}: field '{label}' is {dv} ({readers} read it) but lm_head.weight has {lm[0]} rows "
                f"({weights}); the draft vocabulary is the lm_head's rows."), fix))
        elif d2t is not None and d2t != (dv,):
            out.append(Inconsistency("vocab", (
                f"{src}: field '{label}' is {dv} ({readers} read it) but {weights}: tensor 'd2t' has shape {list(d2t)} "
                "(one entry per draft token)."), fix))
    t2d = info.shape("t2d")
    for label, readers, V in claims("vocab_size", geo=True):
        if t2d is not None and t2d != (V,):
            out.append(Inconsistency("vocab", (
                f"{src}: field '{label}' is {V} ({readers} read it) but {weights}: tensor 't2d' has shape {list(t2d)} "
                "(one entry per target token)."), fix))
    return out


def _block_inconsistencies(info: CheckpointInfo) -> list[Inconsistency]:
    """The top-level config fields that other tools read against the specwire block."""
    dc = info.block_config
    if not dc:
        return []
    out: list[Inconsistency] = []
    src, pre, readers, fix = info.config_path, info.layer_prefix_in_config, info.config_readers, _fix_reexport(info)

    def differ(label: str, found: Any, want: Any) -> None:
        out.append(Inconsistency("geometry", (
            f"{src}: field '{label}' is {found!r} ({readers} read it) but the specwire block (read by {READ_BY_SPECWIRE}) "
            f"says {want!r}."), fix))

    for name in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "vocab_size", "max_position_embeddings"):
        found, want = info.geo_int(name), dc.get(name)
        if found is not None and is_int(want) and found != want:
            differ(pre + name, found, want)
    for name in ("draft_vocab_size", "target_hidden_size"):
        found, want = info.top_int(name), dc.get(name)
        if found is not None and is_int(want) and found != want:
            differ(name, found, want)
    eps, want_eps = info.rms_norm_eps, dc.get("rms_norm_eps")
    if eps is not None and isinstance(want_eps, (int, float)) and not math.isclose(eps, float(want_eps), rel_tol=1e-6):
        differ(pre + "rms_norm_eps", eps, want_eps)
    rope, want_rope = info.rope, dc.get("rope_parameters")
    if rope is not None and isinstance(want_rope, dict):
        want_norm = rope_or_none({"rope_parameters": want_rope})
        if want_norm is not None and rope != want_norm:
            differ(pre + "rope_parameters", rope, want_rope)
    nbr, want_nbr = info.norm_before_residual, dc.get("norm_before_residual")
    if nbr is not None and isinstance(want_nbr, bool) and nbr != want_nbr:
        out.append(Inconsistency("norm-before-residual", (
            f"{src}: field 'norm_before_residual' is {str(nbr).lower()} ({readers} read it) but the specwire block "
            f"(read by {READ_BY_SPECWIRE}) says the draft was trained with {str(want_nbr).lower()}: the engine would add the "
            "wrong residual."), f'set "norm_before_residual": {str(want_nbr).lower()}, or ' + fix))
    return out


def find_inconsistencies(info: CheckpointInfo, num_layers: int | None = None) -> list[Inconsistency]:
    """Every copy of the ids, widths and sizes the folder holds, compared (see the module docstring)."""
    if not isinstance(info.config, dict):
        return []
    L = num_layers if num_layers is not None else info.recorded_num_layers
    return _ids_inconsistencies(info, L) + _width_inconsistencies(info) + _block_inconsistencies(info)
