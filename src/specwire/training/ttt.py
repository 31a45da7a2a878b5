"""Training-time test (TTT) maths: the unrolled draft, its targets, loss and accuracy, as pure functions.

Owns: the TTT attention pattern (`ttt_mask`, `ttt_attention`, `TTTAttend`), the soft cross-entropy and
KL, the target's distributions at the scored positions (`TargetHeads`), a padded batch (`TTTBatch`,
`collate`), the K-step unroll (`ttt_unroll`) that training, validation and `specwire eval` all run, and
the per-step sums it returns (`UnrollStats`, `Totals`). Does not own the draft module
(`draft.model`: one step is `Eagle3Draft.step`), the loop (`training.trainer`) or data loading
(`training.batches`).

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
  loss: sum_j 0.8**j * mean over the step's loss tokens of KL(target || draft) (or, `loss_kind="top1"`,
          of -log q(the target's argmax)).
Accuracy: step-j top-1 "target-vocab" accuracy, the headline, is P(d2t-mapped draft argmax == argmax of
the target over its full vocabulary): a draft token is accepted exactly when it equals the target's
choice, so this is what acceptance means. "Draft-vocab" accuracy compares with the argmax of the
restricted distribution (an upper bound that ignores the tokens the draft vocab lacks).

Efficiency: the target distributions are computed once per batch, only at loss-masked positions, from
one matmul with the target's lm_head rows permuted draft-vocab first (the draft rows give the soft
targets, the rest only the full-vocab argmax); the draft's lm_head runs only on the positions each step
scores. Dumps stored in bf16 are converted to float32 once per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

STEP_DECAY = 0.8  # per-step loss weight decay (EAGLE-3)


def step_weights(steps: int, decay: float = STEP_DECAY) -> list[float]:
    """Loss weight of each unrolled step: decay**j."""
    return [decay ** j for j in range(steps)]


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
    Step 0 is plain causal SDPA. Step j > 0 runs SDPA over the concatenated keys with `ttt_mask`: the
    fused kernel is faster than a hand-written causal block + diagonal scores + softmax, which makes
    about ten passes over [B, nh, T, T] tensors.
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
        with torch.autocast(logits.device.type, enabled=False):  # fp32 sums even inside an autocast region
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


def add_noise(hidden: torch.Tensor, std: float, *, seed: int, step: int, part: int) -> None:
    """Add N(0, std^2) to the fused target states in place (training only), as speculators does: the
    draft then leans less on exact values that serving, in another dtype or kernel, does not reproduce.
    Seeded by (seed, step, part), so a resumed run draws the same noise. hidden: [B, T, n*H_t]"""
    g = torch.Generator(device=hidden.device).manual_seed(((int(seed) * 1_000_003 + int(step)) * 1_000_003 + int(part)) % 2 ** 62)
    hidden.add_(torch.randn(hidden.shape, generator=g, device=hidden.device, dtype=hidden.dtype), alpha=std)


def step_counts(loss_mask: torch.Tensor, steps: int) -> torch.Tensor:
    """Loss tokens scored at each unrolled step: target positions p >= 1 + j with loss_mask. [steps] int64"""
    m = loss_mask.bool()
    T = m.shape[-1]
    t = torch.arange(T, device=m.device)
    return torch.stack([(m & (t >= 1 + j)).sum() for j in range(steps)])


TOPK_STAT = 4  # the per-step top-k accuracy reported beside top-1 (the default tree branching)

@dataclass
class UnrollStats:
    """Sums over one batch for each unrolled step (reduce across batches/ranks by adding)."""

    loss: torch.Tensor | None  # scalar: sum_j w_j * kl_sum_j / norm_j (with grad), None without norm
    kl: torch.Tensor  # [K] sum of KL over scored tokens
    correct: torch.Tensor  # [K] target-vocab top-1 matches (headline)
    correct_draft_vocab: torch.Tensor  # [K] draft-vocab top-1 matches
    count: torch.Tensor  # [K] scored tokens
    in_vocab: torch.Tensor  # [K] scored tokens whose target argmax lies in the draft vocab
    correct_topk: torch.Tensor  # [K] target argmax among the draft's TOPK_STAT best tokens (a tree's chance)

    def vector(self) -> torch.Tensor:
        return torch.cat([self.kl.detach(), self.correct, self.correct_draft_vocab, self.count, self.in_vocab,
                          self.correct_topk]).double()


def top1_cross_entropy(logits: torch.Tensor, target_argmax: torch.Tensor) -> torch.Tensor:
    """-log q(target's top token) per row: the loss of greedy acceptance, which asks only that the draft's
    argmax be the target's. logits [N, Vd], target_argmax [N] draft ids -> [N]"""
    return F.cross_entropy(logits.float(), target_argmax, reduction="none")


def ttt_unroll(draft, heads: TargetHeads, batch: TTTBatch, *, steps: int,
               norm: torch.Tensor | None = None, weights: Sequence[float] | None = None,
               loss_kind: str = "kl") -> UnrollStats:
    """Run the K-step TTT unroll on a batch; returns the weighted loss (when `norm`, the global
    per-step token counts, is given) and per-step sums for metrics.

    loss_kind "kl": KL(target || draft) over the draft vocab (the distribution, as EAGLE-3 trains);
    "top1": cross-entropy on the target's argmax within the draft vocab (what greedy verification accepts).
    The reported `kl` is the KL either way. Under autocast the draft runs in low precision; the target's
    distributions are always computed in fp32."""
    B, T = batch.input_ids.shape
    dev = batch.input_ids.device
    weights = step_weights(steps) if weights is None else weights
    with torch.autocast(dev.type, enabled=False):
        tgt = heads(batch.last_hidden.flatten(0, 1)[batch.score_pos])  # rows in score_pos order
    in_vocab_row = draft.t2d[tgt.argmax_target]
    pos = torch.arange(T, device=dev).expand(B, T)
    h = draft.fuse(batch.hidden)  # shape: [B, T, H]
    cos, sin = draft.rope(pos, h)  # the same positions for every step
    emb = draft.embed(batch.input_ids)  # shape: [B, T, H], embedding of x_t
    attend = TTTAttend()
    zero = torch.zeros((), device=dev)
    loss = zero.clone() if norm is not None else None
    kl_s, cor_s, cord_s, cnt_s, inv_s, topk_s = [], [], [], [], [], []
    for j in range(steps):
        e_j = F.pad(emb[:, 1 + j:], (0, 0, 0, min(1 + j, T)))[:, :T]  # shape: [B, T, H], token x_{t+1+j}
        h = draft.step(h, attend, embeds=e_j, rope=(cos, sin))  # shape: [B, T, H]
        n = int((batch.score_t >= 1 + j).sum())  # scored rows form a prefix (score_t non-increasing)
        q_idx = batch.score_pos[:n] - 1 - j  # query position t = p - 1 - j, same row
        logits = draft.logits(h.flatten(0, 1)[q_idx])  # shape: [n, Vd]
        if loss_kind == "top1":
            with torch.no_grad():
                kl = kl_to_target(logits, tgt.probs[:n], tgt.entropy[:n])
            term = top1_cross_entropy(logits, tgt.argmax_draft[:n])
        else:
            kl = term = kl_to_target(logits, tgt.probs[:n], tgt.entropy[:n])
        if loss is not None:
            loss = loss + weights[j] * term.sum() / norm[j].clamp_min(1)
        with torch.no_grad():
            pred = logits.argmax(-1)
            kl_s.append(kl.detach().sum())
            cor_s.append(((pred + draft.d2t[pred]) == tgt.argmax_target[:n]).sum())
            cord_s.append((pred == tgt.argmax_draft[:n]).sum())
            cnt_s.append(torch.tensor(n, device=dev))
            inv_s.append(in_vocab_row[:n].sum())
            top = logits.topk(min(TOPK_STAT, logits.shape[-1]), dim=-1).indices  # shape: [n, k]
            topk_s.append(((top + draft.d2t[top]) == tgt.argmax_target[:n, None]).any(-1).sum())
    return UnrollStats(loss=loss, kl=torch.stack(kl_s), correct=torch.stack(cor_s).double(),
                       correct_draft_vocab=torch.stack(cord_s).double(), count=torch.stack(cnt_s).double(),
                       in_vocab=torch.stack(inv_s).double(), correct_topk=torch.stack(topk_s).double())


@dataclass
class Totals:
    """Per-step sums accumulated over batches (and ranks)."""

    steps: int
    vec: torch.Tensor = None  # [6K] float64: kl, correct, correct_draft_vocab, count, in_vocab, correct_topk

    def __post_init__(self):
        if self.vec is None:
            self.vec = torch.zeros(6 * self.steps, dtype=torch.float64)

    def add(self, stats: UnrollStats) -> None:
        self.vec = self.vec.to(stats.kl.device) + stats.vector()

    def part(self, i: int) -> list[float]:
        return self.vec[i * self.steps:(i + 1) * self.steps].tolist()

    def summary(self) -> dict[str, Any]:
        kl, cor, cord, cnt, inv, topk = (self.part(i) for i in range(6))
        div = [max(c, 1.0) for c in cnt]
        return {
            "kl": [a / c for a, c in zip(kl, div)],
            "acc": [a / c for a, c in zip(cor, div)],
            "acc_draft_vocab": [a / c for a, c in zip(cord, div)],
            "acc_topk": [a / c for a, c in zip(topk, div)],
            "count": [int(c) for c in cnt],
            "in_vocab": inv[0] / div[0],
        }
