"""Foundation subcommands: `info`, `generate` and `demo`.

Owns their argument definitions and text rendering only; the work is done by `targets`, `plain`
and (when a draft is given) the speculative engine.
"""

from __future__ import annotations

import argparse
import sys
import time

from specwire.cli import add_draft_mode_option, add_json_option, add_model_options, emit_json
from specwire.wiring import CONVENTIONS


def add_cli(sub) -> None:
    p = sub.add_parser("info", help="describe a target: layers, sizes, default wiring in every convention",
                       description="Describe a target from its config: architecture, layers L, hidden size, vocab, "
                       "tied embeddings, max positions, and the default EAGLE-3 wiring in every tool's convention.")
    p.add_argument("target", nargs="?", default="smollm2-135m", help="built-in name or HF folder (default: %(default)s)")
    add_json_option(p)
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("generate", help="one generation, streamed to the terminal",
                       description="Generate a reply to one prompt (the target's chat template is applied). "
                       "Without --draft it decodes plainly; with one it decodes speculatively.")
    add_model_options(p, linear=True)
    p.add_argument("--draft", default=None, help="draft folder or 'smollm2-135m-eagle3' (default: plain decoding)")
    p.add_argument("--prompt", required=True, help="user message")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    add_draft_mode_option(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="the main job on built-in defaults",
                       description="Load the built-in target and its shipped draft, print the wiring table, stream a few "
                       "answers with tree speculation, benchmark hf-generate / plain / eagle3-chain / eagle3-tree on a "
                       "handful of MT-bench prompts (lossless check included), and print the doctor's verdict. Without "
                       "an installed draft it decodes plainly and says so.")
    add_model_options(p, draft=True, linear=True)
    p.add_argument("--max-new-tokens", type=int, default=64, help="new tokens per streamed answer (default: %(default)s)")
    p.add_argument("--bench-prompts", type=int, default=4, help="MT-bench prompts in the benchmark (default: %(default)s)")
    p.add_argument("--bench-tokens", type=int, default=64, help="new tokens per benchmark prompt (default: %(default)s)")
    p.add_argument("--out", default=None, help="benchmark run folder (default: runs/demo-mt-bench-<timestamp>/)")
    p.set_defaults(func=cmd_demo)


def render_info(info) -> str:
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
    meaning = {
        "hs": "hs index: input of layer k (0 = embeddings, L = last layer, pre-norm)",
        "sglang": "eagle_config.eagle_aux_hidden_state_layer_ids: output of layer k",
        "vllm": "eagle_aux_hidden_state_layer_ids: hs index",
        "speculators": "eagle_aux_hidden_state_layer_ids: hs index",
        "specforge": "layer-output ids, SGLang style",
        "eagle": "original EAGLE training code: hs index",
    }
    if not info.default_wiring:
        lines.append(f"  (none: a {info.num_layers}-layer target has no three distinct default states; pass --hs-ids)")
    for c in CONVENTIONS if info.default_wiring else ():
        lines.append(f"  {c:<12} {str(info.default_wiring[c]):<16} {meaning[c]}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from specwire.target.load import target_info

    info = target_info(args.target)
    if args.json:
        emit_json(info.to_dict())
    else:
        print(render_info(info))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from specwire.decode.plain import plain_generate
    from specwire.decode.sampling import SamplingParams, make_generator
    from specwire.target.load import load_target

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    target = load_target(args.target, device=args.device, dtype=args.dtype, linear=args.linear)
    prompt_ids = target.tokenizer(args.prompt)["input_ids"] if args.raw else target.encode_chat(args.prompt)
    stream = _Streamer(target.tokenizer)
    gen = make_generator(args.seed, target.device)
    if args.draft:
        from specwire.decode.engine import speculative_generate, load_engine_draft

        draft = load_engine_draft(args.draft, target)
        res = speculative_generate(target, draft, prompt_ids, max_new_tokens=args.max_new_tokens, params=params,
                                   generator=gen, tree=args.tree, on_token=stream)
    else:
        res = plain_generate(target, prompt_ids, max_new_tokens=args.max_new_tokens, params=params, generator=gen, on_token=stream)
    stream.close()
    extra = ""
    if res.extra.get("accept_length"):
        extra = f", accept length {res.extra['accept_length']:.2f}"
    print(f"[{len(res.output_ids)} tokens, {res.tokens_per_s:.1f} tok/s, stop: {res.stop_reason}{extra}]", file=sys.stderr)
    return 0


class _Streamer:
    """Decode tokens incrementally and print only the new text."""

    def __init__(self, tokenizer):
        self.tok, self.ids, self.printed = tokenizer, [], 0

    def __call__(self, token_id: int) -> None:
        self.ids.append(token_id)
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[self.printed:])
            sys.stdout.flush()
            self.printed = len(text)

    def close(self) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()


DEMO_PROMPTS = [
    "What are three tips for staying productive when working from home?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in a few sentences why the sky is blue.",
]


def _demo_draft(args: argparse.Namespace, target):
    """(draft, None) or (None, why not). Only the default shipped draft may be missing: then the demo decodes plainly."""
    from specwire.draft.model import SHIPPED_DRAFT, shipped_draft_dir
    from specwire.errors import SpecwireError

    shipped = args.draft == SHIPPED_DRAFT
    if shipped and not (shipped_draft_dir() / "config.json").is_file():
        return None, f"no shipped draft is installed ({shipped_draft_dir()} is missing)"
    try:
        from specwire.decode.engine import load_engine_draft
    except ImportError as e:
        return None, f"the speculative engine is not available ({e})"
    try:
        return load_engine_draft(args.draft, target), None
    except SpecwireError as e:
        if not shipped:
            raise
        return None, f"the shipped draft does not fit target '{args.target}': {e}"


def _doctor_verdict(draft_name: str, target) -> str | None:
    """The doctor's one-line verdict from its static checks (None when the doctor is not installed)."""
    from specwire.errors import SpecwireError

    try:
        from specwire.doctor.diagnose import diagnose
    except ImportError:
        return None
    from specwire.draft.model import resolve_draft_path

    try:
        rep = diagnose(resolve_draft_path(draft_name), target, search=False, online=False)
    except SpecwireError as e:
        return f"doctor: could not check the draft ({e})"
    warn = [f.id for f in rep.findings if f.severity == "warning"]
    if rep.ok:
        return "doctor: ok, the draft's wiring fits the target" + (f" ({len(warn)} warning(s): {', '.join(warn)})" if warn else "") + "."
    errs = [f.id for f in rep.findings if f.severity == "error"]
    return f"doctor: {len(errs)} error(s): {', '.join(errs)}; run `specwire doctor {draft_name}` for the fixes."


def cmd_demo(args: argparse.Namespace) -> int:
    from specwire.bench.run import DRAFT_METHODS, BenchConfig, default_run_dir, run_bench
    from specwire.decode.plain import plain_generate
    from specwire.bench.report import render_positions, render_table, speedup_sentence
    from specwire.target.load import load_target

    t0 = time.perf_counter()
    target = load_target(args.target, device=args.device, dtype=args.dtype, linear=args.linear)
    print(render_info(target.info))
    print(f"\nloaded in {time.perf_counter() - t0:.1f} s")
    draft, why_not = _demo_draft(args, target)
    if draft is not None:
        from specwire.decode.engine import speculative_generate

        print(f"draft: {args.draft}, reads hs {list(draft.config.wiring.hs_ids)} "
              f"(draft vocab {draft.config.draft_vocab_size}); tree speculation, greedy:\n")
    else:
        print(f"note: {why_not}; decoding plainly (no speculation). Build the draft with `make draft`.\n")
    for prompt in DEMO_PROMPTS:
        print(f">>> {prompt}")
        stream = _Streamer(target.tokenizer)
        ids = target.encode_chat(prompt)
        if draft is not None:
            res = speculative_generate(target, draft, ids, max_new_tokens=args.max_new_tokens, tree=True, on_token=stream)
        else:
            res = plain_generate(target, ids, max_new_tokens=args.max_new_tokens, on_token=stream)
        stream.close()
        acc = f", accept length {res.extra['accept_length']:.2f}" if res.extra.get("accept_length") else ""
        print(f"[{len(res.output_ids)} tokens, {res.tokens_per_s:.1f} tok/s{acc}]\n")

    methods = ("hf-generate", "plain") + (DRAFT_METHODS if draft is not None else ())
    config = BenchConfig(
        target=args.target, draft=args.draft if draft is not None else None, prompts="mt-bench",
        limit=args.bench_prompts, max_new_tokens=args.bench_tokens, methods=methods, device=args.device,
        dtype=args.dtype, linear=args.linear, threads=args.threads, warmup_tokens=8,
        out_dir=args.out or str(default_run_dir("mt-bench", prefix="demo")),
    )
    print(f"benchmark: {', '.join(methods)} on {args.bench_prompts} MT-bench prompts, {args.bench_tokens} new tokens, "
          "same run, outputs checked against plain greedy:")
    report = run_bench(config, target=target, draft=draft)
    print("\n" + render_table(report))
    pos = render_positions(report)
    if pos:
        print("\nacceptance per draft position:\n" + pos)
    print("\n" + speedup_sentence(report))
    if draft is not None:
        verdict = _doctor_verdict(args.draft, target)
        if verdict:
            print(verdict)
    print(f"written: {report.run_dir}/results.md, results.png, results.json")
    print(f"demo finished in {time.perf_counter() - t0:.0f} s")
    return 0
