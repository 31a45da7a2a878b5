"""Self-distilled conversations and the hidden-state dump: the two resumable phases of `specwire datagen`.

Owns: filling a dump folder, in two resumable phases:
  1. generate: the target answers every prompt in its own chat template (batched HF `generate`, left
     padding, greedy by default). The token ids it generated are stored as they are (never
     re-tokenized), with a loss mask on them, one line per sample in conversations.jsonl. With
     `generator` set, an OpenAI-compatible server writes the answers instead (`specwire.data.generator`:
     its text is re-tokenized with the target's tokenizer, and the manifest says so).
  2. capture: one prefill pass of the target's decoder over each conversation (right padding, batches
     of similar length, no lm_head) reads the fused hs ids and hs L through the one capture path
     (`specwire.target.capture.capture_packed`, shared with online training); samples are packed
     into safetensors shards of about `shard_tokens` tokens.
Does not own the dump's layout, writing primitives or reading (`dump`), the capture itself
(`target.capture`), the vocab map (`draft.vocab`), prompt sets (`prompts`) or the command line
(`specwire.cli.datagen`).

Resumability (a `kill -9` at any moment loses at most the work in flight):
  - the manifest is written first, so a folder is always recognisable; rerunning with another target,
    wiring or option is refused, naming the difference (dumps are never mixed);
  - conversations.jsonl is appended line by line with flush + fsync; on resume a partial last line is
    cut off and every planned batch that is not fully written is generated again as the same batch
    (same prompts, same padding, same seed), and only its missing samples are appended;
  - a shard is written atomically and only then listed in the manifest (also written atomically);
    shard files the manifest does not list are deleted and redone. Shards are planned from the
    conversations alone, so a resumed run writes byte-for-byte the shards of an uninterrupted one.
Prompts longer than the max length (prompt tokens >= max_length, no room for an answer) are skipped
with a warning naming them, and counted in the manifest; they are never truncated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from specwire.data.dump import (CONVERSATIONS, DUMP_DTYPES, DUMP_FORMAT, DUMP_FORMAT_VERSION, MANIFEST, VOCAB_COUNTS,
                                ManifestWriter, check_conversation, clean_strays, parse_manifest, write_shard)
from specwire.errors import SpecwireError
from specwire.safeio import cut_partial_line, read_json, save_tensors
from specwire.target.capture import capture_packed
from specwire.target.load import (
    BUILTIN_TARGET, Target, chat_template_hash, load_target, parse_dtype, tokenizer_fingerprint,
)
from specwire.wiring import Wiring, default_hs_ids, validate_hs_ids

log = logging.getLogger("specwire")

# Options that may change between a run and its resumption (they do not change the data).
RESUMABLE_OPTIONS = frozenset({"device"})


@dataclass
class DatagenConfig:
    """Everything `specwire datagen` takes; all but `out`, `device` and `progress` are recorded in the manifest."""

    out: str  # dump folder (created, or resumed when it holds a dump)
    prompts: str  # mt-bench, humaneval, pool (or a part: pool:synthetic, 'pool[512:1000]'), or a JSONL file
    target: str = BUILTIN_TARGET  # built-in target name or HF model folder
    hs_ids: tuple[int, ...] | None = None  # fused hs ids, e.g. 2,15,27 (default: the target's [2, L//2, L-3])
    max_samples: int | None = None  # use the first N prompts of the source (None = all)
    max_new_tokens: int = 256  # answer length cap
    max_length: int = 2048  # cap on prompt + answer tokens; longer prompts are skipped
    batch_size: int = 64  # sequences decoded together (continuous: rows; padded: per generate call), and per capture batch
    batching: str = "continuous"  # continuous (`data.continuous`: a finished row is refilled at once) or padded (HF generate)
    sort_window: int = 8  # prompts are sorted by length within windows of this many batches
    shard_tokens: int = 65536  # a shard is closed once it holds at least this many tokens
    capture_batch_tokens: int = 16384  # cap on padded tokens in one capture batch (one long sample may exceed it)
    dtype_dump: str = "bfloat16"  # dtype of hidden / last_hidden in the shards
    device: str | None = None  # torch device (None = cuda when available, else cpu)
    dtype: str = "auto"  # weights dtype of the target; auto = bfloat16 on CUDA or a CPU with native bf16, else float32
    seed: int = 0  # sampling seed (per batch: seed and batch number); unused when greedy
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling when temperature > 0
    top_k: int = 0  # top-k sampling when temperature > 0 (0 = off)
    generator: str | None = None  # base URL of an OpenAI-compatible server that writes the answers instead of the target (its text is re-tokenized with the target's tokenizer)
    generator_model: str | None = None  # model name sent to --generator (default: the first one its /v1/models lists)
    progress: bool = True  # progress bars on stderr

    def __post_init__(self):
        if self.hs_ids is not None:
            self.hs_ids = tuple(int(i) for i in self.hs_ids)
        for name in ("max_new_tokens", "max_length", "batch_size", "sort_window", "shard_tokens", "capture_batch_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecwireError(f"datagen {name.replace('_', '-')}: expected a positive integer, found {v!r}.")
        if self.max_samples is not None and (not isinstance(self.max_samples, int) or self.max_samples < 1):
            raise SpecwireError(f"datagen max-samples: expected a positive integer, found {self.max_samples!r}.")
        if self.batching not in ("continuous", "padded"):
            raise SpecwireError(f"datagen batching: '{self.batching}', expected continuous or padded.")
        if self.dtype_dump not in DUMP_DTYPES:
            raise SpecwireError(f"datagen dtype-dump: '{self.dtype_dump}', expected one of {sorted(DUMP_DTYPES)}.")
        if not self.temperature >= 0:
            raise SpecwireError(f"datagen temperature: expected >= 0, found {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise SpecwireError(f"datagen top-p: expected 0 < p <= 1, found {self.top_p}.")
        if self.top_k < 0:
            raise SpecwireError(f"datagen top-k: expected >= 0, found {self.top_k}.")
        if self.generator_model is not None and self.generator is None:
            raise SpecwireError("datagen generator-model: set only with --generator URL.", fix="add --generator URL or drop it.")

    def options(self) -> dict[str, Any]:
        """The options recorded in (and compared against) the manifest."""
        d = dataclasses.asdict(self)
        for k in ("out", "progress"):
            d.pop(k)
        for k in ("generator", "generator_model"):  # absent unless set: dumps of the target's own answers are unchanged
            if d[k] is None:
                d.pop(k)
        d["hs_ids"] = list(self.hs_ids) if self.hs_ids is not None else None
        return d


@dataclass
class PhaseStats:
    samples: int = 0  # samples produced by this run
    tokens: int = 0  # tokens produced (phase 1: generated; phase 2: captured)
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "tokens": self.tokens, "seconds": round(self.seconds, 3),
                "tokens_per_s": round(self.tokens_per_s, 2)}


@dataclass
class DatagenResult:
    out: str
    complete: bool
    prompts: int  # prompts read from the source
    skipped: int  # prompts skipped as longer than max_length
    conversations: int  # lines in conversations.jsonl
    samples: int  # samples in shards
    tokens: int  # tokens in shards
    loss_tokens: int  # assistant tokens in shards
    shards: int
    hs_ids: list[int]
    generate: PhaseStats = field(default_factory=PhaseStats)  # this run's phase 1
    capture: PhaseStats = field(default_factory=PhaseStats)  # this run's phase 2

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["generate"], d["capture"] = self.generate.to_dict(), self.capture.to_dict()
        return d


@dataclass(frozen=True)
class PreparedPrompt:
    index: int  # position in the prompt source = the sample's global index
    id: str
    source: str
    messages: tuple  # the prompt's messages, ending with a user turn
    prompt_ids: tuple[int, ...]  # templated with add_generation_prompt


# ---- pure helpers ----------------------------------------------------------------------------------

def plan_batches(lengths: Sequence[tuple[int, int]], *, batch_size: int, sort_window: int) -> list[list[int]]:
    """(index, length) pairs in index order -> batches of indices.

    Within each window of batch_size * sort_window prompts, longest first (ties: lower index first),
    then cut into batches: padding shrinks and the plan depends on nothing but the prompts.
    """
    out: list[list[int]] = []
    w = batch_size * sort_window
    for start in range(0, len(lengths), w):
        window = sorted(lengths[start:start + w], key=lambda il: (-il[1], il[0]))
        out += [[i for i, _ in window[b:b + batch_size]] for b in range(0, len(window), batch_size)]
    return out


def trim_generated(generated: Sequence[int], *, eos_ids: Sequence[int], limit: int) -> tuple[list[int], str]:
    """The answer: generated tokens up to and including the first EOS ("eos"), else the first `limit` ("length")."""
    eos = set(eos_ids)
    for pos, tok in enumerate(generated[:limit]):
        if tok in eos:
            return list(generated[:pos + 1]), "eos"
    return list(generated[:limit]), "length"


def plan_shards(lengths: Sequence[int], *, shard_tokens: int) -> list[range]:
    """Consecutive sample positions -> shards closed as soon as they reach `shard_tokens` tokens."""
    out, start, acc = [], 0, 0
    for pos, n in enumerate(lengths):
        acc += n
        if acc >= shard_tokens:
            out.append(range(start, pos + 1))
            start, acc = pos + 1, 0
    if start < len(lengths):
        out.append(range(start, len(lengths)))
    return out


def plan_capture_batches(lengths: Sequence[int], *, batch_size: int, max_tokens: int) -> list[list[int]]:
    """Positions -> batches of similar length, longest first, each <= batch_size rows and <= max_tokens
    padded tokens (a single longer sample gets a batch of its own)."""
    order = sorted(range(len(lengths)), key=lambda p: (-lengths[p], p))
    out: list[list[int]] = []
    for p in order:
        if out and len(out[-1]) < batch_size and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(p)
        else:
            out.append([p])
    return out


# ---- phase 1: self-distillation --------------------------------------------------------------------

def prepare_prompts(target: Target, records: Sequence[Any], *, max_length: int) -> tuple[list[PreparedPrompt], list[dict]]:
    """Template every prompt; skip (with a warning) those with no room for an answer under max_length."""
    kept, skipped = [], []
    for index, rec in enumerate(records):
        ids = target.encode_chat([dict(m) for m in rec.messages], add_generation_prompt=True)
        if len(ids) >= max_length:
            skipped.append({"index": index, "id": rec.id, "tokens": len(ids)})
            log.warning("datagen: skipping prompt '%s' (index %d): %d prompt tokens leave no room for an answer "
                        "under --max-length %d", rec.id, index, len(ids), max_length)
            continue
        kept.append(PreparedPrompt(index=index, id=str(rec.id), source=str(rec.source),
                                   messages=tuple(dict(m) for m in rec.messages), prompt_ids=tuple(ids)))
    if skipped:
        log.warning("datagen: skipped %d of %d prompts as longer than --max-length %d", len(skipped), len(records), max_length)
    return kept, skipped


@torch.inference_mode()
def generate_batch(target: Target, prompt_ids: Sequence[Sequence[int]], *, max_new_tokens: int, max_length: int,
                   temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0) -> list[tuple[list[int], str]]:
    """HF `generate` on a left-padded batch; per prompt (answer ids up to and incl. the first EOS, finish).

    Sampling draws from torch's global generator, seeded with `seed` just before (HF `generate` takes
    no torch.Generator); greedy decoding uses no randomness.
    """
    from transformers import GenerationConfig

    tok = target.tokenizer
    lens = [len(p) for p in prompt_ids]
    T = max(lens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else target.eos_token_ids[0]
    limits = [min(max_new_tokens, max_length - n) for n in lens]
    n_new = max(limits)
    max_pos = target.info.max_position_embeddings
    if max_pos is not None:
        n_new = max(1, min(n_new, max_pos - T))
    ids = torch.full((len(lens), T), pad, dtype=torch.long)  # shape: [B, T], left-padded
    mask = torch.zeros(len(lens), T, dtype=torch.long)  # shape: [B, T]
    for r, p in enumerate(prompt_ids):
        ids[r, T - lens[r]:] = torch.as_tensor(list(p), dtype=torch.long)
        mask[r, T - lens[r]:] = 1
    sample = temperature > 0
    gc = GenerationConfig(max_new_tokens=n_new, do_sample=sample, pad_token_id=pad, eos_token_id=list(target.eos_token_ids),
                          temperature=temperature if sample else None, top_p=top_p if sample else None,
                          top_k=(top_k or None) if sample else None)
    if sample:
        torch.manual_seed(seed)
    out = target.model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device), generation_config=gc)
    gen = out[:, T:].tolist()  # shape: [B, n_generated]
    return [trim_generated(g, eos_ids=target.eos_token_ids, limit=lim) for g, lim in zip(gen, limits)]


def _load_done(path: Path, prompts: dict[int, PreparedPrompt]) -> dict[int, dict]:
    """Existing conversations, after cutting a partial last line; checks they fit the prompts.

    Returns index -> {"index", "id", "input_ids" [T] int64 tensor, "loss_mask" [T] uint8 tensor}
    (compact: the answer texts are not kept in memory).
    """
    if not path.exists():
        return {}
    data = cut_partial_line(path)
    done: dict[int, dict] = {}
    for n, line in enumerate(data.split(b"\n")[:-1], start=1):
        where = f"{path}:{n}"
        try:
            rec = check_conversation(json.loads(line), where=where)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SpecwireError(f"{where}: not valid JSON ({e}); the file is corrupt.",
                                fix="delete the dump folder and rerun datagen.") from None
        i = rec["index"]
        if i in done:
            raise SpecwireError(f"{where}: sample index {i} appears twice.", fix="delete the dump folder and rerun datagen.")
        p = prompts.get(i)
        if p is None or rec["id"] != p.id or tuple(rec["input_ids"][:len(p.prompt_ids)]) != p.prompt_ids:
            raise SpecwireError(
                f"{where}: sample {i} ('{rec['id']}') does not match prompt {i} of the source now "
                f"({'skipped or absent' if p is None else repr(p.id)}); the prompt source changed since this dump was started.",
                fix="use a new --out folder for the new prompts.",
            )
        done[i] = {"index": i, "id": rec["id"], "input_ids": torch.tensor(rec["input_ids"], dtype=torch.int64),
                   "loss_mask": torch.tensor(rec["loss_mask"], dtype=torch.uint8)}
    return done


def _server_batch(target: Target, prompts: Sequence[PreparedPrompt], config: DatagenConfig, *, model: str,
                  seed: int) -> list[tuple[list[int], str]]:
    """Like `generate_batch`, with the answers written by the `config.generator` server (re-tokenized)."""
    from specwire.data.generator import answer_ids, ask_all

    limits = [min(config.max_new_tokens, config.max_length - len(p.prompt_ids)) for p in prompts]
    answers = ask_all(config.generator, model, [p.messages for p in prompts], max_tokens=limits,
                      temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, seed=seed)
    return [trim_generated(answer_ids(target, p.messages, p.prompt_ids, a), eos_ids=target.eos_token_ids, limit=lim)
            for p, a, lim in zip(prompts, answers, limits)]


def _limit(p: PreparedPrompt, config: DatagenConfig, target: Target) -> int:
    """New tokens prompt `p` may take: --max-new-tokens, within --max-length and the target's positions."""
    limit = min(config.max_new_tokens, config.max_length - len(p.prompt_ids))
    max_pos = target.info.max_position_embeddings
    if max_pos is not None:
        limit = min(limit, max_pos - len(p.prompt_ids))
    return max(1, limit)


def generate_conversations(target: Target, prompts: Sequence[PreparedPrompt], path: str | os.PathLike,
                           config: DatagenConfig, *, generator_model: str | None = None) -> PhaseStats:
    """Phase 1: append the answers to `path` (conversations.jsonl), resuming what is there.

    The target writes them, or the `config.generator` server (asked for `generator_model`, default
    `config.generator_model`).
    """
    path = Path(path)
    by_index = {p.index: p for p in prompts}
    done = set(_load_done(path, by_index))
    plan = plan_batches([(p.index, len(p.prompt_ids)) for p in prompts], batch_size=config.batch_size,
                        sort_window=config.sort_window)
    todo = sum(1 for p in prompts if p.index not in done)
    stats = PhaseStats()
    if todo == 0:
        return stats
    from tqdm import tqdm

    bar = tqdm(total=todo, unit="sample", desc="datagen 1/2 generate", file=sys.stderr, disable=not config.progress,
               dynamic_ncols=True)
    t0 = time.perf_counter()

    def write(f, i: int, answer: list[int], finish: str) -> None:
        p = by_index[i]
        text = target.tokenizer.decode(answer, skip_special_tokens=True)
        rec = {"index": i, "id": p.id, "source": p.source,
               "messages": [*map(dict, p.messages), {"role": "assistant", "content": text}],
               "input_ids": [*p.prompt_ids, *answer],
               "loss_mask": [0] * len(p.prompt_ids) + [1] * len(answer), "finish": finish}
        f.write((json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())
        done.add(i)
        stats.samples += 1
        stats.tokens += len(answer)
        stats.seconds = time.perf_counter() - t0
        bar.update(1)
        bar.set_postfix_str(f"{stats.tokens_per_s:.1f} tok/s", refresh=False)

    try:
        with open(path, "ab") as f:
            if config.batching == "continuous" and not config.generator:
                from specwire.data.continuous import Request, generate_continuous
                from specwire.decode.sampling import SamplingParams

                order = [i for b in plan for i in b if i not in done]  # longest first within each window
                requests = [Request(tuple(by_index[i].prompt_ids), _limit(by_index[i], config, target)) for i in order]
                params = SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
                generate_continuous(target, requests, slots=config.batch_size, params=params, seed=config.seed,
                                    on_done=lambda r, answer, finish: write(f, order[r], answer, finish))
                plan = []
            for batch_no, batch in enumerate(plan):
                if all(i in done for i in batch):
                    continue
                seed = config.seed * 1_000_003 + batch_no
                if config.generator:
                    answers = _server_batch(target, [by_index[i] for i in batch], config, seed=seed,
                                            model=generator_model or config.generator_model)
                else:
                    answers = generate_batch(
                        target, [by_index[i].prompt_ids for i in batch], max_new_tokens=config.max_new_tokens,
                        max_length=config.max_length, temperature=config.temperature, top_p=config.top_p,
                        top_k=config.top_k, seed=seed)
                for i, (answer, finish) in zip(batch, answers):
                    if i not in done:
                        write(f, i, answer, finish)
    finally:
        bar.close()
    stats.seconds = time.perf_counter() - t0
    return stats


# ---- phase 2: capture into shards ------------------------------------------------------------------

def capture_conversations(target: Target, conversations: Sequence[dict], out: str | os.PathLike, *,
                          hs_ids: Sequence[int], config: DatagenConfig, manifest: ManifestWriter | None = None) -> PhaseStats:
    """Phase 2: capture every conversation not yet in a listed shard; write shards and the manifest.

    conversations: records with "index", "input_ids" and "loss_mask" (lists or 1-D tensors).
    manifest: the folder's manifest (default: read from `out`, which must already hold one).
    """
    out = Path(out)
    manifest = manifest or ManifestWriter.open(out)
    convs = [{"index": r["index"], "input_ids": torch.as_tensor(r["input_ids"], dtype=torch.int64),
              "loss_mask": torch.as_tensor(r["loss_mask"], dtype=torch.uint8)}
             for r in sorted(conversations, key=lambda r: r["index"])]
    plan = plan_shards([len(r["input_ids"]) for r in convs], shard_tokens=config.shard_tokens)
    have = manifest.shards
    for k, entry in enumerate(have):
        rows = [convs[p] for p in plan[k]] if k < len(plan) else []
        if not rows or (entry.first_index, entry.last_index, entry.samples) != (rows[0]["index"], rows[-1]["index"], len(rows)):
            raise SpecwireError(
                f"{out / MANIFEST}: shard {entry.file} does not match the conversations in {out / CONVERSATIONS}; "
                "the folder was modified.", fix="delete the dump folder and rerun datagen.")
    clean_strays(out, {s.file for s in have})
    dtype = DUMP_DTYPES[config.dtype_dump]
    todo_tokens = sum(len(convs[p]["input_ids"]) for shard in plan[len(have):] for p in shard)
    stats = PhaseStats()
    if not todo_tokens:
        return stats
    from tqdm import tqdm

    bar = tqdm(total=todo_tokens, unit="tok", unit_scale=True, desc="datagen 2/2 capture", file=sys.stderr,
               disable=not config.progress, dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        for k in range(len(have), len(plan)):
            rows = [convs[p] for p in plan[k]]
            lengths = [len(r["input_ids"]) for r in rows]
            samples = [dict(r) for r in rows]
            for batch in plan_capture_batches(lengths, batch_size=config.batch_size, max_tokens=config.capture_batch_tokens):
                cap = capture_packed(target, [rows[p]["input_ids"] for p in batch], hs_ids, dtype=dtype)
                h, lh = cap.hidden.to("cpu"), cap.last_hidden.to("cpu")  # the shard is written from host memory
                for p, hp, lp in zip(batch, torch.split(h, cap.lengths), torch.split(lh, cap.lengths)):
                    samples[p]["hidden"], samples[p]["last_hidden"] = hp, lp
                bar.update(sum(cap.lengths))
            shard = write_shard(out, k, samples, hs_ids=hs_ids, hidden_size=target.spec.hidden_size, dtype=config.dtype_dump)
            manifest.add_shard(shard.entry, loss_tokens=shard.loss_tokens)
            stats.samples += shard.entry.samples
            stats.tokens += shard.entry.tokens
            stats.seconds = time.perf_counter() - t0
            bar.set_postfix_str(f"shard {k + 1}/{len(plan)}")
    finally:
        bar.close()
    stats.seconds = time.perf_counter() - t0
    return stats


# ---- the whole job ---------------------------------------------------------------------------------

def _check_existing(manifest: dict, *, path: Path, wiring: Wiring, options: dict, target_name: str) -> None:
    """Refuse to resume a dump made with another target, wiring or options, naming the differences."""
    found_wiring, _ = parse_manifest(manifest, path=path)
    wiring.check_compatible(found_wiring, expected_from="this datagen run", found_in=f"the existing dump {path.parent}")
    old = manifest.get("options") or {}
    diffs = [f"{k}: dump has {old.get(k)!r}, this run has {v!r}" for k, v in options.items()
             if k not in RESUMABLE_OPTIONS and old.get(k) != v]
    diffs += [f"{k}: dump has {old[k]!r}, this run does not set it" for k in old if k not in options]
    if manifest.get("target") != target_name:
        diffs.insert(0, f"target: dump has {manifest.get('target')!r}, this run has {target_name!r}")
    if diffs:
        raise SpecwireError(
            f"{path.parent} already holds a dump made with other settings ({'; '.join(diffs)}); dumps are never mixed.",
            fix="rerun with the dump's settings to resume it, or choose a new --out folder.")


def _load_prompt_records(config: DatagenConfig) -> list:
    from specwire.data.prompts import load_prompts

    records = load_prompts(config.prompts, limit=config.max_samples)
    if not records:
        raise SpecwireError(f"prompt source '{config.prompts}' holds no prompts; datagen needs at least one.",
                            fix="check the file (one JSON record per line) or pick another --prompts source.")
    return list(records)


def run_datagen(config: DatagenConfig, *, target: Target | None = None, prompts: Sequence[Any] | None = None) -> DatagenResult:
    """Both phases, resuming whatever `config.out` already holds. `prompts` (records with .messages, .id,
    .source) overrides loading `config.prompts`; `target` overrides loading `config.target`."""
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise SpecwireError(f"--out {out} is a file; expected a folder for the dump.")
    manifest_path = out / MANIFEST
    existing = read_json(manifest_path, what="dump manifest") if manifest_path.is_file() else None
    if existing is None and out.is_dir() and any(out.iterdir()):
        raise SpecwireError(f"--out {out} is a non-empty folder without a dump manifest; datagen will not write into it.",
                            fix="choose a new or empty --out folder.")
    records = list(prompts) if prompts is not None else _load_prompt_records(config)
    if not records:
        raise SpecwireError("datagen: no prompts given; datagen needs at least one.")
    if target is None:
        from specwire.target.hardware import generation_dtype

        config = dataclasses.replace(config, dtype=generation_dtype(config.dtype, config.device))
        target = load_target(config.target, device=config.device, dtype=config.dtype)
    elif config.dtype == "auto" or parse_dtype(config.dtype) != target.dtype:
        config = dataclasses.replace(config, dtype=str(target.dtype).removeprefix("torch."))
    if target.tokenizer is None:
        raise SpecwireError(f"target '{config.target}' has no tokenizer; datagen needs one to template the prompts.")
    L = target.num_layers
    hs_ids = tuple(config.hs_ids) if config.hs_ids is not None else default_hs_ids(L)
    validate_hs_ids(hs_ids, L, expected_count=3, what="--hs-ids")
    config = dataclasses.replace(config, hs_ids=hs_ids)
    wiring = Wiring(hs_ids, target=target.spec, tokenizer_fingerprint=tokenizer_fingerprint(target.tokenizer),
                    chat_template_hash=chat_template_hash(target.tokenizer))
    max_length = config.max_length
    max_pos = target.info.max_position_embeddings
    if max_pos is not None and max_length > max_pos:
        log.warning("datagen: --max-length %d exceeds the target's %d positions; using %d", max_length, max_pos, max_pos)
        max_length = max_pos
    options = config.options()
    if existing is not None:
        _check_existing(existing, path=manifest_path, wiring=wiring, options=options, target_name=str(config.target))

    kept, skipped = prepare_prompts(target, records, max_length=max_length)
    if not kept:
        raise SpecwireError(f"every one of the {len(records)} prompts is longer than --max-length {max_length} tokens.",
                            fix="raise --max-length or use shorter prompts.")
    if existing is None:
        out.mkdir(parents=True, exist_ok=True)
        existing = {"format": DUMP_FORMAT, "format_version": DUMP_FORMAT_VERSION, "wiring": wiring.to_dict(),
                    "target": str(config.target), "dtype": config.dtype_dump, "max_length": max_length,
                    "counts": {"samples": 0, "tokens": 0, "loss_tokens": 0, "prompts": len(records),
                               "skipped_prompts": len(skipped), "conversations": 0},
                    "skipped_prompts": skipped, "shards": [], "options": options, "complete": False}
        if config.generator:
            from specwire.data.generator import server_model

            existing["generator"] = {
                "url": config.generator, "model": config.generator_model or server_model(config.generator),
                "token_ids": "the server's answer text re-tokenized with the target's tokenizer after the templated prompt"}
    existing["options"]["device"] = options["device"]
    manifest = ManifestWriter(manifest_path, existing)
    manifest.write()
    result = DatagenResult(out=str(out), complete=False, prompts=len(records), skipped=len(skipped), conversations=0,
                           samples=0, tokens=0, loss_tokens=0, shards=0, hs_ids=list(hs_ids))
    if not existing["complete"]:
        gen_config = dataclasses.replace(config, max_length=max_length)
        result.generate = generate_conversations(target, kept, out / CONVERSATIONS, gen_config,
                                                 generator_model=(existing.get("generator") or {}).get("model"))
        # by prompt index: continuous batching appends in finishing order, which a resumed run changes
        conversations = dict(sorted(_load_done(out / CONVERSATIONS, {p.index: p for p in kept}).items()))
        existing["counts"]["conversations"] = len(conversations)
        manifest.write()
        result.capture = capture_conversations(target, list(conversations.values()), out, hs_ids=hs_ids,
                                               config=gen_config, manifest=manifest)
        V = target.spec.vocab_size
        counts = torch.zeros(V, dtype=torch.int64)  # shape: [V]
        for r in conversations.values():
            counts += torch.bincount(r["input_ids"][r["loss_mask"].bool()], minlength=V)
        save_tensors(out / VOCAB_COUNTS, {"counts": counts})
        existing["complete"] = True
        manifest.write()
    c = existing["counts"]
    result.complete = True
    result.conversations = c["conversations"]
    result.samples, result.tokens, result.loss_tokens = c["samples"], c["tokens"], c["loss_tokens"]
    result.shards = len(existing["shards"])
    return result
