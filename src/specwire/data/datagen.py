"""`specwire datagen`: self-distilled conversations and the hidden-state dump.

Owns: writing a dump folder (layout and reading in `dump`), in two resumable phases:
  1. generate: the target answers every prompt in its own chat template (batched HF `generate`, left
     padding, greedy by default). The token ids it generated are stored as they are (never
     re-tokenized), with a loss mask on them, one line per sample in conversations.jsonl.
  2. capture: one prefill pass of the target's decoder over each conversation (right padding, batches
     of similar length, no lm_head) reads the fused hs ids and hs L through forward hooks;
     samples are packed into safetensors shards of about `shard_tokens` tokens.
`capture_batch` is the single capture code path: dump writing and the trainer's online mode both use
it. Does not read dumps back (`dump`), build the vocab map (`vocab`) or load prompt sets (`prompts`).

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

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from specwire.target.capture import capture_hidden_states
from specwire.data.dump import (CONVERSATIONS, DUMP_DTYPES, DUMP_FORMAT, DUMP_FORMAT_VERSION, MANIFEST, SHARD_FORMAT, VOCAB_COUNTS,
                   ShardEntry, check_conversation, parse_manifest, shard_name)
from specwire.errors import SpecwireError
from specwire.safeio import cut_partial_line, read_json, save_tensors, write_json
from specwire.target.load import BUILTIN_TARGET, Target, chat_template_hash, load_target, parse_dtype, tokenizer_fingerprint
from specwire.wiring import Wiring, default_hs_ids, validate_hs_ids

log = logging.getLogger("specwire")

# Test-only crash hook: "conversations:N" (after N lines written by this process), "partial:N" (half of
# line N+1 written), "shard-file:N" (shard file N+1 written, not yet in the manifest), "shards:N" (after
# N shards and their manifest). The process then kills itself with SIGKILL, like `kill -9`.
CRASH_ENV = "SPECWIRE_TEST_CRASH"
# Options that may change between a run and its resumption (they do not change the data).
RESUMABLE_OPTIONS = frozenset({"device"})


@dataclass
class DatagenConfig:
    """Everything `specwire datagen` takes; all but `out`, `device` and `progress` are recorded in the manifest."""

    out: str  # dump folder (created; an existing dump is resumed)
    prompts: str  # prompt source: "mt-bench", "humaneval", "pool" or a JSONL path (see `prompts`)
    target: str = BUILTIN_TARGET  # built-in name or HF folder
    hs_ids: tuple[int, ...] | None = None  # fused hs ids (None = default_hs_ids(L))
    max_samples: int | None = None  # use the first N prompts of the source (None = all)
    max_new_tokens: int = 256  # answer length cap
    max_length: int = 2048  # cap on prompt + answer tokens; longer prompts are skipped
    batch_size: int = 16  # sequences per generate / capture batch
    sort_window: int = 8  # prompts are sorted by length within windows of this many batches
    shard_tokens: int = 65536  # a shard is closed once it holds at least this many tokens
    capture_batch_tokens: int = 16384  # cap on padded tokens in one capture batch (one long sample may exceed it)
    dtype_dump: str = "bfloat16"  # dtype of hidden / last_hidden in the shards
    device: str | None = None  # torch device (None = cuda when available, else cpu)
    dtype: str = "float32"  # weights dtype of the target
    seed: int = 0  # sampling seed (per batch: seed and batch number); unused when greedy
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0  # nucleus sampling when temperature > 0
    top_k: int = 0  # top-k sampling when temperature > 0 (0 = off)
    progress: bool = True  # tqdm progress bars on stderr

    def __post_init__(self):
        if self.hs_ids is not None:
            self.hs_ids = tuple(int(i) for i in self.hs_ids)
        for name in ("max_new_tokens", "max_length", "batch_size", "sort_window", "shard_tokens", "capture_batch_tokens"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecwireError(f"datagen {name.replace('_', '-')}: expected a positive integer, found {v!r}.")
        if self.max_samples is not None and (not isinstance(self.max_samples, int) or self.max_samples < 1):
            raise SpecwireError(f"datagen max-samples: expected a positive integer, found {self.max_samples!r}.")
        if self.dtype_dump not in DUMP_DTYPES:
            raise SpecwireError(f"datagen dtype-dump: '{self.dtype_dump}', expected one of {sorted(DUMP_DTYPES)}.")
        if not self.temperature >= 0:
            raise SpecwireError(f"datagen temperature: expected >= 0, found {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise SpecwireError(f"datagen top-p: expected 0 < p <= 1, found {self.top_p}.")
        if self.top_k < 0:
            raise SpecwireError(f"datagen top-k: expected >= 0, found {self.top_k}.")

    def options(self) -> dict[str, Any]:
        """The options recorded in (and compared against) the manifest."""
        d = dataclasses.asdict(self)
        for k in ("out", "progress"):
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


def _crash_hook(kind: str, count: int) -> None:
    if os.environ.get(CRASH_ENV) == f"{kind}:{count}":
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


# ---- the capture path (shared with online training) ------------------------------------------------

def _capture_packed(target: Target, input_ids_list: Sequence[Sequence[int]], hs_ids: Sequence[int], *,
                    dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """One prefill of a right-padded batch; states of the real tokens packed flat, on the target's device.

    Right padding needs no attention mask: under causal attention a real token only sees earlier
    tokens, which are all real, so each row computes exactly what it would alone (and SDPA keeps its
    causal fast path). Returns hidden [N, n_ids*H], last_hidden [N, H], and the row lengths.
    """
    lens = [len(x) for x in input_ids_list]
    if not lens or min(lens) < 1:
        raise SpecwireError("capture: every sequence needs at least one token.")
    T = max(lens)
    L = target.num_layers
    ids = torch.zeros(len(lens), T, dtype=torch.long)  # shape: [B, T], right-padded with id 0
    for r, x in enumerate(input_ids_list):
        ids[r, :lens[r]] = torch.as_tensor(x, dtype=torch.long)
    ids = ids.to(target.device)
    cap = capture_hidden_states(target.model, ids, list(hs_ids) + [L], parts=target.parts)
    dtype = dtype or cap.states.dtype
    valid = torch.arange(T, device=ids.device)[None, :] < torch.tensor(lens, device=ids.device)[:, None]  # shape: [B, T]
    states = cap.states.to(dtype)  # shape: [n_ids + 1, B, T, H]
    hidden = torch.cat(list(states[:-1]), dim=-1)[valid]  # shape: [N, n_ids * H], rows in batch order
    last_hidden = states[-1][valid]  # shape: [N, H]
    return hidden, last_hidden, lens


def capture_batch(target: Target, input_ids_list: Sequence[Sequence[int]], hs_ids: Sequence[int], *,
                  dtype: torch.dtype | None = None) -> dict[str, list[torch.Tensor]]:
    """Capture the fused `hs_ids` states and hs L for each sequence: the one capture code path.

    Returns {"hidden": [[T_i, n_ids*H]...], "last_hidden": [[T_i, H]...]} on the target's device, in
    `dtype` (default: the model's). Training targets come from lm_head(final_norm(last_hidden)).
    """
    hidden, last_hidden, lens = _capture_packed(target, input_ids_list, hs_ids, dtype=dtype)
    return {"hidden": list(torch.split(hidden, lens)), "last_hidden": list(torch.split(last_hidden, lens))}


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


def generate_conversations(target: Target, prompts: Sequence[PreparedPrompt], path: str | os.PathLike,
                           config: DatagenConfig) -> PhaseStats:
    """Phase 1: append the target's answers to `path` (conversations.jsonl), resuming what is there."""
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
    written = 0
    try:
        with open(path, "ab") as f:
            for batch_no, batch in enumerate(plan):
                if all(i in done for i in batch):
                    continue
                answers = generate_batch(
                    target, [by_index[i].prompt_ids for i in batch], max_new_tokens=config.max_new_tokens,
                    max_length=config.max_length, temperature=config.temperature, top_p=config.top_p,
                    top_k=config.top_k, seed=config.seed * 1_000_003 + batch_no)
                for i, (answer, finish) in zip(batch, answers):
                    if i in done:
                        continue
                    p = by_index[i]
                    text = target.tokenizer.decode(answer, skip_special_tokens=True)
                    rec = {"index": i, "id": p.id, "source": p.source,
                           "messages": [*map(dict, p.messages), {"role": "assistant", "content": text}],
                           "input_ids": [*p.prompt_ids, *answer],
                           "loss_mask": [0] * len(p.prompt_ids) + [1] * len(answer), "finish": finish}
                    line = (json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
                    if os.environ.get(CRASH_ENV) == f"partial:{written}":
                        f.write(line[: len(line) // 2])
                        f.flush()
                        _crash_hook("partial", written)
                    f.write(line)
                    f.flush()
                    os.fsync(f.fileno())
                    done.add(i)
                    written += 1
                    stats.samples += 1
                    stats.tokens += len(answer)
                    bar.update(1)
                    _crash_hook("conversations", written)
                stats.seconds = time.perf_counter() - t0
                bar.set_postfix_str(f"{stats.tokens_per_s:.1f} tok/s")
    finally:
        bar.close()
    stats.seconds = time.perf_counter() - t0
    return stats


# ---- phase 2: capture into shards ------------------------------------------------------------------

class ManifestWriter:
    """The manifest being written: a dict rewritten atomically after each change."""

    def __init__(self, path: Path, data: dict):
        self.path, self.data = path, data

    @classmethod
    def open(cls, out: str | os.PathLike) -> "ManifestWriter":
        """The manifest of an existing (possibly unfinished) dump folder."""
        path = Path(out) / MANIFEST
        data = read_json(path, what="dump manifest")
        parse_manifest(data, path=path)
        return cls(path, data)

    def write(self) -> None:
        write_json(self.path, self.data)

    @property
    def shards(self) -> list[ShardEntry]:
        return [ShardEntry(**s) for s in self.data["shards"]]

    def add_shard(self, entry: ShardEntry, *, loss_tokens: int) -> None:
        self.data["shards"].append(entry.to_dict())
        c = self.data["counts"]
        c["samples"] += entry.samples
        c["tokens"] += entry.tokens
        c["loss_tokens"] += loss_tokens
        self.write()


def _clean_strays(out: Path, listed: set[str]) -> None:
    """Delete shard files the manifest does not list, and temporaries of interrupted atomic writes."""
    import shutil

    for p in out.iterdir():
        name = p.name
        if name.startswith("shard-") and name.endswith(".safetensors") and name not in listed:
            log.info("datagen: removing unfinished %s", p)
            p.unlink()
        elif name.startswith(".") and (name.startswith(".shard-") or name.startswith(f".{MANIFEST}.")
                                       or name.startswith(f".{VOCAB_COUNTS}.")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


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
    _clean_strays(out, {s.file for s in have})
    dtype = DUMP_DTYPES[config.dtype_dump]
    todo_tokens = sum(len(convs[p]["input_ids"]) for shard in plan[len(have):] for p in shard)
    stats = PhaseStats()
    if not todo_tokens:
        return stats
    from tqdm import tqdm

    bar = tqdm(total=todo_tokens, unit="tok", unit_scale=True, desc="datagen 2/2 capture", file=sys.stderr,
               disable=not config.progress, dynamic_ncols=True)
    t0 = time.perf_counter()
    meta = {"format": SHARD_FORMAT, "hs_ids": ",".join(map(str, hs_ids)),
            "hidden_size": str(target.spec.hidden_size), "dtype": config.dtype_dump}
    try:
        for k in range(len(have), len(plan)):
            rows = [convs[p] for p in plan[k]]
            lengths = [len(r["input_ids"]) for r in rows]
            hidden: list[torch.Tensor | None] = [None] * len(rows)
            last: list[torch.Tensor | None] = [None] * len(rows)
            for batch in plan_capture_batches(lengths, batch_size=config.batch_size, max_tokens=config.capture_batch_tokens):
                h, lh, lens = _capture_packed(target, [rows[p]["input_ids"] for p in batch], hs_ids, dtype=dtype)
                h, lh = h.to("cpu"), lh.to("cpu")  # the shard is written from host memory
                for p, hp, lp in zip(batch, torch.split(h, lens), torch.split(lh, lens)):
                    hidden[p], last[p] = hp, lp
                bar.update(sum(lens))
            tensors = {
                "input_ids": torch.cat([r["input_ids"] for r in rows]),  # shape: [N] int64
                "loss_mask": torch.cat([r["loss_mask"] for r in rows]),  # shape: [N] uint8
                "hidden": torch.cat(hidden),  # shape: [N, n_ids * H]
                "last_hidden": torch.cat(last),  # shape: [N, H]
                "offsets": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64),  # shape: [S+1]
                "sample_index": torch.tensor([r["index"] for r in rows], dtype=torch.int64),  # shape: [S]
            }
            entry = ShardEntry(file=shard_name(k), samples=len(rows), tokens=sum(lengths),
                               first_index=rows[0]["index"], last_index=rows[-1]["index"])
            save_tensors(out / entry.file, tensors, metadata=meta)
            _crash_hook("shard-file", k + 1)
            manifest.add_shard(entry, loss_tokens=int(tensors["loss_mask"].sum()))
            stats.samples += entry.samples
            stats.tokens += entry.tokens
            stats.seconds = time.perf_counter() - t0
            bar.set_postfix_str(f"shard {k + 1}/{len(plan)}")
            _crash_hook("shards", k + 1)
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
        target = load_target(config.target, device=config.device, dtype=config.dtype)
    elif parse_dtype(config.dtype) != target.dtype:
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
    existing["options"]["device"] = options["device"]
    manifest = ManifestWriter(manifest_path, existing)
    manifest.write()
    result = DatagenResult(out=str(out), complete=False, prompts=len(records), skipped=len(skipped), conversations=0,
                           samples=0, tokens=0, loss_tokens=0, shards=0, hs_ids=list(hs_ids))
    if not existing["complete"]:
        gen_config = dataclasses.replace(config, max_length=max_length)
        result.generate = generate_conversations(target, kept, out / CONVERSATIONS, gen_config)
        conversations = _load_done(out / CONVERSATIONS, {p.index: p for p in kept})
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


# ---- command line ----------------------------------------------------------------------------------

DATAGEN_HELP = """\
Phase 1 (generate): the target answers every prompt with its own chat template (batched HF generate,
left padding, greedy unless --temperature > 0); the generated token ids are stored as they are in
OUT/conversations.jsonl with a loss mask on the answer (up to and including the first EOS).
Phase 2 (capture): one prefill pass per conversation reads the fused --hs-ids states and hs L (the last
layer, before the final norm) into OUT/shard-NNNNN.safetensors; OUT/manifest.json holds the wiring,
fingerprints, counts and options; OUT/vocab_counts.safetensors the assistant-token frequencies.

Prompts longer than --max-length: a prompt whose templated tokens do not leave room for one answer
token under --max-length is SKIPPED, never truncated; each skip is logged with the prompt's id and
counted in the manifest (counts.skipped_prompts, skipped_prompts). Answers stop at --max-new-tokens or
when prompt + answer reach --max-length (finish "length").

Resumable: rerun the same command after an interruption (even kill -9); finished work is kept, nothing is
duplicated. A rerun with another target, wiring or option into the same OUT is refused.
"""


def add_cli(sub) -> None:
    from specwire.cli import add_json_option, add_model_options

    p = sub.add_parser("datagen", help="self-distilled data + hidden-state dump with manifest; resumable",
                       description=DATAGEN_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_options(p)
    p.add_argument("--prompts", required=True, help="mt-bench, humaneval, pool (or a part: pool:synthetic, 'pool[512:1000]'), or a JSONL file")
    p.add_argument("--out", required=True, help="dump folder (created, or resumed when it holds a dump)")
    p.add_argument("--hs-ids", default=None, help="fused hs ids, e.g. 2,15,27 (default: the target's [2, L//2, L-3])")
    p.add_argument("--max-samples", type=int, default=None, help="use only the first N prompts of the source")
    p.add_argument("--max-new-tokens", type=int, default=256, help="answer length cap (default: %(default)s)")
    p.add_argument("--max-length", type=int, default=2048,
                   help="cap on prompt + answer tokens; longer prompts are skipped with a warning (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per batch (default: %(default)s)")
    p.add_argument("--shard-tokens", type=int, default=65536, help="tokens per shard, about (default: %(default)s)")
    p.add_argument("--dtype-dump", default="bfloat16", choices=sorted(DUMP_DTYPES), help="dtype of the stored states (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy answers (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_json_option(p)
    p.set_defaults(func=cmd_datagen)


def cmd_datagen(args: argparse.Namespace) -> int:
    from specwire.cli import emit_json
    from specwire.data.dump import open_dump
    from specwire.draft.vocab import coverage_table, format_coverage_table
    from specwire.wiring import parse_ids

    config = DatagenConfig(
        out=args.out, prompts=args.prompts, target=args.target,
        hs_ids=tuple(parse_ids(args.hs_ids)) if args.hs_ids else None, max_samples=args.max_samples,
        max_new_tokens=args.max_new_tokens, max_length=args.max_length, batch_size=args.batch_size,
        shard_tokens=args.shard_tokens, dtype_dump=args.dtype_dump, device=args.device, dtype=args.dtype,
        seed=args.seed, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        progress=not args.no_progress)
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
