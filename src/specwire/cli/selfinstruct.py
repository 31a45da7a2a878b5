"""`specwire selfinstruct`: the command line over `specwire.data.selfinstruct.run_selfinstruct`.

Owns: the `selfinstruct` subcommand (flags generated from `SelfInstructConfig` and its `FilterConfig`),
a --help that teaches the method, and printing the result (text, or `--json`). Does not own the
method, the filters or the shard folder (`specwire.data.selfinstruct`).
"""

from __future__ import annotations

import argparse

from specwire.cli.options import add_config_options, add_json_option, add_model_options, config_from_args, emit_json
from specwire.data.selfinstruct import FilterConfig, SelfInstructConfig, run_selfinstruct, summarize

SELFINSTRUCT_HELP = """\
Training prompts written by the target itself (the Magpie method, Xu et al. 2024), answered by it.

How: an instruction-tuned model fed its own chat template up to the start of a user turn (the system
block, then the user header, and nothing else) continues with the kind of user request it was tuned
on. --system TEXT puts a system message of your own in that prefix to steer what the requests are
about (say, "You are an expert Python programmer..." for coding requests); the answers are still
given under the template's default system block. A shard's first round samples --sample-batch such
requests, later rounds about as many as the keep rate says are still missing (at --temperature,
stopped at the end-of-turn token; those that hit --max-request-tokens first are dropped as
unfinished), then filters them:
  - length, words and language: --min-chars, --max-chars, --min-words, --min-ascii, --min-common-words;
  - degenerate loops: --max-repetition (share of repeated word 3-grams);
  - chat-template markup in the text;
  - benchmark contamination: a word --contamination-ngram shared with any MT-bench or HumanEval prompt;
  - near duplicates: MinHash over word 3-grams, Jaccard >= --near-duplicate with any request kept so far
    (in this shard or an earlier one).
The kept requests are templated as ordinary user turns and answered greedily by the target (up to
--max-new-tokens); prompt + answer token ids are stored as generated, with a loss mask on the answer.
Both phases decode --answer-batch rows together with continuous batching (a finished row takes the
next sequence at once; --batching padded uses HF generate), in bf16 under --dtype auto where the CPU
computes it natively. These engine options may change between runs of one build: each shard records
its own in the manifest (`engine`).

OUT holds shard-NNNNN.jsonl.gz (--shard-size conversations each, in datagen's conversation format) and
manifest.json (target identity, options, per-shard counts: sampled, rejected by reason, contaminated
items, tokens, seconds). Each shard draws from its own seeds (--seed, shard, round): a killed run
loses at most the shard in flight, and rerunning the same command resumes and regenerates it exactly.
A rerun with another target or recipe option into the same OUT is refused (--conversations may grow;
the engine options above may change).

A shard is also a prompt file: `specwire datagen --prompts OUT/shard-00000.jsonl.gz` reads its user turns
(and has them answered again, then captures the states).
"""


def add_cli(sub) -> None:
    p = sub.add_parser("selfinstruct", help="prompts written and answered by the target itself (Magpie); resumable",
                       description=SELFINSTRUCT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p, generation=True)
    add_config_options(p, SelfInstructConfig, skip=("target", "device", "dtype", "filters"))
    g = p.add_argument_group("filters (what a sampled user request must satisfy to be kept)")
    add_config_options(g, FilterConfig)
    add_json_option(p)
    p.set_defaults(func=cmd_selfinstruct)


def cmd_selfinstruct(args: argparse.Namespace) -> int:
    config = config_from_args(SelfInstructConfig, args, target=args.target, device=args.device, dtype=args.dtype,
                              filters=config_from_args(FilterConfig, args))
    res = run_selfinstruct(config)
    if args.json:
        emit_json(res.to_dict())
        return 0
    new = summarize(s.to_dict() for s in res.new_shards)
    print(f"selfinstruct {res.out}: {res.conversations} conversations in {res.shards} shards")
    if new["shards"]:
        secs = new["sample_seconds"] + new["answer_seconds"]
        print(f"this run: {new['shards']} shards, {new['conversations']} kept of {new['sampled']} sampled requests; "
              f"rejected: {new['rejected']}; {new['request_tokens'] + new['answer_tokens']} tokens in {secs:.1f} s")
    return 0
