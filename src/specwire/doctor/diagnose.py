"""The doctor: explain every way a draft can be fed the wrong hidden states, and find the right ones.

Owns:
- a *lenient* reader of draft checkpoints (config.json + safetensors headers, any layout: native,
  speculators `layers.0.*`, SGLang/EAGLE `midlayer.*`): the doctor must read broken checkpoints
  (missing `d2t`, a 1*H `fc`, another key layout) that the strict loaders refuse;
- the *engine view*: which hs indices, residual mode and flags a serving engine will actually use for
  a checkpoint (SGLang's +1 and its version caveat, vLLM's defaults), from `--hs-ids` or the config file
  the engine reads;
- the static checks, each a function returning `Finding`s with the evidence and the exact fix;
- the empirical wiring search (`WiringScorer`, `search_wirings`): the draft's step-0 top-1 agreement
  with the target's next token under every ordered triple of hs indices, exploiting fc's linearity;
- the offline-against-online comparison through the speculative engine;
- the all-layer states dump (`dump_states`, `load_states`) that lets the search run here for targets
  too large to run here;
- the `specwire doctor` and `specwire dump-states` commands.
Does not convert checkpoints (`formats`), decode (`engine`) or train (`train`).

The search (EAGLE-3, Li et al. 2025; fc fuses n target states): with fc = [W_1 | W_2 | W_3],
  fc(cat(h_a, h_b, h_c)) = W_1 h_a + W_2 h_b + W_3 h_c,
so P[k, i] = W_k h_i is computed once for every slot k and hs index i. Everything linear in the fused
state g is precomputed per (slot, layer) as well: hidden_norm(g) = w * g * r with the scalar
r = rsqrt(mean(g^2) + eps) (mean(g^2) from a Gram matrix of the P's), so the q/k/v projections of g
are sums of three precomputed, already-rotated tensors times r. Only attention, o_proj, the MLP and
lm_head run per candidate, and only at scored positions. Candidates are pruned by successive halving
(continuous score: log-probability of the target's token over a vocabulary subset, on a growing set
of positions), then the survivors are scored on every position, and the best few exactly (top-1 over
the full draft vocabulary). docs/DOCTOR.md has the measured time.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F

from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, read_json, safetensors_header, load_tensors, save_tensors, write_json
from specwire.wiring import (SGLANG_VERSIONS, DEFAULT_SGLANG_VERSION, TargetSpec, default_hs_ids, hs_to_sglang, parse_ids,
                     sglang_to_hs, validate_hs_ids)

log = logging.getLogger("specwire.doctor.diagnose")

ENGINES = ("sglang", "vllm")
SEVERITIES = ("error", "warning", "info")
STATES_FORMAT = "specwire-states"
STATES_FORMAT_VERSION = 1

# How each engine reads a draft (true for the versions read, FIELD-NOTES sections 1-3, 5):
#   layouts: the tensor key layouts it loads (SGLang silently skips unknown names);
#   nbr_default: norm_before_residual when the config does not say (vLLM assumes True).
ENGINE_RULES = {
    "sglang": {"layouts": ("sglang",), "nbr_default": False},
    "vllm": {"layouts": ("speculators", "sglang"), "nbr_default": True},
}

# Built-in calibration prompts: varied (chat, code, maths, lists, facts), answered greedily by the target.
CALIBRATION_PROMPTS = (
    "Explain why the sky is blue in two sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three benefits of regular exercise.",
    "What is 17 multiplied by 23? Show your steps.",
    "Translate 'good morning, my friend' into French and Spanish.",
    "Give me a short recipe for pancakes.",
    "Summarize the plot of Romeo and Juliet in one paragraph.",
    "What is the difference between a list and a tuple in Python?",
    "Write a haiku about autumn leaves.",
    "How do vaccines train the immune system?",
    "Suggest a name for a small coffee shop and explain it.",
    "Describe the water cycle for a ten-year-old.",
)


# ---- findings and the report ---------------------------------------------------------------------------

@dataclass
class Finding:
    """One diagnosis: what is wrong (with the evidence) and the exact fix, in the engine's convention."""

    id: str  # stable identifier, e.g. "wiring-mismatch", "d2t-missing"
    severity: str  # "error" | "warning" | "info"
    message: str  # what was found and the evidence
    fix: str | None = None  # the corrected config line, id list or launch flag (None when nothing to do)

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"Finding.severity must be one of {SEVERITIES}, found {self.severity!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class DoctorReport:
    """What `specwire doctor` prints; `to_dict()` is the stable `--json` object."""

    ok: bool  # no error-severity finding
    findings: list[Finding]
    wiring: dict[str, Any]  # {configured, best, trained, scores: {configured, best, trained, top: [...]}, ...}
    draft: str = ""  # the draft path as given
    target: str = ""  # the target as given
    engine: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase
    online: dict[str, Any] | None = None  # the offline-vs-online numbers when measured

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def ids(self, severity: str | None = None) -> list[str]:
        return [f.id for f in self.findings if severity is None or f.severity == severity]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "findings": [f.to_dict() for f in self.findings], "wiring": self.wiring,
                "draft": self.draft, "target": self.target, "engine": self.engine, "timings": self.timings,
                "online": self.online}


# ---- the lenient draft reader ----------------------------------------------------------------------------

@dataclass
class DraftView:
    """What a draft checkpoint says about itself, read without strict validation."""

    path: Path
    config: dict  # the raw config.json
    shapes: dict[str, tuple[int, ...]]  # tensor name -> shape, from the safetensors headers
    files: dict[str, Path]  # tensor name -> the file holding it
    layout: str  # "speculators" (layers.0.*), "sglang" (midlayer.*), "unknown"
    config_kind: str  # "native", "speculators", "sglang", "unknown"
    hidden_size: int | None
    target_hidden_size: int | None
    vocab_size: int | None  # target vocabulary the draft maps into
    draft_vocab_size: int | None
    max_position_embeddings: int | None
    rms_norm_eps: float | None
    rope: dict | None  # {"rope_type", "rope_theta", ...}
    norm_before_residual: bool | None  # as written at the top level of the config (None: absent)
    ids_written: list[int] | None  # the layer ids as written in the config
    ids_convention: str | None  # "hs" (speculators/vLLM field) or "sglang" (eagle_config)
    native: dict | None  # the `specwire` block's draft_config (the trained truth) when present

    @property
    def layer_prefix(self) -> str | None:
        return {"speculators": "layers.0.", "sglang": "midlayer."}.get(self.layout)

    @property
    def fc_shape(self) -> tuple[int, ...] | None:
        return self.shapes.get("fc.weight")

    @property
    def recorded_target(self) -> dict | None:
        if self.native:
            return (self.native.get("wiring") or {}).get("target")
        return None

    @property
    def recorded_wiring(self) -> dict | None:
        return (self.native or {}).get("wiring")

    def trained_hs(self, num_layers: int) -> tuple[list[int] | None, str]:
        """The hs ids the draft was trained on, and where that came from."""
        w = self.recorded_wiring
        if w and isinstance(w.get("hs_ids"), list):
            return [int(i) for i in w["hs_ids"]], "the specwire block of config.json (recorded at training)"
        if self.ids_written is not None:
            if self.ids_convention == "sglang":
                try:  # SGLang/SpecForge training writes layer-output ids: hs = id + 1
                    return sglang_to_hs(self.ids_written, num_layers, sglang_version="classic"), \
                        "eagle_config.eagle_aux_hidden_state_layer_ids (SpecForge convention, hs = id + 1)"
                except SpecwireError:
                    return None, "eagle_config ids out of range"
            return list(self.ids_written), "eagle_aux_hidden_state_layer_ids (hs indices)"
        return None, "no layer ids in the config"


def _first_int(d: dict, *names: str) -> int | None:
    for n in names:
        v = d.get(n)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _rope_of(d: dict) -> dict | None:
    rp = d.get("rope_parameters")
    if isinstance(rp, dict):
        return {k: v for k, v in rp.items() if v is not None}
    out = {}
    if isinstance(d.get("rope_scaling"), dict):
        out.update({k: v for k, v in d["rope_scaling"].items() if v is not None})
        if "type" in out and "rope_type" not in out:
            out["rope_type"] = out.pop("type")
    if d.get("rope_theta") is not None:
        out["rope_theta"] = d["rope_theta"]
    if out:
        out.setdefault("rope_type", "default")
    return out or None


def read_draft_view(path: str | os.PathLike) -> DraftView:
    """Read config.json and every safetensors header of a draft folder, validating only what is needed to read."""
    from specwire.draft.model import resolve_draft_path

    p = resolve_draft_path(path)
    cfg = read_json(p / "config.json", what="draft config")
    files = sorted(p.glob("*.safetensors"))
    if not files:
        raise SpecwireError(f"draft '{p}': no *.safetensors file; expected model.safetensors next to config.json.")
    shapes: dict[str, tuple[int, ...]] = {}
    where: dict[str, Path] = {}
    for f in files:
        for name, info in safetensors_header(f).items():
            if name != "__metadata__":
                shapes[name] = tuple(int(s) for s in info["shape"])
                where[name] = f
    keys = list(shapes)
    if any(k.startswith("layers.0.") for k in keys):
        layout = "speculators"
    elif any(k.startswith("midlayer.") for k in keys):
        layout = "sglang"
    else:
        layout = "unknown"
    block = cfg.get("specwire") if isinstance(cfg.get("specwire"), dict) else None
    native = block.get("draft_config") if block and isinstance(block.get("draft_config"), dict) else None
    layer = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else {}
    archs = cfg.get("architectures") or []
    eagle_cfg = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else None
    if native is not None:
        kind = "native"
    elif cfg.get("speculators_model_type") or layer:
        kind = "speculators"
    elif eagle_cfg is not None or any("Eagle3" in str(a) for a in archs):
        kind = "sglang"
    else:
        kind = "unknown"
    geo = {**cfg, **layer} if layer else cfg  # speculators keeps the geometry in transformer_layer_config
    ids, conv = None, None
    if isinstance(cfg.get("eagle_aux_hidden_state_layer_ids"), list):
        ids, conv = cfg["eagle_aux_hidden_state_layer_ids"], "hs"
    elif eagle_cfg is not None and isinstance(eagle_cfg.get("eagle_aux_hidden_state_layer_ids"), list):
        ids, conv = eagle_cfg["eagle_aux_hidden_state_layer_ids"], "sglang"
    if ids is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecwireError(f"{p / 'config.json'}: layer ids {ids!r} are not all integers.")
    nbr = cfg.get("norm_before_residual")
    if nbr is not None and not isinstance(nbr, bool):
        raise SpecwireError(f"{p / 'config.json'}: 'norm_before_residual' must be true or false, found {nbr!r}.")
    eps = geo.get("rms_norm_eps")
    return DraftView(
        path=p, config=cfg, shapes=shapes, files=where, layout=layout, config_kind=kind,
        hidden_size=_first_int(geo, "hidden_size"),
        target_hidden_size=_first_int(cfg, "target_hidden_size"),
        vocab_size=_first_int(geo, "vocab_size"),
        draft_vocab_size=_first_int(cfg, "draft_vocab_size") or _first_int(geo, "draft_vocab_size"),
        max_position_embeddings=_first_int(geo, "max_position_embeddings"),
        rms_norm_eps=float(eps) if isinstance(eps, (int, float)) and not isinstance(eps, bool) else None,
        rope=_rope_of(geo), norm_before_residual=nbr, ids_written=ids, ids_convention=conv, native=native,
    )


# ---- the target side -------------------------------------------------------------------------------------

@dataclass
class TargetView:
    """The target as the doctor sees it: always its config; its weights and tokenizer when present."""

    name: str
    info: Any  # targets.TargetInfo
    spec: TargetSpec  # fingerprint None when the weights are not loaded
    rope: dict | None
    rms_norm_eps: float | None
    tokenizer: Any = None
    loaded: Any = None  # targets.Target when the weights could be loaded

    @property
    def num_layers(self) -> int:
        return self.info.num_layers


def open_target(target, *, load: bool, device=None, dtype="float32") -> TargetView:
    """A built-in name, an HF folder (weights optional), or an already loaded `Target`."""
    from specwire.target.load import Target, load_target, read_target_config, resolve_target_path, info_from_config

    if isinstance(target, Target):
        raw = read_json(Path(target.info.path) / "config.json", what="target config")
        return TargetView(name=target.info.name, info=target.info, spec=target.spec, rope=_rope_of(_text_raw(raw)),
                          rms_norm_eps=_eps_of(_text_raw(raw)), tokenizer=target.tokenizer, loaded=target)
    path = resolve_target_path(target)
    raw = read_json(path / "config.json", what="target config")
    has_weights = any(path.glob("*.safetensors"))
    if load and has_weights:
        t = load_target(target, device=device, dtype=dtype)
        return TargetView(name=str(target), info=t.info, spec=t.spec, rope=_rope_of(_text_raw(raw)),
                          rms_norm_eps=_eps_of(_text_raw(raw)), tokenizer=t.tokenizer, loaded=t)
    info = info_from_config(read_target_config(path), name=str(target), path=str(path))
    spec = TargetSpec(architecture=info.architecture, num_layers=info.num_layers, hidden_size=info.hidden_size,
                      vocab_size=info.vocab_size, fingerprint=None)
    tok = None
    if any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
        try:
            from transformers import AutoTokenizer

            tok = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, TypeError):
            tok = None
    return TargetView(name=str(target), info=info, spec=spec, rope=_rope_of(_text_raw(raw)),
                      rms_norm_eps=_eps_of(_text_raw(raw)), tokenizer=tok, loaded=None)


def _text_raw(raw: dict) -> dict:
    return raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw


def _eps_of(d: dict) -> float | None:
    for n in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"):
        v = d.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


# ---- the engine view ----------------------------------------------------------------------------------------

@dataclass
class ServingView:
    """What the serving engine will actually do with this draft."""

    engine: str | None  # None: no engine named, the draft's own recorded wiring is "configured"
    engine_version: str | None  # SGLang id rule ("classic" or "shift-if-one"); None for vLLM
    hs_ids: list[int] | None  # hs indices the engine will fuse (None when they cannot be read)
    ids_as_written: list[int] | None  # in the engine's convention
    source: str  # where the ids came from
    norm_before_residual: bool | None  # what the engine will use
    nbr_written: bool | None  # as written in the config the engine reads
    ids_problem: str | None = None  # why hs_ids is None


def serving_view(view: DraftView, num_layers: int, *, engine: str | None, engine_version: str | None,
                 hs_ids: Sequence[int] | None, engine_config: str | os.PathLike | None) -> ServingView:
    """Translate what the engine reads into hs indices, as that engine (version) reads it."""
    if engine is not None and engine not in ENGINES:
        raise SpecwireError(f"unknown engine '{engine}'; expected one of {list(ENGINES)}.")
    if engine_version is not None and engine != "sglang":
        raise SpecwireError("--engine-version names an SGLang id rule; it needs --engine sglang.")
    version = (engine_version or DEFAULT_SGLANG_VERSION) if engine == "sglang" else None
    if version is not None and version not in SGLANG_VERSIONS:
        raise SpecwireError(f"unknown SGLang version rule '{version}'; expected one of {list(SGLANG_VERSIONS)}.")
    if hs_ids is not None and engine_config is not None:
        raise SpecwireError("give either --hs-ids or --engine-config, not both.")
    L = num_layers
    cfg_view = view
    if engine_config is not None:  # the config file the engine will read
        ec = Path(engine_config)
        cfg = read_json(ec, what="engine config")
        cfg_view = dataclasses.replace(view, config=cfg, native=None, **_ids_fields(cfg, ec))
    nbr_written = cfg_view.config.get("norm_before_residual") if isinstance(cfg_view.config.get("norm_before_residual"), bool) else None
    if engine is None:
        trained, src = view.trained_hs(L)
        nbr = nbr_written if nbr_written is not None else (view.native or {}).get("norm_before_residual")
        return ServingView(None, None, trained, trained, src, nbr, nbr_written)
    nbr = nbr_written if nbr_written is not None else ENGINE_RULES[engine]["nbr_default"]

    def translate(ids: list[int], conv: str, source: str) -> ServingView:
        try:
            if conv == "sglang":
                hs = sglang_to_hs(ids, L, sglang_version=version)
            else:
                validate_hs_ids(ids, L, what=f"ids {ids}")
                hs = list(ids)
            return ServingView(engine, version, hs, list(ids), source, nbr, nbr_written)
        except SpecwireError as e:
            return ServingView(engine, version, None, list(ids), source, nbr, nbr_written, ids_problem=str(e))

    if hs_ids is not None:
        conv = "sglang" if engine == "sglang" else "hs"
        return translate([int(i) for i in hs_ids], conv, f"--hs-ids (in {engine}'s convention)")
    where = "--engine-config" if engine_config is not None else "the draft's config.json"
    if engine == "sglang":
        if cfg_view.ids_convention == "sglang":
            return translate(list(cfg_view.ids_written), "sglang", f"eagle_config.eagle_aux_hidden_state_layer_ids in {where}")
        # SGLang reads only eagle_config; without it it captures its default hs [2, L//2, L-3]
        d = list(default_hs_ids(L))
        return ServingView(engine, version, d, hs_to_sglang(d, L),
                           f"SGLang's default (no eagle_config in {where})", nbr, nbr_written)
    # vLLM: eagle_aux_hidden_state_layer_ids (hs), or eagle_config's ids read without SGLang's +1
    if cfg_view.ids_written is not None:
        field_name = "eagle_aux_hidden_state_layer_ids" if cfg_view.ids_convention == "hs" else \
            "eagle_config.eagle_aux_hidden_state_layer_ids (read by vLLM as hs indices, no +1)"
        return translate(list(cfg_view.ids_written), "hs", f"{field_name} in {where}")
    d = list(default_hs_ids(L))
    return ServingView(engine, None, d, d, f"vLLM's default (no layer ids in {where})", nbr, nbr_written)


def _ids_fields(cfg: dict, path: Path) -> dict:
    ids, conv = None, None
    eagle_cfg = cfg.get("eagle_config") if isinstance(cfg.get("eagle_config"), dict) else None
    if isinstance(cfg.get("eagle_aux_hidden_state_layer_ids"), list):
        ids, conv = cfg["eagle_aux_hidden_state_layer_ids"], "hs"
    elif eagle_cfg is not None and isinstance(eagle_cfg.get("eagle_aux_hidden_state_layer_ids"), list):
        ids, conv = eagle_cfg["eagle_aux_hidden_state_layer_ids"], "sglang"
    if ids is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise SpecwireError(f"{path}: layer ids {ids!r} are not all integers.")
    nbr = cfg.get("norm_before_residual")
    return {"ids_written": ids, "ids_convention": conv, "norm_before_residual": nbr if isinstance(nbr, bool) else None}


def ids_fix(hs: Sequence[int], num_layers: int, engine: str | None) -> str:
    """The config line that makes `engine` fuse hs indices `hs`, in that engine's convention."""
    hs = [int(i) for i in hs]
    if engine == "sglang":
        ids = hs_to_sglang(hs, num_layers)
        line = f'"eagle_config": {{"eagle_aux_hidden_state_layer_ids": {ids}}}'
        same = _sglang_same_on_all_versions(ids, hs, num_layers)
        if not same:
            line += (f" (SGLang with the classic +1 rule; SGLang versions that add 1 only when the first id is 1 "
                     f"read these as hs {_sglang_read(ids, num_layers, 'shift-if-one')})")
        return line
    return f'"eagle_aux_hidden_state_layer_ids": {hs}'


def _sglang_read(ids, L, version):
    try:
        return sglang_to_hs(ids, L, sglang_version=version)
    except SpecwireError:
        return "out of range"


def _sglang_same_on_all_versions(ids, hs, L) -> bool:
    return all(_sglang_read(ids, L, v) == list(hs) for v in SGLANG_VERSIONS)


def classify_wiring(trained: Sequence[int], served: Sequence[int], num_layers: int) -> str:
    """Name the mix-up between the trained and the served hs ids."""
    t, s = list(trained), list(served)
    if t == s:
        return "match"
    if sorted(t) == sorted(s):
        return "permutation"
    if s == [i + 1 for i in t]:
        return "shift-plus-one"  # SGLang's +1 applied on ids that were already hs indices
    if s == [i - 1 for i in t]:
        return "shift-minus-one"  # the +1 not applied (SpecForge ids read as hs indices)
    if s[0] == 0 and s[1:] == t[:-1]:
        return "embedding-first"  # the incident: embeddings prepended, the last trained state dropped
    if t[0] == 0 and t[1:] == s[:-1]:
        return "embedding-dropped"  # trained with embeddings first, served without them
    return "different"


_KIND_TEXT = {
    "permutation": "the same layers in another order (fc's weights are tied to the order)",
    "shift-plus-one": "every id one layer too deep: SGLang's +1 applied to ids that already were hs indices (+1 twice)",
    "shift-minus-one": "every id one layer too shallow: SpecForge/SGLang layer-output ids read as hs indices (+1 not applied)",
    "embedding-first": "the embedding output put first and the trained list shifted one slot right "
                       "(the incident: [-1, 2, 30] fed to a draft trained on [2, 30, 58])",
    "embedding-dropped": "the draft was trained with the embedding output first, the engine feeds layer outputs only "
                         "(the incident's mirror image)",
    "different": "a different set of layers",
}


# ---- static checks ---------------------------------------------------------------------------------------------

def check_format(view: DraftView, engine: str | None) -> list[Finding]:
    out = []
    d = str(view.path)
    if view.layout == "unknown":
        out.append(Finding("format-unknown", "error",
                           f"{d}: no `layers.0.*` (speculators) nor `midlayer.*` (SGLang/EAGLE) tensors; keys: {sorted(view.shapes)[:8]}.",
                           "export the draft again from its training run (`specwire export D --format sglang|speculators`)."))
        return out
    if engine is not None and view.layout not in ENGINE_RULES[engine]["layouts"]:
        out.append(Finding(
            "format-layout", "error",
            f"{d} uses the {view.layout} key layout ({view.layer_prefix}*) but {engine} loads "
            f"{'/'.join(ENGINE_RULES[engine]['layouts'])} layouts; SGLang silently skips `layers.0.*` names and serves "
            "a randomly initialised layer, with no error.",
            f"specwire export {d} --format {engine if engine == 'sglang' else 'speculators'} --out {d}-{engine}"))
    if engine == "sglang" and view.layout == "sglang" and view.ids_convention != "sglang":
        out.append(Finding("format-config", "warning",
                           f"{d}: SGLang tensor names with a speculators config (no eagle_config): SGLang will use its default ids.",
                           f"specwire export {d} --format sglang --out {d}-sglang"))
    return out


def check_widths(view: DraftView, tv: TargetView) -> list[Finding]:
    out = []
    H = tv.info.hidden_size
    Hd = view.hidden_size or H
    fc = view.fc_shape
    if fc is None:
        out.append(Finding("fc-missing", "error", f"{view.path}: no fc.weight; the draft cannot fuse target states.",
                           "export the draft again from its training run."))
    elif len(fc) != 2 or fc[0] != Hd:
        out.append(Finding("fc-width", "error", f"fc.weight has shape {list(fc)}, expected [{Hd}, 3*{H}].",
                           "export the draft again from its training run."))
    elif fc[1] == H:
        out.append(Finding(
            "fc-bypassed", "error",
            f"fc.weight is [{fc[0]}, {fc[1]}]: a 1*H input. Engines apply fc only when the incoming width differs from "
            f"H ({Hd}), so the target's states would skip fc silently; EAGLE-3 fuses 3 states: [{Hd}, {3 * H}].",
            f"train the draft with 3 fused states (fc.weight [{Hd}, {3 * H}]), e.g. `specwire datagen --hs-ids "
            f"{','.join(map(str, default_hs_ids(tv.num_layers)))}` then `specwire train`."))
    elif fc[1] % H:
        out.append(Finding("fc-width", "error",
                           f"fc.weight input width {fc[1]} is not a multiple of the target hidden size {H}: "
                           "the draft was built for another target.", "pair the draft with the target it was trained on."))
    elif fc[1] // H != 3:
        out.append(Finding("fc-width", "warning", f"fc fuses {fc[1] // H} states (width {fc[1]}), EAGLE-3 engines expect 3.",
                           None))
    pre = view.layer_prefix
    if pre:
        for name in ("q_proj", "k_proj", "v_proj"):
            s = view.shapes.get(f"{pre}self_attn.{name}.weight")
            if s is None:
                out.append(Finding("qkv-missing", "error", f"{pre}self_attn.{name}.weight is missing.",
                                   "export the draft again from its training run."))
            elif s[1] != 2 * Hd:
                out.append(Finding("qkv-width", "error",
                                   f"{pre}self_attn.{name}.weight has input width {s[1]}, expected 2*H = {2 * Hd} "
                                   "(cat(input_layernorm(embeds), hidden_norm(h))): this is a plain Llama layer, not EAGLE-3.",
                                   "train an EAGLE-3 draft (`specwire train`)."))
    return out


def check_vocab(view: DraftView, tv: TargetView, engine: str | None) -> list[Finding]:
    out = []
    V = tv.info.vocab_size
    lm = view.shapes.get("lm_head.weight")
    Vd = view.draft_vocab_size
    if lm is None:
        out.append(Finding("lm-head-missing", "error", "lm_head.weight is missing.", "export the draft again."))
    elif Vd is not None and lm[0] != Vd:
        out.append(Finding("lm-head-rows", "error",
                           f"lm_head.weight has {lm[0]} rows but draft_vocab_size is {Vd}.",
                           f'"draft_vocab_size": {lm[0]}'))
    rows = lm[0] if lm is not None else Vd
    has_d2t, has_t2d = "d2t" in view.shapes, "t2d" in view.shapes
    if rows is not None and rows < V and not has_d2t:
        sev = "error"
        what = ("SGLang's loader may crash on it" if engine == "sglang" else
                "vLLM treats a missing d2t as a shared vocabulary: draft id i is read as target id i")
        out.append(Finding("d2t-missing", sev,
                           f"no d2t tensor, yet the draft predicts {rows} ids out of the target's {V}: {what}; "
                           "every proposed token would be the wrong one.",
                           "add d2t (int64 [draft_vocab_size], target id = i + d2t[i]) and t2d (bool [vocab]) from the "
                           "training run's vocab map (`specwire.draft.vocab.build_vocab_map` over the dump's vocab_counts), "
                           "or export again from the training run."))
    if has_d2t and not has_t2d:
        out.append(Finding("t2d-missing", "warning", "d2t present but no t2d mask.", "add t2d (bool [vocab]) = the target ids d2t maps to."))
    if has_d2t:
        if view.shapes["d2t"] != (rows,):
            out.append(Finding("d2t-invalid", "error", f"d2t has shape {list(view.shapes['d2t'])}, expected [{rows}].",
                               "rebuild the vocab map from the training data."))
        else:
            try:
                t = load_tensors(view.files["d2t"])
                d2t = t["d2t"].long()
                t2d = t["t2d"].bool() if "t2d" in t else load_tensors(view.files["t2d"])["t2d"].bool() if has_t2d else None
                if t2d is not None:
                    from specwire.draft.model import check_vocab_map

                    check_vocab_map(d2t, t2d, vocab_size=V, source="d2t/t2d")
                else:
                    ids = torch.arange(len(d2t)) + d2t
                    if ids.min() < 0 or ids.max() >= V or len(torch.unique(ids)) != len(ids):
                        raise SpecwireError("d2t maps outside the target vocabulary or twice to one id.")
            except SpecwireError as e:
                out.append(Finding("d2t-invalid", "error", str(e), "rebuild the vocab map from the training data."))
    if view.vocab_size is not None and view.vocab_size != V:
        out.append(Finding("vocab-size", "error", f"the draft maps into a {view.vocab_size}-token vocabulary, the target has {V}.",
                           "pair the draft with the target it was trained on."))
    return out


def check_positions_rope_norm(view: DraftView, tv: TargetView) -> list[Finding]:
    out = []
    tmax = tv.info.max_position_embeddings
    dmax = view.max_position_embeddings
    if tmax and dmax and dmax < tmax:
        out.append(Finding("max-positions", "error",
                           f"max_position_embeddings {dmax} < the target's {tmax}: positions past {dmax} break the draft "
                           "(near-zero acceptance on long prompts, as in a SpecForge report).",
                           f'"max_position_embeddings": {tmax}'))
    if view.rope and tv.rope:
        dt, tt = view.rope.get("rope_type", "default"), tv.rope.get("rope_type", "default")
        dth, tth = view.rope.get("rope_theta"), tv.rope.get("rope_theta")
        if dt != tt or (dth is not None and tth is not None and not math.isclose(float(dth), float(tth), rel_tol=1e-6)):
            out.append(Finding("rope", "warning",
                               f"draft rope {view.rope} differs from the target's {tv.rope}; fine only if the draft was trained so.",
                               f'"rope_parameters": {json.dumps(tv.rope)}'))
    if view.rms_norm_eps and tv.rms_norm_eps and not math.isclose(view.rms_norm_eps, tv.rms_norm_eps, rel_tol=1e-3):
        out.append(Finding("norm-eps", "warning",
                           f"draft rms_norm_eps {view.rms_norm_eps:g} differs from the target's {tv.rms_norm_eps:g}.",
                           f'"rms_norm_eps": {tv.rms_norm_eps:g}'))
    return out


def check_norm_before_residual(view: DraftView, sv: ServingView) -> list[Finding]:
    out = []
    trained = (view.native or {}).get("norm_before_residual")
    if view.norm_before_residual is None and sv.nbr_written is None:
        sev = "error" if sv.engine == "vllm" and trained is False else "warning"
        assumed = ENGINE_RULES[sv.engine]["nbr_default"] if sv.engine else "engine-dependent"
        val = "false" if trained is not True else "true"
        out.append(Finding("norm-before-residual-missing", sev,
                           f"norm_before_residual is not written in the config; {sv.engine or 'the engine'} assumes "
                           f"{assumed}{'' if trained is None else f', the draft was trained with {str(trained).lower()}'} "
                           "(vLLM assumes true when the field is missing).",
                           f'"norm_before_residual": {val}'))
    elif trained is not None and sv.norm_before_residual is not None and sv.norm_before_residual != trained:
        out.append(Finding("norm-before-residual-mismatch", "error",
                           f"norm_before_residual is {str(sv.norm_before_residual).lower()} in the config the engine reads, "
                           f"but the draft was trained with {str(trained).lower()} (recorded in its specwire block): the "
                           "draft layer's residual is the wrong tensor.",
                           f'"norm_before_residual": {str(trained).lower()}'))
    return out


def check_target_identity(view: DraftView, tv: TargetView) -> list[Finding]:
    out = []
    rec = view.recorded_target
    if not rec:
        th = view.target_hidden_size
        if th is not None and th != tv.info.hidden_size:
            out.append(Finding("target-shape", "error",
                               f"target_hidden_size {th} differs from the target's hidden size {tv.info.hidden_size}.",
                               "pair the draft with the target it was trained on."))
        out.append(Finding("target-unrecorded", "info",
                           "the draft records no target fingerprint (not a specwire checkpoint): identity not checked.", None))
        return out
    diffs = [f"{k}: trained for {rec.get(k)}, target has {getattr(tv.spec, k)}"
             for k in ("architecture", "num_layers", "hidden_size", "vocab_size") if rec.get(k) != getattr(tv.spec, k)]
    if diffs:
        out.append(Finding("target-shape", "error", "the draft was trained for another model: " + "; ".join(diffs) + ".",
                           "use the target the draft was trained on, or train a draft for this target."))
    fp, found = rec.get("fingerprint"), tv.spec.fingerprint
    if fp and found and fp != found:
        out.append(Finding("target-fingerprint", "error",
                           f"target fingerprint: the draft was trained on {fp}, target '{tv.name}' is {found} "
                           "(same shapes, other weights: another checkpoint or fine-tune of the model).",
                           "serve the draft with the exact target it was trained on, or retrain it on this one "
                           "(`specwire datagen --target T` + `specwire train`)."))
    elif fp and not found:
        out.append(Finding("target-fingerprint-unchecked", "info",
                           f"target weights not loaded (config-only target): fingerprint {fp} not compared; "
                           "architecture, layers, hidden size and vocab agree." if not diffs else
                           f"target weights not loaded: fingerprint {fp} not compared.", None))
    return out


def check_tokenizer(view: DraftView, tv: TargetView, data_manifest: dict | None) -> list[Finding]:
    out = []
    if tv.tokenizer is None:
        return out
    from specwire.target.load import chat_template_hash, tokenizer_fingerprint

    tok_fp, chat = tokenizer_fingerprint(tv.tokenizer), chat_template_hash(tv.tokenizer)
    sources = []
    if view.recorded_wiring:
        sources.append(("the draft's recorded training data", view.recorded_wiring))
    if data_manifest is not None:
        sources.append(("--data manifest", data_manifest.get("wiring") or {}))
    for where, w in sources:
        if w.get("tokenizer_fingerprint") and w["tokenizer_fingerprint"] != tok_fp:
            out.append(Finding("data-tokenizer", "error",
                               f"{where}: tokenizer fingerprint {w['tokenizer_fingerprint']}, the target's tokenizer is {tok_fp}: "
                               "the training text was tokenized for another model.",
                               "regenerate the data with this target's tokenizer (`specwire datagen --target T`) and retrain."))
        if w.get("chat_template_hash") and chat and w["chat_template_hash"] != chat:
            out.append(Finding("data-chat-template", "error",
                               f"{where}: chat template hash {w['chat_template_hash']}, the target's is {chat}: "
                               "training conversations were formatted differently from what is served (e.g. a thinking "
                               "template vs a non-thinking one).",
                               "regenerate the data with the target's own chat template and retrain."))
    return out


def check_ids(view: DraftView, sv: ServingView, tv: TargetView, trained: list[int] | None, trained_src: str) -> list[Finding]:
    out = []
    L = tv.num_layers
    if sv.hs_ids is None and sv.ids_problem:
        fix = ids_fix(trained, L, sv.engine) if trained else None
        out.append(Finding("ids-out-of-range", "error",
                           f"{sv.source}: {sv.ids_problem} (on GPT-OSS such a shift crashed with a width error).", fix))
        return out
    if trained is None:
        out.append(Finding("trained-wiring-unknown", "warning",
                           f"the draft does not say which hidden states it was trained on ({trained_src}); "
                           "the wiring search below is the evidence.", None))
        return out
    try:
        validate_hs_ids(trained, L, what=f"trained ids ({trained_src})")
    except SpecwireError as e:
        out.append(Finding("trained-ids-invalid", "error", str(e), "pair the draft with the target it was trained on."))
        return out
    if sv.engine is None or sv.hs_ids is None:
        return out
    kind = classify_wiring(trained, sv.hs_ids, L)
    if kind != "match":
        conv = ""
        if sv.engine == "sglang":
            conv = f" (SGLang ids {sv.ids_as_written}, read by the {sv.engine_version} rule)"
        out.append(Finding(f"wiring-{kind}" if kind != "different" else "wiring-mismatch", "error",
                           f"{sv.engine} will fuse hs {sv.hs_ids}{conv} from {sv.source}, but the draft was trained on "
                           f"hs {trained} ({trained_src}): {_KIND_TEXT[kind]}.",
                           ids_fix(trained, L, sv.engine)))
    if sv.engine == "sglang":
        ids = hs_to_sglang(trained, L)
        if not _sglang_same_on_all_versions(ids, trained, L):
            alt = _sglang_read(ids, L, "shift-if-one")
            out.append(Finding("sglang-version", "warning",
                               f"SGLang ids {ids} mean hs {trained} under the classic +1 rule but hs {alt} on SGLang versions "
                               "that add 1 only when the first id is 1: the same config is two wirings on two versions.",
                               f"pin an SGLang version with the classic rule, or check with `specwire doctor D --engine sglang "
                               f"--engine-version shift-if-one`."))
        if 0 in trained:
            out.append(Finding("sglang-embedding", "error",
                               f"the draft fuses the embedding output (hs 0 = SGLang id -1); stock SGLang cannot capture it.",
                               "serve on vLLM, or retrain on layer outputs only (e.g. the default "
                               f"hs {list(default_hs_ids(L))})."))
    return out


def check_spec_flags(engine: str | None, num_steps: int | None, topk: int | None, num_draft_tokens: int | None,
                     max_draft_tokens: int | None = None) -> list[Finding]:
    out = []
    if topk == 1 and num_steps is not None and num_draft_tokens is not None and num_draft_tokens != num_steps + 1:
        out.append(Finding("spec-topk1-draft-tokens", "error",
                           f"--speculative-eagle-topk 1 with --speculative-num-draft-tokens {num_draft_tokens}: with topk 1 "
                           f"SGLang overrides num-draft-tokens to num-steps + 1 = {num_steps + 1} with only a warning.",
                           f"--speculative-num-draft-tokens {num_steps + 1}"))
    if topk and num_steps and num_draft_tokens and topk > 1:
        cap = 1 + sum(topk ** d for d in range(1, num_steps + 1))
        if num_draft_tokens > cap:
            out.append(Finding("spec-draft-tokens-cap", "error",
                               f"--speculative-num-draft-tokens {num_draft_tokens} exceeds what a depth-{num_steps}, "
                               f"topk-{topk} tree holds ({cap}).", f"--speculative-num-draft-tokens {cap}"))
    return out


# ---- calibration data: all L+1 states of some text ----------------------------------------------------------

@dataclass
class Calibration:
    """Target states of calibration text at every hs index, samples concatenated (the search's input).

    Sample s spans [offsets[s], offsets[s+1]). Position j holds token input_ids[j]; labels[j] is the
    target's greedy prediction of token j+1; score_mask[j] says whether that prediction is scored.
    """

    states: torch.Tensor  # [L+1, N, H_t]
    embeds: torch.Tensor  # [N, H] the target's input embedding of each token (what the draft embeds)
    input_ids: torch.Tensor  # [N] int64
    labels: torch.Tensor  # [N] int64
    score_mask: torch.Tensor  # [N] bool
    offsets: list[int]
    source: str = "built-in"

    @property
    def num_layers(self) -> int:
        return self.states.shape[0] - 1

    def draft_positions(self) -> "DraftPositions":
        """Step-0 inputs: at draft position t of a sample: g from states[:, t], embed(x_{t+1}), label of t+1."""
        rows, pos, sample = [], [], []
        for s in range(len(self.offsets) - 1):
            o, e = self.offsets[s], self.offsets[s + 1]
            for t in range(e - o - 1):
                rows.append(o + t)
                pos.append(t)
                sample.append(s)
        rows_t = torch.tensor(rows, dtype=torch.long)
        return DraftPositions(rows=rows_t, local=torch.tensor(pos, dtype=torch.long), sample=torch.tensor(sample),
                              labels=self.labels[rows_t + 1], scored=self.score_mask[rows_t + 1])


@dataclass
class DraftPositions:
    rows: torch.Tensor  # [Nd] calibration row of the hidden state (position t)
    local: torch.Tensor  # [Nd] position within the sample (rope position)
    sample: torch.Tensor  # [Nd] sample index
    labels: torch.Tensor  # [Nd] target id the draft should predict (target's greedy token at t+1)
    scored: torch.Tensor  # [Nd] bool


def _greedy_continuations(target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Prompt + the target's greedy continuation, batched with left padding (HF generate)."""
    tok = target.tokenizer
    pad = (tok.pad_token_id if tok is not None and tok.pad_token_id is not None else target.eos_token_ids[0])
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), n), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, n - len(p):] = torch.tensor(p)
        mask[i, n - len(p):] = 1
    with torch.no_grad():
        out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                    max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad,
                                    eos_token_id=target.eos_token_ids)
    seqs = []
    eos = set(target.eos_token_ids)
    for i, p in enumerate(prompts):
        gen = out[i, n:].tolist()
        cut = []
        for t in gen:
            cut.append(t)
            if t in eos:
                break
        seqs.append(list(p) + cut)
    return seqs


@torch.no_grad()
def capture_all_layers(target, sequences: list[list[int]], score_from: list[int], *, source: str,
                       loss_masks: list[list[int]] | None = None) -> Calibration:
    """One pass per sample with hooks on every hs index 0..L; labels = the target's argmax."""
    from specwire.target.capture import capture_hidden_states

    L = target.num_layers
    states, embeds, ids_all, labels, masks, offsets = [], [], [], [], [], [0]
    for k, seq in enumerate(sequences):
        ids = torch.tensor([seq], device=target.device)
        cap = capture_hidden_states(target.model, ids, list(range(L + 1)), with_logits=True, parts=target.parts)
        states.append(cap.states[:, 0].float())
        embeds.append(target.parts.embed(ids)[0].float())
        ids_all.append(ids[0])
        labels.append(cap.logits[0].argmax(-1))
        if loss_masks is not None:
            m = torch.tensor(loss_masks[k], dtype=torch.bool, device=target.device)
            # label j predicts token j+1: scored when token j+1 is an assistant token
            m = torch.cat([m[1:], m[-1:]])
        else:
            m = torch.zeros(len(seq), dtype=torch.bool, device=target.device)
            m[max(0, score_from[k] - 1):] = True
        masks.append(m)
        offsets.append(offsets[-1] + len(seq))
    return Calibration(states=torch.cat(states, 1), embeds=torch.cat(embeds), input_ids=torch.cat(ids_all),
                       labels=torch.cat(labels), score_mask=torch.cat(masks), offsets=offsets, source=source)


def builtin_calibration(target, *, num_prompts: int = 12, max_new_tokens: int = 40) -> Calibration:
    """The built-in prompts in the target's chat template plus their greedy continuations; scored on the continuation."""
    prompts = [target.encode_chat(p) for p in CALIBRATION_PROMPTS[:num_prompts]]
    seqs = _greedy_continuations(target, prompts, max_new_tokens)
    return capture_all_layers(target, seqs, [len(p) for p in prompts], source=f"built-in ({len(prompts)} prompts)")


def data_calibration(target, data_dir: str | os.PathLike, *, max_samples: int = 12, max_tokens: int = 160) -> Calibration:
    """Conversations of a datagen dump (`conversations.jsonl`), scored on assistant tokens."""
    from specwire.data.dump import read_conversations

    recs = read_conversations(Path(data_dir) / "conversations.jsonl")[:max_samples]
    if not recs:
        raise SpecwireError(f"{data_dir}/conversations.jsonl has no conversations to calibrate on.")
    seqs = [r["input_ids"][:max_tokens] for r in recs]
    masks = [r["loss_mask"][:max_tokens] for r in recs]
    return capture_all_layers(target, seqs, [0] * len(seqs), source=f"--data {data_dir} ({len(seqs)} conversations)",
                              loss_masks=masks)


def data_prompts(data_dir: str | os.PathLike, *, limit: int = 3) -> list[list[int]]:
    """The prompt part (tokens before the first assistant token) of a dump's first conversations."""
    from specwire.data.dump import read_conversations

    out = []
    for r in read_conversations(Path(data_dir) / "conversations.jsonl")[:limit]:
        first = next((j for j, m in enumerate(r["loss_mask"]) if m), len(r["loss_mask"]))
        if first > 0:
            out.append(list(r["input_ids"][:first]))
    return out


# ---- the all-layer states dump (for targets too large to run here) -------------------------------------------

def _encode_prompt(target, p) -> list[int]:
    """A PromptRecord or a string (chat template applied), or a list of token ids (taken as is)."""
    if hasattr(p, "messages"):
        return target.encode_chat(list(p.messages))
    if isinstance(p, str):
        return target.encode_chat(p)
    return [int(i) for i in p]


def dump_states(target, prompts, out: str | os.PathLike, *, max_new_tokens: int = 40, dtype: str = "float32",
                target_name: str | None = None) -> Path:
    """Write every hs index of the target on calibration text, so the search can run elsewhere (docs/DOCTOR.md)."""
    from specwire.target.load import chat_template_hash, tokenizer_fingerprint

    enc = [_encode_prompt(target, p) for p in prompts]
    seqs = _greedy_continuations(target, enc, max_new_tokens) if max_new_tokens > 0 else enc
    cal = capture_all_layers(target, seqs, [len(p) for p in enc], source="dump-states")
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if dt is None:
        raise SpecwireError(f"dump-states --dtype {dtype}: expected float32 or bfloat16.")
    out = Path(out)
    samples = []
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for s in range(len(cal.offsets) - 1):
            o, e = cal.offsets[s], cal.offsets[s + 1]
            name = f"states-{s:05d}.safetensors"
            save_tensors(tmp / name, {
                "states": cal.states[:, o:e].to(dt), "embeds": cal.embeds[o:e].to(dt),
                "input_ids": cal.input_ids[o:e].long(), "labels": cal.labels[o:e].long(),
                "score_mask": cal.score_mask[o:e].to(torch.uint8)})
            samples.append({"file": name, "tokens": e - o, "prompt_tokens": len(enc[s])})
        manifest = {
            "format": STATES_FORMAT, "format_version": STATES_FORMAT_VERSION,
            "target": {"name": target_name or target.info.name, **target.spec.to_dict(),
                       "max_position_embeddings": target.info.max_position_embeddings},
            "tokenizer_fingerprint": tokenizer_fingerprint(target.tokenizer) if target.tokenizer is not None else None,
            "chat_template_hash": chat_template_hash(target.tokenizer) if target.tokenizer is not None else None,
            "dtype": dtype, "num_hs": target.num_layers + 1, "samples": samples,
            "options": {"max_new_tokens": max_new_tokens}, "complete": True,
        }
        write_json(tmp / "manifest.json", manifest)
    return out


def load_states(path: str | os.PathLike, tv: TargetView) -> tuple[Calibration, dict]:
    """Read a states dump, refusing one captured on another target."""
    path = Path(path)
    m = read_json(path / "manifest.json", what="states dump manifest")
    if m.get("format") != STATES_FORMAT or m.get("format_version") != STATES_FORMAT_VERSION:
        raise SpecwireError(f"{path / 'manifest.json'}: format {m.get('format')!r} v{m.get('format_version')!r}, "
                            f"expected {STATES_FORMAT!r} v{STATES_FORMAT_VERSION} (written by `specwire dump-states`).")
    if not m.get("complete"):
        raise SpecwireError(f"{path}: the states dump is incomplete; rerun `specwire dump-states`.")
    t = m.get("target") or {}
    for k in ("num_layers", "hidden_size", "vocab_size", "architecture"):
        if t.get(k) != getattr(tv.spec, k):
            raise SpecwireError(f"{path / 'manifest.json'}: target.{k} is {t.get(k)!r}, the target given has "
                                f"{getattr(tv.spec, k)!r}: the states were captured on another model.",
                                fix="pass the target the dump was made from, or dump it again.")
    if tv.spec.fingerprint and t.get("fingerprint") and t["fingerprint"] != tv.spec.fingerprint:
        raise SpecwireError(f"{path}: captured on target fingerprint {t['fingerprint']}, the target given is {tv.spec.fingerprint}.")
    L, H = tv.num_layers, tv.info.hidden_size
    states, embeds, ids, labels, masks, offsets = [], [], [], [], [], [0]
    for s in m.get("samples") or []:
        f = path / str(s.get("file"))
        d = load_tensors(f)
        want = {"states", "embeds", "input_ids", "labels", "score_mask"}
        if set(d) != want:
            raise SpecwireError(f"{f}: tensors {sorted(d)}, expected {sorted(want)}.")
        T = d["input_ids"].shape[0]
        shapes = {"states": (L + 1, T, H), "embeds": (T, H), "labels": (T,), "score_mask": (T,)}
        for k, sh in shapes.items():
            if tuple(d[k].shape) != sh:
                raise SpecwireError(f"{f}: '{k}' has shape {tuple(d[k].shape)}, expected {sh} (L+1={L + 1}, H={H}).")
        states.append(d["states"].float())
        embeds.append(d["embeds"].float())
        ids.append(d["input_ids"].long())
        labels.append(d["labels"].long())
        masks.append(d["score_mask"].bool())
        offsets.append(offsets[-1] + T)
    if not states:
        raise SpecwireError(f"{path / 'manifest.json'}: no samples listed.")
    cal = Calibration(torch.cat(states, 1), torch.cat(embeds), torch.cat(ids), torch.cat(labels), torch.cat(masks),
                      offsets, source=f"--states {path} ({len(states)} samples)")
    return cal, m


# ---- the wiring search ----------------------------------------------------------------------------------------------

@dataclass
class SearchResult:
    """Step-0 top-1 agreement of the draft with the target's next token, per candidate wiring."""

    best: list[int]
    best_score: float
    scores: dict[tuple[int, ...], float]  # exact scores (full draft vocabulary) of the finalists
    top: list[tuple[list[int], float]]  # best first
    num_candidates: int
    num_positions: int  # scored positions in the final stage
    seconds: float
    stages: list[dict]  # per stage: candidates, positions, seconds


class WiringScorer:
    """Scores candidate wirings of one draft on one calibration set, reusing everything linear in g."""

    FLOATS_PER_CHUNK = 2 ** 24  # bound on the floats one batch of candidates allocates per tensor (~64 MB)

    def __init__(self, draft, cal: Calibration, *, vocab_subset: int = 512, norm_before_residual: bool | None = None):
        from specwire.draft.model import rotate_half

        self.draft = draft
        c = draft.config
        self.dev = draft.fc.weight.device
        self.n_slots = c.num_fused
        self.L = cal.num_layers
        self.nbr = c.norm_before_residual if norm_before_residual is None else norm_before_residual
        Ht, Hd = c.target_hidden_size, c.hidden_size
        if cal.states.shape[-1] != Ht:
            raise SpecwireError(f"calibration states have width {cal.states.shape[-1]}, the draft's fc reads {Ht}.")
        layer = draft.layers[0]
        attn = layer.self_attn
        self.nh, self.nkv, self.d = attn.nh, attn.nkv, attn.d
        self.eps = layer.hidden_norm.eps
        self.Hd = Hd
        pos = cal.draft_positions()
        self.pos = pos
        n_u = self.n_slots * (self.L + 1)  # one "unit" per (slot, hs index)
        with torch.no_grad():
            W = draft.fc.weight.float()  # shape: [Hd, n_slots * Ht]
            hs = cal.states[:, pos.rows].to(self.dev).float()  # shape: [L+1, Nd, Ht]
            P = torch.stack([hs @ W[:, k * Ht:(k + 1) * Ht].T for k in range(self.n_slots)])  # [n, L+1, Nd, Hd]
            self.P = P.reshape(n_u, -1, Hd)  # shape: [U, Nd, Hd]
            # Gram of the units per position: mean(g^2) of any candidate is a sum of 9 entries
            U = n_u
            self.G = torch.einsum("upd,vpd->uvp", self.P, self.P).reshape(U * U, -1)  # shape: [U*U, Nd]
            w_hn = layer.hidden_norm.weight.float()
            Wq, Wk, Wv = attn.q_proj.weight.float(), attn.k_proj.weight.float(), attn.v_proj.weight.float()
            e = layer.input_layernorm(cal.embeds[pos.rows + 1].to(self.dev).float())  # shape: [Nd, Hd]
            cos, sin = draft.rope(pos.local.to(self.dev)[None], e)  # each [1, Nd, d]
            cos, sin = cos[0], sin[0]

            def rope(x, heads):  # x [..., Nd, heads*d] -> rotated, same shape
                s = x.shape
                x = x.reshape(*s[:-1], heads, self.d)
                x = x * cos[:, None] + rotate_half(x) * sin[:, None]
                return x.reshape(s)

            def bias(m):
                return m.bias.float() if m.bias is not None else 0.0

            Ph = self.P * w_hn  # hidden_norm(g) = w * g * r, the r applied per candidate
            self.Qh = rope(Ph @ Wq[:, Hd:].T, self.nh)  # shape: [U, Nd, nh*d]
            # keys and values side by side, so one gather per slot serves both
            self.KVh = torch.cat([rope(Ph @ Wk[:, Hd:].T, self.nkv), Ph @ Wv[:, Hd:].T], -1)  # shape: [U, Nd, 2*nkv*d]
            self.Qe = rope(e @ Wq[:, :Hd].T + bias(attn.q_proj), self.nh)  # shape: [Nd, nh*d]
            self.KVe = torch.cat([rope(e @ Wk[:, :Hd].T + bias(attn.k_proj), self.nkv),
                                  e @ Wv[:, :Hd].T + bias(attn.v_proj)], -1)  # shape: [Nd, 2*nkv*d]
            self.w_hn = w_hn
        # vocabulary: draft ids and the target ids they stand for
        self.d2t = draft.d2t.to(self.dev)
        Vd = len(self.d2t)
        draft_target = torch.arange(Vd, device=self.dev) + self.d2t  # shape: [Vd]
        t2draft = torch.full((int(draft.t2d.numel()),), -1, dtype=torch.long, device=self.dev)
        t2draft[draft_target] = torch.arange(Vd, device=self.dev)
        self.labels = pos.labels.to(self.dev)
        self.label_draft = t2draft[self.labels.clamp(0, len(t2draft) - 1)]  # -1: not in the draft vocab
        self.scored = pos.scored.to(self.dev)
        # the subset used for cheap scoring: every label's draft id, then evenly spread others
        need = torch.unique(self.label_draft[self.scored & (self.label_draft >= 0)])
        extra = torch.linspace(0, Vd - 1, steps=min(Vd, max(vocab_subset, len(need))), device=self.dev).long()
        self.subset = torch.unique(torch.cat([need, extra]))[: max(vocab_subset, len(need))]
        self.subset = torch.unique(torch.cat([need, self.subset]))
        pos_in_subset = torch.full((Vd,), -1, dtype=torch.long, device=self.dev)
        pos_in_subset[self.subset] = torch.arange(len(self.subset), device=self.dev)
        self.label_subset = torch.where(self.label_draft >= 0, pos_in_subset[self.label_draft.clamp(min=0)],
                                        torch.full_like(self.label_draft, -1))
        self.draft_target = draft_target
        self.sample = pos.sample.to(self.dev)
        self.local = pos.local.to(self.dev)

    @property
    def scored_positions(self) -> torch.Tensor:
        """Indices (into draft positions) that count towards agreement."""
        return torch.nonzero(self.scored).flatten()

    def units(self, cands: torch.Tensor) -> torch.Tensor:
        """hs-index candidates [B, n] -> unit ids [B, n] (slot k, layer i -> k*(L+1) + i)."""
        return cands + torch.arange(self.n_slots, device=cands.device) * (self.L + 1)

    @torch.no_grad()
    def evaluate(self, cands: torch.Tensor, queries: torch.Tensor, *, full_vocab: bool = False,
                 context: int | None = None, norm_before_residual: bool | None = None,
                 chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per candidate and query position: (correct [B, Q] bool, log-prob of the label over the vocab used [B, Q]).

        cands: [B, n] hs indices; queries: draft-position indices. Attention covers the full prefix of each
        query's sample (exact), or only its last `context` positions (the cheap proxy of the pruning rounds).
        `norm_before_residual` overrides the scorer's residual mode (to test the other value empirically).
        """
        nbr = self.nbr if norm_before_residual is None else norm_before_residual
        cands = cands.to(self.dev)
        queries = queries.to(self.dev)
        B, Q = cands.shape[0], len(queries)
        correct = torch.zeros(B, Q, dtype=torch.bool, device=self.dev)
        logp = torch.full((B, Q), float("nan"), device=self.dev)
        if B == 0 or Q == 0:
            return correct, logp
        u = self.units(cands)  # shape: [B, n]
        U = self.P.shape[0]
        pair = (u[:, :, None] * U + u[:, None, :]).reshape(B, -1)  # Gram entries of each candidate, [B, n*n]
        layer = self.draft.layers[0]
        lm_w = self.draft.lm_head.weight if full_vocab else self.draft.lm_head.weight[self.subset]
        inter = layer.mlp.gate_proj.weight.shape[0]
        kvw = self.nkv * self.d
        for s in torch.unique(self.sample[queries]).tolist():
            qsel = torch.nonzero(self.sample[queries] == s).flatten()
            qi = queries[qsel]  # draft-position indices of this sample's queries
            qpos = self.local[qi]
            first = 0 if context is None else max(0, int(qpos.min()) - context + 1)
            keys = torch.nonzero(self.sample == s).flatten()[first: int(qpos.max()) + 1]
            nk, m = len(keys), len(qi)
            kpos = self.local[keys]
            mask = (kpos[None, :] <= qpos[:, None])  # shape: [m, nk]
            if context is not None:
                mask &= kpos[None, :] > qpos[:, None] - context
            per_cand = nk * (2 * kvw + self.nh * m + self.n_slots ** 2) + m * (lm_w.shape[0] + 3 * inter + 8 * self.Hd)
            step = chunk or max(1, min(B, int(self.FLOATS_PER_CHUNK // per_cand)))
            Gs = self.G[:, keys]  # shape: [U*U, nk]
            KVh = self.KVh[:, keys]  # shape: [U, nk, 2*kvw]
            Qh, Ph = self.Qh[:, qi], self.P[:, qi]  # [U, m, nh*d], [U, m, Hd]
            KVe, Qe = self.KVe[keys], self.Qe[qi]
            qk = qpos - first  # index of each query among the keys
            for b0 in range(0, B, step):
                ub = u[b0:b0 + step]  # shape: [b, n]
                b = ub.shape[0]
                # mean(g^2) at every key position from the Gram matrix of the units: r = rsqrt(mean(g^2) + eps)
                r = torch.rsqrt(Gs[pair[b0:b0 + b]].sum(1) / self.Hd + self.eps)  # shape: [b, nk]
                kv = KVh[ub[:, 0]]
                q = Qh[ub[:, 0]]
                g = Ph[ub[:, 0]]
                for j in range(1, self.n_slots):  # the fused input is a sum over slots: fc is linear
                    kv += KVh[ub[:, j]]
                    q += Qh[ub[:, j]]
                    g += Ph[ub[:, j]]
                rq = r[:, qk]  # shape: [b, m]
                kv.mul_(r[..., None]).add_(KVe)  # shape: [b, nk, 2*kvw]
                q.mul_(rq[..., None]).add_(Qe)
                k = kv[..., :kvw].view(b, nk, self.nkv, self.d).transpose(1, 2)
                v = kv[..., kvw:].view(b, nk, self.nkv, self.d).transpose(1, 2)
                q = q.view(b, m, self.nh, self.d).transpose(1, 2)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.nkv != self.nh)
                o = layer.self_attn.o_proj(a.transpose(1, 2).reshape(b, m, -1))  # shape: [b, m, Hd]
                h = (g * rq[..., None] * self.w_hn if nbr else g) + o  # residual: hidden_norm(g) or g
                h = h + layer.mlp(layer.post_attention_layernorm(h))
                logits = self.draft.norm(h) @ lm_w.T  # shape: [b, m, V used]
                top = logits.argmax(-1)
                top_draft = top if full_vocab else self.subset[top]
                correct[b0:b0 + b, qsel] = self.draft_target[top_draft] == self.labels[qi][None]
                lab = self.label_draft[qi] if full_vocab else self.label_subset[qi]  # shape: [m]
                got = logits.gather(-1, lab.clamp(min=0)[None, :, None].expand(b, m, 1))[..., 0] - torch.logsumexp(logits, -1)
                logp[b0:b0 + b, qsel] = torch.where(lab[None] >= 0, got, torch.full_like(got, float("nan")))
        return correct, logp


def all_candidates(num_layers: int, n_slots: int = 3) -> torch.Tensor:
    """Every ordered choice of n distinct hs indices in 0..L. shape: [n_cands, n]"""
    return torch.tensor(list(itertools.permutations(range(num_layers + 1), n_slots)), dtype=torch.long)


def search_wirings(scorer: WiringScorer, *, must_score: Sequence[Sequence[int]] = (), keep: int = 64,
                   prune: int = 8, grow: int = 4, first_positions: int = 2, proxy_context: int | None = 24,
                   finalists: int = 6, seed: int = 0, candidates: torch.Tensor | None = None) -> SearchResult:
    """Successive halving over all ordered triples, then every position for `keep` survivors, then exact top-1.

    Pruning rounds rank candidates by the mean log-probability of the target's token (over a vocabulary
    subset, attention limited to the last `proxy_context` positions) on a random subset of positions that
    grows `grow`-fold each round, keeping 1/`prune` of them (at least `keep`). The survivors are scored on
    every position with exact attention (top-1 over the subset), and the best `finalists` exactly (top-1
    over the full draft vocabulary). `must_score` wirings (the configured and the trained ones) always
    reach the exact stage so that their scores are reported.
    """
    t0 = time.perf_counter()
    n = scorer.n_slots
    cands = all_candidates(scorer.L, n) if candidates is None else candidates.long()
    forced = [tuple(int(i) for i in w) for w in must_score if w is not None and len(w) == n]
    scored = scorer.scored_positions
    if len(scored) == 0:
        raise SpecwireError("no scored positions in the calibration data (empty continuations / loss masks).")
    usable = scored[scorer.label_draft[scored] >= 0]
    gen = torch.Generator().manual_seed(seed)
    order = usable[torch.randperm(len(usable), generator=gen).to(usable.device)] if len(usable) else scored
    stages = []
    alive = cands
    sum_lp = torch.zeros(len(alive))
    cnt = torch.zeros(len(alive))
    used = 0
    take = first_positions
    while len(alive) > keep and used < len(order):
        ts = time.perf_counter()
        q = order[used:used + take]
        used += len(q)
        _, lp = scorer.evaluate(alive, q, context=proxy_context)
        lp = lp.cpu()
        sum_lp += torch.nan_to_num(lp, nan=0.0).sum(1)
        cnt += (~torch.isnan(lp)).sum(1)
        mean = sum_lp / cnt.clamp(min=1)
        n_keep = max(keep, len(alive) // prune)
        idx = torch.argsort(mean, descending=True, stable=True)[:n_keep]
        stages.append({"candidates": len(alive), "positions": used, "seconds": round(time.perf_counter() - ts, 3)})
        alive, sum_lp, cnt = alive[idx], sum_lp[idx], cnt[idx]
        take = used * (grow - 1)
    alive_set = {tuple(r.tolist()) for r in alive}
    extra = [w for w in forced if w not in alive_set]
    if extra:
        alive = torch.cat([alive, torch.tensor(extra, dtype=torch.long)])
    # every scored position, restricted vocabulary
    ts = time.perf_counter()
    corr, lp = scorer.evaluate(alive, scored)
    acc = corr.float().mean(1).cpu()
    mlp = torch.nan_to_num(lp, nan=-1e4).mean(1).cpu()
    rank = torch.argsort(acc * 1e6 + mlp, descending=True, stable=True)
    stages.append({"candidates": len(alive), "positions": len(scored), "seconds": round(time.perf_counter() - ts, 3)})
    final = [tuple(alive[i].tolist()) for i in rank[:finalists].tolist()]
    final += [w for w in forced if w not in final]
    # exact: top-1 over the full draft vocabulary
    ts = time.perf_counter()
    fc, flp = scorer.evaluate(torch.tensor(final, dtype=torch.long), scored, full_vocab=True)
    facc = fc.float().mean(1).cpu().tolist()
    fmlp = torch.nan_to_num(flp, nan=-1e4).mean(1).cpu().tolist()
    stages.append({"candidates": len(final), "positions": len(scored), "seconds": round(time.perf_counter() - ts, 3),
                   "exact": True})
    scores = {w: float(a) for w, a in zip(final, facc)}
    order_f = sorted(range(len(final)), key=lambda i: (-facc[i], -fmlp[i]))
    top = [(list(final[i]), float(facc[i])) for i in order_f]
    return SearchResult(best=top[0][0], best_score=top[0][1], scores=scores, top=top, num_candidates=len(cands),
                        num_positions=len(scored), seconds=time.perf_counter() - t0, stages=stages)


# ---- a runnable draft from any checkpoint the doctor reads ----------------------------------------------------

def runnable_draft(view: DraftView, tv: TargetView, trained_hs: list[int] | None, *, device="cpu"):
    """An Eagle3Draft with the checkpoint's weights (any layout), or (None, reason) when it cannot run."""
    from specwire.draft.model import DraftConfig, Eagle3Draft, load_draft
    from specwire.wiring import Wiring

    fc = view.fc_shape
    H = tv.info.hidden_size
    if fc is None or fc[1] == H or fc[1] % H:
        return None, "fc does not fuse whole target states"
    if view.config_kind == "native" and view.layout == "speculators" and {"d2t", "t2d"} <= set(view.shapes):
        try:
            return load_draft(view.path, device=device), None
        except SpecwireError as e:
            log.info("strict load failed (%s); trying the lenient path", e)
    if view.layout == "unknown":
        return None, "unknown key layout"
    n = fc[1] // H
    hs = trained_hs if trained_hs and len(trained_hs) == n else list(range(n))
    cfg = view.config
    layer = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else cfg
    pre = view.layer_prefix
    try:
        tensors = {}
        for f in sorted(set(view.files.values())):
            tensors.update(load_tensors(f))
        q = tensors[f"{pre}self_attn.q_proj.weight"]
        k = tensors[f"{pre}self_attn.k_proj.weight"]
        heads = _first_int(layer, "num_attention_heads")
        head_dim = _first_int(layer, "head_dim") or (q.shape[0] // heads if heads else None)
        Vd = tensors["lm_head.weight"].shape[0]
        wiring = Wiring(hs_ids=tuple(hs), target=tv.spec,
                        norm_before_residual=bool(view.native.get("norm_before_residual")) if view.native else
                        bool(view.norm_before_residual), draft_vocab_size=Vd)
        dc = DraftConfig(
            wiring=wiring, hidden_size=fc[0], intermediate_size=tensors[f"{pre}mlp.gate_proj.weight"].shape[0],
            num_attention_heads=heads, num_key_value_heads=k.shape[0] // head_dim, head_dim=head_dim,
            vocab_size=tv.info.vocab_size, draft_vocab_size=Vd,
            max_position_embeddings=view.max_position_embeddings or tv.info.max_position_embeddings or 2048,
            rms_norm_eps=view.rms_norm_eps or 1e-6, rope_parameters=view.rope or {"rope_type": "default", "rope_theta": 10000.0},
            norm_before_residual=wiring.norm_before_residual, target_hidden_size=H)
        draft = Eagle3Draft(dc)
        sd = {}
        for name, t in tensors.items():
            if name.startswith(pre):
                sd["layers.0." + name[len(pre):]] = t.float()
            elif name in ("fc.weight", "norm.weight", "lm_head.weight"):
                sd[name] = t.float()
        if "d2t" in tensors:
            sd["d2t"] = tensors["d2t"].long()
            sd["t2d"] = tensors["t2d"].bool() if "t2d" in tensors else draft.t2d.clone()
        elif Vd == tv.info.vocab_size:
            sd["d2t"], sd["t2d"] = draft.d2t.clone(), torch.ones(Vd, dtype=torch.bool)
        else:
            return None, "no d2t: draft ids cannot be mapped to target ids"
        missing, unexpected = draft.load_state_dict(sd, strict=False)
        if missing or unexpected:
            return None, f"tensors missing {missing} / unexpected {unexpected}"
    except (KeyError, TypeError, ZeroDivisionError, SpecwireError, RuntimeError) as e:
        return None, f"cannot build the draft ({e})"
    return draft.to(device).eval(), None


# ---- offline against online ------------------------------------------------------------------------------------

ONLINE_PROMPTS = CALIBRATION_PROMPTS[:3]


def offline_vs_online(draft_path, tv: TargetView, *, served_hs: list[int], trained_hs: list[int], served_nbr: bool | None,
                      prompts: Sequence[str | list[int]] = ONLINE_PROMPTS, max_new_tokens: int = 32,
                      num_steps: int = 4) -> dict:
    """Live chain acceptance per draft position under the served wiring, and offline step-0 agreement on the same text."""
    from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate

    target = tv.loaded
    draft = load_engine_draft(draft_path, target, hs_ids_override=served_hs)
    if served_nbr is not None:
        for layer in draft.layers:
            layer.norm_before_residual = bool(served_nbr)
    accept, reach, seqs, starts = [0.0] * num_steps, [0.0] * num_steps, [], []
    for p in prompts:
        ids = target.encode_chat(p) if isinstance(p, str) else [int(i) for i in p]
        res = speculative_generate(target, draft, ids, max_new_tokens=max_new_tokens, tree=False,
                                   spec=SpecConfig(num_steps=num_steps, topk=1, num_draft_tokens=num_steps + 1, tree=False))
        for k, (a, r) in enumerate(zip(res.extra.get("accept_counts", []), res.extra.get("reach_counts", []))):
            if k < num_steps:
                accept[k] += a
                reach[k] += r
        seqs.append(ids + res.output_ids)
        starts.append(len(ids))
    online = [a / r if r else 0.0 for a, r in zip(accept, reach)]
    cal = capture_all_layers(target, seqs, starts, source="online text")
    trained_nbr = draft.config.norm_before_residual  # the engine draft's config keeps the trained value
    sc = WiringScorer(draft, cal, norm_before_residual=trained_nbr)
    corr, _ = sc.evaluate(torch.tensor([trained_hs, served_hs]), sc.scored_positions, full_vocab=True)
    off_trained, off_served = corr.float().mean(1).tolist()
    return {"online_accept_per_position": online, "offline_step0_trained": off_trained,
            "offline_step0_served": off_served, "served_hs": list(served_hs), "trained_hs": list(trained_hs),
            "served_norm_before_residual": served_nbr, "trained_norm_before_residual": trained_nbr,
            "num_layers": target.num_layers, "prompts": len(prompts), "max_new_tokens": max_new_tokens}


# ---- the diagnosis -------------------------------------------------------------------------------------------

def diagnose(
    draft_path: str | os.PathLike,
    target,
    *,
    engine: str | None = None,
    engine_version: str | None = None,
    hs_ids: Sequence[int] | None = None,
    engine_config: str | os.PathLike | None = None,
    data: str | os.PathLike | None = None,
    states: str | os.PathLike | None = None,
    num_steps: int | None = None,
    topk: int | None = None,
    num_draft_tokens: int | None = None,
    search: bool = True,
    online: bool = True,
    keep: int = 64,
    calib_prompts: int = 12,
    calib_new_tokens: int = 40,
    calibration: Calibration | None = None,
    online_new_tokens: int = 32,
    device=None,
    dtype="float32",
) -> DoctorReport:
    """Static checks, then (optionally) the wiring search and the offline-vs-online comparison."""
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    view = read_draft_view(draft_path)
    # the weights are loaded whenever they are there: the fingerprint needs them, even in static-only mode
    tv = open_target(target, load=states is None, device=device, dtype=dtype)
    L = tv.num_layers
    data_manifest = read_json(Path(data) / "manifest.json", what="data manifest") if data is not None else None
    sv = serving_view(view, L, engine=engine, engine_version=engine_version, hs_ids=hs_ids, engine_config=engine_config)
    trained, trained_src = view.trained_hs(L)
    if data_manifest is not None and not trained:
        w = data_manifest.get("wiring") or {}
        if isinstance(w.get("hs_ids"), list):
            trained, trained_src = [int(i) for i in w["hs_ids"]], "--data manifest wiring"
    findings: list[Finding] = []
    findings += check_format(view, engine)
    findings += check_widths(view, tv)
    findings += check_vocab(view, tv, engine)
    findings += check_positions_rope_norm(view, tv)
    findings += check_norm_before_residual(view, sv)
    findings += check_target_identity(view, tv)
    findings += check_tokenizer(view, tv, data_manifest)
    findings += check_ids(view, sv, tv, trained, trained_src)
    findings += check_spec_flags(engine, num_steps, topk, num_draft_tokens)
    timings["static_s"] = round(time.perf_counter() - t_start, 3)
    configured = sv.hs_ids
    wiring: dict[str, Any] = {"configured": configured, "best": None, "trained": trained,
                              "configured_source": sv.source,
                              "scores": {"configured": None, "best": None, "trained": None, "top": []}}
    online_info = None
    if search or online:
        draft, why = runnable_draft(view, tv, trained, device=tv.loaded.device if tv.loaded else "cpu")
        if draft is None:
            findings.append(Finding("search-skipped", "info", f"wiring search not run: {why}.", None))
        elif tv.loaded is None and states is None:
            findings.append(Finding("search-skipped", "info",
                                    f"wiring search not run: target '{tv.name}' has no weights here; capture its states "
                                    "where it runs and pass them with --states.",
                                    f"specwire dump-states --target {tv.name} --prompts builtin --out STATES  # then: "
                                    f"specwire doctor {view.path} --target {tv.name} --states STATES"))
        elif search:
            ts = time.perf_counter()
            if calibration is not None:
                cal = calibration
            elif states is not None:
                cal, _ = load_states(states, tv)
            elif data is not None:
                cal = data_calibration(tv.loaded, data, max_samples=calib_prompts)
            else:
                cal = builtin_calibration(tv.loaded, num_prompts=calib_prompts, max_new_tokens=calib_new_tokens)
            timings["calibration_s"] = round(time.perf_counter() - ts, 3)
            ts = time.perf_counter()
            sc = WiringScorer(draft, cal)
            timings["precompute_s"] = round(time.perf_counter() - ts, 3)
            res = search_wirings(sc, must_score=[configured, trained], keep=keep)
            timings["search_s"] = round(res.seconds, 3)
            findings += _search_findings(res, configured, trained, sv, L, cal)
            wiring["best"] = res.best
            wiring["scores"] = {
                "configured": res.scores.get(tuple(configured)) if configured else None,
                "best": res.best_score,
                "trained": res.scores.get(tuple(trained)) if trained else None,
                "top": [{"hs_ids": w, "score": s} for w, s in res.top[:5]],
            }
            wiring["search"] = {"candidates": res.num_candidates, "positions": res.num_positions,
                                "calibration": cal.source, "stages": res.stages, "seconds": round(res.seconds, 3)}
            # the residual mode, empirically: the best wiring under both values
            ts = time.perf_counter()
            c_alt, _ = sc.evaluate(torch.tensor([res.best]), sc.scored_positions, full_vocab=True,
                                   norm_before_residual=not sc.nbr)
            alt_score = float(c_alt.float().mean())
            wiring["scores"]["norm_before_residual"] = {str(sc.nbr).lower(): res.best_score, str(not sc.nbr).lower(): alt_score}
            if alt_score > res.best_score + max(0.05, 0.2 * res.best_score):
                findings.append(Finding("norm-before-residual-empirical", "error",
                                        f"the draft agrees with the target {alt_score:.1%} of the time with norm_before_residual="
                                        f"{str(not sc.nbr).lower()} but {res.best_score:.1%} with the recorded "
                                        f"{str(sc.nbr).lower()}: the checkpoint records the wrong residual mode.",
                                        f'"norm_before_residual": {str(not sc.nbr).lower()}'))
            timings["residual_check_s"] = round(time.perf_counter() - ts, 3)
        if online and draft is not None and tv.loaded is not None and configured and trained and \
                len(configured) == len(trained) and view.config_kind == "native":
            ts = time.perf_counter()
            try:
                prompts = (data_prompts(data) if data is not None else None) or ONLINE_PROMPTS
                online_info = offline_vs_online(view.path, tv, served_hs=list(configured), trained_hs=list(trained),
                                                served_nbr=sv.norm_before_residual, prompts=prompts,
                                                max_new_tokens=online_new_tokens)
                findings += _online_findings(online_info, sv, trained)
            except (ImportError, SpecwireError) as e:
                findings.append(Finding("online-skipped", "info", f"offline-vs-online comparison not run: {e}", None))
            timings["online_s"] = round(time.perf_counter() - ts, 3)
        elif online and draft is not None and tv.loaded is not None:
            findings.append(Finding("online-skipped", "info",
                                    "offline-vs-online comparison not run: the engine runs native checkpoints with a known "
                                    "trained wiring (`specwire import D --out DIR` first).", None))
    timings["total_s"] = round(time.perf_counter() - t_start, 3)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    ok = not any(f.severity == "error" for f in findings)
    return DoctorReport(ok=ok, findings=findings, wiring=wiring, draft=str(draft_path), target=tv.name, engine=engine,
                        timings=timings, online=online_info)


def _search_findings(res: SearchResult, configured, trained, sv: ServingView, L: int, cal: Calibration) -> list[Finding]:
    out = []
    conf = res.scores.get(tuple(configured)) if configured else None
    top = ", ".join(f"hs {w} {s:.1%}" for w, s in res.top[:3])
    margin = 0.03
    if conf is not None and res.best != list(configured) and res.best_score > conf + margin:
        out.append(Finding(
            "wiring-search", "error",
            f"empirical: the draft agrees with the target's next token {res.best_score:.1%} of the time fed hs {res.best}, "
            f"but {conf:.1%} with the configured hs {list(configured)} ({res.num_candidates} wirings, {res.num_positions} "
            f"positions of {cal.source}; top: {top}).",
            ids_fix(res.best, L, sv.engine)))
    else:
        out.append(Finding("wiring-search", "info",
                           f"empirical: best wiring hs {res.best} ({res.best_score:.1%} step-0 agreement over "
                           f"{res.num_positions} positions, {res.num_candidates} wirings searched in {res.seconds:.1f} s); "
                           f"configured {list(configured) if configured else None}: "
                           f"{'n/a' if conf is None else f'{conf:.1%}'}; top: {top}.", None))
    if trained and res.best != list(trained) and tuple(trained) in res.scores and \
            res.best_score > res.scores[tuple(trained)] + margin:
        out.append(Finding("trained-wiring-suspect", "warning",
                           f"the recorded training wiring hs {list(trained)} scores {res.scores[tuple(trained)]:.1%}, below hs "
                           f"{res.best} ({res.best_score:.1%}): the checkpoint's record may be wrong (data captured at other ids?).",
                           ids_fix(res.best, L, sv.engine)))
    return out


def _online_findings(info: dict, sv: ServingView, trained: list[int]) -> list[Finding]:
    per_pos = info["online_accept_per_position"]
    on = per_pos[0] if per_pos else 0.0
    off, off_served = info["offline_step0_trained"], info["offline_step0_served"]
    gap = off - on
    base = (f"offline step-0 accuracy with the trained wiring hs {list(trained)}: {off:.1%}; live acceptance at draft "
            f"position 0 served with hs {info['served_hs']}: {on:.1%} (per position: "
            f"{', '.join(f'{a:.0%}' for a in per_pos)})")
    if gap <= max(0.1, 0.25 * off):
        return [Finding("online-check", "info", base + ": they agree.", None)]
    served_nbr, trained_nbr = info.get("served_norm_before_residual"), info.get("trained_norm_before_residual")
    fix = None
    if list(info["served_hs"]) != list(trained):
        cause = (f"the served wiring: offline with the served hs {info['served_hs']} gives {off_served:.1%}, close to the "
                 "live figure; the engine feeds other states than the draft was trained on")
        fix = ids_fix(trained, info["num_layers"], sv.engine)
    elif served_nbr is not None and served_nbr != trained_nbr:
        cause = (f"norm_before_residual: served as {str(served_nbr).lower()}, trained with {str(trained_nbr).lower()}")
        fix = f'"norm_before_residual": {str(trained_nbr).lower()}'
    else:
        cause = "not the ids nor the residual mode: check the engine's draft positions, rope and the chat template"
    return [Finding("online-gap", "error", f"{base}. Gap {gap:.1%}; likely cause: {cause}.", fix)]


# ---- text rendering and the commands ---------------------------------------------------------------------------

def render_report(rep: DoctorReport) -> str:
    icon = {"error": "ERROR  ", "warning": "warning", "info": "info   "}
    lines = [f"specwire doctor: {rep.draft}  target {rep.target}  engine {rep.engine or '(none)'}", ""]
    for f in rep.findings:
        lines.append(f"[{icon[f.severity]}] {f.id}: {f.message}")
        if f.fix:
            lines.append(f"          fix: {f.fix}")
    w = rep.wiring
    sc = w.get("scores") or {}

    def pct(x):
        return "n/a" if x is None else f"{x:.1%}"

    lines += ["", "wiring (hs indices; 0 = embeddings, L = last layer before the final norm):",
              f"  configured  {w.get('configured')}  {pct(sc.get('configured'))}   ({w.get('configured_source')})",
              f"  trained     {w.get('trained')}  {pct(sc.get('trained'))}"]
    if w.get("best") is not None:
        lines.append(f"  best        {w['best']}  {pct(sc.get('best'))}")
        for t in sc.get("top", [])[1:]:
            lines.append(f"    then      {t['hs_ids']}  {pct(t['score'])}")
        s = w.get("search") or {}
        lines.append(f"  searched {s.get('candidates')} wirings on {s.get('positions')} positions of {s.get('calibration')} "
                     f"in {s.get('seconds')} s")
    if rep.online:
        o = rep.online
        lines.append(f"  online: acceptance per draft position {[round(a, 3) for a in o['online_accept_per_position']]}; "
                     f"offline step-0 (trained wiring) {pct(o['offline_step0_trained'])}")
    n_err = len(rep.errors)
    lines += ["", "ok: no errors." if rep.ok else f"{n_err} error{'s' if n_err != 1 else ''}: see the fixes above."]
    return "\n".join(lines)


def add_cli(sub) -> None:
    from specwire.cli import add_json_option

    p = sub.add_parser("doctor", help="diagnose wiring, format and flag problems; find the wiring a draft was trained on",
                       description="Static checks of a draft against a target and a serving configuration, an empirical "
                       "search over every ordered triple of hidden states, and live acceptance against offline accuracy. "
                       "Exit code 1 when an error is found, 2 for a usage mistake.")
    p.add_argument("draft", help="draft folder (native, speculators or SGLang layout) or 'smollm2-135m-eagle3'")
    p.add_argument("--target", default="smollm2-135m", help="built-in name, HF folder, or a folder with only config.json")
    p.add_argument("--engine", choices=ENGINES, default=None, help="the engine that will serve the draft")
    p.add_argument("--engine-version", choices=SGLANG_VERSIONS, default=None,
                   help="SGLang's id rule: classic (+1 always) or shift-if-one (newer: +1 only when the first id is 1)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--hs-ids", default=None, help="layer ids the engine is given, in the engine's convention")
    g.add_argument("--engine-config", default=None, help="the draft config.json the engine will read")
    p.add_argument("--data", default=None, help="the datagen dump the draft was trained on (tokenizer check, calibration)")
    p.add_argument("--states", default=None, help="an all-layer states dump (`specwire dump-states`) for the search")
    p.add_argument("--num-steps", type=int, default=None)
    p.add_argument("--topk", type=int, default=None)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--no-search", action="store_true", help="static checks only (fast)")
    p.add_argument("--no-online", action="store_true", help="skip the live-acceptance comparison")
    p.add_argument("--keep", type=int, default=64, help="wirings rescored on every position after pruning (default: %(default)s)")
    p.add_argument("--calib-prompts", type=int, default=12, help="built-in calibration prompts (default: %(default)s)")
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None)
    add_json_option(p)
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("dump-states", help="write all-layer target states of calibration text (for `doctor --states`)",
                       description="Run the target on calibration prompts (plus greedy continuations) and write every hs "
                       "index 0..L, the token embeddings, and the target's greedy next tokens (docs/DOCTOR.md).")
    p.add_argument("--target", required=True, help="built-in name or HF folder with weights")
    p.add_argument("--prompts", default="builtin", help="'builtin' (the doctor's prompts), mt-bench, humaneval, pool or a JSONL file")
    p.add_argument("--limit", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--out", required=True)
    p.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--threads", type=int, default=None)
    p.set_defaults(func=cmd_dump_states)


def cmd_doctor(args: argparse.Namespace) -> int:
    from specwire.cli import emit_json

    rep = diagnose(args.draft, args.target, engine=args.engine, engine_version=args.engine_version,
                   hs_ids=parse_ids(args.hs_ids) if args.hs_ids else None, engine_config=args.engine_config,
                   data=args.data, states=args.states, num_steps=args.num_steps, topk=args.topk,
                   num_draft_tokens=args.num_draft_tokens, search=not args.no_search, online=not args.no_online,
                   keep=args.keep, calib_prompts=args.calib_prompts, device=args.device, dtype=args.dtype)
    if args.json:
        emit_json(rep.to_dict())
    else:
        print(render_report(rep))
    return 0 if rep.ok else 1


def cmd_dump_states(args: argparse.Namespace) -> int:
    from specwire.target.load import load_target

    target = load_target(args.target, device=args.device, dtype=args.dtype)
    if args.prompts == "builtin":
        prompts = list(CALIBRATION_PROMPTS[: args.limit])
    else:
        from specwire.data.prompts import load_prompts

        prompts = load_prompts(args.prompts, limit=args.limit)
    out = dump_states(target, prompts, args.out, max_new_tokens=args.max_new_tokens, dtype=args.state_dtype,
                      target_name=args.target)
    print(f"wrote {len(prompts)} samples of {target.num_layers + 1} states each to {out}")
    return 0
