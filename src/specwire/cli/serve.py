"""The `serve` subcommand: parse the flags, load the target and draft, and run the OpenAI-compatible server.

Owns the `serve` flags only: the shared model options, `--no-draft`, the speculation knobs
(`--tree/--chain`, `--num-steps`, `--topk`, `--num-draft-tokens`, from `specwire.cli.spec`), and the
`ServeConfig` flags generated from its fields (`--host`, `--port`, `--model-name`, `--max-queue`,
`--request-timeout`, `--shutdown-timeout`). The server itself (validation, admission, streaming,
metrics, graceful shutdown) is `specwire.server`.
"""

from __future__ import annotations

import argparse
import sys

from specwire.cli.options import add_config_options, add_model_options, config_from_args
from specwire.cli.spec import add_spec_options, spec_from_args
from specwire.server.config import ServeConfig


def add_cli(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, streaming, /metrics)",
                       description="Serve the target over an OpenAI-compatible HTTP API: /v1/completions, "
                       "/v1/chat/completions (both with stream=true), /v1/models, /health and /metrics (Prometheus). "
                       "Decodes speculatively with the draft (lossless), or plainly with --no-draft. Requests are "
                       "processed one at a time, in arrival order; at most --max-queue wait, the rest get 429 with "
                       "Retry-After. SIGTERM drains in-flight requests (--shutdown-timeout) and exits 0.")
    add_model_options(p, draft=True, linear=True)
    p.add_argument("--no-draft", action="store_true", help="plain decoding, no speculation")
    add_spec_options(p, mode=True)
    add_config_options(p, ServeConfig)
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from specwire.server import create_app, serve
    from specwire.decode.kernels import load_decoding_target

    config = config_from_args(ServeConfig, args)  # validated before anything loads
    spec = None if args.no_draft else spec_from_args(args)
    target = load_decoding_target(args.target, device=args.device, dtype=args.dtype, linear=args.linear)
    draft = None
    if not args.no_draft:
        from specwire.decode.engine import load_engine_draft

        draft = load_engine_draft(args.draft, target)
    app = create_app(target, draft, spec=spec, config=config)
    mode = "plain decoding" if draft is None else (f"{'tree' if spec.tree else 'chain'} speculation with {args.draft}, "
                                                   f"budget {spec.budget}")
    mode += f", {str(target.dtype).replace('torch.', '')}"
    print(f"specwire serve: {target.info.name} ({mode}) on http://{config.host}:{config.port}/v1 "
          f"(queue {config.max_queue}, request timeout {config.request_timeout:g} s)", file=sys.stderr, flush=True)
    return serve(app, config, log_level="info" if args.verbose else "warning")
