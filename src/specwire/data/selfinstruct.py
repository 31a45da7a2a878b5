"""Self-instruct conversations written by the target itself (the Magpie method): `specwire selfinstruct`.

Owns: asking the target for user requests, filtering and deduplicating them, checking them against
the benchmark prompts, answering them with the target's own greedy decoding, and the resumable folder
of compressed conversation shards that holds the result. Does not own the hidden-state dump (`datagen`
captures states from these conversations), prompt loading (`prompts`) or training.

The method (Xu et al., "Magpie", 2024): an instruction-tuned model fed its own chat template up to the
start of a user turn (the system block, then the user header) writes a user request of the kind it was
tuned on. Sampled at temperature 1 and stopped at the end-of-turn token, this gives in-domain prompts
without any outside data. The request is then templated as a normal user turn and answered greedily.
A `system` message in the sampling prefix steers what the requests are about (as Magpie's task-specific
system prompts do); the answers are still given under the template's default system block, as a user's
request would be.

Layout of OUT:
  manifest.json              target identity, options, and one entry per finished shard (counts, timings)
  shard-NNNNN.jsonl.gz       conversations, one JSON record per line, in datagen's conversation format
                             (`index`, `id`, `source`, `messages`, `input_ids`, `loss_mask`, `finish`)
Each shard is generated from its own seeds (seed, shard, round), written atomically, and only then
listed in the manifest; a killed run loses at most the shard in flight, and a rerun with the same
engine options regenerates it exactly. Deduplication runs against every earlier shard, so shard k
depends only on shards < k.

The recipe (target, filters, lengths, sampling, seed) is fixed for a folder; how a shard is computed
(`ENGINE_OPTIONS`: batching, batch sizes, dtype) may change between sessions of one build and is
recorded per shard. Batched generation is the target's greedy decoding in that dtype, up to near-ties
that batching can flip (`data.continuous`).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, read_json, write_json
from specwire.target.load import BUILTIN_TARGET, Target, chat_template_hash, load_target, tokenizer_fingerprint

log = logging.getLogger("specwire")

FORMAT = "specwire-selfinstruct"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SOURCE = "selfinstruct"
_SENTINEL = "\u2063SPECWIRE-USER-TURN\u2063"
MIN_TOP_UP = 16  # requests sampled at least in a round after the first


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.jsonl.gz"


# ---- configuration ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class FilterConfig:
    """What a generated user request must satisfy to be kept."""

    min_chars: int = 24  # shorter requests are mostly fragments ("Hi", "Write it")
    max_chars: int = 1500  # the pool's own cap on a prompt
    min_words: int = 5  # fewer words: a fragment
    min_ascii: float = 0.97  # share of ASCII characters: the built-in target is English-only
    min_common_words: int = 1  # at least this many common English function words ("the", "a", "how"...)
    max_repetition: float = 0.35  # 1 - distinct word 3-grams / all word 3-grams (degenerate loops score high)
    near_duplicate: float = 0.6  # word 3-gram Jaccard similarity at which a request counts as a duplicate
    contamination_ngram: int = 8  # a shared word n-gram of this length with a benchmark prompt excludes it


@dataclass
class SelfInstructConfig:
    """Everything `specwire selfinstruct` takes; all but `out`, `conversations`, `device` and `progress` go in the manifest."""

    out: str  # folder of shards (created; an existing one is resumed)
    target: str = BUILTIN_TARGET  # built-in name or HF folder with a chat template
    conversations: int = 20000  # stop once the shards hold this many conversations
    shard_size: int = 256  # conversations per shard
    sample_batch: int = 320  # user requests sampled in a shard's first round (top-up rounds: what the keep rate says is missing)
    answer_batch: int = 128  # sequences decoded together, in both phases (continuous: slots; padded: batch size)
    batching: str = "continuous"  # continuous (`data.continuous`, refills finished rows) or padded (HF generate)
    max_request_tokens: int = 128  # cap on a sampled user request; unfinished ones are dropped
    max_new_tokens: int = 128  # answer length cap
    temperature: float = 1.0  # sampling temperature of the user requests
    top_p: float = 1.0  # nucleus sampling of the user requests
    max_rounds: int = 64  # sampling rounds per shard before giving up (a target that writes only junk)
    seed: int = 0  # sampling seed (per shard and round) and the MinHash seed
    system: str | None = None  # a system message that steers the requests (sampling only; answers keep the default)
    device: str | None = None  # torch device (None = cuda when available, else cpu)
    dtype: str = "auto"  # weights dtype of the target; auto = bfloat16 where the CPU computes it natively (AMX or AVX512-BF16) or on CUDA, else float32
    filters: FilterConfig = field(default_factory=FilterConfig)  # what a request must satisfy to be kept
    progress: bool = True  # progress bar on stderr

    def __post_init__(self):
        if isinstance(self.filters, dict):
            self.filters = FilterConfig(**self.filters)
        for name in ("conversations", "shard_size", "sample_batch", "answer_batch", "max_request_tokens",
                     "max_new_tokens", "max_rounds"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecwireError(f"selfinstruct {name.replace('_', '-')}: expected a positive integer, found {v!r}.")
        if self.batching not in BATCHING:
            raise SpecwireError(f"selfinstruct batching: '{self.batching}', expected one of {list(BATCHING)}.")
        if not self.temperature > 0:
            raise SpecwireError(f"selfinstruct temperature: expected > 0 (requests are sampled), found {self.temperature}.")
        if not 0 < self.top_p <= 1:
            raise SpecwireError(f"selfinstruct top-p: expected 0 < p <= 1, found {self.top_p}.")

    def options(self) -> dict[str, Any]:
        """The options recorded in, and compared against, the manifest (they decide the recipe)."""
        d = dataclasses.asdict(self)
        for k in ("out", "device", "progress", "conversations", *ENGINE_OPTIONS):
            d.pop(k)
        if d["system"] is None:  # builds from before --system existed record no such key
            d.pop("system")
        return d

    def engine(self, target: Target) -> dict[str, Any]:
        """How this run computes (recorded per shard): batching, batch sizes and the dtype actually used."""
        return {"batching": self.batching, "sample_batch": self.sample_batch, "answer_batch": self.answer_batch,
                "dtype": str(target.dtype).removeprefix("torch.")}


BATCHING = ("continuous", "padded")
# How a shard is computed, not what it is: they may change between sessions of one build, and each shard
# records its own (`ShardStats.engine`). A shard's answers are the target's greedy decoding in its dtype.
ENGINE_OPTIONS = ("sample_batch", "answer_batch", "batching", "dtype")


# ---- pure text functions ---------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9']+")
_COMMON = frozenset(
    "the a an and or of to in on for with about what how why who which is are can could would should "
    "please write explain describe give list make create help me my i you your it this that be do does "
    "tell some from as at by".split())


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def shingles(text: str, n: int = 3) -> set[tuple[str, ...]]:
    """The set of word n-grams of a text (the whole word list when shorter than n)."""
    w = words(text)
    if len(w) < n:
        return {tuple(w)} if w else set()
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def repetition(text: str) -> float:
    """1 - distinct word 3-grams / all word 3-grams: 0 for varied text, near 1 for a degenerate loop."""
    w = words(text)
    grams = [tuple(w[i:i + 3]) for i in range(len(w) - 2)]
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def reject_reason(text: str, *, finished: bool, f: FilterConfig) -> str | None:
    """Why a sampled user request is dropped (None = keep). Checks run cheapest first."""
    if not finished:
        return "unfinished"
    t = text.strip()
    if len(t) < f.min_chars:
        return "too-short"
    if len(t) > f.max_chars:
        return "too-long"
    if sum(c.isascii() for c in t) < f.min_ascii * len(t):
        return "not-english"
    w = words(t)
    if len(w) < f.min_words:
        return "too-short"
    if sum(x in _COMMON for x in w) < f.min_common_words:
        return "not-english"
    if repetition(t) > f.max_repetition:
        return "repetitive"
    if "<|" in t or "|>" in t:
        return "template-tokens"
    return None


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


class NearDuplicateIndex:
    """MinHash with banded locality-sensitive hashing over word 3-gram shingles.

    `add` keeps a text unless one already kept has Jaccard similarity >= threshold; candidate pairs come
    from 16 bands of 4 hashes each and are confirmed on the exact shingle sets, so a miss is possible
    (two texts at exactly the threshold share a band with probability about 0.87) but a false merge is not.
    """

    BANDS, ROWS = 16, 4
    _PRIME = (1 << 61) - 1

    def __init__(self, threshold: float, seed: int = 0):
        self.threshold = threshold
        rng = np.random.default_rng(seed)
        n = self.BANDS * self.ROWS
        self._a = rng.integers(1, self._PRIME, size=n, dtype=np.uint64)
        self._b = rng.integers(0, self._PRIME, size=n, dtype=np.uint64)
        self._buckets: list[dict[tuple, list[int]]] = [{} for _ in range(self.BANDS)]
        self._sets: list[set] = []

    def _signature(self, sh: set) -> np.ndarray:
        x = np.array([int.from_bytes(hashlib.blake2b(" ".join(s).encode(), digest_size=7).digest(), "little")
                      for s in sh], dtype=np.uint64)  # shape: [S]
        # a*x+b wraps modulo 2**64 before the mod p: not a textbook universal family, but a fixed, well-mixed one
        h = (x[:, None] * self._a[None, :] + self._b[None, :]) % np.uint64(self._PRIME)  # shape: [S, 64]
        return h.min(axis=0)

    def add(self, text: str) -> bool:
        """Keep `text` (True) unless a near duplicate of it was kept before (False)."""
        sh = shingles(text)
        if not sh:
            return False
        sig = self._signature(sh)
        keys = [tuple(sig[b * self.ROWS:(b + 1) * self.ROWS].tolist()) for b in range(self.BANDS)]
        seen: set[int] = set()
        for band, key in enumerate(keys):
            for j in self._buckets[band].get(key, ()):
                if j not in seen:
                    seen.add(j)
                    if jaccard(sh, self._sets[j]) >= self.threshold:
                        return False
        k = len(self._sets)
        self._sets.append(sh)
        for band, key in enumerate(keys):
            self._buckets[band].setdefault(key, []).append(k)
        return True


def benchmark_ngrams(n: int) -> dict[tuple[str, ...], str]:
    """Every word n-gram of the MT-bench and HumanEval prompts, mapped to the item it comes from."""
    from specwire.data.prompts import humaneval_path, mt_bench_path, read_json_lines

    grams: dict[tuple[str, ...], str] = {}

    def add(text: str, origin: str) -> None:
        w = words(text)
        for i in range(len(w) - n + 1):
            grams.setdefault(tuple(w[i:i + n]), origin)

    for _, q in read_json_lines(mt_bench_path()):
        for t, turn in enumerate(q["turns"]):
            add(turn, f"mt-bench:{q['question_id']} turn {t + 1}")
    for _, p in read_json_lines(humaneval_path()):
        add(p["prompt"], p["task_id"])
    return grams


def shared_ngram(text: str, grams: dict[tuple[str, ...], str], n: int) -> tuple[str, ...] | None:
    """The first word n-gram of a text that `grams` holds, or None."""
    w = words(text)
    return next((g for g in (tuple(w[i:i + n]) for i in range(len(w) - n + 1)) if g in grams), None)


def contamination(text: str, grams: dict[tuple[str, ...], str], n: int) -> str | None:
    """The benchmark item a text shares a word n-gram with, or None."""
    hit = shared_ngram(text, grams, n)
    return None if hit is None else grams[hit]


# ---- the target's side -----------------------------------------------------------------------------

def user_turn_prefix(target: Target, system: str | None = None) -> list[int]:
    """Token ids of the target's chat template up to where a first user message's text begins.

    `system`: the system message to open with (None: whatever the template puts there by default)."""
    tok = target.tokenizer
    if tok is None or not getattr(tok, "chat_template", None):
        raise SpecwireError(f"target '{target.info.name}' has no chat template; self-instruct needs one to open a user turn.",
                            fix="use an instruction-tuned target whose tokenizer carries a chat template.")
    head = [] if system is None else [{"role": "system", "content": system}]
    text = tok.apply_chat_template(head + [{"role": "user", "content": _SENTINEL}], tokenize=False,
                                   add_generation_prompt=False)
    if system is not None and system not in text:
        raise SpecwireError(f"target '{target.info.name}': its chat template drops a system message, so --system "
                            "cannot steer the requests.", fix="leave --system out for this target.")
    cut = text.find(_SENTINEL)
    if cut < 0:
        raise SpecwireError(f"target '{target.info.name}': its chat template does not place the user message in the text.")
    return tok(text[:cut], add_special_tokens=False)["input_ids"]


@torch.inference_mode()
def sample_requests(target: Target, prefix: Sequence[int], *, n: int, max_new_tokens: int, temperature: float,
                    top_p: float, seed: int, batching: str = "continuous", rows: int = 128) -> list[tuple[str, bool]]:
    """`n` user requests sampled after `prefix`: (text, finished at an end-of-turn token).

    continuous: `rows` rows at a time, a finished row refilled at once (`data.continuous`); padded: one
    HF `generate` call over all `n` (every row runs until the longest request ends).
    """
    eos = list(target.eos_token_ids)
    if batching == "continuous":
        from specwire.data.continuous import Request, generate_continuous
        from specwire.decode.sampling import SamplingParams

        outs = generate_continuous(target, [Request(tuple(prefix), max_new_tokens)] * n, slots=rows, seed=seed,
                                   params=SamplingParams(temperature=temperature, top_p=top_p))
        rows_out = [ids for ids, _ in outs]
    else:
        from transformers import GenerationConfig

        ids = torch.tensor([list(prefix)] * n, dtype=torch.long, device=target.device)  # shape: [n, P]
        gc = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_p=top_p,
                              top_k=None, eos_token_id=eos, pad_token_id=eos[0])
        torch.manual_seed(seed)  # HF generate samples from the global generator
        out = target.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        rows_out = out[:, len(prefix):].tolist()
    result = []
    for row in rows_out:
        stop = next((i for i, t in enumerate(row) if t in eos), None)
        body = row if stop is None else row[:stop]
        result.append((target.tokenizer.decode(body, skip_special_tokens=True).strip(), stop is not None))
    return result


def _answer(target: Target, requests: Sequence[str], *, config: SelfInstructConfig, first_index: int) -> list[dict]:
    """Greedy answers to `requests`; conversation records in request order."""
    from specwire.data.datagen import generate_batch

    prompts = [target.encode_chat([{"role": "user", "content": r}]) for r in requests]
    answers: dict[int, tuple[list[int], str]] = {}
    if config.batching == "continuous":
        from specwire.data.continuous import Request, generate_continuous

        outs = generate_continuous(target, [Request(tuple(p), config.max_new_tokens) for p in prompts],
                                   slots=config.answer_batch)
        answers = dict(enumerate(outs))
    else:  # padded batches sorted by prompt length
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        for s in range(0, len(order), config.answer_batch):
            batch = order[s:s + config.answer_batch]
            outs = generate_batch(target, [prompts[i] for i in batch], max_new_tokens=config.max_new_tokens,
                                  max_length=4096)
            answers.update(zip(batch, outs))
    records = []
    for i, (request, prompt) in enumerate(zip(requests, prompts)):
        answer, finish = answers[i]
        text = target.tokenizer.decode(answer, skip_special_tokens=True)
        records.append({"index": first_index + i, "id": f"{SOURCE}-{first_index + i:06d}", "source": SOURCE,
                        "messages": [{"role": "user", "content": request}, {"role": "assistant", "content": text}],
                        "input_ids": [*prompt, *answer], "loss_mask": [0] * len(prompt) + [1] * len(answer),
                        "finish": finish})
    return records


# ---- the resumable folder --------------------------------------------------------------------------

@dataclass
class ShardStats:
    """What building one shard took and what its filters did."""

    shard: int
    conversations: int
    sampled: int  # user requests sampled
    rejected: dict[str, int]  # reason -> count (incl. "duplicate" and "contaminated")
    contaminated: list[str]  # benchmark items that excluded a request
    request_tokens: int  # tokens sampled for requests
    answer_tokens: int  # tokens in the answers
    sample_seconds: float
    answer_seconds: float
    # Requests that passed every filter after the shard was full: not answered, but already in the
    # near-duplicate index, which a resumed run must rebuild exactly (absent from older manifests).
    dedup_only: list[str] = field(default_factory=list)
    # How the shard was computed (`SelfInstructConfig.engine`); absent from shards built before it was
    # recorded, which took the manifest's options (float32, padded batches).
    engine: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_shard(path: Path) -> list[dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecwireError(f"{path}: not a readable gzip JSONL shard ({e}).",
                            fix="delete the shard and its manifest entry, then rerun to regenerate it.") from None


def read_conversations(out: str | os.PathLike) -> list[dict]:
    """All conversations of the finished shards listed in OUT's manifest, in order."""
    out = Path(out)
    manifest = _read_manifest(out / MANIFEST)
    return [r for s in manifest["shards"] for r in read_shard(out / shard_name(s["shard"]))]


def read_requests(out: str | os.PathLike) -> list[str]:
    """The user request of every conversation in OUT, in order."""
    return [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in read_conversations(out)]


def _read_manifest(path: Path) -> dict:
    m = read_json(path, what="self-instruct manifest")
    if m.get("format") != FORMAT:
        raise SpecwireError(f"{path}: field 'format' is {m.get('format')!r}, expected {FORMAT!r}.")
    return m


def _identity(target: Target) -> dict[str, Any]:
    return {"target": target.spec.to_dict(), "tokenizer_fingerprint": tokenizer_fingerprint(target.tokenizer),
            "chat_template_hash": chat_template_hash(target.tokenizer)}


@dataclass
class SelfInstructResult:
    out: str
    conversations: int
    shards: int
    new_shards: list[ShardStats]

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "conversations": self.conversations, "shards": self.shards,
                "new_shards": [s.to_dict() for s in self.new_shards]}


def build_shard(target: Target, k: int, *, prefix: Sequence[int], dedup: NearDuplicateIndex,
                grams: dict[tuple[str, ...], str], config: SelfInstructConfig, first_index: int) -> tuple[list[dict], ShardStats]:
    """Sample, filter and answer one shard's worth of requests (deterministic given earlier shards)."""
    f = config.filters
    kept: list[str] = []
    rejected: dict[str, int] = {}
    contaminated: list[str] = []
    overflow: list[str] = []
    sampled = request_tokens = 0
    t0 = time.perf_counter()
    for r in range(config.max_rounds):
        if len(kept) >= config.shard_size:
            break
        n = config.sample_batch
        if r > 0:  # a top-up round: about what the keep rate so far says is missing, not a whole batch
            rate = max(len(kept) / max(sampled, 1), 0.25)
            n = min(n, max(MIN_TOP_UP, math.ceil((config.shard_size - len(kept)) / rate * 1.2)))
        batch = sample_requests(target, prefix, n=n, max_new_tokens=config.max_request_tokens,
                                temperature=config.temperature, top_p=config.top_p,
                                seed=(config.seed * 1_000_003 + k) * 1009 + r, batching=config.batching,
                                rows=config.answer_batch)
        for text, finished in batch:
            sampled += 1
            request_tokens += len(target.tokenizer(text, add_special_tokens=False)["input_ids"])
            reason = reject_reason(text, finished=finished, f=f)
            if reason is None and (hit := contamination(text, grams, f.contamination_ngram)) is not None:
                reason = "contaminated"
                contaminated.append(hit)
            if reason is None and not dedup.add(text):
                reason = "duplicate"
            if reason is not None:
                rejected[reason] = rejected.get(reason, 0) + 1
                continue
            if len(kept) < config.shard_size:
                kept.append(text)
            else:
                overflow.append(text)
    t1 = time.perf_counter()
    records = _answer(target, kept, config=config, first_index=first_index)
    t2 = time.perf_counter()
    stats = ShardStats(shard=k, conversations=len(records), sampled=sampled, rejected=dict(sorted(rejected.items())),
                       contaminated=contaminated, request_tokens=request_tokens,
                       answer_tokens=sum(sum(r["loss_mask"]) for r in records),
                       sample_seconds=round(t1 - t0, 2), answer_seconds=round(t2 - t1, 2), dedup_only=overflow,
                       engine=config.engine(target))
    return records, stats


def run_selfinstruct(config: SelfInstructConfig, *, target: Target | None = None) -> SelfInstructResult:
    """Build shards until OUT holds `config.conversations` conversations, resuming what is there."""
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise SpecwireError(f"--out {out} is a file; expected a folder for the self-instruct shards.")
    if target is None:
        from specwire.target.hardware import generation_dtype

        target = load_target(config.target, device=config.device, dtype=generation_dtype(config.dtype, config.device))
    identity = _identity(target)
    mpath = out / MANIFEST
    if mpath.is_file():
        manifest = _read_manifest(mpath)
        for key, want in (("identity", identity), ("options", config.options())):
            have = manifest.get(key) or {}
            if key == "options":  # older manifests also recorded how their first shards were computed
                have = {k: v for k, v in have.items() if k not in ENGINE_OPTIONS}
            if have != want:
                diff = sorted(k for k in set(want) | set(have) if have.get(k) != want.get(k))
                raise SpecwireError(f"{mpath}: this folder was built with another {key} (differs in: {', '.join(diff)}).",
                                    fix="rerun with the same target and options, or choose a new --out folder.")
    else:
        if out.is_dir() and any(out.iterdir()):
            raise SpecwireError(f"--out {out} is a non-empty folder without a self-instruct manifest.",
                                fix="choose a new or empty --out folder.")
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "target_name": str(config.target),
                    "identity": identity, "options": config.options(), "shards": []}
        write_json(mpath, manifest)
    f = config.filters
    dedup = NearDuplicateIndex(f.near_duplicate, seed=config.seed)
    done = 0
    for s in manifest["shards"]:  # the index as the run that wrote these shards left it
        for rec in read_shard(out / shard_name(s["shard"])):
            dedup.add(rec["messages"][0]["content"])
            done += 1
        for text in s.get("dedup_only", ()):
            dedup.add(text)
    for stray in out.glob("shard-*.jsonl.gz"):
        if stray.name not in {shard_name(s["shard"]) for s in manifest["shards"]}:
            stray.unlink()
    for tmp in out.glob(".shard-*"):  # temporaries of atomic writes a kill interrupted
        shutil.rmtree(tmp, ignore_errors=True)
    grams = benchmark_ngrams(f.contamination_ngram)
    prefix = user_turn_prefix(target, config.system)
    from tqdm import tqdm

    bar = tqdm(total=config.conversations, initial=min(done, config.conversations), unit="conv",
               desc="selfinstruct", file=sys.stderr, disable=not config.progress, dynamic_ncols=True)
    new: list[ShardStats] = []
    try:
        while done < config.conversations:
            k = len(manifest["shards"])
            records, stats = build_shard(target, k, prefix=prefix, dedup=dedup, grams=grams, config=config,
                                         first_index=done)
            if not records:
                raise SpecwireError(f"selfinstruct: shard {k} kept no request in {config.max_rounds} sampling rounds "
                                    f"({stats.sampled} sampled; rejected: {stats.rejected}).",
                                    fix="check that the target is instruction-tuned, or relax the filters.")
            with atomic_path(out / shard_name(k)) as tmp:
                body = "".join(json.dumps(rec, ensure_ascii=False, separators=(",", ":")) + "\n" for rec in records)
                with open(tmp, "wb") as raw:  # no name and mtime 0 in the gzip header: the bytes depend on the records only
                    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as g:
                        g.write(body.encode("utf-8"))
            manifest["shards"].append(stats.to_dict())
            write_json(mpath, manifest)
            done += len(records)
            new.append(stats)
            bar.update(len(records))
            secs = stats.sample_seconds + stats.answer_seconds
            bar.set_postfix_str(f"keep {len(records)}/{stats.sampled}, "
                                f"{(stats.request_tokens + stats.answer_tokens) / max(secs, 1e-9):.0f} tok/s")
            log.info("selfinstruct: shard %d: %s", k, json.dumps(stats.to_dict()))
    finally:
        bar.close()
    return SelfInstructResult(out=str(out), conversations=done, shards=len(manifest["shards"]), new_shards=new)


def summarize(shards: Iterable[dict]) -> dict[str, Any]:
    """Totals over manifest shard entries: counts, rejection reasons, contamination, throughput."""
    total: dict[str, Any] = {"shards": 0, "conversations": 0, "sampled": 0, "rejected": {}, "contaminated": [],
                             "request_tokens": 0, "answer_tokens": 0, "sample_seconds": 0.0, "answer_seconds": 0.0}
    for s in shards:
        total["shards"] += 1
        for k in ("conversations", "sampled", "request_tokens", "answer_tokens", "sample_seconds", "answer_seconds"):
            total[k] += s[k]
        for reason, n in s["rejected"].items():
            total["rejected"][reason] = total["rejected"].get(reason, 0) + n
        total["contaminated"].extend(s["contaminated"])
    return total
