"""The doctor's static checks: each a function returning `Finding`s with the evidence and the exact fix.

Owns: `Finding`, the target as the doctor sees it (`TargetView`, `open_target`: config always, weights
and tokenizer when present), the serving view (`serving_view`: what the engine will fuse and run, taken
from `interop.engines.engine_reading`, the one model of how SGLang and vLLM read a draft), the fix in
each engine's convention (`ids_fix`), and every static check (format, widths, vocabulary, positions,
rope and norms, residual mode, target identity, tokenizer, ids, SGLang flags, and the reader's
consistency check as findings). Does not read draft folders itself (`draft.reader`), search wirings
(`doctor.search`) or run anything.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from specwire.draft.model import check_vocab_map
from specwire.errors import SpecwireError
from specwire.draft.fields import rope_or_none
from specwire.draft.reader import CheckpointInfo
from specwire.interop.engines import ENGINE_LAYOUTS, ENGINES, EngineReading, engine_nbr_default, engine_reading
from specwire.safeio import load_tensors, read_json
from specwire.wiring import (DEFAULT_SGLANG_VERSION, TargetSpec, classify_wiring, default_hs_ids,
                             hs_to_sglang, sglang_readings, validate_hs_ids)

SEVERITIES = ("error", "warning", "info")


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



# ---- the serving view -------------------------------------------------------------------------------------

@dataclass
class ServingView:
    """What the serving engine will actually do with this draft (an `EngineReading`, or the trained record)."""

    engine: str | None  # None: no engine named, the draft's own recorded wiring is "configured"
    engine_version: str | None  # SGLang id rule ("classic" or "shift-if-one"); None for vLLM
    hs_ids: list[int] | None  # hs indices the engine will fuse (None when they cannot be read)
    ids_as_written: list[int] | None  # in the engine's convention
    source: str  # where the ids came from
    norm_before_residual: bool | None  # what the engine will use
    nbr_written: bool | None  # as written in the config the engine reads
    ids_problem: str | None = None  # why hs_ids is None


def serving_view(view: CheckpointInfo, num_layers: int, *, engine: str | None, engine_version: str | None,
                 hs_ids: Sequence[int] | None, engine_config: str | os.PathLike | None) -> ServingView:
    """What `engine` (version) reads from the draft, `--hs-ids` or `--engine-config`, in hs indices."""
    if engine is not None and engine not in ENGINES:
        raise SpecwireError(f"unknown engine '{engine}'; expected one of {list(ENGINES)}.")
    if engine_version is not None and engine != "sglang":
        raise SpecwireError("--engine-version names an SGLang id rule; it needs --engine sglang.")
    if hs_ids is not None and engine_config is not None:
        raise SpecwireError("give either --hs-ids or --engine-config, not both.")
    cfg = read_json(Path(engine_config), what="engine config") if engine_config is not None else None
    if engine is None:
        trained, src = view.trained_hs(num_layers)
        nbr = view.norm_before_residual
        nbr = nbr if nbr is not None else (view.block_config or {}).get("norm_before_residual")
        return ServingView(None, None, trained, trained, src, nbr, view.norm_before_residual)
    r: EngineReading = engine_reading(view, engine, num_layers, sglang_version=engine_version or DEFAULT_SGLANG_VERSION,
                                      hs_ids=hs_ids, config=cfg,
                                      config_name="--engine-config" if engine_config is not None else None)
    return ServingView(engine, r.sglang_version, list(r.hs_ids) if r.hs_ids is not None else None,
                       list(r.ids_as_written) if r.ids_as_written is not None else None, r.ids_source,
                       r.norm_before_residual, r.nbr_written, r.ids_problem)


def check_consistency(view: CheckpointInfo, num_layers: int) -> list[Finding]:
    """The reader's consistency check as findings: copies of one fact in the folder that disagree."""
    return [Finding(f"inconsistent-{i.kind}", "error", i.message, i.fix)
            for i in view.check_consistency(view.recorded_num_layers or num_layers)]

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
        return TargetView(name=target.info.name, info=target.info, spec=target.spec, rope=rope_or_none(_text_raw(raw)),
                          rms_norm_eps=_eps_of(_text_raw(raw)), tokenizer=target.tokenizer, loaded=target)
    path = resolve_target_path(target)
    raw = read_json(path / "config.json", what="target config")
    has_weights = any(path.glob("*.safetensors"))
    if load and has_weights:
        t = load_target(target, device=device, dtype=dtype)
        return TargetView(name=str(target), info=t.info, spec=t.spec, rope=rope_or_none(_text_raw(raw)),
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
    return TargetView(name=str(target), info=info, spec=spec, rope=rope_or_none(_text_raw(raw)),
                      rms_norm_eps=_eps_of(_text_raw(raw)), tokenizer=tok, loaded=None)


def _text_raw(raw: dict) -> dict:
    return raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw


def _eps_of(d: dict) -> float | None:
    for n in ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"):
        v = d.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def ids_fix(hs: Sequence[int], num_layers: int, engine: str | None) -> str:
    """The config line that makes `engine` fuse hs indices `hs`, in that engine's convention."""
    hs = [int(i) for i in hs]
    if engine == "sglang":
        ids = hs_to_sglang(hs, num_layers)
        line = f'"eagle_config": {{"eagle_aux_hidden_state_layer_ids": {ids}}}'
        readings = sglang_readings(ids, num_layers)
        if not all(r == hs for r in readings.values()):
            line += (f" (SGLang with the classic +1 rule; SGLang versions that add 1 only when the first id is 1 "
                     f"read these as hs {readings['shift-if-one'] or 'out of range'})")
        return line
    return f'"eagle_aux_hidden_state_layer_ids": {hs}'


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

def check_format(view: CheckpointInfo, engine: str | None) -> list[Finding]:
    out = []
    d = str(view.path)
    if view.layout not in ("layers", "midlayer"):
        out.append(Finding("format-unknown", "error",
                           f"{d}: tensor layout '{view.layout}': not `layers.0.*` (speculators) nor `midlayer.*` (SGLang/EAGLE) "
                           f"alone; keys: {sorted(view.shapes)[:8]}.",
                           "export the draft again from its training run (`specwire export D --format sglang|speculators`)."))
        return out
    if engine is not None and view.layout not in ENGINE_LAYOUTS[engine]:
        out.append(Finding(
            "format-layout", "error",
            f"{d} uses the {view.layout} key layout ({view.layer_prefix}*) but {engine} loads "
            f"{'/'.join(ENGINE_LAYOUTS[engine])} layouts; SGLang silently skips `layers.0.*` names and serves "
            "a randomly initialised layer, with no error.",
            f"specwire export {d} --format {engine if engine == 'sglang' else 'speculators'} --out {d}-{engine}"))
    if engine == "sglang" and view.layout == "midlayer" and not any(r.convention == "sglang" for r in view.ids_records()):
        out.append(Finding("format-config", "warning",
                           f"{d}: SGLang tensor names with a speculators config (no eagle_config): SGLang will use its default ids.",
                           f"specwire export {d} --format sglang --out {d}-sglang"))
    return out


def check_widths(view: CheckpointInfo, tv: TargetView) -> list[Finding]:
    out = []
    H = tv.info.hidden_size
    Hd = view.hidden_size or H
    fc = view.shape("fc.weight")
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


def check_vocab(view: CheckpointInfo, tv: TargetView, engine: str | None) -> list[Finding]:
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
                t = load_tensors(view.path / view.tensors["d2t"].file)
                d2t = t["d2t"].long()
                t2d = t["t2d"].bool() if "t2d" in t else \
                    load_tensors(view.path / view.tensors["t2d"].file)["t2d"].bool() if has_t2d else None
                if t2d is not None:
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


def check_positions_rope_norm(view: CheckpointInfo, tv: TargetView) -> list[Finding]:
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


def check_norm_before_residual(view: CheckpointInfo, sv: EngineReading) -> list[Finding]:
    out = []
    trained = (view.block_config or {}).get("norm_before_residual")
    if view.norm_before_residual is None and sv.nbr_written is None:
        sev = "error" if sv.engine == "vllm" and trained is False else "warning"
        assumed = engine_nbr_default(sv.engine, view.raw) if sv.engine else "engine-dependent"
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


def check_target_identity(view: CheckpointInfo, tv: TargetView) -> list[Finding]:
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


def check_tokenizer(view: CheckpointInfo, tv: TargetView, data_manifest: dict | None) -> list[Finding]:
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


def check_ids(view: CheckpointInfo, sv: EngineReading, tv: TargetView, trained: list[int] | None, trained_src: str) -> list[Finding]:
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
        readings = sglang_readings(ids, L)
        if not all(r == list(trained) for r in readings.values()):
            alt = readings["shift-if-one"] or "out of range"
            out.append(Finding("sglang-version", "warning",
                               f"SGLang ids {ids} mean hs {trained} under the classic +1 rule but hs {alt} on SGLang versions "
                               "that add 1 only when the first id is 1: the same config is two wirings on two versions.",
                               "pin an SGLang version with the classic rule, or check with `specwire doctor D --engine sglang "
                               "--engine-version shift-if-one`."))
        if 0 in trained:
            out.append(Finding("sglang-embedding", "error",
                               "the draft fuses the embedding output (hs 0 = SGLang id -1); stock SGLang cannot capture it.",
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
