"""The draft vocabulary: which target token ids the draft's lm_head predicts.

Owns: building the `d2t` / `t2d` maps from assistant-token frequencies (`docs/CONVENTIONS.md` section 2), the
coverage they give, a coverage table over candidate sizes (from which a draft vocab size is
picked), and the lm_head rows of a vocabulary chosen again for new data (`refit_rows`). Pure functions
on tensors; no model, no files. The counts come from the dump
(`dump.DumpReader.vocab_counts()`); the maps are checked by `draft.check_vocab_map` and stored in the
draft checkpoint.

Conventions (as SGLang, vLLM and speculators read them):
  d2t [Vd] int64: an *offset*; draft id i stands for target id i + d2t[i].
  t2d [V]  bool : True on the target ids that the draft vocabulary contains.
The chosen target ids are the `draft_vocab_size` most frequent ones, ties broken by the lower id
first, then sorted by target id (so d2t is non-decreasing). When fewer ids were seen than the draft
vocabulary holds, the rest is filled with the lowest unseen ids: deterministic, never random.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from specwire.errors import SpecwireError

# Candidate draft vocab sizes that `coverage_table` reports by default (those <= V are kept).
DEFAULT_CANDIDATE_SIZES: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32000, 32768, 65536)


class VocabMap(NamedTuple):
    """Unpacks as `d2t, t2d = build_vocab_map(...)`."""

    d2t: torch.Tensor  # [Vd] int64 offsets: target id = i + d2t[i]
    t2d: torch.Tensor  # [V] bool: target ids present in the draft vocabulary

    @property
    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id, ascending. shape: [Vd]"""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t


def _check_counts(counts: torch.Tensor) -> torch.Tensor:
    if not isinstance(counts, torch.Tensor) or counts.dim() != 1 or counts.numel() == 0:
        shape = tuple(counts.shape) if isinstance(counts, torch.Tensor) else type(counts).__name__
        raise SpecwireError(f"vocab counts: expected a non-empty 1-D tensor [V] of token frequencies, found {shape}.")
    if counts.is_floating_point() or counts.is_complex() or counts.dtype == torch.bool:
        raise SpecwireError(f"vocab counts: expected integer frequencies, found dtype {counts.dtype}.")
    if bool((counts < 0).any()):
        raise SpecwireError("vocab counts: found negative frequencies; counts must be >= 0.")
    return counts.long()


def frequency_order(counts: torch.Tensor) -> torch.Tensor:
    """Target ids from most to least frequent; equal counts keep the lower id first. shape: [V]"""
    counts = _check_counts(counts)
    return torch.argsort(-counts, stable=True)


def build_vocab_map(counts: torch.Tensor, draft_vocab_size: int) -> VocabMap:
    """d2t offsets and t2d mask for the `draft_vocab_size` most frequent target ids (see module doc)."""
    counts = _check_counts(counts)
    V = counts.numel()
    if not isinstance(draft_vocab_size, int) or isinstance(draft_vocab_size, bool) or not 0 < draft_vocab_size <= V:
        raise SpecwireError(
            f"draft_vocab_size: expected an integer in 1..{V} (the target vocabulary), found {draft_vocab_size!r}."
        )
    chosen = torch.sort(frequency_order(counts)[:draft_vocab_size]).values  # shape: [Vd], ascending target ids
    d2t = chosen - torch.arange(draft_vocab_size, device=counts.device)  # shape: [Vd]
    t2d = torch.zeros(V, dtype=torch.bool, device=counts.device)  # shape: [V]
    t2d[chosen] = True
    return VocabMap(d2t=d2t, t2d=t2d)


def coverage(counts: torch.Tensor, t2d: torch.Tensor) -> float:
    """Fraction of the counted (assistant) tokens whose target id is in the draft vocabulary."""
    counts = _check_counts(counts)
    if t2d.shape != counts.shape or t2d.dtype != torch.bool:
        raise SpecwireError(
            f"coverage: t2d must be a bool tensor shaped like the counts {tuple(counts.shape)}, "
            f"found {t2d.dtype} {tuple(t2d.shape)}."
        )
    total = int(counts.sum())
    if total == 0:
        raise SpecwireError("coverage: the counts are all zero (no assistant tokens were counted).")
    return int(counts[t2d].sum()) / total


@dataclass(frozen=True)
class CoverageRow:
    draft_vocab_size: int  # candidate size
    coverage: float  # fraction of assistant tokens covered by the top-`draft_vocab_size` ids
    seen: int  # distinct target ids seen at least once (the same for every row)


def coverage_table(counts: torch.Tensor, sizes: Sequence[int] | None = None) -> list[CoverageRow]:
    """Coverage of the top-k map for each candidate size k (a size above V counts as V: full coverage)."""
    counts = _check_counts(counts)
    V = counts.numel()
    total = int(counts.sum())
    if total == 0:
        raise SpecwireError("coverage table: the counts are all zero (no assistant tokens were counted).")
    sizes = DEFAULT_CANDIDATE_SIZES if sizes is None else sizes
    bad = [s for s in sizes if not isinstance(s, int) or s <= 0]
    if bad:
        raise SpecwireError(f"coverage table: candidate sizes must be positive integers, found {bad}.")
    kept = sorted({min(s, V) for s in sizes})
    cum = torch.cumsum(torch.sort(counts, descending=True).values, dim=0)  # shape: [V]
    seen = int((counts > 0).sum())
    return [CoverageRow(draft_vocab_size=s, coverage=int(cum[s - 1]) / total, seen=seen) for s in kept]


def format_coverage_table(rows: Sequence[CoverageRow]) -> str:
    lines = ["draft vocab size   coverage of assistant tokens"]
    for r in rows:
        lines.append(f"{r.draft_vocab_size:>16}   {100 * r.coverage:6.2f}%")
    if rows:
        lines.append(f"(distinct target ids seen: {rows[0].seen})")
    return "\n".join(lines)


def refit_rows(draft_rows: torch.Tensor, old_ids: torch.Tensor, new_ids: torch.Tensor,
               target_rows: torch.Tensor) -> torch.Tensor:
    """lm_head rows for a draft vocabulary chosen again (`new_ids`), from a trained draft's rows for `old_ids`.

    An id in both vocabularies keeps its trained row. A new id starts from the target's lm_head row for it,
    taken through the linear map M that best carries the target's rows onto the draft's trained rows over
    the shared ids (least squares: target_rows[shared] @ M ~= draft_rows[shared]). Training moves a
    draft's rows away from the target's it started from (on the shipped draft their median cosine is about
    0.5), but the move is close to linear: M predicts held-out trained rows at a median cosine of about
    0.95. With fewer shared ids than the hidden size the system is underdetermined and M is the identity.

    draft_rows [Vd_old, H]; old_ids [Vd_old] and new_ids [Vd_new]: ascending target ids;
    target_rows [Vd_new, H]: the target's lm_head rows for new_ids. Returns [Vd_new, H] in draft_rows' dtype.
    """
    if draft_rows.dim() != 2 or target_rows.dim() != 2 or draft_rows.shape[1] != target_rows.shape[1]:
        raise SpecwireError(f"refit_rows: expected draft rows [Vd, H] and target rows [Vd_new, H], found "
                            f"{tuple(draft_rows.shape)} and {tuple(target_rows.shape)}.")
    if len(old_ids) != len(draft_rows) or len(new_ids) != len(target_rows):
        raise SpecwireError(f"refit_rows: {len(old_ids)} old ids for {len(draft_rows)} draft rows, "
                            f"{len(new_ids)} new ids for {len(target_rows)} target rows.")
    kept = torch.isin(new_ids, old_ids)  # shape: [Vd_new] bool
    trained = draft_rows.double()[torch.searchsorted(old_ids, new_ids[kept])]  # shape: [n_kept, H]
    src = target_rows.double()
    H = draft_rows.shape[1]
    if int(kept.sum()) >= H:
        M = torch.linalg.lstsq(src[kept], trained).solution  # shape: [H, H]
    else:
        M = torch.eye(H, dtype=torch.float64)
    out = src @ M  # shape: [Vd_new, H]
    out[kept] = trained
    return out.to(draft_rows.dtype)
