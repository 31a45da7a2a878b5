"""The doctor's empirical wiring search: which hidden states does this draft agree with the target on?

Owns: `WiringScorer` (the draft's step-0 top-1 agreement with the target's next token under any
candidate wiring, reusing everything linear in the fused state) and `search_wirings` (every ordered
choice of hs indices, pruned by successive halving, the best few scored exactly). Does not capture
states (`doctor.states`) or judge the result (`doctor.diagnose`).

The search (EAGLE-3, Li et al. 2025; fc fuses n target states): with fc = [W_1 | W_2 | W_3],
  fc(cat(h_a, h_b, h_c)) = W_1 h_a + W_2 h_b + W_3 h_c,
so P[k, i] = W_k h_i is computed once for every slot k and hs index i. Everything linear in the fused
state g is precomputed per (slot, layer) as well: hidden_norm(g) = w * g * r with the scalar
r = rsqrt(mean(g^2) + eps) (mean(g^2) from a Gram matrix of the P's), so the q/k/v projections of g
are sums of three precomputed, already-rotated tensors times r. Only attention, o_proj, the MLP and
lm_head run per candidate, and only at scored positions. Candidates are pruned by successive halving
(continuous score: log-probability of the target's token over a vocabulary subset, on a growing set
of positions), then the survivors are scored on every position, and the best few exactly (top-1 over
the full draft vocabulary). docs/DOCTOR.md has the measured time.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from specwire.doctor.states import Calibration
from specwire.draft.model import rotate_half
from specwire.errors import SpecwireError
from specwire.wiring import num_hs_indices

# ---- the wiring search ----------------------------------------------------------------------------------------------

@dataclass
class SearchResult:
    """Step-0 top-1 agreement of the draft with the target's next token, per candidate wiring."""

    best: list[int]
    best_score: float
    scores: dict[tuple[int, ...], float]  # exact scores (full draft vocabulary) of the finalists
    top: list[tuple[list[int], float]]  # best first
    num_candidates: int
    num_positions: int  # scored positions in the final stage
    seconds: float
    stages: list[dict]  # per stage: candidates, positions, seconds


class WiringScorer:
    """Scores candidate wirings of one draft on one calibration set, reusing everything linear in g."""

    FLOATS_PER_CHUNK = 2 ** 24  # bound on the floats one batch of candidates allocates per tensor (~64 MB)

    def __init__(self, draft, cal: Calibration, *, vocab_subset: int = 512, norm_before_residual: bool | None = None):
        self.draft = draft
        c = draft.config
        self.dev = draft.fc.weight.device
        self.n_slots = c.num_fused
        self.L = cal.num_layers
        self.nbr = c.norm_before_residual if norm_before_residual is None else norm_before_residual
        Ht, Hd = c.target_hidden_size, c.hidden_size
        if cal.states.shape[-1] != Ht:
            raise SpecwireError(f"calibration states have width {cal.states.shape[-1]}, the draft's fc reads {Ht}.")
        layer = draft.layers[0]
        attn = layer.self_attn
        self.nh, self.nkv, self.d = attn.nh, attn.nkv, attn.d
        self.eps = layer.hidden_norm.eps
        self.Hd = Hd
        pos = cal.draft_positions()
        self.pos = pos
        n_u = self.n_slots * num_hs_indices(self.L)  # one "unit" per (slot, hs index)
        with torch.no_grad():
            W = draft.fc.weight.float()  # shape: [Hd, n_slots * Ht]
            hs = cal.states[:, pos.rows].to(self.dev).float()  # shape: [L+1, Nd, Ht]
            P = torch.stack([hs @ W[:, k * Ht:(k + 1) * Ht].T for k in range(self.n_slots)])  # [n, L+1, Nd, Hd]
            self.P = P.reshape(n_u, -1, Hd)  # shape: [U, Nd, Hd]
            # Gram of the units per position: mean(g^2) of any candidate is a sum of 9 entries
            U = n_u
            self.G = torch.einsum("upd,vpd->uvp", self.P, self.P).reshape(U * U, -1)  # shape: [U*U, Nd]
            w_hn = layer.hidden_norm.weight.float()
            Wq, Wk, Wv = attn.q_proj.weight.float(), attn.k_proj.weight.float(), attn.v_proj.weight.float()
            e = layer.input_layernorm(cal.embeds[pos.rows + 1].to(self.dev).float())  # shape: [Nd, Hd]
            cos, sin = draft.rope(pos.local.to(self.dev)[None], e)  # each [1, Nd, d]
            cos, sin = cos[0], sin[0]

            def rope(x, heads):  # x [..., Nd, heads*d] -> rotated, same shape
                s = x.shape
                x = x.reshape(*s[:-1], heads, self.d)
                x = x * cos[:, None] + rotate_half(x) * sin[:, None]
                return x.reshape(s)

            def bias(m):
                return m.bias.float() if m.bias is not None else 0.0

            Ph = self.P * w_hn  # hidden_norm(g) = w * g * r, the r applied per candidate
            self.Qh = rope(Ph @ Wq[:, Hd:].T, self.nh)  # shape: [U, Nd, nh*d]
            # keys and values side by side, so one gather per slot serves both
            self.KVh = torch.cat([rope(Ph @ Wk[:, Hd:].T, self.nkv), Ph @ Wv[:, Hd:].T], -1)  # shape: [U, Nd, 2*nkv*d]
            self.Qe = rope(e @ Wq[:, :Hd].T + bias(attn.q_proj), self.nh)  # shape: [Nd, nh*d]
            self.KVe = torch.cat([rope(e @ Wk[:, :Hd].T + bias(attn.k_proj), self.nkv),
                                  e @ Wv[:, :Hd].T + bias(attn.v_proj)], -1)  # shape: [Nd, 2*nkv*d]
            self.w_hn = w_hn
        # vocabulary: draft ids and the target ids they stand for
        self.d2t = draft.d2t.to(self.dev)
        Vd = len(self.d2t)
        draft_target = torch.arange(Vd, device=self.dev) + self.d2t  # shape: [Vd]
        t2draft = torch.full((int(draft.t2d.numel()),), -1, dtype=torch.long, device=self.dev)
        t2draft[draft_target] = torch.arange(Vd, device=self.dev)
        self.labels = pos.labels.to(self.dev)
        self.label_draft = t2draft[self.labels.clamp(0, len(t2draft) - 1)]  # -1: not in the draft vocab
        self.scored = pos.scored.to(self.dev)
        # the subset used for cheap scoring: every label's draft id, then evenly spread others
        need = torch.unique(self.label_draft[self.scored & (self.label_draft >= 0)])
        extra = torch.linspace(0, Vd - 1, steps=min(Vd, max(vocab_subset, len(need))), device=self.dev).long()
        self.subset = torch.unique(torch.cat([need, extra]))[: max(vocab_subset, len(need))]
        self.subset = torch.unique(torch.cat([need, self.subset]))
        pos_in_subset = torch.full((Vd,), -1, dtype=torch.long, device=self.dev)
        pos_in_subset[self.subset] = torch.arange(len(self.subset), device=self.dev)
        self.label_subset = torch.where(self.label_draft >= 0, pos_in_subset[self.label_draft.clamp(min=0)],
                                        torch.full_like(self.label_draft, -1))
        self.draft_target = draft_target
        self.sample = pos.sample.to(self.dev)
        self.local = pos.local.to(self.dev)

    @property
    def scored_positions(self) -> torch.Tensor:
        """Indices (into draft positions) that count towards agreement."""
        return torch.nonzero(self.scored).flatten()

    def units(self, cands: torch.Tensor) -> torch.Tensor:
        """hs-index candidates [B, n] -> unit ids [B, n] (slot k, layer i -> k*(L+1) + i)."""
        return cands + torch.arange(self.n_slots, device=cands.device) * num_hs_indices(self.L)

    @torch.no_grad()
    def evaluate(self, cands: torch.Tensor, queries: torch.Tensor, *, full_vocab: bool = False,
                 context: int | None = None, norm_before_residual: bool | None = None,
                 chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per candidate and query position: (correct [B, Q] bool, log-prob of the label over the vocab used [B, Q]).

        cands: [B, n] hs indices; queries: draft-position indices. Attention covers the full prefix of each
        query's sample (exact), or only its last `context` positions (the cheap proxy of the pruning rounds).
        `norm_before_residual` overrides the scorer's residual mode (to test the other value empirically).
        """
        nbr = self.nbr if norm_before_residual is None else norm_before_residual
        cands = cands.to(self.dev)
        queries = queries.to(self.dev)
        B, Q = cands.shape[0], len(queries)
        correct = torch.zeros(B, Q, dtype=torch.bool, device=self.dev)
        logp = torch.full((B, Q), float("nan"), device=self.dev)
        if B == 0 or Q == 0:
            return correct, logp
        u = self.units(cands)  # shape: [B, n]
        U = self.P.shape[0]
        pair = (u[:, :, None] * U + u[:, None, :]).reshape(B, -1)  # Gram entries of each candidate, [B, n*n]
        layer = self.draft.layers[0]
        lm_w = self.draft.lm_head.weight if full_vocab else self.draft.lm_head.weight[self.subset]
        inter = layer.mlp.gate_proj.weight.shape[0]
        kvw = self.nkv * self.d
        for s in torch.unique(self.sample[queries]).tolist():
            qsel = torch.nonzero(self.sample[queries] == s).flatten()
            qi = queries[qsel]  # draft-position indices of this sample's queries
            qpos = self.local[qi]
            first = 0 if context is None else max(0, int(qpos.min()) - context + 1)
            keys = torch.nonzero(self.sample == s).flatten()[first: int(qpos.max()) + 1]
            nk, m = len(keys), len(qi)
            kpos = self.local[keys]
            mask = (kpos[None, :] <= qpos[:, None])  # shape: [m, nk]
            if context is not None:
                mask &= kpos[None, :] > qpos[:, None] - context
            per_cand = nk * (2 * kvw + self.nh * m + self.n_slots ** 2) + m * (lm_w.shape[0] + 3 * inter + 8 * self.Hd)
            step = chunk or max(1, min(B, int(self.FLOATS_PER_CHUNK // per_cand)))
            Gs = self.G[:, keys]  # shape: [U*U, nk]
            KVh = self.KVh[:, keys]  # shape: [U, nk, 2*kvw]
            Qh, Ph = self.Qh[:, qi], self.P[:, qi]  # [U, m, nh*d], [U, m, Hd]
            KVe, Qe = self.KVe[keys], self.Qe[qi]
            qk = qpos - first  # index of each query among the keys
            for b0 in range(0, B, step):
                ub = u[b0:b0 + step]  # shape: [b, n]
                b = ub.shape[0]
                # mean(g^2) at every key position from the Gram matrix of the units: r = rsqrt(mean(g^2) + eps)
                r = torch.rsqrt(Gs[pair[b0:b0 + b]].sum(1) / self.Hd + self.eps)  # shape: [b, nk]
                kv = KVh[ub[:, 0]]
                q = Qh[ub[:, 0]]
                g = Ph[ub[:, 0]]
                for j in range(1, self.n_slots):  # the fused input is a sum over slots: fc is linear
                    kv += KVh[ub[:, j]]
                    q += Qh[ub[:, j]]
                    g += Ph[ub[:, j]]
                rq = r[:, qk]  # shape: [b, m]
                kv.mul_(r[..., None]).add_(KVe)  # shape: [b, nk, 2*kvw]
                q.mul_(rq[..., None]).add_(Qe)
                k = kv[..., :kvw].view(b, nk, self.nkv, self.d).transpose(1, 2)
                v = kv[..., kvw:].view(b, nk, self.nkv, self.d).transpose(1, 2)
                q = q.view(b, m, self.nh, self.d).transpose(1, 2)
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.nkv != self.nh)
                o = layer.self_attn.o_proj(a.transpose(1, 2).reshape(b, m, -1))  # shape: [b, m, Hd]
                h = (g * rq[..., None] * self.w_hn if nbr else g) + o  # residual: hidden_norm(g) or g
                h = h + layer.mlp(layer.post_attention_layernorm(h))
                logits = self.draft.norm(h) @ lm_w.T  # shape: [b, m, V used]
                top = logits.argmax(-1)
                top_draft = top if full_vocab else self.subset[top]
                correct[b0:b0 + b, qsel] = self.draft_target[top_draft] == self.labels[qi][None]
                lab = self.label_draft[qi] if full_vocab else self.label_subset[qi]  # shape: [m]
                got = logits.gather(-1, lab.clamp(min=0)[None, :, None].expand(b, m, 1))[..., 0] - torch.logsumexp(logits, -1)
                logp[b0:b0 + b, qsel] = torch.where(lab[None] >= 0, got, torch.full_like(got, float("nan")))
        return correct, logp


def all_candidates(num_layers: int, n_slots: int = 3) -> torch.Tensor:
    """Every ordered choice of n distinct hs indices in 0..L. shape: [n_cands, n]"""
    return torch.tensor(list(itertools.permutations(range(num_hs_indices(num_layers)), n_slots)), dtype=torch.long)


def search_wirings(scorer: WiringScorer, *, must_score: Sequence[Sequence[int]] = (), keep: int = 64,
                   prune: int = 8, grow: int = 4, first_positions: int = 2, proxy_context: int | None = 24,
                   finalists: int = 6, seed: int = 0, candidates: torch.Tensor | None = None) -> SearchResult:
    """Successive halving over all ordered triples, then every position for `keep` survivors, then exact top-1.

    Pruning rounds rank candidates by the mean log-probability of the target's token (over a vocabulary
    subset, attention limited to the last `proxy_context` positions) on a random subset of positions that
    grows `grow`-fold each round, keeping 1/`prune` of them (at least `keep`). The survivors are scored on
    every position with exact attention (top-1 over the subset), and the best `finalists` exactly (top-1
    over the full draft vocabulary). `must_score` wirings (the configured and the trained ones) always
    reach the exact stage so that their scores are reported.
    """
    t0 = time.perf_counter()
    n = scorer.n_slots
    cands = all_candidates(scorer.L, n) if candidates is None else candidates.long()
    forced = list(dict.fromkeys(tuple(int(i) for i in w) for w in must_score if w is not None and len(w) == n))
    scored = scorer.scored_positions
    if len(scored) == 0:
        raise SpecwireError("no scored positions in the calibration data (empty continuations / loss masks).")
    usable = scored[scorer.label_draft[scored] >= 0]
    gen = torch.Generator().manual_seed(seed)
    order = usable[torch.randperm(len(usable), generator=gen).to(usable.device)] if len(usable) else scored
    stages = []
    alive = cands
    sum_lp = torch.zeros(len(alive))
    cnt = torch.zeros(len(alive))
    used = 0
    take = first_positions
    while len(alive) > keep and used < len(order):
        ts = time.perf_counter()
        q = order[used:used + take]
        used += len(q)
        _, lp = scorer.evaluate(alive, q, context=proxy_context)
        lp = lp.cpu()
        sum_lp += torch.nan_to_num(lp, nan=0.0).sum(1)
        cnt += (~torch.isnan(lp)).sum(1)
        mean = sum_lp / cnt.clamp(min=1)
        n_keep = max(keep, len(alive) // prune)
        idx = torch.argsort(mean, descending=True, stable=True)[:n_keep]
        stages.append({"candidates": len(alive), "positions": used, "seconds": round(time.perf_counter() - ts, 3)})
        alive, sum_lp, cnt = alive[idx], sum_lp[idx], cnt[idx]
        take = used * (grow - 1)
    alive_set = {tuple(r.tolist()) for r in alive}
    extra = [w for w in forced if w not in alive_set]
    if extra:
        alive = torch.cat([alive, torch.tensor(extra, dtype=torch.long)])
    # every scored position, restricted vocabulary
    ts = time.perf_counter()
    corr, lp = scorer.evaluate(alive, scored)
    acc = corr.float().mean(1).cpu()
    mlp = torch.nan_to_num(lp, nan=-1e4).mean(1).cpu()
    rank = torch.argsort(acc * 1e6 + mlp, descending=True, stable=True)
    stages.append({"candidates": len(alive), "positions": len(scored), "seconds": round(time.perf_counter() - ts, 3)})
    final = [tuple(alive[i].tolist()) for i in rank[:finalists].tolist()]
    final += [w for w in forced if w not in final]
    # exact: top-1 over the full draft vocabulary
    ts = time.perf_counter()
    fc, flp = scorer.evaluate(torch.tensor(final, dtype=torch.long), scored, full_vocab=True)
    facc = fc.float().mean(1).cpu().tolist()
    fmlp = torch.nan_to_num(flp, nan=-1e4).mean(1).cpu().tolist()
    stages.append({"candidates": len(final), "positions": len(scored), "seconds": round(time.perf_counter() - ts, 3),
                   "exact": True})
    scores = {w: float(a) for w, a in zip(final, facc)}
    order_f = sorted(range(len(final)), key=lambda i: (-facc[i], -fmlp[i]))
    top = [(list(final[i]), float(facc[i])) for i in order_f]
    return SearchResult(best=top[0][0], best_score=top[0][1], scores=scores, top=top, num_candidates=len(cands),
                        num_positions=len(scored), seconds=time.perf_counter() - t0, stages=stages)
