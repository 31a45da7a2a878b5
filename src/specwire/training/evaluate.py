"""Offline evaluation of a draft on stored target states: `specwire eval`.

Owns: the one validation loop (`measure`: training's periodic and final validation and `specwire eval`
both run it), `EvalResult` (per-step top-1 accuracy and the chain accept length it predicts) and
`evaluate()`. The unroll itself is `training.ttt.ttt_unroll` (the same teacher-forced TTT unroll the
draft was trained with), so offline accuracy and training accuracy mean the same thing. Does not own
the command line (`cli.eval`). Does not measure serving acceptance: that needs the engine (`bench`,
`doctor`); a high offline accuracy validates the draft, not the wiring it is served with.

Headline accuracy, step j: P(the draft's argmax, mapped to a target id, equals the target's argmax over
its full vocabulary) at the positions the dump's loss mask marks, teacher forced.

Predicted chain accept length (tokens per target pass, bonus token included) for a K-step chain:
    L = 1 + sum_{k=1..K} prod_{j<k} a_j  =  1 + a_0 + a_0 a_1 + ... + a_0 ... a_{K-1}
where a_j is step j's accuracy. Approximation: it treats step j's teacher-forced accuracy as the chance
that draft token j is accepted given that tokens 0..j-1 were (teacher forcing conditions on the right
prefix, which is what an accepted prefix is), and ignores the correlation between steps (easy stretches
make consecutive steps right together, which makes real chains somewhat longer). Greedy verification.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from specwire.errors import SpecwireError
from specwire.training.batches import micro_batches
from specwire.training.config import DEFAULT_TTT_STEPS
from specwire.training.dist import Dist
from specwire.training.rundir import resolve_draft_arg
from specwire.training.ttt import TargetHeads, Totals, collate, ttt_unroll


def predicted_accept_length(step_accuracy: Sequence[float]) -> float:
    """1 + sum_{k=1..K} prod_{j<k} a_j (see the module docstring)."""
    total, run = 1.0, 1.0
    for a in step_accuracy:
        if not 0.0 <= a <= 1.0:
            raise SpecwireError(f"step accuracy {a} is not a probability in [0, 1].")
        run *= a
        total += run
    return total


@dataclass
class EvalResult:
    """Offline per-step accuracy of a draft (JSON keys `step_accuracy`, `predicted_accept_length` are stable)."""

    step_accuracy: list[float]  # target-vocab top-1 accuracy per unrolled step, step 0 first (headline)
    predicted_accept_length: float  # 1 + sum_k prod_{j<k} a_j
    step_accuracy_draft_vocab: list[float]  # top-1 against the argmax of the restricted distribution
    step_accuracy_topk: list[float]  # target argmax among the draft's ttt.TOPK_STAT best tokens, per step
    step_kl: list[float]  # mean KL(target || draft) per step, nats
    step_tokens: list[int]  # scored tokens per step
    n_tokens: int  # scored tokens at step 0
    n_samples: int
    draft_vocab_coverage: float  # share of scored positions whose target argmax is in the draft vocab
    split: str  # "val", "train", "all" or "eval_data"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def measure(draft, heads: TargetHeads, samples: Sequence[dict], *, steps: int, batch_tokens: int, max_length: int,
            device, dist: Dist | None = None,
            prepare: Callable[[list[dict]], list[dict]] | None = None) -> Totals:
    """The validation loop: per-step sums of the teacher-forced unroll over `samples`, without gradients.

    Under torchrun each rank takes every `world`-th sample and the sums are all-reduced. `prepare` turns
    a forward pass's samples into ones with states (training's online mode captures them there).
    """
    d = dist or Dist()
    lengths = [len(s["input_ids"]) for s in samples]
    mine = list(range(d.rank, len(samples), d.world))
    totals = Totals(steps)
    totals.vec = totals.vec.to(device)
    was = draft.training
    draft.eval()
    with torch.no_grad():
        for mb in micro_batches(mine, lengths, batch_tokens=batch_tokens, max_length=max_length):
            chunk = [samples[i] for i in mb]
            if prepare is not None:
                chunk = prepare(chunk)
            batch = collate(chunk, max_length=max_length, device=device)
            totals.add(ttt_unroll(draft, heads, batch, steps=steps))
    draft.train(was)
    d.all_sum(totals.vec)
    return totals


def summarize(totals: Totals, *, split: str, n_samples: int, coverage: float | None = None) -> EvalResult:
    """An EvalResult from accumulated per-step sums (`ttt.Totals`)."""
    s = totals.summary()
    return EvalResult(step_accuracy=s["acc"], predicted_accept_length=predicted_accept_length(s["acc"]),
                      step_accuracy_draft_vocab=s["acc_draft_vocab"],
                      step_accuracy_topk=s["acc_topk"], step_kl=s["kl"], step_tokens=s["count"],
                      n_tokens=s["count"][0] if s["count"] else 0, n_samples=n_samples,
                      draft_vocab_coverage=s["in_vocab"] if coverage is None else coverage, split=split)


def evaluate(draft, data, *, target=None, ttt_steps: int = DEFAULT_TTT_STEPS, split: str = "val",
             max_samples: int | None = None, batch_tokens: int = 8192, max_length: int = 4096, device: str | torch.device | None = None,
             dtype: str = "float32") -> EvalResult:
    """Teacher-forced per-step accuracy of `draft` on a dump.

    draft: an Eagle3Draft, or a checkpoint path/name or `train --out` folder (`rundir.resolve_draft_arg`).
    data: a dump folder or an open dump.DumpReader. Its wiring must match the draft's.
    target: a loaded Target or a name/path; default: the target the dump's manifest names. Its final
        norm and lm_head give the reference distributions, its embedding feeds the draft.
    split: "val" (the dump's validation samples), "train", or "all".
    """
    from specwire.draft.checkpoint import load_draft
    from specwire.draft.model import Eagle3Draft
    from specwire.data.dump import DumpReader, open_dump
    from specwire.target.load import Target, default_device, load_target

    if split not in ("val", "train", "all"):
        raise SpecwireError(f"eval split '{split}': expected val, train or all.")
    if ttt_steps <= 0:
        raise SpecwireError(f"ttt_steps: expected a positive integer, found {ttt_steps}.")
    device = torch.device(device or default_device())
    reader = data if isinstance(data, DumpReader) else open_dump(data)
    if not isinstance(draft, Eagle3Draft):
        draft = load_draft(resolve_draft_arg(draft).path, device=device)
    draft.to(device)
    dw = draft.config.wiring
    dw.check_compatible(reader.wiring, expected_from="the draft", found_in=f"dump {reader.path}",
                        ignore=("draft_vocab_size", "norm_before_residual"))
    if not isinstance(target, Target):
        name = target or reader.manifest.get("target")
        if not name:
            raise SpecwireError(f"dump {reader.path}: the manifest names no target.", fix="pass --target.")
        target = load_target(name, device=device, dtype=dtype)
    dw.check_compatible(dataclasses.replace(reader.wiring, target=target.spec), expected_from="the draft",
                        found_in=f"target '{target.info.name}'", ignore=("draft_vocab_size", "norm_before_residual"))
    draft.attach_embeddings(target.parts.embed)
    heads = TargetHeads(target.parts.final_norm, target.parts.lm_head, draft.d2t, device=device)
    samples = list(reader.iter_samples(None if split == "all" else split))
    if max_samples is not None:
        samples = samples[:max_samples]
    if not samples:
        raise SpecwireError(f"dump {reader.path}: the '{split}' split holds no samples.",
                            fix="use --split all, or a larger dump (every 50th sample is validation).")
    totals = measure(draft, heads, samples, steps=ttt_steps, batch_tokens=batch_tokens, max_length=max_length,
                     device=device)
    return summarize(totals, split=split, n_samples=len(samples))
