"""Training an EAGLE-3 draft with training-time test (TTT): `specwire train`.

Owns: `TrainConfig`, the TTT maths as pure functions (attention pattern, target distributions, loss,
accuracy, learning-rate schedule), the unrolled forward shared with `evaluate`, batching (one or several
dumps merged, each checked against the run's wiring), resumable checkpoints, data parallelism under
`torchrun`, online mode, and the `train` subcommand. Does not own
the draft module (`draft`), the dump format (`dump`), the vocabulary map (`vocab`) or the offline
report (`evaluate`).

TTT (Li et al., EAGLE-3, 2025; as SpecForge and speculators train it), for a sequence x_0..x_{T-1}
with fused target states g_t and pre-norm last states l_t, unrolled for K steps:
  step 0, position t: hidden = fc(g_t), token x_{t+1}; target = softmax(lm_head(final_norm(l_{t+1})))
          restricted to the draft vocabulary and renormalised (the target's distribution of x_{t+2}).
  step j: hidden = the draft's own output hidden of step j-1 at position t, token x_{t+1+j} (teacher
          forced), target = the distribution at t+1+j. Positions past the sequence end are masked out.
  weight: loss mask = the dump's loss_mask at the target position t+1+j.
  attention in step j: the query at t sees the step-0 keys of positions <= t (causal) and the keys of
          steps 1..j at position t only (the diagonal): exactly what it would see when drafting j tokens
          ahead of position t at decode time (`ttt_mask` is the explicit picture).
  positions: every step reuses the position ids of step 0 (as the EAGLE-3 reference and SpecForge do),
          so RoPE sees position t for all unrolled drafts at t.
  loss: sum_j 0.8**j * mean over the step's loss tokens of KL(target || draft).
Accuracy: step-j top-1 "target-vocab" accuracy, the headline, is P(d2t-mapped draft argmax == argmax of
the target over its full vocabulary): a draft token is accepted exactly when it equals the target's
choice, so this is what acceptance means. "Draft-vocab" accuracy compares with the argmax of the
restricted distribution (an upper bound that ignores the tokens the draft vocab lacks).

Efficiency: the target distributions are computed once per batch, only at loss-masked positions, from
one matmul with the target's lm_head rows permuted draft-vocab first (the draft rows give the soft
targets, the rest only the full-vocab argmax); the draft's lm_head runs only on the positions each step
scores. Dumps stored in bf16 are converted to float32 once per batch.

Data parallelism: under `torchrun` every rank takes its share of each global batch; the loss is
normalised by the global number of loss tokens per step (one small all-reduce), and gradients are
summed with one all-reduce of a flat buffer before clipping. We reduce gradients ourselves instead of
wrapping the draft in DistributedDataParallel because the unroll calls the module K times per step and
ranks may hold no sample of a short last batch; the arithmetic is the same.

Checkpoints (`OUT/checkpoint/`, written atomically every `save_every` steps): `draft.safetensors`,
`optimizer.safetensors` (AdamW moments and step counts, keyed by parameter name) and `state.json`
(step, config, optimizer hyper-parameters). The data order is a pure function of (seed, epoch), and
the learning rate a pure function of the step, so the step number is the whole data position; a rerun
of the same command resumes and reproduces the uninterrupted run step for step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specwire.draft.model import Eagle3Draft, save_draft
from specwire.errors import SpecwireError
from specwire.safeio import atomic_path, check_tensors, load_tensors, read_json, save_tensors
from specwire.wiring import Wiring, parse_ids

log = logging.getLogger("specwire")

STEP_DECAY = 0.8  # per-step loss weight decay (EAGLE-3)
DEFAULT_DRAFT_VOCAB = 16384  # capped at the target vocab; see TrainConfig.draft_vocab_size
CHECKPOINT_FORMAT = "specwire-train-checkpoint"
CHECKPOINT_VERSION = 1
# TrainConfig fields that may change between a run and its resumption (everything else must match).
RESUME_FREE_FIELDS = ("out", "eval_every", "save_every", "log_every", "eval_max_samples", "progress", "stop_after",
                      "device", "batch_tokens")


# ---- configuration ---------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    """Everything `train` needs. The CLI fills it from flags; tests build it directly."""

    data: str | list[str]  # dump folder(s), merged (or, with online=True, one datagen folder with conversations.jsonl)
    out: str  # run folder: checkpoint/, draft/, metrics.jsonl
    target: str | None = None  # target name/path; default: the one the dump's manifest names
    hs_ids: list[int] | None = None  # expected fused hs ids; default: the dump's (online: EAGLE-3 default)
    online: bool = False  # capture target states per batch from conversations.jsonl instead of shards
    eval_data: str | None = None  # separate validation dump; default: the dump's own val split
    ttt_steps: int = 5  # K, unrolled draft steps
    draft_vocab_size: int | None = None  # None: min(16384, target vocab)
    norm_before_residual: bool = False  # draft layer flag (FIELD-NOTES section 2)
    init_lm_head: str = "target"  # "target": lm_head/norm start as the target's rows; "random": default init
    epochs: float = 1.0  # passes over the train split (fractions allowed)
    max_steps: int | None = None  # cap on optimizer steps (changes the schedule's length)
    batch_size: int = 8  # samples per optimizer step, over all ranks (the global batch)
    batch_tokens: int = 8192  # max padded tokens per forward pass on one rank (larger batches accumulate)
    max_length: int = 2048  # samples are truncated to this many tokens
    lr: float = 1e-4  # AdamW peak learning rate
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_ratio: float = 0.015  # linear warm-up share of the steps, then cosine decay to 0
    max_grad_norm: float = 0.5  # gradient clipping
    seed: int = 0  # draft init and data order
    eval_every: int = 0  # validation every N steps (0: only at the end)
    eval_max_samples: int | None = None  # cap on validation samples (None: the whole split)
    save_every: int = 200  # checkpoint every N steps (and at the end)
    log_every: int = 10  # a metrics.jsonl record every N steps (covering the steps since the last one)
    device: str | None = None  # default: cuda when available, else cpu
    target_dtype: str = "float32"  # dtype the target is loaded in (its lm_head/norm produce the targets)
    progress: bool = True  # tqdm bar on rank 0
    stop_after: int | None = None  # stop this invocation after N more steps, as if killed (tests, time boxes)

    def __post_init__(self):
        if not isinstance(self.data, str):
            self.data = [str(d) for d in self.data]
            if not self.data:
                raise SpecwireError("TrainConfig.data: expected a dump folder, found an empty list.")
            if len(self.data) == 1:
                self.data = self.data[0]
            elif self.online:
                raise SpecwireError(f"TrainConfig.data: online mode reads one datagen folder, found {len(self.data)}.",
                                    fix="merge the prompts into one datagen run, or capture dumps and train without --online.")
        if self.hs_ids is not None:
            self.hs_ids = [int(i) for i in self.hs_ids]
        self.betas = tuple(float(b) for b in self.betas)
        positive = ("ttt_steps", "batch_size", "batch_tokens", "max_length", "save_every", "log_every")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecwireError(f"TrainConfig.{name}: expected a positive integer, found {v!r}.")
        for name in ("max_steps", "stop_after", "eval_max_samples", "draft_vocab_size"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or v <= 0):
                raise SpecwireError(f"TrainConfig.{name}: expected a positive integer or None, found {v!r}.")
        if self.eval_every < 0:
            raise SpecwireError(f"TrainConfig.eval_every: expected >= 0, found {self.eval_every}.")
        if not self.epochs > 0:
            raise SpecwireError(f"TrainConfig.epochs: expected > 0, found {self.epochs}.")
        if not self.lr > 0:
            raise SpecwireError(f"TrainConfig.lr: expected > 0, found {self.lr}.")
        if not 0 <= self.warmup_ratio < 1:
            raise SpecwireError(f"TrainConfig.warmup_ratio: expected a value in [0, 1), found {self.warmup_ratio}.")
        if not self.max_grad_norm > 0:
            raise SpecwireError(f"TrainConfig.max_grad_norm: expected > 0, found {self.max_grad_norm}.")
        if self.init_lm_head not in ("target", "random"):
            raise SpecwireError(f"TrainConfig.init_lm_head: expected 'target' or 'random', found {self.init_lm_head!r}.")

    @property
    def data_dirs(self) -> list[str]:
        return [self.data] if isinstance(self.data, str) else list(self.data)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise SpecwireError(f"train config: unknown fields {unknown}.")
        return cls(**d)


# ---- TTT maths (pure functions) --------------------------------------------------------------------

def step_weights(steps: int, decay: float = STEP_DECAY) -> list[float]:
    """Loss weight of each unrolled step: decay**j."""
    return [decay ** j for j in range(steps)]


def lr_at(step: int, *, total: int, lr: float, warmup_ratio: float) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warm-up, then cosine decay to 0."""
    warmup = int(math.ceil(warmup_ratio * total))
    if step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def ttt_mask(T: int, step: int, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The TTT attention pattern of unrolled step `step` as an explicit boolean mask (True = may attend).

    Keys are laid out as [step-0 keys (T) | step-1 keys (T) | ... | step-`step` keys (T)].
    The query at t sees step-0 keys at s <= t and, for every later step, only the key at t.
    shape: [T, T * (step + 1)]
    """
    eye = torch.eye(T, dtype=torch.bool, device=device)
    causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_attention(q: torch.Tensor, k0: torch.Tensor, v0: torch.Tensor,
                  ks: Sequence[torch.Tensor] = (), vs: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """Attention of one TTT step: step-0 keys causally, the keys of steps 1..j on the diagonal only.

    q: [B, nh, T, d] (this step's queries); k0, v0: [B, nkv, T, d] (step-0 keys/values);
    ks, vs: the keys/values of steps 1..j, each [B, nkv, T, d]. Returns [B, nh, T, d] (GQA when nkv < nh).
    Step 0 is plain causal SDPA. Step j > 0 runs SDPA over the concatenated keys with `ttt_mask`: on
    CPU (torch 2.13) the fused kernel beats a hand-written causal block + diagonal scores + softmax by
    2-4x at T=512, because the hand-written form makes ~10 passes over [B, nh, T, T] tensors.
    """
    nkv = k0.shape[1]
    gqa = nkv != q.shape[1]
    if not ks:
        return F.scaled_dot_product_attention(q, k0, v0, is_causal=True, enable_gqa=gqa)
    T = q.shape[2]
    k = torch.cat([k0, *ks], dim=2)  # shape: [B, nkv, T * (j + 1), d]
    v = torch.cat([v0, *vs], dim=2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=ttt_mask(T, len(ks), device=q.device), enable_gqa=gqa)


class TTTAttend:
    """The `attend` callable for one unrolled sequence: remembers each step's keys and values.

    The first call is step 0 (causal); call j attends as `ttt_attention` step j. Gradients flow
    through the remembered keys, as in the reference implementations.
    """

    def __init__(self):
        self.k0: torch.Tensor | None = None
        self.v0: torch.Tensor | None = None
        self.ks: list[torch.Tensor] = []
        self.vs: list[torch.Tensor] = []

    def __call__(self, q, k, v):
        if self.k0 is None:
            self.k0, self.v0 = k, v
            return ttt_attention(q, k, v)
        self.ks.append(k)
        self.vs.append(v)
        return ttt_attention(q, self.k0, self.v0, self.ks, self.vs)


class _SoftCrossEntropy(torch.autograd.Function):
    """ce = logsumexp(z) - <p, z> (as sum p = 1); d ce / dz = softmax(z) - p. Two passes over [N, Vd]
    forward and three backward, instead of log_softmax + product + sum and their backwards."""

    @staticmethod
    def forward(ctx, logits, probs):
        lse = torch.logsumexp(logits, dim=-1)  # shape: [N]
        dot = torch.bmm(probs.unsqueeze(1), logits.unsqueeze(2)).view(-1)  # shape: [N], <p, z> per row
        ctx.save_for_backward(logits, probs, lse)
        return lse - dot

    @staticmethod
    def backward(ctx, grad):
        logits, probs, lse = ctx.saved_tensors
        g = torch.exp(logits - lse.unsqueeze(1))  # shape: [N, Vd], softmax(z)
        g.sub_(probs).mul_(grad.unsqueeze(1))
        return g, None


def soft_cross_entropy(logits: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
    """-sum_v p_v log q_v per row, q = softmax(logits); rows of target_probs sum to 1. [N, Vd] -> [N]"""
    return _SoftCrossEntropy.apply(logits.float(), target_probs.to(torch.float32).detach())


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """-sum p log p per row (0 log 0 = 0). [N, Vd] -> [N]"""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)


def kl_to_target(logits: torch.Tensor, target_probs: torch.Tensor, target_entropy: torch.Tensor | None = None) -> torch.Tensor:
    """KL(target || draft) per row = soft cross-entropy - target entropy. [N, Vd] -> [N]"""
    h = entropy(target_probs) if target_entropy is None else target_entropy
    return soft_cross_entropy(logits, target_probs) - h


def restricted_target(target_logits: torch.Tensor, draft_target_ids: torch.Tensor) -> torch.Tensor:
    """The target's distribution restricted to the draft vocab and renormalised (draft id order).

    target_logits: [N, V] full-vocab logits; draft_target_ids: [Vd] target id of each draft id.
    shape: [N, Vd]
    """
    return torch.softmax(target_logits[:, draft_target_ids].float(), dim=-1)


def top1_matches(draft_logits: torch.Tensor, d2t: torch.Tensor, target_argmax: torch.Tensor) -> torch.Tensor:
    """Whether the draft's argmax, mapped to a target id (i + d2t[i]), is the target's own argmax. [N] bool"""
    pred = draft_logits.argmax(-1)
    return (pred + d2t[pred]) == target_argmax


# ---- target distributions ----------------------------------------------------------------------------

@dataclass
class TargetDist:
    """Target distributions at the scored positions of a batch (rows in `TTTBatch.score_pos` order)."""

    probs: torch.Tensor  # [N, Vd] float32, restricted to the draft vocab and renormalised
    entropy: torch.Tensor  # [N] entropy of probs
    argmax_draft: torch.Tensor  # [N] argmax of probs (a draft id)
    argmax_target: torch.Tensor  # [N] argmax over the full target vocab (a target id)


class TargetHeads:
    """The target's final norm and lm_head, with lm_head rows permuted draft-vocab first.

    One matmul gives the draft-vocab logits (soft targets) and the other rows (only for the full-vocab
    argmax, the headline accuracy's reference). Frozen, float32, on `device`.
    """

    def __init__(self, final_norm: nn.Module, lm_head: nn.Module, d2t: torch.Tensor, *, device, chunk: int = 2048):
        w = lm_head.weight.detach()
        V = w.shape[0]
        draft_ids = (torch.arange(len(d2t), device=d2t.device) + d2t).to(w.device)  # shape: [Vd]
        in_draft = torch.zeros(V, dtype=torch.bool, device=w.device)
        in_draft[draft_ids] = True
        rest_ids = (~in_draft).nonzero().squeeze(1)  # shape: [V - Vd]
        order = torch.cat([draft_ids, rest_ids])
        self.weight = w[order].to(device=device, dtype=torch.float32)  # shape: [V, H]
        b = getattr(lm_head, "bias", None)
        self.bias = None if b is None else b.detach()[order].to(device=device, dtype=torch.float32)
        self.order = order.to(device)  # position in the permuted rows -> target id
        self.n_draft = len(d2t)
        self.final_norm = final_norm
        self.chunk = chunk

    @torch.no_grad()
    def __call__(self, last_hidden: torch.Tensor) -> TargetDist:
        """last_hidden: [N, H] pre-norm hs L at the target positions -> their distributions."""
        norm_dtype = next(self.final_norm.parameters(), torch.empty(0, dtype=torch.float32)).dtype
        outs = []
        for a in range(0, max(1, last_hidden.shape[0]), self.chunk):
            h = self.final_norm(last_hidden[a:a + self.chunk].to(norm_dtype)).float()
            logits = F.linear(h, self.weight, self.bias)  # shape: [n, V], permuted rows
            d, rest = logits[:, :self.n_draft], logits[:, self.n_draft:]
            probs = torch.softmax(d, dim=-1)
            dmax, darg = d.max(-1)
            if rest.shape[1]:
                rmax, rarg = rest.max(-1)
                # ties go to the lower target id, as argmax over the unpermuted vocab would
                did, rid = self.order[darg], self.order[self.n_draft + rarg]
                take_rest = (rmax > dmax) | ((rmax == dmax) & (rid < did))
                amax = torch.where(take_rest, rid, did)
            else:
                amax = self.order[darg]
            outs.append((probs, entropy(probs), darg, amax))
        return TargetDist(*(torch.cat(x) for x in zip(*outs)))


# ---- batches and the unroll --------------------------------------------------------------------------

@dataclass
class TTTBatch:
    """Right-padded samples on the device, plus where the loss is scored."""

    input_ids: torch.Tensor  # [B, T] int64, 0 on padding
    loss_mask: torch.Tensor  # [B, T] bool, False on padding
    hidden: torch.Tensor  # [B, T, n*H_t] float32 fused target states (zeros on padding)
    last_hidden: torch.Tensor  # [B, T, H_t] float32 (zeros on padding)
    score_pos: torch.Tensor  # [N] flat indices (b*T + p) of target positions p >= 1 with loss_mask, t descending
    score_t: torch.Tensor  # [N] their in-row positions p (non-increasing)


def collate(samples: Sequence[dict], *, max_length: int, device, dtype=torch.float32) -> TTTBatch:
    """Pad samples (dicts of input_ids, loss_mask, hidden, last_hidden) into a batch; truncate to max_length."""
    lengths = [min(len(s["input_ids"]), max_length) for s in samples]
    B, T = len(samples), max(lengths)
    W, H = samples[0]["hidden"].shape[-1], samples[0]["last_hidden"].shape[-1]
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.bool)
    hidden = torch.zeros(B, T, W, dtype=dtype, device=device)
    last = torch.zeros(B, T, H, dtype=dtype, device=device)
    for b, (s, n) in enumerate(zip(samples, lengths)):
        ids[b, :n] = s["input_ids"][:n]
        mask[b, :n] = s["loss_mask"][:n].bool()
        hidden[b, :n] = s["hidden"][:n].to(device=device, dtype=dtype)  # bf16 -> fp32 once per batch
        last[b, :n] = s["last_hidden"][:n].to(device=device, dtype=dtype)
    ids, mask = ids.to(device), mask.to(device)
    return make_batch(ids, mask, hidden, last)


def make_batch(input_ids, loss_mask, hidden, last_hidden) -> TTTBatch:
    B, T = input_ids.shape
    m = loss_mask.bool().clone()
    m[:, 0] = False  # position 0 is nobody's target
    t = torch.arange(T, device=m.device).expand(B, T)
    flat = m.flatten().nonzero().squeeze(1)  # shape: [N]
    tt = t.flatten()[flat]
    order = torch.sort(tt, descending=True, stable=True).indices  # later positions first: step j scores a prefix
    return TTTBatch(input_ids=input_ids, loss_mask=loss_mask.bool(), hidden=hidden, last_hidden=last_hidden,
                    score_pos=flat[order], score_t=tt[order])


def step_counts(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Loss tokens scored at each unrolled step: target positions p >= 1 + j with loss_mask. [steps] int64"""
    m = loss_mask.bool()
    T = m.shape[-1]
    t = torch.arange(T, device=m.device)
    return torch.stack([(m & (t >= 1 + j)).sum() for j in range(steps)])


def _draft_hidden_step(draft, embeds, hidden, cos, sin, attend):
    """The draft's decoder layer only (Eagle3Draft.forward minus lm_head; tested equal to it)."""
    return draft.layers[0](embeds, hidden, cos, sin, attend)


@dataclass
class UnrollStats:
    """Sums over one batch for each unrolled step (reduce across batches/ranks by adding)."""

    loss: torch.Tensor | None  # scalar: sum_j w_j * kl_sum_j / norm_j (with grad), None without norm
    kl: torch.Tensor  # [K] sum of KL over scored tokens
    correct: torch.Tensor  # [K] target-vocab top-1 matches (headline)
    correct_draft_vocab: torch.Tensor  # [K] draft-vocab top-1 matches
    count: torch.Tensor  # [K] scored tokens
    in_vocab: torch.Tensor  # [K] scored tokens whose target argmax lies in the draft vocab

    def vector(self) -> torch.Tensor:
        return torch.cat([self.kl.detach(), self.correct, self.correct_draft_vocab, self.count, self.in_vocab]).double()


def ttt_unroll(draft, heads: TargetHeads, batch: TTTBatch, *, steps: int,
               norm: torch.Tensor | None = None, weights: Sequence[float] | None = None) -> UnrollStats:
    """Run the K-step TTT unroll on a batch; returns the weighted loss (when `norm`, the global
    per-step token counts, is given) and per-step sums for metrics."""
    B, T = batch.input_ids.shape
    dev = batch.input_ids.device
    weights = step_weights(steps) if weights is None else weights
    tgt = heads(batch.last_hidden.flatten(0, 1)[batch.score_pos])  # rows in score_pos order
    in_vocab_row = draft.t2d[tgt.argmax_target]
    pos = torch.arange(T, device=dev).expand(B, T)
    h = draft.fuse(batch.hidden)  # shape: [B, T, H]
    cos, sin = draft.rope(pos, h)  # the same positions for every step
    emb = draft.embed(batch.input_ids)  # shape: [B, T, H], embedding of x_t
    attend = TTTAttend()
    zero = torch.zeros((), device=dev)
    loss = zero.clone() if norm is not None else None
    kl_s, cor_s, cord_s, cnt_s, inv_s = [], [], [], [], []
    for j in range(steps):
        e_j = F.pad(emb[:, 1 + j:], (0, 0, 0, min(1 + j, T)))[:, :T]  # shape: [B, T, H], token x_{t+1+j}
        h = _draft_hidden_step(draft, e_j, h, cos, sin, attend)
        n = int((batch.score_t >= 1 + j).sum())  # scored rows form a prefix (score_t non-increasing)
        q_idx = batch.score_pos[:n] - 1 - j  # query position t = p - 1 - j, same row
        logits = draft.lm_head(draft.norm(h.flatten(0, 1)[q_idx]))  # shape: [n, Vd]
        kl = kl_to_target(logits, tgt.probs[:n], tgt.entropy[:n])
        if loss is not None:
            loss = loss + weights[j] * kl.sum() / norm[j].clamp_min(1)
        with torch.no_grad():
            pred = logits.argmax(-1)
            kl_s.append(kl.detach().sum())
            cor_s.append(((pred + draft.d2t[pred]) == tgt.argmax_target[:n]).sum())
            cord_s.append((pred == tgt.argmax_draft[:n]).sum())
            cnt_s.append(torch.tensor(n, device=dev))
            inv_s.append(in_vocab_row[:n].sum())
    return UnrollStats(loss=loss, kl=torch.stack(kl_s), correct=torch.stack(cor_s).double(),
                       correct_draft_vocab=torch.stack(cord_s).double(), count=torch.stack(cnt_s).double(),
                       in_vocab=torch.stack(inv_s).double())


@dataclass
class Totals:
    """Per-step sums accumulated over batches (and ranks)."""

    steps: int
    vec: torch.Tensor = None  # [5K] float64: kl, correct, correct_draft_vocab, count, in_vocab

    def __post_init__(self):
        if self.vec is None:
            self.vec = torch.zeros(5 * self.steps, dtype=torch.float64)

    def add(self, stats: UnrollStats) -> None:
        self.vec = self.vec.to(stats.kl.device) + stats.vector()

    def part(self, i: int) -> list[float]:
        return self.vec[i * self.steps:(i + 1) * self.steps].tolist()

    def summary(self) -> dict[str, Any]:
        kl, cor, cord, cnt, inv = (self.part(i) for i in range(5))
        div = [max(c, 1.0) for c in cnt]
        return {
            "kl": [a / c for a, c in zip(kl, div)],
            "acc": [a / c for a, c in zip(cor, div)],
            "acc_draft_vocab": [a / c for a, c in zip(cord, div)],
            "count": [int(c) for c in cnt],
            "in_vocab": inv[0] / div[0],
        }


# ---- distributed helpers -----------------------------------------------------------------------------

@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    owns_group: bool = False  # we initialised the process group (and destroy it at the end)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


def init_dist(device: str | None) -> tuple[Dist, torch.device]:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    from specwire.target.load import default_device

    if world <= 1:
        return Dist(), torch.device(device or default_device())
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(device or default_device())
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    owns = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        owns = True
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), owns_group=owns), dev


def all_reduce_grads(params: list[nn.Parameter], d: Dist) -> None:
    """Sum gradients over ranks with one flat all-reduce (the loss is already globally normalised)."""
    if d.world <= 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    d.all_sum(flat)
    a = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[a:a + n].view_as(p).clone()
        a += n


# ---- data -----------------------------------------------------------------------------------------

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
    """Open the data (dump or conversations), check it against the run's wiring, and load its splits."""
    from specwire.data.dump import CONVERSATIONS, MANIFEST, is_validation, open_dump, read_conversations

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
    data = Path(config.data)
    # online: conversations.jsonl of a datagen run (phase 1); states are captured per batch
    conv_path = data / CONVERSATIONS if data.is_dir() else data
    from specwire.wiring import default_hs_ids

    hs_ids = config.hs_ids if config.hs_ids is not None else list(default_hs_ids(target.num_layers))
    expect = expected_wiring(target, hs_ids)
    man = conv_path.parent / MANIFEST
    if man.is_file():  # a datagen folder: its manifest must agree with the run
        from specwire.data.dump import parse_manifest

        found, _ = parse_manifest(read_json(man, what="dump manifest"), path=man)
        expect.check_compatible(found, expected_from="this run", found_in=f"{man}",
                                ignore=() if config.hs_ids is not None else ("hs_ids",))
    recs = read_conversations(conv_path)
    if not recs:
        raise SpecwireError(f"{conv_path}: no conversations; run `specwire datagen` first.")
    V = target.spec.vocab_size
    counts = torch.zeros(V, dtype=torch.int64)
    samples = []
    for r in recs:
        ids = torch.tensor(r["input_ids"], dtype=torch.long)
        mask = torch.tensor(r["loss_mask"], dtype=torch.uint8)
        if bool((ids < 0).any()) or bool((ids >= V).any()):
            raise SpecwireError(f"{conv_path}: sample {r['index']} holds token ids outside the target vocabulary 0..{V - 1}.")
        counts += torch.bincount(ids[mask.bool()], minlength=V)
        samples.append({"input_ids": ids, "loss_mask": mask, "index": int(r["index"])})
    train = [s for s in samples if not is_validation(s["index"])]
    val = [s for s in samples if is_validation(s["index"])]
    if config.eval_data is not None:
        train = samples
        val = list(open_dump(config.eval_data, expect=expect).iter_samples(None))
        return RunData(train=DataSet(train, online=True), val=DataSet(val), wiring=expect, vocab_counts=counts,
                       target_name=None, source=f"conversations {conv_path}")
    return RunData(train=DataSet(train, online=True), val=DataSet(val, online=True), wiring=expect,
                   vocab_counts=counts, target_name=None, source=f"conversations {conv_path}")


def materialize(samples: list[dict], *, target, hs_ids: Sequence[int], max_length: int) -> list[dict]:
    """Online mode: capture the fused and last states of samples that carry only ids (datagen's capture)."""
    need = [s for s in samples if "hidden" not in s]
    if not need:
        return samples
    from specwire.data.datagen import capture_batch

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


# ---- the draft ------------------------------------------------------------------------------------

def build_draft(target, wiring: Wiring, vocab_counts: torch.Tensor, *, draft_vocab_size: int | None,
                norm_before_residual: bool, init_lm_head: str, seed: int, device) -> Eagle3Draft:
    """A fresh draft for `target`: vocab map from the counts, seeded init, embeddings attached."""
    from specwire.draft.model import DraftConfig
    from specwire.draft.vocab import build_vocab_map

    V = target.spec.vocab_size
    vd = min(DEFAULT_DRAFT_VOCAB, V) if draft_vocab_size is None else draft_vocab_size
    if vd > V:
        raise SpecwireError(f"--draft-vocab-size {vd} exceeds the target vocabulary ({V}).", fix=f"use at most {V}.")
    d2t, t2d = build_vocab_map(vocab_counts, vd)
    cfg = DraftConfig.for_target(target.model.config, wiring, draft_vocab_size=vd,
                                 norm_before_residual=norm_before_residual)
    draft = Eagle3Draft(cfg)
    g = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for m in draft.modules():
            if isinstance(m, nn.Linear):
                nn.init.kaiming_uniform_(m.weight, a=math.sqrt(5), generator=g)  # PyTorch's default Linear init
                if m.bias is not None:
                    bound = 1 / math.sqrt(m.in_features)
                    nn.init.uniform_(m.bias, -bound, bound, generator=g)
        if init_lm_head == "target":
            ids = torch.arange(vd) + d2t
            draft.lm_head.weight.copy_(target.parts.lm_head.weight.detach()[ids.to(target.device)].float().cpu())
            nw = getattr(target.parts.final_norm, "weight", None)
            if nw is not None and tuple(nw.shape) == tuple(draft.norm.weight.shape):
                draft.norm.weight.copy_(nw.detach().float().cpu())
    draft.set_vocab_map(d2t, t2d)
    draft.to(device)
    draft.attach_embeddings(target.parts.embed)
    return draft


# ---- checkpoints ----------------------------------------------------------------------------------

def _resume_view(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k not in RESUME_FREE_FIELDS}


def save_checkpoint(path: Path, *, draft, optimizer: torch.optim.Optimizer, step: int, config: TrainConfig,
                    total_steps: int) -> None:
    """Atomically write draft weights, AdamW state (safetensors) and scalars (JSON)."""
    names = {id(p): n for n, p in draft.named_parameters()}
    opt_tensors: dict[str, torch.Tensor] = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            st = optimizer.state.get(p, {})
            for k, v in st.items():
                t = v if isinstance(v, torch.Tensor) else torch.tensor(float(v))
                opt_tensors[f"{names[id(p)]}::{k}"] = t.detach().cpu()
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
              for g in optimizer.param_groups]
    state = {"format": CHECKPOINT_FORMAT, "format_version": CHECKPOINT_VERSION, "step": step,
             "total_steps": total_steps, "config": config.to_dict(), "param_groups": groups,
             "param_names": [names[id(p)] for g in optimizer.param_groups for p in g["params"]]}
    with atomic_path(path) as tmp:
        tmp.mkdir()
        save_tensors(tmp / "draft.safetensors", {k: v.detach().cpu() for k, v in draft.state_dict().items()})
        save_tensors(tmp / "optimizer.safetensors", opt_tensors)
        (tmp / "state.json").write_text(json.dumps(state, indent=2) + "\n")


def load_checkpoint(path: Path, *, draft, optimizer: torch.optim.Optimizer, config: TrainConfig) -> int:
    """Restore a checkpoint written by `save_checkpoint`; returns its step. Refuses another run's."""
    state = read_json(path / "state.json", what="training checkpoint state")
    if state.get("format") != CHECKPOINT_FORMAT or state.get("format_version") != CHECKPOINT_VERSION:
        raise SpecwireError(f"{path / 'state.json'}: not a specwire training checkpoint (version {CHECKPOINT_VERSION}).")
    saved, now = _resume_view(state.get("config") or {}), _resume_view(config.to_dict())
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, now {now.get(k)!r}" for k in sorted(set(saved) | set(now))
             if saved.get(k) != now.get(k)]
    if diffs:
        raise SpecwireError(
            f"{path}: the checkpoint belongs to a run with other settings ({'; '.join(diffs)}).",
            fix="rerun with the original options to resume, or pass a new --out folder to start afresh.",
        )
    tensors = load_tensors(path / "draft.safetensors")
    check_tensors(path / "draft.safetensors", tensors, draft.expected_shapes())
    draft.load_state_dict({k: v.to(draft.fc.weight.device) for k, v in tensors.items()}, strict=True)
    opt = load_tensors(path / "optimizer.safetensors")
    params = dict(draft.named_parameters())
    order = state["param_names"]
    per: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in opt.items():
        name, _, field_ = key.partition("::")
        if name not in params or name not in order:
            raise SpecwireError(f"{path / 'optimizer.safetensors'}: state for unknown parameter '{name}'.")
        per.setdefault(order.index(name), {})[field_] = t
    groups, a = [], 0
    for g, live in zip(state["param_groups"], optimizer.param_groups):
        n = len(live["params"])
        groups.append({**g, "betas": tuple(g["betas"]), "params": list(range(a, a + n))})
        a += n
    optimizer.load_state_dict({"state": per, "param_groups": groups})
    return int(state["step"])


# ---- the training loop ----------------------------------------------------------------------------

@dataclass
class TrainResult:
    """What a finished (or stopped) run produced."""

    out_dir: Path
    draft_dir: Path | None  # OUT/draft (None when stopped before the end)
    checkpoint_dir: Path
    metrics_path: Path
    steps: int  # optimizer steps completed in total
    total_steps: int  # steps of the full schedule
    resumed_from: int  # step the run resumed from (0: fresh)
    train: dict  # last logged training metrics
    val: dict | None  # final validation summary (evaluate.EvalResult.to_dict())
    tokens_per_s: float  # loss tokens (step 0) per second of training in this invocation
    finished: bool

    @property
    def data_dirs(self) -> list[str]:
        return [self.data] if isinstance(self.data, str) else list(self.data)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("out_dir", "draft_dir", "checkpoint_dir", "metrics_path"):
            d[k] = None if d[k] is None else str(d[k])
        return d


def _append_jsonl(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()


def _trim_metrics(path: Path, step: int, *, final: bool) -> None:
    """On resume from `step`, drop the records that the resumed run writes again: everything after the
    checkpoint, and the end-of-run validation when the run had already finished (`final`)."""
    if not path.is_file():
        return
    keep = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        s = int(rec.get("step", 0))
        if s < step or (s == step and not (final and rec.get("kind") == "val")):
            keep.append(line)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(l + "\n" for l in keep))


def validate(draft, heads: TargetHeads, data: DataSet, *, config: TrainConfig, d: Dist, target, hs_ids,
             device) -> Totals:
    """Per-step sums over a data set (this rank's share of it), all-reduced."""
    n = len(data) if config.eval_max_samples is None else min(len(data), config.eval_max_samples)
    lengths = data.lengths()[:n]
    mine = list(range(d.rank, n, d.world))
    totals = Totals(config.ttt_steps)
    totals.vec = totals.vec.to(device)
    was = draft.training
    draft.eval()
    with torch.no_grad():
        for mb in micro_batches(mine, lengths, batch_tokens=config.batch_tokens, max_length=config.max_length):
            samples = materialize([data.samples[i] for i in mb], target=target, hs_ids=hs_ids, max_length=config.max_length)
            batch = collate(samples, max_length=config.max_length, device=device)
            totals.add(ttt_unroll(draft, heads, batch, steps=config.ttt_steps))
    draft.train(was)
    d.all_sum(totals.vec)
    return totals


def train(config: TrainConfig) -> TrainResult:
    """Train (or resume training) a draft; see the module docstring. Runs single-process or under torchrun."""
    from specwire.target.load import load_target

    d, device = init_dist(config.device)
    try:
        return _train(config, d, device, load_target)
    finally:
        if d.owns_group:
            import torch.distributed as dist

            dist.destroy_process_group()


def _train(config: TrainConfig, d: Dist, device: torch.device, load_target) -> TrainResult:
    out = Path(config.out)
    ckpt_dir, metrics_path, draft_dir = out / "checkpoint", out / "metrics.jsonl", out / "draft"
    target_name = config.target or manifest_target(config.data_dirs[0])
    if target_name is None:
        raise SpecwireError(f"{config.data_dirs[0]}: no manifest names the target.", fix="pass --target NAME_OR_PATH.")
    target = load_target(target_name, device=device, dtype=config.target_dtype)
    data = load_run_data(config, target)
    if len(data.train) == 0:
        raise SpecwireError(f"{data.source}: the train split is empty.")
    hs_ids = list(data.wiring.hs_ids)
    draft = build_draft(target, data.wiring, data.vocab_counts, draft_vocab_size=config.draft_vocab_size,
                        norm_before_residual=config.norm_before_residual, init_lm_head=config.init_lm_head,
                        seed=config.seed, device=device)
    heads = TargetHeads(target.parts.final_norm, target.parts.lm_head, draft.d2t, device=device)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay,
                            foreach=False)

    lengths = data.train.lengths()
    per_epoch = math.ceil(len(data.train) / config.batch_size)
    total = max(1, int(math.ceil(config.epochs * per_epoch)))
    if config.max_steps is not None:
        total = min(total, config.max_steps)

    start = 0
    if (ckpt_dir / "state.json").is_file():
        start = load_checkpoint(ckpt_dir, draft=draft, optimizer=opt, config=config)
        draft.attach_embeddings(target.parts.embed)
        heads = TargetHeads(target.parts.final_norm, target.parts.lm_head, draft.d2t, device=device)
        if d.main:
            _trim_metrics(metrics_path, start, final=start >= total)
            log.info("resuming %s from step %d of %d", ckpt_dir, start, total)
    elif d.main:
        out.mkdir(parents=True, exist_ok=True)
        if metrics_path.exists():
            metrics_path.unlink()
    d.barrier()

    from specwire.training.evaluate import summarize

    bar = None
    if d.main and config.progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=start, desc="train", unit="step", dynamic_ncols=True)
    K = config.ttt_steps
    weights = step_weights(K)
    window = Totals(K)
    window.vec = window.vec.to(device)
    win_loss, win_steps, last_train = 0.0, 0, {}
    loss_tokens, t0 = 0.0, time.perf_counter()
    batches_cache: dict[int, list[list[int]]] = {}
    step = start
    done_here = 0
    draft.train()
    while step < total:
        if config.stop_after is not None and done_here >= config.stop_after:
            break
        epoch, b = divmod(step, per_epoch)
        if epoch not in batches_cache:
            batches_cache = {epoch: epoch_batches(lengths, batch_size=config.batch_size, seed=config.seed, epoch=epoch)}
        gbatch = batches_cache[epoch][b]
        mine = rank_share(gbatch, lengths, d)
        lr = lr_at(step, total=total, lr=config.lr, warmup_ratio=config.warmup_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        # global per-step token counts normalise the loss (the same on every rank)
        norm = torch.zeros(K, dtype=torch.float64, device=device)
        for i in mine:
            s = data.train.samples[i]
            norm += step_counts(s["loss_mask"][:config.max_length].to(device), K).double()
        d.all_sum(norm)
        loss_tokens += float(norm[0])
        norm = norm.float()
        opt.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        for mb in micro_batches(mine, lengths, batch_tokens=config.batch_tokens, max_length=config.max_length):
            samples = materialize([data.train.samples[i] for i in mb], target=target, hs_ids=hs_ids,
                                  max_length=config.max_length)
            batch = collate(samples, max_length=config.max_length, device=device)
            stats = ttt_unroll(draft, heads, batch, steps=K, norm=norm, weights=weights)
            stats.loss.backward()
            step_loss += stats.loss.detach()
            window.add(stats)
        all_reduce_grads(params, d)
        torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        opt.step()
        step += 1
        done_here += 1
        win_loss += float(d.all_sum(step_loss))
        win_steps += 1
        if bar is not None:
            s0 = window.vec
            bar.update(1)
            bar.set_postfix(loss=f"{win_loss / win_steps:.3f}", acc0=f"{float(s0[K] / max(float(s0[3 * K]), 1.0)):.3f}")
        if step % config.log_every == 0 or step == total:
            d.all_sum(window.vec)
            summ = window.summary()
            last_train = {"kind": "train", "step": step, "epoch": step / per_epoch, "lr": lr,
                          "loss": win_loss / win_steps, **summ}
            if d.main:
                _append_jsonl(metrics_path, last_train)
            window = Totals(K)
            window.vec = window.vec.to(device)
            win_loss, win_steps = 0.0, 0
        if config.eval_every and step % config.eval_every == 0 and step != total and len(data.val):
            vt = validate(draft, heads, data.val, config=config, d=d, target=target, hs_ids=hs_ids, device=device)
            if d.main:
                _append_jsonl(metrics_path, {"kind": "val", "step": step, **vt.summary()})
        if step % config.save_every == 0 or step == total:
            if d.main:
                save_checkpoint(ckpt_dir, draft=draft, optimizer=opt, step=step, config=config, total_steps=total)
            d.barrier()
    elapsed = time.perf_counter() - t0
    if bar is not None:
        bar.close()
    finished = step >= total
    val = None
    if finished:
        if len(data.val):
            vt = validate(draft, heads, data.val, config=config, d=d, target=target, hs_ids=hs_ids, device=device)
            val = summarize(vt, split="val" if config.eval_data is None else "eval_data",
                            n_samples=len(data.val) if config.eval_max_samples is None else min(len(data.val), config.eval_max_samples),
                            coverage=None).to_dict()
            if d.main:
                _append_jsonl(metrics_path, {"kind": "val", "step": step, **vt.summary(),
                                             "predicted_accept_length": val["predicted_accept_length"]})
        if d.main:
            extra = {"training": {"steps": step, "ttt_steps": K, "data": str(config.data),
                                  "target": target_name, "online": config.online,
                                  "config": config.to_dict(), "val": val}}
            save_draft(draft, draft_dir, extra=extra, verifier_path=str(target.info.path))
        d.barrier()
    return TrainResult(out_dir=out, draft_dir=draft_dir if finished else None, checkpoint_dir=ckpt_dir,
                       metrics_path=metrics_path, steps=step, total_steps=total, resumed_from=start,
                       train=last_train, val=val, tokens_per_s=loss_tokens / elapsed if elapsed > 0 else 0.0,
                       finished=finished)


# ---- command line ---------------------------------------------------------------------------------

def add_cli(sub) -> None:
    from specwire.cli import add_json_option

    p = sub.add_parser(
        "train", help="train an EAGLE-3 draft with training-time test (resumable; works under torchrun)",
        description="Train an EAGLE-3 draft on a hidden-state dump (from `specwire datagen`) with K-step "
        "training-time test. Rerunning the same command resumes from OUT/checkpoint. Under "
        "`torchrun --nproc-per-node N` the data is sharded by rank. The final draft goes to OUT/draft.")
    p.add_argument("--data", required=True, nargs="+", metavar="DIR",
                   help="dump folder(s), merged into one data set after each is checked against the wiring "
                        "(online: one datagen folder with conversations.jsonl)")
    p.add_argument("--out", required=True, help="run folder (checkpoint/, draft/, metrics.jsonl)")
    p.add_argument("--target", default=None, help="target name or HF folder (default: the one the dump names)")
    p.add_argument("--hs-ids", default=None, help="expected fused hs ids, e.g. 2,15,27 (default: the dump's)")
    p.add_argument("--online", action="store_true", help="capture target states per batch from conversations.jsonl")
    p.add_argument("--eval-data", default=None, help="separate validation dump (default: the dump's val split)")
    p.add_argument("--ttt-steps", type=int, default=5, help="unrolled draft steps K (default: %(default)s)")
    p.add_argument("--draft-vocab-size", type=int, default=None,
                   help=f"draft vocabulary (default: min({DEFAULT_DRAFT_VOCAB}, target vocab))")
    p.add_argument("--norm-before-residual", action="store_true", help="draft layer residual is hidden_norm(h)")
    p.add_argument("--init-lm-head", choices=["target", "random"], default="target",
                   help="initialise lm_head/norm from the target's rows (default) or randomly")
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--max-steps", type=int, default=None, help="cap on optimizer steps")
    p.add_argument("--batch-size", type=int, default=8, help="samples per optimizer step, all ranks (default: %(default)s)")
    p.add_argument("--batch-tokens", type=int, default=8192, help="max padded tokens per forward pass (default: %(default)s)")
    p.add_argument("--max-length", type=int, default=2048, help="truncate samples to this length (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--warmup-ratio", type=float, default=0.015)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=0, help="validate every N steps (default: only at the end)")
    p.add_argument("--eval-max-samples", type=int, default=None)
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--stop-after", type=int, default=None, help="stop after N steps of this invocation (resume later)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="weights dtype of the target (its norm and lm_head make the soft targets; the draft trains in float32)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_json_option(p)
    p.set_defaults(func=cmd_train)


def config_from_args(args) -> TrainConfig:
    return TrainConfig(
        data=args.data, out=args.out, target=args.target, hs_ids=parse_ids(args.hs_ids) if args.hs_ids else None,
        online=args.online, eval_data=args.eval_data, ttt_steps=args.ttt_steps, draft_vocab_size=args.draft_vocab_size,
        norm_before_residual=args.norm_before_residual, init_lm_head=args.init_lm_head, epochs=args.epochs,
        max_steps=args.max_steps, batch_size=args.batch_size, batch_tokens=args.batch_tokens, max_length=args.max_length,
        lr=args.lr, weight_decay=args.weight_decay, warmup_ratio=args.warmup_ratio, max_grad_norm=args.max_grad_norm,
        seed=args.seed, eval_every=args.eval_every, eval_max_samples=args.eval_max_samples, save_every=args.save_every,
        log_every=args.log_every, device=args.device, target_dtype=args.dtype, progress=not args.no_progress,
        stop_after=args.stop_after,
    )


def cmd_train(args) -> int:
    from specwire.cli import emit_json

    result = train(config_from_args(args))
    if int(os.environ.get("RANK", "0")) != 0:
        return 0
    if args.json:
        emit_json(result.to_dict())
        return 0
    if not result.finished:
        print(f"stopped at step {result.steps} of {result.total_steps}; rerun the same command to resume "
              f"(checkpoint: {result.checkpoint_dir})")
        return 0
    print(f"trained {result.steps} steps -> {result.draft_dir}")
    if result.val:
        acc = ", ".join(f"{a:.3f}" for a in result.val["step_accuracy"])
        print(f"validation step accuracy: [{acc}]  predicted accept length {result.val['predicted_accept_length']:.2f}")
    print(f"metrics: {result.metrics_path}")
    return 0
