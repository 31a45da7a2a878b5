"""`specwire export` and `specwire import`: checkpoint conversion between specwire, SGLang and speculators.

Owns the two subcommands' flags and text output only; the work is `interop.convert.export_draft` and
`import_draft`, which read every folder through the one reader (`draft.reader`).
"""

from __future__ import annotations

import argparse

from specwire.cli.options import add_json_option, emit_json
from specwire.interop.convert import EXPORT_FORMATS, export_draft, import_draft
from specwire.draft.reader import FORMAT_SGLANG
from specwire.wiring import DEFAULT_SGLANG_VERSION, SGLANG_VERSIONS


def add_cli(sub) -> None:
    p = sub.add_parser("export", help="convert a native draft to the SGLang or speculators (vLLM) layout",
                       description="Write a native specwire draft in another tool's checkpoint format. sglang: midlayer.* "
                       "keys and a LlamaForCausalLMEagle3 config with SGLang-convention eagle_config ids (SpecForge reads "
                       "it too). speculators: layers.0.* keys and a speculators eagle3 config with hs-index ids (vLLM and "
                       "the speculators package read it). Both keep a 'specwire' block so import is lossless.")
    p.add_argument("draft", help="native draft folder or 'smollm2-135m-eagle3'")
    p.add_argument("--format", dest="fmt", required=True, choices=EXPORT_FORMATS)
    p.add_argument("--out", required=True, help="output folder (replaced atomically)")
    p.add_argument("--sglang-version", default=DEFAULT_SGLANG_VERSION, choices=SGLANG_VERSIONS,
                   help="which SGLang id rule to write for (default: %(default)s)")
    p.add_argument("--verifier", default=None, help="speculators: verifier name_or_path written to speculators_config")
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="speculators: default speculative_tokens")
    p.add_argument("--max-position-embeddings", type=int, default=None,
                   help="raise the draft's max_position_embeddings to the target's (default rope only)")
    p.add_argument("--embeddings-from", default=None, metavar="TARGET",
                   help="also write embed_tokens.weight from this target (for tools that do not share it themselves)")
    add_json_option(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("import", help="convert an SGLang/SpecForge/EAGLE or speculators draft to a native one",
                       description="Detect the format of a draft folder (native, sglang, speculators) and write a native "
                       "checkpoint. Fields whose meaning differs between tools are never guessed: pass --sglang-version "
                       "or --norm-before-residual when asked. Without a specwire block, --target is required.")
    p.add_argument("src", help="draft folder to import")
    p.add_argument("--out", required=True, help="output folder (replaced atomically)")
    p.add_argument("--sglang-version", default=None, choices=SGLANG_VERSIONS, help="how SGLang read the eagle_config ids")
    p.add_argument("--norm-before-residual", default=None, choices=["true", "false"],
                   help="what the draft was trained with, when its config does not say")
    p.add_argument("--target", default=None, help="the target the draft was trained for (built-in name or HF folder)")
    add_json_option(p)
    p.set_defaults(func=cmd_import)


def cmd_export(args: argparse.Namespace) -> int:
    r = export_draft(args.draft, args.out, fmt=args.fmt, sglang_version=args.sglang_version, verifier=args.verifier,
                     num_speculative_tokens=args.num_speculative_tokens, max_position_embeddings=args.max_position_embeddings,
                     embeddings_from=args.embeddings_from)
    if args.json:
        emit_json(r.to_dict())
        return 0
    conv = "SGLang layer-output ids" if r.format == FORMAT_SGLANG else "hs indices"
    print(f"wrote {r.format} checkpoint to {r.out}")
    print(f"  layer ids {r.layer_ids} ({conv}) = hs {list(r.wiring.hs_ids)}")
    for w in r.warnings:
        print(f"  warning: {w}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    r = import_draft(args.src, args.out, sglang_version=args.sglang_version, norm_before_residual=args.norm_before_residual,
                     target=args.target)
    if args.json:
        emit_json(r.to_dict())
        return 0
    print(f"imported {r.source_format} checkpoint into {r.out} (hs {list(r.wiring.hs_ids)})")
    for n in r.notes:
        print(f"  note: {n}")
    return 0
