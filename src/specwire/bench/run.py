"""Side-by-side benchmark of decoding methods: `specwire bench`.

Owns: `BenchConfig`, running every method on the same prompts in one process (same dtype, same
thread count, prompt-major interleaving after a short warm-up), the lossless check of every
method's output against plain greedy decoding, resuming an interrupted run from its record
(`benchlog`), the aggregate numbers (tok/s, accept length, acceptance per draft position,
draft/verify/other time, speed-ups over `hf-generate` and over `plain`), the run folder
(results.md / results.png / results.json) and the `bench` subcommand.

Does not own: the decoding itself (`plain`, `engine`, transformers' `generate`), prompt sets
(`prompts`), or how a report looks (`report`: Markdown table, plot).

Methods:
- `hf-generate`: transformers `generate`, greedy, batch 1 (the baseline a user already has);
- `hf-prompt-lookup`: the same with `prompt_lookup_num_tokens=10` (n-gram drafting from the prompt);
- `plain`: `specwire.decode.plain.plain_generate`, our own KV-cached loop and the greedy oracle;
- `eagle3-chain`, `eagle3-tree`: `specwire.decode.engine.speculative_generate` with the draft.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import os
import platform
import re
import shlex
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from specwire.bench.record import RUNS_FILE, append_prompt, resume_record, start_record
from specwire.errors import SpecwireError

METHODS = ("hf-generate", "hf-prompt-lookup", "plain", "eagle3-chain", "eagle3-tree")
# BenchConfig fields a resumed run may change: a larger limit extends a run with more prompts.
RESUME_FREE_FIELDS = ("limit", "out_dir", "resume", "progress", "command")
DRAFT_METHODS = ("eagle3-chain", "eagle3-tree")
REFERENCE = "plain"  # every method's output is compared with this one's (greedy oracle)
BASELINE = "hf-generate"
PROMPT_LOOKUP_TOKENS = 10  # n-gram candidates per step for hf-prompt-lookup


def parse_methods(text: str | Sequence[str]) -> tuple[str, ...]:
    """'a,b,c' or a list -> validated tuple of method names, in the order given, no duplicates."""
    items = [m.strip() for m in (text.split(",") if isinstance(text, str) else text)]
    items = [m for m in items if m]
    unknown = [m for m in items if m not in METHODS]
    if unknown or not items:
        raise SpecwireError(
            f"--methods: unknown method(s) {unknown} in {text!r}; expected a comma-separated subset of {', '.join(METHODS)}."
            if unknown else "--methods: no method given.",
            fix=f"--methods {','.join(METHODS)}",
        )
    seen: list[str] = []
    for m in items:
        if m not in seen:
            seen.append(m)
    return tuple(seen)


@dataclass
class BenchConfig:
    """What to benchmark. Everything a run depends on is here, so a report can be reproduced."""

    target: str = "smollm2-135m"  # built-in target name or HF folder
    draft: str | None = "smollm2-135m-eagle3"  # draft folder or shipped name; needed only by eagle3 methods
    prompts: str = "mt-bench"  # "mt-bench", "humaneval" or a JSONL path (see specwire.data.prompts)
    limit: int | None = None  # first N prompts (None = all)
    max_new_tokens: int = 128  # per prompt and method
    methods: tuple[str, ...] = METHODS  # subset of METHODS; `plain` is always run (it is the oracle)
    num_steps: int | None = None  # draft depth (None: the engine's SpecConfig default)
    topk: int | None = None  # tree branching per step (None: engine default)
    num_draft_tokens: int | None = None  # tree budget of draft tokens per verify pass (None: engine default)
    device: str | None = None  # torch device (None: cuda when available, else cpu)
    dtype: str = "float32"  # weights dtype, the same for every method
    linear: str = "torch"  # the target's linear layers ("torch" or "pretransposed"), shared by every method
    threads: int | None = None  # torch CPU threads (None: leave torch's setting)
    warmup_tokens: int = 16  # new tokens per method on the first prompt before timing (0 = no warm-up)
    out_dir: str | None = None  # run folder (None: runs/bench-<prompts>-<timestamp>/); "" = write nothing
    resume: bool = True  # continue the record (runs.jsonl) an interrupted run left in out_dir; False: measure afresh
    progress: bool = True  # tqdm progress bar on stderr
    command: str | None = None  # the command line recorded in results.md (None: `cli_command()`)

    def __post_init__(self):
        self.methods = parse_methods(self.methods)
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise SpecwireError(f"BenchConfig.max_new_tokens: expected a positive integer, found {self.max_new_tokens!r}.")
        if self.limit is not None and (not isinstance(self.limit, int) or isinstance(self.limit, bool) or self.limit < 1):
            raise SpecwireError(f"BenchConfig.limit: expected a positive integer or None, found {self.limit!r}.")
        for name in ("num_steps", "topk", "num_draft_tokens", "threads"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise SpecwireError(f"BenchConfig.{name}: expected a positive integer or None, found {v!r}.",
                                    fix=f"--{name.replace('_', '-')} 4")
        if not isinstance(self.warmup_tokens, int) or self.warmup_tokens < 0:
            raise SpecwireError(f"BenchConfig.warmup_tokens: expected an integer >= 0, found {self.warmup_tokens!r}.")
        if self.needs_draft and not self.draft:
            raise SpecwireError(f"methods {[m for m in self.methods if m in DRAFT_METHODS]} need a draft; none given.",
                                fix="pass --draft DIR, or leave eagle3-chain/eagle3-tree out of --methods.")

    @property
    def needs_draft(self) -> bool:
        return any(m in DRAFT_METHODS for m in self.methods)

    @property
    def run_methods(self) -> tuple[str, ...]:
        """The methods actually run: the requested ones, plus `plain` (the oracle) if it was left out."""
        return self.methods if REFERENCE in self.methods else self.methods + (REFERENCE,)

    def cli_command(self) -> str:
        """A `specwire bench` command line that reproduces this configuration, every setting explicit."""
        argv = ["specwire", "bench", "--target", self.target, "--prompts", self.prompts]
        if self.needs_draft:
            argv += ["--draft", str(self.draft)]
        if self.limit is not None:
            argv += ["--limit", str(self.limit)]
        argv += ["--max-new-tokens", str(self.max_new_tokens), "--methods", ",".join(self.methods)]
        for name in ("num_steps", "topk", "num_draft_tokens", "device", "threads"):
            if getattr(self, name) is not None:
                argv += [f"--{name.replace('_', '-')}", str(getattr(self, name))]
        argv += ["--dtype", self.dtype, "--linear", self.linear, "--warmup-tokens", str(self.warmup_tokens)]
        return shlex.join(argv)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["methods"] = list(self.methods)
        return d

    def resume_settings(self) -> dict[str, Any]:
        """The settings a resumed run must share with the record (where it writes and how many prompts may differ)."""
        return {k: v for k, v in self.to_dict().items() if k not in RESUME_FREE_FIELDS}


# ---- results ---------------------------------------------------------------------------------------

@dataclass
class PromptRun:
    """One method on one prompt."""

    method: str
    prompt_id: str
    prompt_tokens: int  # length of the chat-templated prompt
    output_ids: list[int]  # generated ids (EOS included when hit)
    seconds: float  # wall time of the generation call
    target_forwards: int | None  # target passes, prefill included (None when unknown)
    stop_reason: str  # "eos" | "length"
    extra: dict = field(default_factory=dict)  # engine metrics (accept_length, accept_per_position, draft_s, ...)

    def summary(self) -> dict[str, Any]:
        return {"method": self.method, "prompt_id": self.prompt_id, "prompt_tokens": self.prompt_tokens,
                "new_tokens": len(self.output_ids), "seconds": self.seconds, "target_forwards": self.target_forwards,
                "stop_reason": self.stop_reason, "accept_length": self.extra.get("accept_length")}


@dataclass
class MethodResult:
    """Aggregate of one method over all prompts of a run."""

    method: str
    tokens: int  # generated tokens, all prompts
    seconds: float  # generation wall time, all prompts
    tokens_per_s: float  # tokens / seconds
    target_forwards: int | None  # target passes, all prompts (None when unknown)
    tokens_per_forward: float | None  # tokens / target_forwards
    accept_length: float | None  # mean tokens per verify pass (accepted drafts + bonus); None without a draft
    accept_per_position: list[float] | None  # position k: accepted / reached over verify passes (0 first); None without a draft
    lossless: bool  # output identical to plain greedy on every prompt
    mismatches: int  # prompts whose output differs from plain greedy
    first_mismatch: dict | None  # {"prompt_id", "position"} of the first difference, if any
    time_split: dict | None  # {"draft_s", "verify_s", "other_s", "verify_passes"} summed, for draft methods
    speedup_vs_hf: float | None = None  # tokens_per_s / hf-generate's (None when not run)
    speedup_vs_plain: float | None = None  # tokens_per_s / plain's

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BenchReport:
    """Everything `bench` reports; `to_dict` is the `--json` object (stable keys: DESIGN.md)."""

    config: BenchConfig
    results: list[MethodResult]  # in the order of config.methods (+ plain when added as oracle)
    prompt_ids: list[str]  # ids of the prompts used, in order
    machine: dict[str, Any]  # torch version, threads, CPU model, device, dtype
    spec: dict[str, Any] | None  # the engine's SpecConfig used by eagle3 methods
    runs: list[PromptRun]  # every (method, prompt) run, in execution order
    notes: list[str] = field(default_factory=list)  # things a reader must know (oracle added, ...)
    run_dir: str | None = None  # where results.md/png/json were written

    def result(self, method: str) -> MethodResult | None:
        return next((r for r in self.results if r.method == method), None)

    @property
    def best_draft_method(self) -> MethodResult | None:
        cands = [r for r in self.results if r.method in DRAFT_METHODS]
        return max(cands, key=lambda r: r.tokens_per_s) if cands else None

    def to_dict(self) -> dict[str, Any]:
        reference = {r.prompt_id: r.output_ids for r in self.runs if r.method == REFERENCE}
        return {
            "results": [
                {"method": r.method, "tokens_per_s": r.tokens_per_s, "accept_length": r.accept_length,
                 "lossless": r.lossless, "speedup_vs_hf": r.speedup_vs_hf, "speedup_vs_plain": r.speedup_vs_plain,
                 "tokens": r.tokens, "seconds": r.seconds, "target_forwards": r.target_forwards,
                 "tokens_per_forward": r.tokens_per_forward, "accept_per_position": r.accept_per_position,
                 "mismatches": r.mismatches, "first_mismatch": r.first_mismatch, "time_split": r.time_split}
                for r in self.results
            ],
            "prompts": self.config.prompts,
            "n_prompts": len(self.prompt_ids),
            "max_new_tokens": self.config.max_new_tokens,
            "target": self.config.target,
            "draft": self.config.draft if self.config.needs_draft else None,
            "spec": self.spec,
            "machine": self.machine,
            "prompt_ids": self.prompt_ids,
            "notes": self.notes,
            "command": self.config.command or self.config.cli_command(),
            "run_dir": self.run_dir,
            "per_prompt": [{**r.summary(), "matches_plain": reference.get(r.prompt_id) == r.output_ids} for r in self.runs],
        }


# ---- the maths of the summary (pure) -----------------------------------------------------------------

def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two id lists differ (length counts), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def weighted_positions(rows: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """Per-position mean of rate rows of possibly different lengths, each row weighted (by its passes)."""
    width = max((len(r) for r in rows), default=0)
    out = []
    for i in range(width):
        num = sum(r[i] * w for r, w in zip(rows, weights) if i < len(r))
        den = sum(w for r, w in zip(rows, weights) if i < len(r))
        out.append(num / den if den > 0 else 0.0)
    return out


def _sum_rows(rows: Sequence[Sequence[float]]) -> list[float]:
    width = max((len(r) for r in rows), default=0)
    return [float(sum(r[i] for r in rows if i < len(r))) for i in range(width)]


def summarize_method(method: str, runs: Sequence[PromptRun], reference: dict[str, list[int]]) -> MethodResult:
    """Aggregate one method's runs; `reference` maps prompt id -> plain greedy output ids."""
    tokens = sum(len(r.output_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    fwd = None if any(r.target_forwards is None for r in runs) else sum(r.target_forwards for r in runs)
    mismatches, first = 0, None
    for r in runs:
        pos = first_difference(r.output_ids, reference[r.prompt_id])
        if pos is not None:
            mismatches += 1
            first = first or {"prompt_id": r.prompt_id, "position": pos}
    accept = per_pos = split = None
    if method in DRAFT_METHODS:
        # Weight each request by its verify passes so the aggregate keeps the engine's definition.
        passes = [float(r.extra.get("num_verify_passes") or 0) for r in runs]
        if all("accept_length" in r.extra for r in runs) and sum(passes) > 0:
            accept = sum(float(r.extra["accept_length"]) * p for r, p in zip(runs, passes)) / sum(passes)
        elif fwd:
            accept = tokens / fwd
        if all("accept_counts" in r.extra and "reach_counts" in r.extra for r in runs):
            # exact: accepted / reached, summed over requests
            acc, reach = _sum_rows([r.extra["accept_counts"] for r in runs]), _sum_rows([r.extra["reach_counts"] for r in runs])
            per_pos = [a / n if n > 0 else 0.0 for a, n in zip(acc, reach)]
        else:
            rows = [r.extra.get("accept_per_position") or [] for r in runs]
            per_pos = weighted_positions(rows, passes if sum(passes) > 0 else [1.0] * len(rows))
        split = {k: sum(float(r.extra.get(k) or 0.0) for r in runs) for k in ("draft_s", "verify_s", "other_s")}
        split["verify_passes"] = int(sum(passes))
    return MethodResult(
        method=method, tokens=tokens, seconds=seconds,
        tokens_per_s=tokens / seconds if seconds > 0 else float("nan"),
        target_forwards=fwd, tokens_per_forward=(tokens / fwd) if fwd else None,
        accept_length=accept, accept_per_position=per_pos,
        lossless=mismatches == 0, mismatches=mismatches, first_mismatch=first, time_split=split,
    )


def add_speedups(results: Sequence[MethodResult]) -> None:
    """Fill speedup_vs_hf and speedup_vs_plain from the tok/s of the same run (None when a baseline is absent)."""
    by = {r.method: r for r in results}
    for r in results:
        for attr, base in (("speedup_vs_hf", BASELINE), ("speedup_vs_plain", REFERENCE)):
            b = by.get(base)
            ok = b is not None and b.tokens_per_s > 0 and r.tokens_per_s == r.tokens_per_s
            setattr(r, attr, r.tokens_per_s / b.tokens_per_s if ok else None)


def summarize(runs: Sequence[PromptRun], methods: Sequence[str]) -> list[MethodResult]:
    """All methods' results from the raw runs (reference = `plain`), speed-ups included."""
    reference = {r.prompt_id: r.output_ids for r in runs if r.method == REFERENCE}
    if not reference:
        raise SpecwireError("bench: no plain reference run; the lossless check needs `plain`.")
    results = [summarize_method(m, [r for r in runs if r.method == m], reference) for m in methods]
    add_speedups(results)
    return results


# ---- machine -------------------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device, dtype: torch.dtype, model: torch.nn.Module | None = None) -> dict[str, Any]:
    import transformers

    from specwire.target.fastlinear import is_pretransposed

    info = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
    }
    if model is not None:  # what the target's linear layers actually run (the config may ask for what CUDA skips)
        info["linear"] = "pretransposed" if is_pretransposed(model) else "torch"
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


# ---- the method runners ----------------------------------------------------------------------------

Runner = Callable[[list[int], int], PromptRun]  # (prompt_ids, max_new_tokens) -> PromptRun (method/prompt_id unset)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _hf_runner(target, *, prompt_lookup: bool) -> Runner:
    """transformers `generate`, greedy, batch 1; counts target passes with a forward pre-hook."""
    from transformers import GenerationConfig

    pad = target.tokenizer.pad_token_id if target.tokenizer is not None else None
    eos = target.eos_token_ids
    calls = [0]

    def count(_module, _args):
        calls[0] += 1

    def run(prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        gc = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                              eos_token_id=eos, pad_token_id=pad if pad is not None else eos[0],
                              prompt_lookup_num_tokens=PROMPT_LOOKUP_TOKENS if prompt_lookup else None)
        ids = torch.tensor([prompt_ids], device=target.device)
        mask = torch.ones_like(ids)
        calls[0] = 0
        handle = target.model.register_forward_pre_hook(count)
        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")
                _sync(target.device)
                t0 = time.perf_counter()
                out = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=gc)
                _sync(target.device)
                seconds = time.perf_counter() - t0
        finally:
            handle.remove()
        new = out[0, len(prompt_ids):].tolist()
        stop = "eos" if new and new[-1] in eos else "length"
        return PromptRun("", "", len(prompt_ids), new, seconds, calls[0], stop)

    return run


def _plain_runner(target) -> Runner:
    from specwire.decode.plain import plain_generate

    def run(prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        _sync(target.device)
        res = plain_generate(target, prompt_ids, max_new_tokens=max_new_tokens)
        _sync(target.device)
        return PromptRun("", "", len(prompt_ids), list(res.output_ids), res.seconds, res.target_forwards,
                         res.stop_reason, dict(res.extra))

    return run


def _engine_runner(target, draft, spec, *, tree: bool) -> Runner:
    from specwire.decode.engine import speculative_generate

    def run(prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        _sync(target.device)
        res = speculative_generate(target, draft, prompt_ids, max_new_tokens=max_new_tokens, tree=tree, spec=spec)
        _sync(target.device)
        return PromptRun("", "", len(prompt_ids), list(res.output_ids), res.seconds, res.target_forwards,
                         res.stop_reason, dict(res.extra))

    return run


def make_spec(config: BenchConfig):
    """The engine's SpecConfig with the overrides of `config` (engine defaults for the rest)."""
    from specwire.decode.engine import SpecConfig

    overrides = {k: getattr(config, k) for k in ("num_steps", "topk", "num_draft_tokens") if getattr(config, k) is not None}
    return SpecConfig(**overrides)


def load_bench_draft(config: BenchConfig, target):
    """The draft for eagle3 methods, loaded and checked against the target by the engine."""
    try:
        from specwire.decode.engine import load_engine_draft
    except ImportError as e:
        raise SpecwireError(f"methods eagle3-chain/eagle3-tree need specwire.decode.engine, which failed to import ({e}).",
                            fix="run the other methods: --methods hf-generate,hf-prompt-lookup,plain") from None
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
    from specwire.target.load import load_target

    if config.threads:
        torch.set_num_threads(config.threads)
    if records is None:
        records = load_prompts(config.prompts, limit=config.limit)
    elif config.limit is not None:
        records = list(records)[: config.limit]
    if not records:
        raise SpecwireError(f"prompt source {config.prompts!r} holds no prompts.")
    if target is None:
        target = load_target(config.target, device=config.device, dtype=config.dtype, linear=config.linear)
    spec = None
    runners: dict[str, Runner] = {}
    for m in config.run_methods:
        if m in ("hf-generate", "hf-prompt-lookup"):
            runners[m] = _hf_runner(target, prompt_lookup=m == "hf-prompt-lookup")
        elif m == "plain":
            runners[m] = _plain_runner(target)
    if config.needs_draft:
        if draft is None:
            draft = load_bench_draft(config, target)
        spec = make_spec(config)
        for m in DRAFT_METHODS:
            if m in config.run_methods:
                runners[m] = _engine_runner(target, draft, spec, tree=m == "eagle3-tree")
    notes: list[str] = []
    if REFERENCE not in config.methods:
        notes.append("plain was added to the run: it is the greedy oracle of the lossless check.")

    from specwire.decode.plain import check_request

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
    fallbacks = sorted({str(r.extra["tree_fallback"]) for r in runs if r.extra.get("tree_fallback")})
    if fallbacks:
        notes.append("eagle3-tree ran as a chain on this target: " + "; ".join(fallbacks))
    spec_dict = None
    if spec is not None and dataclasses.is_dataclass(spec):
        spec_dict = {k: v for k, v in dataclasses.asdict(spec).items() if k != "tree"}  # the method picks chain/tree
    report = BenchReport(
        config=config, results=results, prompt_ids=[pid for pid, _ in encoded], machine=machine, spec=spec_dict,
        runs=runs, notes=notes,
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
                                 prompt_tokens={pid: len(ids) for pid, ids in encoded}, methods=methods)
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


# ---- CLI ---------------------------------------------------------------------------------------------

def add_cli(sub) -> None:
    from specwire.cli import add_json_option, add_model_options

    p = sub.add_parser(
        "bench", help="side-by-side speed, acceptance and losslessness of decoding methods",
        description="Run hf-generate, hf-prompt-lookup, plain, eagle3-chain and eagle3-tree on the same prompts in one "
        "run (same dtype and threads, prompt-major interleaving, warm-up first). Every output is compared with plain "
        "greedy decoding (lossless column); speed-ups are given over hf-generate and over plain. Writes results.md, "
        "results.png and results.json into the run folder, and records every finished prompt in runs.jsonl there: "
        "rerunning an interrupted command resumes it (same settings and machine only).")
    add_model_options(p, draft=True, linear=True)
    p.add_argument("--prompts", default="mt-bench", help="mt-bench, humaneval, or a JSONL file (default: %(default)s)")
    p.add_argument("--limit", type=int, default=None, help="first N prompts (default: all)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="new tokens per prompt (default: %(default)s)")
    p.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of: %(default)s")
    p.add_argument("--num-steps", type=int, default=None, help="draft depth (default: the engine's)")
    p.add_argument("--topk", type=int, default=None, help="tree branching per step (default: the engine's)")
    p.add_argument("--num-draft-tokens", type=int, default=None, help="tree budget of draft tokens (default: the engine's)")
    p.add_argument("--warmup-tokens", type=int, default=16, help="warm-up tokens per method before timing (default: %(default)s)")
    p.add_argument("--out", default=None, help="run folder (default: runs/bench-<prompts>-<timestamp>/). A run "
                   "interrupted there resumes when the same command is rerun; a larger --limit extends a finished one")
    p.add_argument("--fresh", action="store_true", help="measure every prompt again, ignoring what --out has recorded")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json_option(p)
    p.set_defaults(func=cmd_bench)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    return BenchConfig(
        target=args.target, draft=args.draft, prompts=args.prompts, limit=args.limit,
        max_new_tokens=args.max_new_tokens, methods=parse_methods(args.methods), num_steps=args.num_steps,
        topk=args.topk, num_draft_tokens=args.num_draft_tokens, device=args.device, dtype=args.dtype,
        linear=args.linear, threads=args.threads, warmup_tokens=args.warmup_tokens, out_dir=args.out, resume=not args.fresh,
        progress=not args.no_progress,
        command=None,  # results.md records the equivalent command with every setting explicit
    )


def cmd_bench(args: argparse.Namespace) -> int:
    from specwire.cli import emit_json
    from specwire.bench.report import render_summary

    report = run_bench(config_from_args(args))
    if args.json:
        emit_json(report.to_dict())
    else:
        print(render_summary(report))
    return 0
