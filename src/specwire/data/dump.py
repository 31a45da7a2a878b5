"""The hidden-state dump on disk (the folder `specwire datagen` writes): its layout, writing and reading.

Owns: the dump's on-disk names and constants; writing: the `ManifestWriter` (the manifest rewritten
atomically after each change), `write_shard` (one shard, written atomically) and `clean_strays`
(shard files the manifest does not list, and temporaries of interrupted writes); reading: validation
of `manifest.json` (format, version, wiring, counts, shard list) and of every shard's tensors (names,
dtypes, shapes, offsets, indices), the `DumpReader` that iterates samples, the deterministic
train/validation split, the vocabulary counts, and `conversations.jsonl`. Does not decide what goes
into a dump (generation and capture are `datagen`'s) nor train (`training`).

Layout (the shared contract; datagen writes it, the trainer and eval read it):
  conversations.jsonl       phase 1: one JSON object per sample (index, id, source, messages,
                            input_ids, loss_mask, finish)
  shard-00000.safetensors   phase 2: samples packed flat: input_ids [N] int64, loss_mask [N] uint8,
                            hidden [N, n_ids*H] and last_hidden [N, H] (the manifest's dtype),
                            offsets [S+1] int64 (sample s = offsets[s]:offsets[s+1]),
                            sample_index [S] int64 (global indices, increasing)
  manifest.json             format, version, wiring, dtype, counts, shard list, options, complete
  vocab_counts.safetensors  counts [V] int64 of target ids at loss-masked positions

A sample is a dict {input_ids [T] int64, loss_mask [T] uint8, hidden [T, n_ids*H],
last_hidden [T, H], index int}. The training target at position t (the distribution of token t+1)
is lm_head(final_norm(last_hidden[t])).

Incomplete dumps: `open_dump` refuses a dump whose manifest says `complete: false` (datagen was
interrupted; rerun it to finish) unless `allow_incomplete=True`, which reads the shards listed in the
manifest (all fully written) and logs a warning. Training on half a dump by accident is worse than an
error.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from specwire.errors import SpecwireError
from specwire.safeio import load_tensors, read_json, safetensors_header, save_tensors, write_json
from specwire.wiring import Wiring

log = logging.getLogger("specwire")

DUMP_FORMAT = "specwire-dump"
DUMP_FORMAT_VERSION = 1
MANIFEST = "manifest.json"
CONVERSATIONS = "conversations.jsonl"
VOCAB_COUNTS = "vocab_counts.safetensors"
SHARD_FORMAT = "specwire-dump-shard"  # `format` in each shard's safetensors metadata
VAL_EVERY = 50  # a sample is validation when index % VAL_EVERY == 0 (2%)
SPLITS = ("train", "val")
SHARD_TENSORS = ("input_ids", "loss_mask", "hidden", "last_hidden", "offsets", "sample_index")
CONVERSATION_KEYS = ("index", "id", "source", "messages", "input_ids", "loss_mask", "finish")

DUMP_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_ST_DTYPE = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.safetensors"


def is_validation(index: int) -> bool:
    """The deterministic split: validation when index % VAL_EVERY == 0."""
    return int(index) % VAL_EVERY == 0


def in_split(index: int, split: str | None) -> bool:
    if split is None:
        return True
    if split not in SPLITS:
        raise SpecwireError(f"unknown split '{split}'; expected one of {list(SPLITS)} (or None for all samples).")
    return is_validation(index) == (split == "val")


@dataclass(frozen=True)
class ShardEntry:
    """One finished shard, as the manifest lists it."""

    file: str  # file name inside the dump folder
    samples: int  # number of samples S
    tokens: int  # number of tokens N (sum of sample lengths)
    first_index: int  # global index of its first sample
    last_index: int  # global index of its last sample

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "samples": self.samples, "tokens": self.tokens,
                "first_index": self.first_index, "last_index": self.last_index}


# ---- manifest ---------------------------------------------------------------------------------------

def _int_field(d: dict, name: str, where: str, *, minimum: int = 0) -> int:
    v = d.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise SpecwireError(f"{where}: field '{name}' must be an integer >= {minimum}, found {v!r}.")
    return v


def parse_manifest(manifest: dict, *, path: str | os.PathLike) -> tuple[Wiring, list[ShardEntry]]:
    """Validate a manifest dict; return its wiring and shard entries (errors name the file and field)."""
    where = str(path)
    fmt = manifest.get("format")
    if fmt != DUMP_FORMAT:
        raise SpecwireError(f"{where}: field 'format' is {fmt!r}, expected '{DUMP_FORMAT}'; this is not a specwire dump.")
    version = manifest.get("format_version")
    if version != DUMP_FORMAT_VERSION:
        raise SpecwireError(
            f"{where}: format_version {version!r}, this specwire reads version {DUMP_FORMAT_VERSION}.",
            fix="regenerate the dump with this specwire, or use the specwire version that wrote it.",
        )
    wiring = Wiring.from_dict(manifest.get("wiring"), source=f"{where}: wiring")
    dtype = manifest.get("dtype")
    if dtype not in DUMP_DTYPES:
        raise SpecwireError(f"{where}: field 'dtype' is {dtype!r}, expected one of {sorted(DUMP_DTYPES)}.")
    if not isinstance(manifest.get("complete"), bool):
        raise SpecwireError(f"{where}: field 'complete' must be true or false, found {manifest.get('complete')!r}.")
    counts = manifest.get("counts")
    if not isinstance(counts, dict):
        raise SpecwireError(f"{where}: field 'counts' must be an object, found {counts!r}.")
    for name in ("samples", "tokens", "loss_tokens"):
        _int_field(counts, name, f"{where}: counts")
    shards_raw = manifest.get("shards")
    if not isinstance(shards_raw, list):
        raise SpecwireError(f"{where}: field 'shards' must be a list, found {type(shards_raw).__name__}.")
    shards: list[ShardEntry] = []
    for k, s in enumerate(shards_raw):
        w = f"{where}: shards[{k}]"
        if not isinstance(s, dict):
            raise SpecwireError(f"{w}: expected an object, found {s!r}.")
        if s.get("file") != shard_name(k):
            raise SpecwireError(f"{w}: file is {s.get('file')!r}, expected '{shard_name(k)}' (shards are numbered in order).")
        entry = ShardEntry(file=s["file"], samples=_int_field(s, "samples", w, minimum=1),
                           tokens=_int_field(s, "tokens", w, minimum=1), first_index=_int_field(s, "first_index", w),
                           last_index=_int_field(s, "last_index", w))
        if entry.last_index < entry.first_index or entry.last_index - entry.first_index + 1 < entry.samples:
            raise SpecwireError(f"{w}: indices {entry.first_index}..{entry.last_index} cannot hold {entry.samples} samples.")
        if shards and entry.first_index <= shards[-1].last_index:
            raise SpecwireError(
                f"{w}: first_index {entry.first_index} overlaps the previous shard (last_index {shards[-1].last_index}); "
                "a sample would appear twice."
            )
        shards.append(entry)
    total = (sum(s.samples for s in shards), sum(s.tokens for s in shards))
    if (counts["samples"], counts["tokens"]) != total:
        raise SpecwireError(
            f"{where}: counts say {counts['samples']} samples / {counts['tokens']} tokens but the shards hold "
            f"{total[0]} / {total[1]}; the manifest is inconsistent."
        )
    return wiring, shards


def check_shard_header(path: Path, entry: ShardEntry, *, wiring: Wiring, dtype: str) -> None:
    """Names, dtypes and shapes of a shard's tensors (from the header only), and its claimed wiring."""
    header = safetensors_header(path)
    meta = header.get("__metadata__") or {}
    names = sorted(k for k in header if k != "__metadata__")
    if names != sorted(SHARD_TENSORS):
        raise SpecwireError(f"{path}: tensors {names}, expected {sorted(SHARD_TENSORS)}.")
    H = wiring.target.hidden_size
    n_ids = len(wiring.hs_ids)
    claimed = meta.get("hs_ids")
    if claimed is not None and claimed != ",".join(map(str, wiring.hs_ids)):
        raise SpecwireError(
            f"{path}: the shard was captured at hs ids [{claimed}] but the manifest's wiring is {list(wiring.hs_ids)}; "
            "this dump mixes wirings.",
            fix="regenerate the dump into an empty folder (datagen never mixes wirings; the folder was edited by hand).",
        )
    N, S = entry.tokens, entry.samples
    expected = {
        "input_ids": ("I64", [N]), "loss_mask": ("U8", [N]), "hidden": (_ST_DTYPE[dtype], [N, n_ids * H]),
        "last_hidden": (_ST_DTYPE[dtype], [N, H]), "offsets": ("I64", [S + 1]), "sample_index": ("I64", [S]),
    }
    for name, (st_dtype, shape) in expected.items():
        found_dtype, found_shape = header[name]["dtype"], list(header[name]["shape"])
        if name == "hidden" and len(found_shape) == 2 and found_shape[0] == N and found_shape[1] != n_ids * H:
            raise SpecwireError(
                f"{path}: tensor 'hidden' is {found_shape[1]} wide, but the manifest's wiring fuses {n_ids} states "
                f"(hs {list(wiring.hs_ids)}) of width {H} = {n_ids * H}; this dump mixes wirings.",
                fix="regenerate the dump into an empty folder.",
            )
        if found_dtype != st_dtype or found_shape != shape:
            raise SpecwireError(
                f"{path}: tensor '{name}' is {found_dtype} {found_shape}, expected {st_dtype} {shape} "
                f"(from the manifest: {S} samples, {N} tokens, dtype {dtype}, hidden size {H})."
            )


def check_shard_data(path: Path, t: dict[str, torch.Tensor], entry: ShardEntry, *, vocab_size: int) -> None:
    """Offsets, sample indices, token ids and masks of a loaded shard."""
    off, idx = t["offsets"], t["sample_index"]
    if int(off[0]) != 0 or int(off[-1]) != entry.tokens or bool((off[1:] <= off[:-1]).any()):
        raise SpecwireError(f"{path}: 'offsets' must rise strictly from 0 to {entry.tokens}; the shard is corrupt.")
    if bool((idx[1:] <= idx[:-1]).any()) or int(idx[0]) != entry.first_index or int(idx[-1]) != entry.last_index:
        raise SpecwireError(
            f"{path}: 'sample_index' must rise strictly from {entry.first_index} to {entry.last_index} "
            f"(from the manifest), found {idx[0].item()}..{idx[-1].item()}."
        )
    ids = t["input_ids"]
    if bool((ids < 0).any()) or bool((ids >= vocab_size).any()):
        raise SpecwireError(f"{path}: 'input_ids' holds ids outside the target vocabulary 0..{vocab_size - 1}.")
    if bool((t["loss_mask"] > 1).any()):
        raise SpecwireError(f"{path}: 'loss_mask' holds values other than 0 and 1.")


# ---- writing ----------------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class WrittenShard:
    entry: ShardEntry  # what the manifest lists
    loss_tokens: int  # assistant tokens in the shard


def write_shard(out: str | os.PathLike, k: int, samples: Sequence[dict], *, hs_ids: Sequence[int], hidden_size: int,
                dtype: str) -> WrittenShard:
    """Write shard k atomically from `samples` (in sample order), each {"index", "input_ids" [T] int64,
    "loss_mask" [T] uint8, "hidden" [T, n_ids*H], "last_hidden" [T, H]} in host memory and dtype `dtype`.

    The caller lists it in the manifest afterwards (`ManifestWriter.add_shard`): a shard file that the
    manifest does not list is unfinished work, deleted by `clean_strays`.
    """
    lengths = [len(s["input_ids"]) for s in samples]
    tensors = {
        "input_ids": torch.cat([s["input_ids"] for s in samples]),  # shape: [N] int64
        "loss_mask": torch.cat([s["loss_mask"] for s in samples]),  # shape: [N] uint8
        "hidden": torch.cat([s["hidden"] for s in samples]),  # shape: [N, n_ids * H]
        "last_hidden": torch.cat([s["last_hidden"] for s in samples]),  # shape: [N, H]
        "offsets": torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64),  # shape: [S+1]
        "sample_index": torch.tensor([s["index"] for s in samples], dtype=torch.int64),  # shape: [S]
    }
    meta = {"format": SHARD_FORMAT, "hs_ids": ",".join(map(str, hs_ids)), "hidden_size": str(hidden_size), "dtype": dtype}
    entry = ShardEntry(file=shard_name(k), samples=len(samples), tokens=sum(lengths),
                       first_index=samples[0]["index"], last_index=samples[-1]["index"])
    save_tensors(Path(out) / entry.file, tensors, metadata=meta)
    return WrittenShard(entry=entry, loss_tokens=int(tensors["loss_mask"].sum()))


def clean_strays(out: str | os.PathLike, listed: set[str]) -> None:
    """Delete shard files the manifest does not list, and temporaries of interrupted atomic writes."""
    for p in Path(out).iterdir():
        name = p.name
        if name.startswith("shard-") and name.endswith(".safetensors") and name not in listed:
            log.info("datagen: removing unfinished %s", p)
            p.unlink()
        elif name.startswith(".") and (name.startswith(".shard-") or name.startswith(f".{MANIFEST}.")
                                       or name.startswith(f".{VOCAB_COUNTS}.")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()


# ---- conversations ----------------------------------------------------------------------------------

def check_conversation(rec: Any, *, where: str) -> dict:
    """A conversations.jsonl record has every key, and ids and mask of one length."""
    if not isinstance(rec, dict):
        raise SpecwireError(f"{where}: expected a JSON object, found {type(rec).__name__}.")
    missing = [k for k in CONVERSATION_KEYS if k not in rec]
    if missing:
        raise SpecwireError(f"{where}: missing fields {missing}.")
    if not isinstance(rec["input_ids"], list) or not isinstance(rec["loss_mask"], list) or \
            len(rec["input_ids"]) != len(rec["loss_mask"]) or not rec["input_ids"]:
        raise SpecwireError(f"{where}: 'input_ids' and 'loss_mask' must be non-empty lists of the same length.")
    if not isinstance(rec["index"], int) or rec["index"] < 0:
        raise SpecwireError(f"{where}: 'index' must be a non-negative integer, found {rec['index']!r}.")
    return rec


def read_conversations(path: str | os.PathLike) -> list[dict]:
    """All complete records of a conversations.jsonl (a partial last line, from a crash, is ignored)."""
    path = Path(path)
    if not path.is_file():
        raise SpecwireError(f"conversations file not found: {path}")
    data = path.read_bytes()
    lines = data.split(b"\n")
    if lines and lines[-1] != b"":
        log.warning("%s: ignoring a partial last line (datagen was interrupted while writing it)", path)
    out = []
    for n, line in enumerate(lines[:-1], start=1):
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SpecwireError(f"{path}:{n}: not valid JSON ({e}); the file is corrupt.") from None
        out.append(check_conversation(rec, where=f"{path}:{n}"))
    return out


# ---- the reader -------------------------------------------------------------------------------------

class DumpReader:
    """A validated dump: manifest, wiring, shards; iterates samples shard by shard."""

    def __init__(self, path: Path, manifest: dict, wiring: Wiring, shards: list[ShardEntry]):
        self.path = path
        self.manifest = manifest
        self.wiring = wiring
        self.shards = shards
        self.dtype_name: str = manifest["dtype"]
        self.dtype: torch.dtype = DUMP_DTYPES[self.dtype_name]
        self.complete: bool = manifest["complete"]
        self._indices: dict[int, torch.Tensor] = {}

    # sizes
    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def num_loss_tokens(self) -> int:
        return int(self.manifest["counts"]["loss_tokens"])

    @property
    def hidden_width(self) -> int:
        return len(self.wiring.hs_ids) * self.wiring.target.hidden_size

    def __len__(self) -> int:
        return self.num_samples

    def __repr__(self) -> str:
        return (f"DumpReader({str(self.path)!r}, samples={self.num_samples}, tokens={self.num_tokens}, "
                f"hs_ids={list(self.wiring.hs_ids)}, dtype={self.dtype_name}, complete={self.complete})")

    # shards
    def load_shard(self, k: int, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        """All tensors of shard k, validated (header, shapes, offsets, indices, ids)."""
        entry = self.shards[k]
        path = self.path / entry.file
        check_shard_header(path, entry, wiring=self.wiring, dtype=self.dtype_name)
        t = load_tensors(path, device=device)
        check_shard_data(path, t, entry, vocab_size=self.wiring.target.vocab_size)
        return t

    def shard_sample_index(self, k: int) -> torch.Tensor:
        """Global sample indices of shard k, read without loading its states. shape: [S]"""
        if k not in self._indices:
            from safetensors import safe_open

            with safe_open(str(self.path / self.shards[k].file), framework="pt") as f:
                self._indices[k] = f.get_tensor("sample_index")
        return self._indices[k]

    def sample_indices(self, split: str | None = None) -> list[int]:
        """Global indices of the samples in `split` (None = all), in dump order."""
        return [i for k in range(len(self.shards)) for i in self.shard_sample_index(k).tolist() if in_split(i, split)]

    # samples
    def iter_samples(self, split: str | None = None, *, shards: list[int] | None = None,
                     device: str | torch.device = "cpu") -> Iterator[dict[str, Any]]:
        """Samples of `split` (None = all) from the given shards (default all), in dump order."""
        in_split(0, split)  # validates the name
        for k in range(len(self.shards)) if shards is None else shards:
            t = self.load_shard(k, device=device)
            off = t["offsets"].tolist()
            for s, index in enumerate(t["sample_index"].tolist()):
                if not in_split(index, split):
                    continue
                a, b = off[s], off[s + 1]
                yield {"input_ids": t["input_ids"][a:b], "loss_mask": t["loss_mask"][a:b],
                       "hidden": t["hidden"][a:b], "last_hidden": t["last_hidden"][a:b], "index": index}

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.iter_samples()

    def split(self, name: str) -> "DumpSplit":
        in_split(0, name)
        return DumpSplit(self, name)

    # side files
    def vocab_counts(self) -> torch.Tensor:
        """Frequencies of target ids at loss-masked positions. shape: [V] int64

        Read from vocab_counts.safetensors (written when the dump completes); counted from the shards
        when that file is absent (an incomplete dump).
        """
        V = self.wiring.target.vocab_size
        f = self.path / VOCAB_COUNTS
        if f.is_file():
            t = load_tensors(f)
            c = t.get("counts")
            if c is None or c.dtype != torch.int64 or tuple(c.shape) != (V,):
                found = "missing" if c is None else f"{c.dtype} {tuple(c.shape)}"
                raise SpecwireError(f"{f}: tensor 'counts' must be int64 [{V}] (the target vocab), found {found}.")
            return c
        counts = torch.zeros(V, dtype=torch.int64)
        for k in range(len(self.shards)):
            t = self.load_shard(k)
            counts += torch.bincount(t["input_ids"][t["loss_mask"].bool()], minlength=V)
        return counts

    def conversations(self) -> list[dict]:
        return read_conversations(self.path / CONVERSATIONS)


@dataclass
class DumpSplit:
    """The train or val samples of a dump (see `is_validation`)."""

    reader: DumpReader
    name: str  # "train" | "val"

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return self.reader.iter_samples(self.name)

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def indices(self) -> list[int]:
        return self.reader.sample_indices(self.name)


def open_dump(path: str | os.PathLike, *, expect: Wiring | None = None, allow_incomplete: bool = False,
              check_shards: bool = True) -> DumpReader:
    """Open and validate a dump folder.

    expect: the wiring the caller will train/evaluate with; a dump of another target, tokenizer, chat
    template or hs ids raises `WiringMismatch` naming every difference.
    allow_incomplete: read an interrupted dump's finished shards (with a warning) instead of refusing.
    check_shards: validate every shard's header now (cheap: no tensor data is read).
    """
    path = Path(path)
    if not path.is_dir():
        raise SpecwireError(f"dump folder not found: {path}", fix="run `specwire datagen --out DIR` first.")
    manifest = read_json(path / MANIFEST, what="dump manifest")
    wiring, shards = parse_manifest(manifest, path=path / MANIFEST)
    if expect is not None:
        expect.check_compatible(wiring, expected_from="this run", found_in=f"dump {path}")
    if not manifest["complete"]:
        if not allow_incomplete:
            raise SpecwireError(
                f"dump {path} is incomplete ({len(shards)} shards, {sum(s.samples for s in shards)} samples so far): "
                "datagen was interrupted.",
                fix="rerun the same `specwire datagen` command to finish it (it resumes).",
            )
        log.warning("dump %s is incomplete: reading its %d finished shards only", path, len(shards))
    if not shards and manifest["complete"]:
        raise SpecwireError(f"dump {path} holds no samples.")
    reader = DumpReader(path, manifest, wiring, shards)
    if check_shards:
        for entry in shards:
            check_shard_header(path / entry.file, entry, wiring=wiring, dtype=reader.dtype_name)
    return reader
