"""The demo (`specwire demo`): the main job on built-in defaults, from loading to the doctor's verdict.

Owns: `DemoConfig`, the demo's prompts, its sequence (describe the target and its wiring, load the
shipped draft or say why it cannot, stream a few answers, benchmark the methods side by side on a few
MT-bench prompts with the lossless check, print the doctor's verdict), and `render_info`, the text
description of a target that `specwire info` prints too. Every line goes through a `say` function,
so a front end decides where it goes. Does not own decoding (`decode.generate`), benchmarking
(`bench.run`), the diagnosis (`doctor.diagnose`) or argument parsing (`cli.demo`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from specwire.bench.config import DRAFT_METHODS, BenchConfig, BenchReport
from specwire.bench.report import render_budgets, render_lookup, render_positions, render_table, speedup_sentence
from specwire.bench.run import default_run_dir, run_bench
from specwire.decode.engine import SpecConfig, load_engine_draft
from specwire.decode.generate import decode_reply
from specwire.data.prompts import SPREAD_MT_BENCH
from specwire.draft.model import SHIPPED_DRAFT
from specwire.errors import SpecwireError
from specwire.decode.kernels import load_decoding_target
from specwire.target.load import BUILTIN_TARGET, Target, TargetInfo
from specwire.wiring import CONVENTIONS

DEMO_PROMPTS = [
    "What are three tips for staying productive when working from home?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in a few sentences why the sky is blue.",
]
DEMO_WARMUP_TOKENS = 8  # warm-up tokens per method before the demo's benchmark

# What each convention's ids mean, for the wiring table.
CONVENTION_MEANING = {
    "hs": "hs index: input of layer k (0 = embeddings, L = last layer, pre-norm)",
    "sglang": "eagle_config.eagle_aux_hidden_state_layer_ids: output of layer k",
    "vllm": "eagle_aux_hidden_state_layer_ids: hs index",
    "speculators": "eagle_aux_hidden_state_layer_ids: hs index",
    "specforge": "layer-output ids, SGLang style",
    "eagle": "original EAGLE training code: hs index",
}


def render_info(info: TargetInfo) -> str:
    """A target described from its config: architecture, sizes, and the default wiring in every convention."""
    lines = [
        f"target            {info.name}  ({info.path})",
        f"architecture      {info.architecture} (model_type {info.model_type})",
        f"layers (L)        {info.num_layers}",
        f"hidden size       {info.hidden_size}",
        f"vocab size        {info.vocab_size}",
        f"tied embeddings   {info.tie_word_embeddings}",
        f"max positions     {info.max_position_embeddings}",
        "",
        "default EAGLE-3 wiring (the same three states, in each tool's convention):",
    ]
    if not info.default_wiring:
        lines.append(f"  (none: a {info.num_layers}-layer target has no three distinct default states; pass --hs-ids)")
    for c in CONVENTIONS if info.default_wiring else ():
        lines.append(f"  {c:<12} {str(info.default_wiring[c]):<16} {CONVENTION_MEANING[c]}")
    return "\n".join(lines)


@dataclass
class DemoConfig:
    """What the demo runs on and how long it takes."""

    target: str = BUILTIN_TARGET  # built-in target name or HF model folder
    draft: str = SHIPPED_DRAFT  # draft folder or the shipped draft (missing shipped draft: plain decoding)
    max_new_tokens: int = 64  # new tokens per streamed answer
    bench_prompts: int = 8  # MT-bench prompts in the benchmark, one from each category in turn ("mt-bench:spread")
    bench_tokens: int = 64  # new tokens per benchmark prompt
    out: str | None = None  # benchmark run folder (default: runs/demo-mt-bench-<timestamp>/)
    device: str | None = None  # torch device (None: cuda when available, else cpu)
    dtype: str = "auto"  # weights dtype ("auto": the fastest batch-invariant on this machine)
    linear: str = "auto"  # the target's linear layers ("auto", "torch", "pretransposed", "onednn", "rowdot" or "amx")
    threads: int | None = None  # torch CPU threads (None: leave torch's setting)

    def __post_init__(self):
        for name in ("max_new_tokens", "bench_prompts", "bench_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecwireError(f"DemoConfig.{name}: expected a positive integer, found {v!r}.",
                                    fix=f"--{name.replace('_', '-')} {type(self).__dataclass_fields__[name].default}")


def demo_draft(config: DemoConfig, target: Target):
    """(draft, None) or (None, why not). Only the default shipped draft may be missing: then the demo decodes plainly."""
    from specwire.draft.checkpoint import shipped_draft_dir

    shipped = config.draft == SHIPPED_DRAFT
    if shipped and not (shipped_draft_dir() / "config.json").is_file():
        return None, f"no shipped draft is installed ({shipped_draft_dir()} is missing)"
    try:
        return load_engine_draft(config.draft, target), None
    except SpecwireError as e:
        if not shipped:
            raise
        return None, f"the shipped draft does not fit target '{config.target}': {e}"


def doctor_verdict(draft_name: str, target: Target) -> str:
    """The doctor's one-line verdict on a draft for `target`, from its static checks."""
    from specwire.doctor.diagnose import diagnose
    from specwire.draft.checkpoint import resolve_draft_path

    try:
        rep = diagnose(resolve_draft_path(draft_name), target, search=False, online=False)
    except SpecwireError as e:
        return f"doctor: could not check the draft ({e})"
    warn = [f.id for f in rep.findings if f.severity == "warning"]
    if rep.ok:
        return "doctor: ok, the draft's wiring fits the target" + (f" ({len(warn)} warning(s): {', '.join(warn)})" if warn else "") + "."
    errs = [f.id for f in rep.findings if f.severity == "error"]
    return f"doctor: {len(errs)} error(s): {', '.join(errs)}; run `specwire doctor {draft_name}` for the fixes."


def machine_sentence(report: BenchReport, target: Target) -> str:
    """Which kernel the defaults chose on this machine and, when speculation did not beat the faster baseline,
    why: the measured cost of a verify pass against a one-token step, the cost of the invariant kernels, and
    the CPU features behind them."""
    from specwire.decode.kernels import cost_curve, describe_features, kernel_of

    curve = cost_curve(target)
    ratio = curve.at(17) / curve.at(1)
    head = (f"this machine: {report.machine.get('cpu')} ({describe_features()}), {kernel_of(target).name} chosen as the "
            f"fastest bitwise-invariant kernel; a 17-token verify pass costs {ratio:.2f}x a 1-token step here.")
    best, plain = report.best_draft_method, report.result("plain")
    vs = [x for x in ((best.speedup_vs_hf, best.speedup_vs_plain) if best else ()) if x is not None]
    if best is None or not vs or min(vs) > 1.0:
        return head
    cost = (f" The bitwise-invariant kernels make a plain step {1 / plain.speedup_vs_hf - 1:.0%} dearer than "
            "transformers' own (plain against hf-generate), and speculation has to win that back."
            if plain and plain.speedup_vs_hf and plain.speedup_vs_hf < 1 else "")
    why = ("Without AMX a multi-token pass costs more than a one-token step, so a draft this weak "
           f"(accept length {best.accept_length or 0:.2f}) cannot pay for much verification; `--budget auto` drafts "
           "less, or not at all, rather than lose to plain decoding." if not cpu_has_amx() else
           f"The draft's accept length ({best.accept_length or 0:.2f}) is too low to pay for more on this prompt set.")
    return head + f" Speculation does not beat the faster baseline here.{cost} {why}"


def cpu_has_amx() -> bool:
    from specwire.target.cpu import cpu_features

    return cpu_features().get("amx_bf16", False)


def run_demo(config: DemoConfig, *, say: Callable[..., None] = print) -> BenchReport:
    """Run the demo, handing every line (and every streamed piece, with end="") to `say`; return the benchmark."""
    t0 = time.perf_counter()
    target = load_decoding_target(config.target, device=config.device, dtype=config.dtype, linear=config.linear)
    say(render_info(target.info))
    say(f"\nloaded in {time.perf_counter() - t0:.1f} s")
    draft, why_not = demo_draft(config, target)
    if draft is not None:
        say(f"draft: {config.draft}, reads hs {list(draft.config.wiring.hs_ids)} "
            f"(draft vocab {draft.config.draft_vocab_size}); tree speculation, greedy:\n")
    else:
        say(f"note: {why_not}; decoding plainly (no speculation). Build the draft with `make draft`.\n")
    for prompt in DEMO_PROMPTS:
        say(f">>> {prompt}")
        reply = decode_reply(target, draft, target.encode_chat(prompt), max_new_tokens=config.max_new_tokens,
                             spec=SpecConfig(tree=True), on_text=lambda piece: say(piece, end="", flush=True))
        say("")
        res = reply.result
        acc = f", accept length {res.extra['accept_length']:.2f}" if res.extra.get("accept_length") else ""
        say(f"[{len(res.output_ids)} tokens, {res.tokens_per_s:.1f} tok/s{acc}]\n")

    methods = ("hf-generate", "plain") + (DRAFT_METHODS if draft is not None else ())
    bench = BenchConfig(
        target=config.target, draft=config.draft if draft is not None else None, prompts=SPREAD_MT_BENCH,
        limit=config.bench_prompts, max_new_tokens=config.bench_tokens, methods=methods, device=config.device,
        dtype=config.dtype, linear=config.linear, threads=config.threads, warmup_tokens=DEMO_WARMUP_TOKENS,
        out_dir=config.out or str(default_run_dir("mt-bench", prefix="demo")),
    )
    say(f"benchmark: {', '.join(methods)} on {config.bench_prompts} MT-bench prompts (categories in turn), "
        f"{config.bench_tokens} new tokens, "
        "same run, outputs checked against plain greedy:")
    report = run_bench(bench, target=target, draft=draft)
    say("\n" + render_table(report))
    pos = render_positions(report)
    if pos:
        say("\nacceptance per draft position:\n" + pos)
    budgets = render_budgets(report)
    if budgets:
        say("\nspeculation budget (auto), rounds per choice ('none': plain steps):\n" + budgets)
    copies = render_lookup(report)
    if copies:
        say(f"\ncontext lookup (up to {bench.spec.lookup} copied tokens a round):\n" + copies)
    say("\n" + speedup_sentence(report))
    say(machine_sentence(report, target))
    if draft is not None:
        say(doctor_verdict(config.draft, target))
    say(f"written: {report.run_dir}/results.md, results.png, results.json")
    say(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return report
