"""`specwire datagen`: the command line over `specwire.data.datagen.run_datagen`.

Owns: the `datagen` subcommand (flags generated from `DatagenConfig`), its help text, and printing the
result (text, or `--json`) with the vocabulary coverage of the answers. Does not own generating,
capturing or the dump format (`specwire.data.datagen`, `specwire.data.dump`).
"""

from __future__ import annotations

import argparse
import dataclasses

from specwire.cli.options import add_config_options, add_json_option, add_model_options, config_from_args, emit_json
from specwire.data.datagen import DatagenConfig, run_datagen
from specwire.data.dump import DUMP_DTYPES, open_dump

DATAGEN_HELP = """\
Phase 1 (generate): the target answers every prompt with its own chat template (greedy unless
--temperature > 0); the generated token ids are stored as they are in OUT/conversations.jsonl with a
loss mask on the answer (up to and including the first EOS), each as soon as it is finished.
  --batching continuous (default): --batch-size rows decode together and a finished row takes the next
    prompt at once (static per-row cache, no padding; several times HF generate's throughput).
  --batching padded: HF generate on left-padded batches of --batch-size (every row runs until the
    batch's longest answer ends); needed for targets with a sliding attention window.
  --dtype auto (default) decodes in bf16 where the CPU computes it natively (AMX or AVX512-BF16) or on
    CUDA: the answers are then the target's greedy decoding in bf16.
Phase 2 (capture): one prefill pass per conversation reads the fused --hs-ids states and hs L (the last
layer, before the final norm) into OUT/shard-NNNNN.safetensors; OUT/manifest.json holds the wiring,
fingerprints, counts and options; OUT/vocab_counts.safetensors the assistant-token frequencies.

Answers from another model: --generator URL asks an OpenAI-compatible server (specwire serve, vLLM,
SGLang, ...) for the answers instead (POST URL/v1/chat/completions with the prompt's messages,
--temperature, --max-new-tokens). Its text is re-tokenized with the target's tokenizer after the
templated prompt (the manifest records the server under `generator`); capture is unchanged.

Prompts longer than --max-length: a prompt whose templated tokens do not leave room for one answer
token under --max-length is SKIPPED, never truncated; each skip is logged with the prompt's id and
counted in the manifest (counts.skipped_prompts, skipped_prompts). Answers stop at --max-new-tokens or
when prompt + answer reach --max-length (finish "length").

Resumable: rerun the same command after an interruption (even kill -9); finished work is kept, nothing is
duplicated. A rerun with another target, wiring or option into the same OUT is refused.
"""


def add_cli(sub) -> None:
    p = sub.add_parser("datagen", help="self-distilled data + hidden-state dump with manifest; resumable",
                       description=DATAGEN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p, generation=True)
    add_config_options(p, DatagenConfig, skip=("target", "device", "dtype"),
                       choices={"dtype_dump": sorted(DUMP_DTYPES)})
    add_json_option(p)
    p.set_defaults(func=cmd_datagen)


def cmd_datagen(args: argparse.Namespace) -> int:
    from specwire.draft.vocab import coverage_table, format_coverage_table

    config = config_from_args(DatagenConfig, args, target=args.target, device=args.device, dtype=args.dtype)
    res = run_datagen(config)
    counts = open_dump(res.out).vocab_counts()
    table = coverage_table(counts) if int(counts.sum()) else []
    if args.json:
        d = res.to_dict()
        d["vocab_coverage"] = [dataclasses.asdict(r) for r in table]
        emit_json(d)
        return 0
    g, c = res.generate, res.capture
    print(f"dump {res.out}: {res.samples} samples, {res.tokens} tokens ({res.loss_tokens} assistant), "
          f"{res.shards} shards, hs ids {res.hs_ids}; {res.skipped} of {res.prompts} prompts skipped as too long")
    print(f"this run: generated {g.samples} answers ({g.tokens} tokens, {g.tokens_per_s:.1f} tok/s); "
          f"captured {c.samples} samples ({c.tokens} tokens, {c.tokens_per_s:.1f} tok/s)")
    if table:
        print(format_coverage_table(table))
    return 0
