"""The doctor's diagnosis: every way a draft can be fed the wrong hidden states, and the right ones.

Owns: `DoctorConfig` (what to check and how hard; the `specwire doctor` flags are generated from it),
`diagnose` (the static checks of `doctor.checks`, then optionally the wiring search of `doctor.search`
and the offline-against-online comparison through the speculative engine), `DoctorReport` and its
text rendering. The draft is read with the one reader (`draft.reader.read_checkpoint`): its
consistency check is reported as errors, and a folder it cannot read at all is refused. Does not
convert checkpoints (`interop.convert`), decode (`decode.engine`) or train (`training`); the commands
are `specwire.cli.doctor`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from specwire.doctor.checks import (SEVERITIES, Finding, ServingView, TargetView, check_consistency, check_format,
                                    check_ids, check_norm_before_residual, check_positions_rope_norm, check_spec_flags,
                                    check_target_identity, check_tokenizer, check_vocab, check_widths, ids_fix,
                                    open_target, serving_view)
from specwire.doctor.search import SearchResult, WiringScorer, search_wirings
from specwire.doctor.states import (CALIBRATION_PROMPTS, Calibration, builtin_calibration, capture_all_layers,
                                    data_calibration, data_prompts, load_states)
from specwire.draft.checkpoint import load_draft, resolve_draft_path
from specwire.draft.model import Eagle3Draft
from specwire.errors import SpecwireError, WiringMismatch
from specwire.draft.fields import build_draft_config
from specwire.draft.reader import FORMAT_NATIVE, NATIVE_LAYER_PREFIX, CheckpointInfo, read_checkpoint
from specwire.interop.engines import ENGINES
from specwire.safeio import load_tensors, read_json
from specwire.wiring import SGLANG_VERSIONS, validate_hs_ids

log = logging.getLogger("specwire.doctor.diagnose")

ONLINE_PROMPTS = CALIBRATION_PROMPTS[:3]
DTYPES = ("float32", "bfloat16")


@dataclass
class DoctorConfig:
    """What the doctor checks against, and how hard it looks."""

    engine: str | None = None  # the engine that will serve the draft
    engine_version: str | None = None  # SGLang's id rule: classic (+1 always) or shift-if-one (newer: +1 only when the first id is 1)
    hs_ids: tuple[int, ...] | None = None  # layer ids the engine is given, in the engine's convention
    engine_config: str | None = None  # the draft config.json the engine will read
    data: str | None = None  # the datagen dump the draft was trained on (tokenizer check, calibration)
    states: str | None = None  # an all-layer states dump (`specwire dump-states`) for the search
    num_steps: int | None = None  # SGLang --speculative-num-steps to check
    topk: int | None = None  # SGLang --speculative-eagle-topk to check
    num_draft_tokens: int | None = None  # SGLang --speculative-num-draft-tokens to check
    search: bool = True  # the empirical wiring search (--no-search: static checks only, fast)
    online: bool = True  # live acceptance against offline accuracy (--no-online skips it)
    keep: int = 64  # wirings rescored on every position after pruning
    calib_prompts: int = 12  # built-in calibration prompts
    calib_new_tokens: int = 40  # greedy tokens the target adds to each calibration prompt
    online_new_tokens: int = 32  # tokens generated per prompt in the live comparison
    device: str | None = None  # torch device (default: cuda when available, else cpu)
    dtype: str = "float32"  # the target's weights dtype

    def __post_init__(self):
        if self.engine is not None and self.engine not in ENGINES:
            raise SpecwireError(f"DoctorConfig.engine: unknown engine '{self.engine}'; expected one of {list(ENGINES)}.")
        if self.engine_version is not None:
            if self.engine != "sglang":
                raise SpecwireError("--engine-version names an SGLang id rule; it needs --engine sglang.")
            if self.engine_version not in SGLANG_VERSIONS:
                raise SpecwireError(f"unknown SGLang version rule '{self.engine_version}'; expected one of {list(SGLANG_VERSIONS)}.")
        if self.hs_ids is not None:
            self.hs_ids = tuple(int(i) for i in self.hs_ids)
            if self.engine_config is not None:
                raise SpecwireError("give either --hs-ids or --engine-config, not both.")
        for name in ("keep", "calib_prompts", "calib_new_tokens", "online_new_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecwireError(f"DoctorConfig.{name}: expected a positive integer, found {v!r}.")
        if self.dtype not in DTYPES:
            raise SpecwireError(f"DoctorConfig.dtype: expected one of {list(DTYPES)}, found {self.dtype!r}.")


# ---- the report ----------------------------------------------------------------------------------------------

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

# ---- a runnable draft from any checkpoint the doctor reads ----------------------------------------------------

def runnable_draft(view: CheckpointInfo, tv: TargetView, trained_hs: list[int] | None, *, device="cpu"):
    """(an Eagle3Draft with the checkpoint's weights, None), or (None, the reason it cannot run).

    A consistent native checkpoint is loaded strictly; anything else (another layout, a config that
    disagrees with itself) is built from the specwire block, or else from the config's geometry, with
    the weights loaded by name.
    """
    fc = view.shape("fc.weight")
    H = tv.info.hidden_size
    if fc is None or len(fc) != 2 or fc[1] == H or fc[1] % H:
        return None, "fc does not fuse whole target states"
    if view.format == FORMAT_NATIVE and view.layout == "layers" and {"d2t", "t2d"} <= set(view.tensors) \
            and not view.inconsistencies:
        try:
            return load_draft(view.path, device=device), None
        except SpecwireError as e:
            log.info("strict load failed (%s); trying the lenient path", e)
    pre = view.layer_prefix
    if pre is None:
        return None, f"tensor layout '{view.layout}'"
    n = fc[1] // H
    hs = trained_hs if trained_hs and len(trained_hs) == n else list(range(n))
    try:
        dc = view.draft_config()
        if dc is not None:  # the trained geometry, with the wiring the doctor will feed
            dc = dataclasses.replace(dc, wiring=dc.wiring.replace(hs_ids=tuple(hs)))
        else:
            nbr = bool(view.norm_before_residual)
            dc = build_draft_config(view.geometry(), view.raw, view.shapes, tv.spec, hs=hs, nbr=nbr,
                                    source=str(view.config_path))
        draft = Eagle3Draft(dc)
        if view.read_errors:
            return None, view.read_errors[0]
        tensors = {}
        for f in view.files:
            tensors.update(load_tensors(view.path / f))
        sd = {}
        for name, t in tensors.items():
            if name.startswith(pre):
                sd[NATIVE_LAYER_PREFIX + name[len(pre):]] = t.float()
            elif name in ("fc.weight", "norm.weight", "lm_head.weight"):
                sd[name] = t.float()
        Vd = dc.draft_vocab_size
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


def _serving_draft(draft: Eagle3Draft, target, served_hs: list[int]) -> Eagle3Draft:
    """A copy of `draft` fed `served_hs`, checked against `target` as the engine checks it, embeddings attached."""
    from specwire.decode.engine import draft_fit_problems

    d = copy.deepcopy(draft).to(device=target.device, dtype=target.dtype)
    c = d.config = dataclasses.replace(draft.config)
    validate_hs_ids(served_hs, target.num_layers, expected_count=c.num_fused, what="served hs ids")
    c.wiring = c.wiring.replace(hs_ids=tuple(served_hs))
    problems = draft_fit_problems(d, target)
    if problems:
        raise WiringMismatch(f"the draft does not fit target '{target.info.name}': " + "; ".join(problems) + ".")
    return d.attach_embeddings(target.parts.embed)


# ---- offline against online ------------------------------------------------------------------------------------

def offline_vs_online(draft: Eagle3Draft, tv: TargetView, *, served_hs: list[int], trained_hs: list[int],
                      served_nbr: bool | None, prompts: Sequence[str | list[int]] = ONLINE_PROMPTS,
                      max_new_tokens: int = 32, num_steps: int = 4) -> dict:
    """Live chain acceptance per draft position under the served wiring, and offline step-0 agreement on the same text."""
    from specwire.decode.engine import SpecConfig, speculative_generate

    target = tv.loaded
    served = _serving_draft(draft, target, served_hs)
    if served_nbr is not None:
        for layer in served.layers:
            layer.norm_before_residual = bool(served_nbr)
    accept, reach, seqs, starts = [0.0] * num_steps, [0.0] * num_steps, [], []
    for p in prompts:
        ids = target.encode_chat(p) if isinstance(p, str) else [int(i) for i in p]
        res = speculative_generate(target, served, ids, max_new_tokens=max_new_tokens, tree=False,
                                   spec=SpecConfig(num_steps=num_steps, topk=1, num_draft_tokens=num_steps + 1, tree=False))
        for k, (a, r) in enumerate(zip(res.extra.get("accept_counts", []), res.extra.get("reach_counts", []))):
            if k < num_steps:
                accept[k] += a
                reach[k] += r
        seqs.append(ids + res.output_ids)
        starts.append(len(ids))
    online = [a / r if r else 0.0 for a, r in zip(accept, reach)]
    cal = capture_all_layers(target, seqs, starts, source="online text")
    trained_nbr = draft.config.norm_before_residual  # the draft's config keeps the trained value
    sc = WiringScorer(draft.to(device=target.device), cal, norm_before_residual=trained_nbr)
    corr, _ = sc.evaluate(torch.tensor([trained_hs, served_hs]), sc.scored_positions, full_vocab=True)
    off_trained, off_served = corr.float().mean(1).tolist()
    return {"online_accept_per_position": online, "offline_step0_trained": off_trained,
            "offline_step0_served": off_served, "served_hs": list(served_hs), "trained_hs": list(trained_hs),
            "served_norm_before_residual": served_nbr, "trained_norm_before_residual": trained_nbr,
            "num_layers": target.num_layers, "prompts": len(prompts), "max_new_tokens": max_new_tokens}


# ---- the diagnosis -------------------------------------------------------------------------------------------

def open_draft_view(draft_path: str | os.PathLike) -> CheckpointInfo:
    """The draft through the one reader; a folder it cannot read at all is refused (one SpecwireError)."""
    view = read_checkpoint(resolve_draft_path(draft_path))
    if view.read_errors:
        raise SpecwireError(view.read_errors[0])
    if view.format is None:
        raise SpecwireError(f"cannot tell the format of draft '{view.path}': " + " ".join(view.problems))
    return view


def diagnose(draft_path: str | os.PathLike, target, config: DoctorConfig | None = None, *,
             calibration: Calibration | None = None, **overrides: Any) -> DoctorReport:
    """Static checks, then (optionally) the wiring search and the offline-vs-online comparison.

    `config` says what to check; keyword `overrides` replace its fields (`diagnose(d, t, engine="vllm")`).
    `calibration` (tests, notebooks) replaces the calibration text the search would capture.
    """
    cfg = dataclasses.replace(config or DoctorConfig(), **overrides)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}
    view = open_draft_view(draft_path)
    # the weights are loaded whenever they are there: the fingerprint needs them, even in static-only mode
    tv = open_target(target, load=cfg.states is None, device=cfg.device, dtype=cfg.dtype)
    L = tv.num_layers
    data_manifest = read_json(Path(cfg.data) / "manifest.json", what="data manifest") if cfg.data is not None else None
    sv = serving_view(view, L, engine=cfg.engine, engine_version=cfg.engine_version, hs_ids=cfg.hs_ids,
                      engine_config=cfg.engine_config)
    trained, trained_src = view.trained_hs(L)
    if data_manifest is not None and not trained:
        w = data_manifest.get("wiring") or {}
        if isinstance(w.get("hs_ids"), list):
            trained, trained_src = [int(i) for i in w["hs_ids"]], "--data manifest wiring"
    findings: list[Finding] = []
    findings += check_consistency(view, L)
    findings += check_format(view, cfg.engine)
    findings += check_widths(view, tv)
    findings += check_vocab(view, tv, cfg.engine)
    findings += check_positions_rope_norm(view, tv)
    findings += check_norm_before_residual(view, sv)
    findings += check_target_identity(view, tv)
    findings += check_tokenizer(view, tv, data_manifest)
    findings += check_ids(view, sv, tv, trained, trained_src)
    findings += check_spec_flags(cfg.engine, cfg.num_steps, cfg.topk, cfg.num_draft_tokens)
    timings["static_s"] = round(time.perf_counter() - t_start, 3)
    configured = sv.hs_ids
    wiring: dict[str, Any] = {"configured": configured, "best": None, "trained": trained,
                              "configured_source": sv.source,
                              "scores": {"configured": None, "best": None, "trained": None, "top": []}}
    online_info = None
    if cfg.search or cfg.online:
        draft, why = runnable_draft(view, tv, trained, device=tv.loaded.device if tv.loaded else "cpu")
        if draft is None:
            findings.append(Finding("search-skipped", "info", f"wiring search not run: {why}.", None))
        elif tv.loaded is None and cfg.states is None:
            findings.append(Finding("search-skipped", "info",
                                    f"wiring search not run: target '{tv.name}' has no weights here; capture its states "
                                    "where it runs and pass them with --states.",
                                    f"specwire dump-states --target {tv.name} --prompts builtin --out STATES  # then: "
                                    f"specwire doctor {view.path} --target {tv.name} --states STATES"))
        elif cfg.search:
            _search(draft, tv, cfg, calibration, configured, trained, sv, findings, wiring, timings)
        if cfg.online and draft is not None and tv.loaded is not None and configured and trained and \
                len(configured) == len(trained) and view.format == FORMAT_NATIVE:
            ts = time.perf_counter()
            try:
                prompts = (data_prompts(cfg.data) if cfg.data is not None else None) or ONLINE_PROMPTS
                online_info = offline_vs_online(draft, tv, served_hs=list(configured), trained_hs=list(trained),
                                                served_nbr=sv.norm_before_residual, prompts=prompts,
                                                max_new_tokens=cfg.online_new_tokens)
                findings += _online_findings(online_info, sv, trained)
            except (ImportError, SpecwireError) as e:
                findings.append(Finding("online-skipped", "info", f"offline-vs-online comparison not run: {e}", None))
            timings["online_s"] = round(time.perf_counter() - ts, 3)
        elif cfg.online and draft is not None and tv.loaded is not None:
            findings.append(Finding("online-skipped", "info",
                                    "offline-vs-online comparison not run: the engine runs native checkpoints with a known "
                                    "trained wiring (`specwire import D --out DIR` first).", None))
    timings["total_s"] = round(time.perf_counter() - t_start, 3)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings.sort(key=lambda f: order[f.severity])
    ok = not any(f.severity == "error" for f in findings)
    return DoctorReport(ok=ok, findings=findings, wiring=wiring, draft=str(draft_path), target=tv.name, engine=cfg.engine,
                        timings=timings, online=online_info)


def _search(draft, tv: TargetView, cfg: DoctorConfig, calibration: Calibration | None, configured, trained,
            sv: ServingView, findings: list[Finding], wiring: dict, timings: dict) -> None:
    """The wiring search and the empirical residual-mode check; results go into `findings`, `wiring`, `timings`."""
    ts = time.perf_counter()
    if calibration is not None:
        cal = calibration
    elif cfg.states is not None:
        cal, _ = load_states(cfg.states, tv)
    elif cfg.data is not None:
        cal = data_calibration(tv.loaded, cfg.data, max_samples=cfg.calib_prompts)
    else:
        cal = builtin_calibration(tv.loaded, num_prompts=cfg.calib_prompts, max_new_tokens=cfg.calib_new_tokens)
    timings["calibration_s"] = round(time.perf_counter() - ts, 3)
    ts = time.perf_counter()
    sc = WiringScorer(draft, cal)
    timings["precompute_s"] = round(time.perf_counter() - ts, 3)
    res = search_wirings(sc, must_score=[configured, trained], keep=cfg.keep)
    timings["search_s"] = round(res.seconds, 3)
    findings += _search_findings(res, configured, trained, sv, tv.num_layers, cal)
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
    c_alt, _ = sc.evaluate(torch.tensor([res.best]), sc.scored_positions, full_vocab=True, norm_before_residual=not sc.nbr)
    alt_score = float(c_alt.float().mean())
    wiring["scores"]["norm_before_residual"] = {str(sc.nbr).lower(): res.best_score, str(not sc.nbr).lower(): alt_score}
    if alt_score > res.best_score + max(0.05, 0.2 * res.best_score):
        findings.append(Finding("norm-before-residual-empirical", "error",
                                f"the draft agrees with the target {alt_score:.1%} of the time with norm_before_residual="
                                f"{str(not sc.nbr).lower()} but {res.best_score:.1%} with the recorded "
                                f"{str(sc.nbr).lower()}: the checkpoint records the wrong residual mode.",
                                f'"norm_before_residual": {str(not sc.nbr).lower()}'))
    timings["residual_check_s"] = round(time.perf_counter() - ts, 3)


# How much better (in step-0 agreement) another wiring must score before the search calls the configured or the
# recorded one wrong: about 13 of the built-in text's 449 positions. Wirings that differ only in a middle layer by a
# few places can tie with the trained one for a well-trained draft; a wrong residual mode or a shifted list cannot.
SEARCH_MARGIN = 0.03


def _search_findings(res: SearchResult, configured, trained, sv: ServingView, L: int, cal: Calibration) -> list[Finding]:
    out = []
    conf = res.scores.get(tuple(configured)) if configured else None
    top = ", ".join(f"hs {w} {s:.1%}" for w, s in res.top[:3])
    margin = SEARCH_MARGIN
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

