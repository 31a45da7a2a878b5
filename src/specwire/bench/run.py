"""Running a side-by-side benchmark of decoding methods (`specwire bench`, `specwire demo`).

Owns: running every method on the same prompts in one process (same dtype, same thread count,
prompt-major interleaving with the method order rotated per prompt, after a short warm-up), the
method runners, the machine description a record is tied to, resuming an interrupted run from its
record (`bench.record`), and writing the run folder (results.md / results.png / results.json).

Does not own: the decoding itself (`decode.plain`, `decode.engine`, transformers' `generate`), the
configuration and result types (`bench.config`), the summary maths (`bench.summary`), prompt sets
(`data.prompts`), how a report looks (`bench.report`), or the command line (`cli.bench`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import platform
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from specwire.bench.config import (
    DRAFT_METHODS,
    PROMPT_LOOKUP_TOKENS,
    REFERENCE,
    BenchConfig,
    BenchReport,
    PromptRun,
    upgrade_settings,
)
from specwire.bench.record import RUNS_FILE, append_prompt, resume_record, start_record
from specwire.bench.summary import summarize, summarize_by_category
from specwire.decode.engine import SpecConfig, load_engine_draft, speculative_generate
from specwire.decode.plain import check_request, plain_generate
from specwire.errors import SpecwireError
from specwire.target.attention import ATTENTION_NAME, kernels_available
from specwire.target.cpu import cpu_features, cpu_model
from specwire.target.hardware import synchronize

# ---- machine -------------------------------------------------------------------------------------------

def machine_info(device: torch.device, dtype: torch.dtype, model: torch.nn.Module | None = None) -> dict[str, Any]:
    import transformers

    from specwire.target.fastlinear import linear_kind, linear_min_rows

    info = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_features": [f for f, on in cpu_features().items() if on],
        "cpu_count": os.cpu_count(),
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
    }
    if model is not None:  # what the target's linear layers actually run (the config may ask for what CUDA skips)
        info["linear"] = linear_kind(model)
        info["linear_min_rows"] = linear_min_rows(model)
        info["attention"] = getattr(model.config, "_attn_implementation", None)
        if info["attention"] == ATTENTION_NAME:  # which form of the invariant attention ran (`target.attention`)
            info["attention"] += " (compiled)" if device.type == "cpu" and kernels_available() else " (torch)"
    if device.type == "cpu" and kernels_available():  # which build of the compiled kernels timed the runs
        from specwire.target.hardware import kernels_digest

        info["kernels"] = kernels_digest()
    if info.get("linear") == "rowdot":  # and what they read a pass (compact forms: fewer bytes)
        from specwire.target.fastlinear import weight_bytes

        info["weights_read_mb"] = round(weight_bytes(model)[0] / 1e6)
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# ---- the method runners ----------------------------------------------------------------------------

Runner = Callable[[list[int], int], PromptRun]  # (prompt_ids, max_new_tokens) -> PromptRun (method/prompt_id unset)


def _hf_runner(target, *, prompt_lookup: bool) -> Runner:
    """transformers `generate`, greedy, batch 1, on transformers' own kernels (sdpa, unpadded linear layers: see
    `target.invariance.stock_kernels`); counts target passes with a forward pre-hook."""
    from transformers import GenerationConfig

    pad = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    eos = target.eos_token_ids
    calls = [0]

    def count(_module, _args):
        calls[0] += 1

    def run(prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        from specwire.target.invariance import stock_kernels

        gc = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                              eos_token_id=eos, pad_token_id=pad if pad is not None else eos[0],
                              prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS if prompt_lookup else None)
        ids = torch.tensor([prompt_ids], device=target.device)
        mask = torch.ones_like(ids)
        calls[0] = 0
        handle = target.model.register_forward_pre_hook(count)
        try:
            with warnings.catch_warnings(), torch.inference_mode(), stock_kernels(target.model):
                warnings.simplefilter("ignore")
                synchronize(target.device)
                t0 = time.perf_counter()
                out = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
                synchronize(target.device)
                seconds = time.perf_counter() - t0
        finally:
            handle.remove()
        new = out[0, len(prompt_ids):].tolist()
        stop = "eos" if new and new[-1] in eos else "length"
        return PromptRun("", "", len(prompt_ids), new, seconds, calls[0], stop)

    return run


def _plain_runner(target) -> Runner:
    def run(prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        synchronize(target.device)
        res = plain_generate(target, prompt_ids, max_new_tokens=max_new_tokens)
        synchronize(target.device)
        return PromptRun("", "", len(prompt_ids), list(res.output_ids), res.seconds, res.target_forwards,
                         res.stop_reason, dict(res.extra))

    return run


def _engine_runner(target, draft, spec: SpecConfig, *, tree: bool) -> Runner:
    """`speculative_generate` with `spec`'s knobs, drafting a tree or a chain as the method says."""
    spec = dataclasses.replace(spec, tree=tree)

    def run(prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        synchronize(target.device)
        res = speculative_generate(target, draft, prompt_ids, max_new_tokens=max_new_tokens, tree=tree, spec=spec)
        synchronize(target.device)
        return PromptRun("", "", len(prompt_ids), list(res.output_ids), res.seconds, res.target_forwards,
                         res.stop_reason, dict(res.extra))

    return run


def load_bench_draft(config: BenchConfig, target):
    """The draft for eagle3 methods, loaded and checked against the target by the engine."""
    try:
        return load_engine_draft(config.draft, target)
    except SpecwireError as e:
        if e.fix:
            raise
        raise SpecwireError(str(e), fix="pass --draft DIR, or run without a draft: --methods hf-generate,hf-prompt-lookup,plain") from None


def default_run_dir(prompts: str, *, root: str | os.PathLike = "runs", prefix: str = "bench") -> Path:
    """runs/<prefix>-<prompt set>-<timestamp>/ (relative to the working directory)."""
    name = prompts if prompts in ("mt-bench", "humaneval", "pool") else Path(prompts).stem
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", name) or "prompts"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{prefix}-{name}-{stamp}"


# ---- the run -----------------------------------------------------------------------------------------

def run_bench(config: BenchConfig, *, target=None, draft=None, records=None) -> BenchReport:
    """Run every method on every prompt (prompt-major), check losslessness, summarise, write the run folder.

    `target`/`draft` may be passed already loaded (the demo does); `records` (PromptRecords) replaces
    loading `config.prompts`.
    """
    from specwire.data.prompts import load_prompts
    from specwire.decode.kernels import load_decoding_target

    if config.threads:
        torch.set_num_threads(config.threads)
    if records is None:
        records = load_prompts(config.prompts, limit=config.limit)
    elif config.limit is not None:
        records = list(records)[: config.limit]
    if not records:
        raise SpecwireError(f"prompt source {config.prompts!r} holds no prompts.")
    if target is None:
        target = load_decoding_target(config.target, device=config.device, dtype=config.dtype, linear=config.linear)
    spec = None  # the knobs the eagle3 methods use, as the report states them
    runners: dict[str, Runner] = {}
    for m in config.run_methods:
        if m in ("hf-generate", "hf-prompt-lookup"):
            runners[m] = _hf_runner(target, prompt_lookup=m == "hf-prompt-lookup")
        elif m == "plain":
            runners[m] = _plain_runner(target)
    if config.needs_draft:
        if draft is None:
            draft = load_bench_draft(config, target)
        spec = config.spec_settings()
        for m in DRAFT_METHODS:
            if m in config.run_methods:
                runners[m] = _engine_runner(target, draft, config.spec, tree=m == "eagle3-tree")
    notes: list[str] = []
    if REFERENCE not in config.methods:
        notes.append("plain was added to the run: it is the greedy oracle of the lossless check.")

    encoded = []
    for rec in records:  # every prompt checked before any timing starts
        ids = target.encode_chat(list(rec.messages))
        try:
            check_request(target, ids, config.max_new_tokens)
        except SpecwireError as e:
            raise SpecwireError(f"prompt {rec.id!r} of {config.prompts}: {e}") from None
        encoded.append((rec.id, ids))
    methods = config.run_methods
    machine = machine_info(target.device, target.dtype, target.model)
    if draft is not None:  # what the draft's products ran (`decode.draft_step.draft_products`)
        from specwire.decode.draft_step import draft_products

        machine["draft_products"] = draft_products(draft)
    out = None if config.out_dir == "" else Path(config.out_dir) if config.out_dir else default_run_dir(config.prompts)
    done, when = _open_record(config, out, machine, encoded, methods)
    if done:
        dated = f" {when}" if when else ""  # ' on 2026-12-01', or nothing for lines recorded without a time
        notes.append(f"resumed: {len(done)} of {len(encoded)} prompts were measured by an earlier invocation{dated}, "
                     f"on a machine with the same CPU, core count and software ({RUNS_FILE}); each prompt's methods "
                     "always ran side by side in one process.")

    if config.warmup_tokens and len(done) < len(encoded):
        wid = encoded[0][1]
        for m in methods:
            runners[m](wid, min(config.warmup_tokens, config.max_new_tokens))

    runs: list[PromptRun] = []
    bar = _progress(total=len(encoded) * len(methods), enabled=config.progress)
    try:
        for i, (pid, ids) in enumerate(encoded):
            if pid in done:
                runs += done[pid]
                bar.update(len(methods))
                continue
            k = i % len(methods)  # rotate the order per prompt: no method always runs first (cold) or last
            prompt_runs = []
            for m in methods[k:] + methods[:k]:
                bar.set_postfix_str(f"{m} {pid}", refresh=False)
                run = runners[m](ids, config.max_new_tokens)
                run.method, run.prompt_id = m, pid
                prompt_runs.append(run)
                bar.update(1)
            runs += prompt_runs
            if out is not None:
                append_prompt(out / RUNS_FILE, pid, [dataclasses.asdict(r) for r in prompt_runs])
    finally:
        bar.close()

    results = summarize(runs, methods)
    categories = {rec.id: rec.category for rec in records}
    fallbacks = sorted({str(r.extra["tree_fallback"]) for r in runs if r.extra.get("tree_fallback")})
    if fallbacks:
        notes.append("eagle3-tree ran as a chain on this target: " + "; ".join(fallbacks))
    report = BenchReport(
        config=config, results=results, prompt_ids=[pid for pid, _ in encoded], machine=machine, spec=spec,
        runs=runs, notes=notes, categories=categories,
        by_category=summarize_by_category(runs, methods, categories),
    )
    if out is not None:
        report.run_dir = str(write_run_folder(report, out))
    return report


def _open_record(config: BenchConfig, out: Path | None, machine: dict, encoded,
                 methods) -> tuple[dict[str, list[PromptRun]], str]:
    """The runs an earlier invocation recorded in out/runs.jsonl (resume) and when, as dates ('' if unrecorded);
    or a new record, and ({}, '') when nothing is done."""
    if out is None:
        return {}, ""
    path = out / RUNS_FILE
    settings = config.resume_settings()
    done, when = {}, ""
    if config.resume:
        recorded = resume_record(path, settings=settings, machine=machine,
                                 prompt_tokens={pid: len(ids) for pid, ids in encoded}, methods=methods,
                                 upgrade=upgrade_settings)
        if recorded is not None:
            done = {pid: [_prompt_run(r, path) for r in runs] for pid, runs in recorded.prompts.items()}
            when = recorded.sittings()
    if not done:
        out.mkdir(parents=True, exist_ok=True)
        start_record(path, settings=settings, machine=machine)
    return done, when


def _prompt_run(d: dict, path: Path) -> PromptRun:
    names = {f.name for f in dataclasses.fields(PromptRun)}
    if set(d) != names:
        raise SpecwireError(f"{path}: a run of prompt {d.get('prompt_id')!r} has fields {sorted(d)}, expected {sorted(names)}.",
                            fix="pass --fresh to measure again.")
    return PromptRun(**d)


def _progress(*, total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="bench", unit="run", disable=not enabled, file=sys.stderr, leave=False)


def write_run_folder(report: BenchReport, out: Path) -> Path:
    """results.md, results.png and results.json into `out` (each written atomically)."""
    from specwire.bench.report import render_markdown, save_plot
    from specwire.safeio import write_json, write_text

    out.mkdir(parents=True, exist_ok=True)
    report.run_dir = str(out)
    write_json(out / "results.json", report.to_dict())
    write_text(out / "results.md", render_markdown(report))
    save_plot(report, out / "results.png")
    return out
