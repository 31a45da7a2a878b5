"""What a training run reads: dumps (one or several, merged), online conversations, and batch order.

Owns: the in-memory splits (`DataSet`, `RunData`), opening and checking the data against the run's
wiring (`load_run_data`: each dump by name; online mode: the conversations of datagen or selfinstruct
folders, the states captured per batch by `materialize`), and the order of samples (`epoch_batches`: a pure function
of (seed, epoch); `rank_share`; `micro_batches` under a token budget). Does not own the dump format
(`data.dump`), the capture (`target.capture.capture_batch`) or padding into a batch (`training.ttt.collate`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from specwire.errors import SpecwireError
from specwire.safeio import read_json
from specwire.training.config import TrainConfig
from specwire.training.dist import Dist
from specwire.wiring import Wiring


@dataclass
class DataSet:
    """Samples of one split, in memory (dump mode: with states; online mode: ids and masks only)."""

    samples: list[dict]  # {input_ids, loss_mask, index[, hidden, last_hidden]}
    online: bool = False

    def __len__(self) -> int:
        return len(self.samples)

    def lengths(self) -> list[int]:
        return [len(s["input_ids"]) for s in self.samples]


@dataclass
class RunData:
    """What the trainer reads: train and val sets, the wiring they were made with, vocab counts."""

    train: DataSet
    val: DataSet
    wiring: Wiring
    vocab_counts: torch.Tensor  # [V] int64
    target_name: str | None  # what the manifest names as the target (None if unknown)
    source: str  # description for errors and logs


def expected_wiring(target, hs_ids: Sequence[int]) -> Wiring:
    """The wiring a run with this loaded target and hs ids expects its data to carry."""
    from specwire.target.load import chat_template_hash, tokenizer_fingerprint

    tok = target.tokenizer
    return Wiring(hs_ids=tuple(hs_ids), target=target.spec,
                  tokenizer_fingerprint=tokenizer_fingerprint(tok) if tok is not None else None,
                  chat_template_hash=chat_template_hash(tok) if tok is not None else None)


def manifest_target(data: str) -> str | None:
    """The target name/path a dump (or datagen folder) was made with, from its manifest."""
    from specwire.data.dump import MANIFEST

    p = Path(data) / MANIFEST
    if p.is_file():
        t = read_json(p, what="dump manifest").get("target")
        return t if isinstance(t, str) else None
    return None


def load_run_data(config: TrainConfig, target) -> RunData:
    """Open the data (dump or conversations), check it against the run's wiring, and load its splits.

    The train split is then cut to a window of its samples, in data order: `skip_train_samples` drop the
    first ones, and `max_train_samples` keeps at most N of the rest. The vocabulary counts still cover
    every sample, so stages that train on successive windows share one draft vocabulary.
    """
    data = _load_run_data(config, target)
    skip, n = config.skip_train_samples, config.max_train_samples
    if skip >= len(data.train):
        raise SpecwireError(f"{data.source}: skip_train_samples is {skip}, but the train split holds only "
                            f"{len(data.train)} samples; nothing would be left to train on.")
    if skip or (n is not None and n < len(data.train) - skip):
        window = data.train.samples[skip:None if n is None else skip + n]
        data = dataclasses.replace(data, train=DataSet(window, online=data.train.online))
    return data


def _load_run_data(config: TrainConfig, target) -> RunData:
    from specwire.data.dump import is_validation, open_dump

    if not config.online:
        first = config.data_dirs[0]
        probe = open_dump(first, check_shards=False)
        hs_ids = config.hs_ids if config.hs_ids is not None else list(probe.wiring.hs_ids)
        expect = expected_wiring(target, hs_ids)
        # Several dumps merge into one data set; each is checked against the same wiring, so a dump made
        # with other layers, another target or another tokenizer is refused by name.
        readers = [open_dump(d, expect=expect) for d in config.data_dirs]
        own_val = config.eval_data is None  # without --eval-data, each dump's val split validates
        train = DataSet([s for r in readers for s in (r.split("train") if own_val else r.iter_samples(None))])
        if own_val:
            val = DataSet([s for r in readers for s in r.split("val")])
        else:
            val = DataSet(list(open_dump(config.eval_data, expect=expect).iter_samples(None)))
        counts = sum((r.vocab_counts() for r in readers[1:]), readers[0].vocab_counts())
        return RunData(train=train, val=val, wiring=readers[0].wiring, vocab_counts=counts,
                       target_name=readers[0].manifest.get("target"), source="dump " + ", ".join(config.data_dirs))
    # online: the conversations of datagen folders (phase 1) or selfinstruct folders; states are captured per batch
    from specwire.wiring import default_hs_ids

    hs_ids = config.hs_ids if config.hs_ids is not None else list(default_hs_ids(target.num_layers))
    expect = expected_wiring(target, hs_ids)
    V = target.spec.vocab_size
    samples, sources, answer_ids = [], [], []
    for folder in config.data_dirs:
        recs, where = online_conversations(Path(folder), expect=expect, hs_ids_given=config.hs_ids is not None)
        sources.append(where)
        for r in recs:
            ids = torch.tensor(r["input_ids"], dtype=torch.long)
            mask = torch.tensor(r["loss_mask"], dtype=torch.uint8)
            if bool((ids < 0).any()) or bool((ids >= V).any()):
                raise SpecwireError(f"{where}: sample {r['index']} holds token ids outside the target vocabulary 0..{V - 1}.")
            answer_ids.append(ids[mask.bool()])
            samples.append({"input_ids": ids, "loss_mask": mask, "index": int(r["index"])})
    # one count over every sample's trained tokens (a bincount per sample costs minutes on 20,000 samples)
    counts = torch.bincount(torch.cat(answer_ids), minlength=V) if answer_ids else torch.zeros(V, dtype=torch.int64)
    train = [s for s in samples if not is_validation(s["index"])]
    val = [s for s in samples if is_validation(s["index"])]
    source = "conversations " + ", ".join(sources)
    if config.eval_data is not None:
        train = samples
        val = list(open_dump(config.eval_data, expect=expect).iter_samples(None))
        return RunData(train=DataSet(train, online=True), val=DataSet(val), wiring=expect, vocab_counts=counts,
                       target_name=None, source=source)
    return RunData(train=DataSet(train, online=True), val=DataSet(val, online=True), wiring=expect,
                   vocab_counts=counts, target_name=None, source=source)


def online_conversations(data: Path, *, expect: Wiring, hs_ids_given: bool) -> tuple[list[dict], str]:
    """The conversations of one online source, checked against the run: (records, where they came from).

    A datagen folder (or its conversations.jsonl) is checked through its dump manifest's wiring; a
    selfinstruct folder through the target identity its manifest records (it holds no hs ids: the
    states are captured now, at the run's ids).
    """
    from specwire.data import selfinstruct
    from specwire.data.dump import CONVERSATIONS, MANIFEST, parse_manifest, read_conversations
    from specwire.wiring import TargetSpec

    man = (data if data.is_dir() else data.parent) / MANIFEST
    meta = read_json(man, what="manifest") if man.is_file() else None
    if data.is_dir() and meta is not None and meta.get("format") == selfinstruct.FORMAT:
        ident = meta.get("identity") or {}
        found = Wiring(hs_ids=expect.hs_ids, target=TargetSpec.from_dict(ident.get("target") or {}, source=f"{man}: identity"),
                       tokenizer_fingerprint=ident.get("tokenizer_fingerprint"),
                       chat_template_hash=ident.get("chat_template_hash"))
        expect.check_compatible(found, expected_from="this run", found_in=str(man), ignore=("hs_ids",))
        recs = selfinstruct.read_conversations(data)
        where = f"{data} (selfinstruct)"
    else:
        conv_path = data / CONVERSATIONS if data.is_dir() else data
        if meta is not None:  # a datagen folder: its manifest must agree with the run
            found, _ = parse_manifest(meta, path=man)
            expect.check_compatible(found, expected_from="this run", found_in=f"{man}",
                                    ignore=() if hs_ids_given else ("hs_ids",))
        recs = read_conversations(conv_path)
        where = str(conv_path)
    if not recs:
        raise SpecwireError(f"{where}: no conversations; run `specwire datagen` or `specwire selfinstruct` first.")
    return recs, where


def materialize(samples: list[dict], *, target, hs_ids: Sequence[int], max_length: int) -> list[dict]:
    """Online mode: capture the fused and last states of samples that carry only ids (datagen's capture)."""
    need = [s for s in samples if "hidden" not in s]
    if not need:
        return samples
    from specwire.target.capture import capture_batch

    ids = [s["input_ids"][:max_length].tolist() for s in need]
    captured = capture_batch(target, ids, list(hs_ids))  # {"hidden": [[T_i, n*H]], "last_hidden": [[T_i, H]]}
    out, k = [], 0
    for s in samples:
        if "hidden" in s:
            out.append(s)
            continue
        out.append({**s, "input_ids": s["input_ids"][:max_length], "loss_mask": s["loss_mask"][:max_length],
                    "hidden": captured["hidden"][k], "last_hidden": captured["last_hidden"][k]})
        k += 1
    return out


def epoch_batches(lengths: Sequence[int], *, batch_size: int, seed: int, epoch: int, bucket: int = 8) -> list[list[int]]:
    """The global batches of one epoch: a seeded permutation, cut into chunks of `bucket` batches whose
    samples are sorted by length (less padding), with the batch order shuffled again. Deterministic."""
    n = len(lengths)
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(epoch))
    order = torch.randperm(n, generator=g).tolist()
    batches: list[list[int]] = []
    span = batch_size * bucket
    for a in range(0, n, span):
        chunk = sorted(order[a:a + span], key=lambda i: (-lengths[i], i))
        part = [chunk[b:b + batch_size] for b in range(0, len(chunk), batch_size)]
        perm = torch.randperm(len(part), generator=g).tolist()
        batches.extend(part[i] for i in perm)
    return batches


def rank_share(batch: list[int], lengths: Sequence[int], d: Dist) -> list[int]:
    """This rank's samples of a global batch: longest first, dealt round robin (balanced work)."""
    ordered = sorted(batch, key=lambda i: (-lengths[i], i))
    return ordered[d.rank::d.world]


def micro_batches(idx: list[int], lengths: Sequence[int], *, batch_tokens: int, max_length: int) -> list[list[int]]:
    """Split samples (longest first) into forward passes of at most `batch_tokens` padded tokens."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i in sorted(idx, key=lambda i: (-lengths[i], i)):
        longest = min(max_length, lengths[cur[0]] if cur else lengths[i])
        if cur and (len(cur) + 1) * longest > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out
