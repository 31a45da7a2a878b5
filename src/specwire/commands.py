"""Foundation subcommands: `info`, `generate` and `demo`.

Owns their argument definitions and text rendering only; the work is done by `targets`, `plain`
and (when a draft is given) the speculative engine.
"""

from __future__ import annotations

import argparse
import sys
import time

from .cli import add_json_option, add_model_options, emit_json
from .wiring import CONVENTIONS


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
    add_model_options(p)
    p.add_argument("--draft", default=None, help="draft folder or 'smollm2-135m-eagle3' (default: plain decoding)")
    p.add_argument("--prompt", required=True, help="user message")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--tree", dest="tree", action="store_true", default=True, help="tree drafting (default)")
    g.add_argument("--chain", dest="tree", action="store_false", help="chain drafting")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="the main job on built-in defaults",
                       description="Load the built-in target (and its shipped draft when available), decode a few real "
                       "prompts, and print the wiring table.")
    add_model_options(p)
    p.add_argument("--max-new-tokens", type=int, default=64)
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
    for c in CONVENTIONS:
        lines.append(f"  {c:<12} {str(info.default_wiring[c]):<16} {meaning[c]}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from .targets import target_info

    info = target_info(args.target)
    if args.json:
        emit_json(info.to_dict())
    else:
        print(render_info(info))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from .plain import plain_generate
    from .sampling import SamplingParams, make_generator
    from .targets import load_target

    params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    prompt_ids = target.tokenizer(args.prompt)["input_ids"] if args.raw else target.encode_chat(args.prompt)
    stream = _Streamer(target.tokenizer)
    gen = make_generator(args.seed, target.device)
    if args.draft:
        from .engine import speculative_generate, load_engine_draft

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
]


def cmd_demo(args: argparse.Namespace) -> int:
    from .plain import plain_generate
    from .targets import load_target

    t0 = time.perf_counter()
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    print(render_info(target.info))
    print(f"\nloaded in {time.perf_counter() - t0:.1f} s; plain greedy decoding of {len(DEMO_PROMPTS)} prompts:\n")
    for prompt in DEMO_PROMPTS:
        print(f">>> {prompt}")
        stream = _Streamer(target.tokenizer)
        res = plain_generate(target, target.encode_chat(prompt), max_new_tokens=args.max_new_tokens, on_token=stream)
        stream.close()
        print(f"[{len(res.output_ids)} tokens, {res.tokens_per_s:.1f} tok/s]\n")
    return 0
