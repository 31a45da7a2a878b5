"""The bench's record types: what to run (`BenchConfig`) and what a run found (`PromptRun`, `MethodResult`,
`BenchReport`), plus the method names.

Owns: the method names and their roles (the `plain` oracle, the `hf-generate` baseline), validating a
bench configuration, the equivalent `specwire bench` command line, the settings a resumed run must
share with its record, and the `--json` object of a report. Imports nothing else of the bench: the
runner (`bench.run`), the record (`bench.record`), the maths (`bench.summary`) and the rendering
(`bench.report`) all import this module, never each other in a circle.

Methods:
- `hf-generate`: transformers `generate`, greedy, batch 1 (the baseline a user already has);
- `hf-prompt-lookup`: the same with `prompt_lookup_num_tokens` (n-gram drafting from the prompt);
- `plain`: `specwire.decode.plain.plain_generate`, our own KV-cached loop and the greedy oracle;
- `eagle3-chain`, `eagle3-tree`: `specwire.decode.engine.speculative_generate` with the draft.
"""

from __future__ import annotations

import dataclasses
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from specwire.decode.engine import SpecConfig
from specwire.errors import SpecwireError

METHODS = ("hf-generate", "hf-prompt-lookup", "plain", "eagle3-chain", "eagle3-tree")
DRAFT_METHODS = ("eagle3-chain", "eagle3-tree")
REFERENCE = "plain"  # every method's output is compared with this one's (greedy oracle)
BASELINE = "hf-generate"
PROMPT_LOOKUP_TOKENS = 10  # n-gram candidates per step for hf-prompt-lookup
SPEC_KNOBS = ("num_steps", "topk", "num_draft_tokens", "budget", "lookup")  # the SpecConfig fields a bench records (the method picks tree/chain)
# BenchConfig fields a resumed run may change: a larger limit extends a run with more prompts.
RESUME_FREE_FIELDS = ("limit", "out_dir", "resume", "progress", "command")


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


def _positive_or_none(owner: str, name: str, v: Any, flag: str) -> None:
    if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
        raise SpecwireError(f"{owner}.{name}: expected a positive integer or None, found {v!r}.", fix=f"{flag} 4")


@dataclass
class BenchConfig:
    """What to benchmark. Everything a run depends on is here, so a report can be reproduced."""

    target: str = "smollm2-135m"  # built-in target name or HF folder
    draft: str | None = "smollm2-135m-eagle3"  # draft folder or shipped name; needed only by eagle3 methods
    prompts: str = "mt-bench"  # mt-bench (mt-bench:spread: its 8 categories in turn), humaneval, or a JSONL file
    limit: int | None = None  # first N prompts (default: all)
    max_new_tokens: int = 128  # new tokens per prompt
    methods: tuple[str, ...] = METHODS  # comma-separated subset of the methods; plain always runs (it is the oracle)
    spec: SpecConfig = field(default_factory=SpecConfig)  # speculation of the eagle3 methods (its `tree` is ignored: the method picks)
    device: str | None = None  # torch device (None: cuda when available, else cpu)
    dtype: str = "auto"  # weights dtype, the same for every method ("auto": the fastest batch-invariant on this machine)
    linear: str = "auto"  # the target's linear layers ("auto", "torch", "pretransposed", "onednn", "rowdot" or "amx"), shared by every method
    threads: int | None = None  # torch CPU threads (None: leave torch's setting)
    warmup_tokens: int = 16  # warm-up tokens per method on the first prompt before timing (0: no warm-up)
    out_dir: str | None = None  # run folder (None: runs/bench-<prompts>-<timestamp>/); "" = write nothing
    resume: bool = True  # continue the record (runs.jsonl) an interrupted run left in out_dir; False: measure afresh
    progress: bool = True  # progress bar on stderr
    command: str | None = None  # the command line recorded in results.md (None: `cli_command()`)

    def __post_init__(self):
        self.methods = parse_methods(self.methods)
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise SpecwireError(f"BenchConfig.max_new_tokens: expected a positive integer, found {self.max_new_tokens!r}.",
                                fix="--max-new-tokens 128")
        _positive_or_none("BenchConfig", "limit", self.limit, "--limit")
        _positive_or_none("BenchConfig", "threads", self.threads, "--threads")
        if not isinstance(self.spec, SpecConfig):
            raise SpecwireError(f"BenchConfig.spec: expected a SpecConfig, found {type(self.spec).__name__}.")
        if not isinstance(self.warmup_tokens, int) or isinstance(self.warmup_tokens, bool) or self.warmup_tokens < 0:
            raise SpecwireError(f"BenchConfig.warmup_tokens: expected an integer >= 0, found {self.warmup_tokens!r}.",
                                fix="--warmup-tokens 16")
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

    def spec_settings(self) -> dict[str, Any]:
        """The speculation knobs the eagle3 methods use (what results.json's `spec` holds)."""
        return {k: getattr(self.spec, k) for k in SPEC_KNOBS}

    def cli_command(self) -> str:
        """A `specwire bench` command line that reproduces this configuration, every setting explicit."""
        argv = ["specwire", "bench", "--target", self.target, "--prompts", self.prompts]
        if self.needs_draft:
            argv += ["--draft", str(self.draft)]
        if self.limit is not None:
            argv += ["--limit", str(self.limit)]
        argv += ["--max-new-tokens", str(self.max_new_tokens), "--methods", ",".join(self.methods)]
        if self.needs_draft:
            for name, v in self.spec_settings().items():
                argv += [f"--{name.replace('_', '-')}", str(v)]
        for name in ("device", "threads"):
            if getattr(self, name) is not None:
                argv += [f"--{name.replace('_', '-')}", str(getattr(self, name))]
        argv += ["--dtype", self.dtype, "--linear", self.linear, "--warmup-tokens", str(self.warmup_tokens)]
        return shlex.join(argv)

    def to_dict(self) -> dict[str, Any]:
        """Flat settings: the speculation knobs sit beside the others (as runs.jsonl records them)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "spec"}
        d["methods"] = list(self.methods)
        return {**d, **self.spec_settings()}

    def resume_settings(self) -> dict[str, Any]:
        """The settings a resumed run must share with the record (where it writes and how many prompts may differ)."""
        return {k: v for k, v in self.to_dict().items() if k not in RESUME_FREE_FIELDS}


def upgrade_settings(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """Settings of an older runs.jsonl in today's terms: a knob recorded as null meant the engine's default."""
    d = dict(recorded)
    default = SpecConfig()
    for k in SPEC_KNOBS:
        if k in d and d[k] is None:
            d[k] = getattr(default, k)
    d.setdefault("budget", "fixed")  # runs recorded before `auto` used the knobs as given
    d.setdefault("lookup", 0)  # runs recorded before context lookup verified no copied tokens
    return d


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
    time_split: dict | None  # {"draft_s", "verify_s", "plain_s", "other_s", "verify_passes"} summed, for draft methods
    speedup_vs_hf: float | None = None  # tokens_per_s / hf-generate's (None when not run)
    speedup_vs_plain: float | None = None  # tokens_per_s / plain's
    budgets: dict[str, int] | None = None  # draft methods: rounds run with each speculation budget (auto's choices)
    lookup: dict[str, int] | None = None  # draft methods: {"rounds", "tokens", "accepted"} of the copied branch, summed

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class BenchReport:
    """Everything `bench` reports; `to_dict` is the `--json` object (stable keys: DESIGN.md)."""

    config: BenchConfig
    results: list[MethodResult]  # in the order of config.methods (+ plain when added as oracle)
    prompt_ids: list[str]  # ids of the prompts used, in order
    machine: dict[str, Any]  # torch version, threads, CPU model, device, dtype
    spec: dict[str, Any] | None  # the speculation knobs the eagle3 methods used (None without them)
    runs: list[PromptRun]  # every (method, prompt) run, in execution order
    notes: list[str] = field(default_factory=list)  # things a reader must know (oracle added, ...)
    run_dir: str | None = None  # where results.md/png/json were written
    categories: dict[str, str] = field(default_factory=dict)  # prompt id -> its category ("" when unknown)
    by_category: dict[str, list[MethodResult]] = field(default_factory=dict)  # category -> its results ({}: under two)

    def result(self, method: str) -> MethodResult | None:
        return next((r for r in self.results if r.method == method), None)

    def prompts_in(self, category: str) -> int:
        """How many of the run's prompts belong to `category`."""
        return sum(self.categories.get(p) == category for p in self.prompt_ids)

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
                 "mismatches": r.mismatches, "first_mismatch": r.first_mismatch, "time_split": r.time_split,
                 "budgets": r.budgets}
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
            "by_category": {
                cat: {"n_prompts": self.prompts_in(cat),
                      "results": [{"method": r.method, "tokens_per_s": r.tokens_per_s, "accept_length": r.accept_length,
                                   "speedup_vs_plain": r.speedup_vs_plain, "lossless": r.lossless,
                                   "accept_per_position": r.accept_per_position} for r in results]}
                for cat, results in self.by_category.items()
            },
        }
