"""The draft's side of a round: its own KV cache and its proposals, a chain or an EAGLE-2 dynamic tree.

Owns: `DraftKVCache` (the one draft layer's keys and values for one request, written by position),
`causal_prefix_mask`, the `DraftProposer` protocol (what the engine asks of a drafter: the EAGLE-3 draft, or a
test's oracle), `EagleProposer` (reads the newly accepted positions' fused target states, then expands a chain,
one token a step, or a tree, top-k a step with the best nodes by cumulative log-probability expanded further
and `num_draft_tokens` kept; every drafted node sits at the last real position, as in training, and is dropped
from the cache after proposing) and `primed_proposer` (a proposer at a fixed context, for timing draft steps).
Does not own the round (`engine`), the tree structure (`tree`) nor the served layer pass (`draft_step`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F

from specwire.decode.sampling import SamplingParams, greedy_token, logits_to_probs, sample_from
from specwire.decode.tree import DraftTree, chain_tree, root_only, select_tree
from specwire.draft.model import AttendFn, Eagle3Draft


class DraftKVCache:
    """Preallocated K/V for the one draft layer of one request, written by position (no rollback copies)."""

    def __init__(self, *, num_kv_heads: int, head_dim: int, capacity: int, device, dtype):
        self.k = torch.zeros(1, num_kv_heads, capacity, head_dim, device=device, dtype=dtype)  # shape: [1, nkv, cap, d]
        self.v = torch.zeros_like(self.k)
        self.length = 0

    def reserve(self, n: int) -> None:
        """Make room for n positions (doubling the capacity when it grows)."""
        cap = self.k.shape[2]
        if n > cap:
            new = max(n, 2 * cap)
            pad = lambda t: torch.cat([t, t.new_zeros(t.shape[0], t.shape[1], new - cap, t.shape[3])], dim=2)
            self.k, self.v = pad(self.k), pad(self.v)

    def attend(self, mask: torch.Tensor | None) -> AttendFn:
        """An attend(q, k, v) that appends k/v and attends over the whole cache.

        mask: [1, 1, T, length + T] bool (True = may attend) or None (every query sees every entry).
        """
        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            T = k.shape[2]
            start, end = self.length, self.length + T
            self.reserve(end)
            self.k[:, :, start:end] = k
            self.v[:, :, start:end] = v
            self.length = end
            return F.scaled_dot_product_attention(q, self.k[:, :, :end], self.v[:, :, :end], attn_mask=mask,
                                                  enable_gqa=k.shape[1] != q.shape[1])
        return fn

    def crop(self, length: int) -> None:
        self.length = length


def causal_prefix_mask(T: int, past: int, device) -> torch.Tensor | None:
    """T new queries after `past` cached entries, causal among themselves. [1, 1, T, past+T] or None if T == 1."""
    if T == 1:
        return None
    m = torch.ones(T, past + T, dtype=torch.bool, device=device)
    m[:, past:] = torch.ones(T, T, dtype=torch.bool, device=device).tril()
    return m[None, None]


# ---- proposers ------------------------------------------------------------------------------------------

@runtime_checkable
class DraftProposer(Protocol):
    """What the engine asks of a drafter (the EAGLE-3 draft, or a test oracle)."""

    hs_ids: tuple[int, ...]  # target hidden states (hs indices) to capture for it

    def propose(self, states: torch.Tensor, tokens: torch.Tensor, start: int, *, steps: int, spec,
                tree: bool, params: SamplingParams, generator: torch.Generator | None) -> DraftTree:
        """Take in the newly accepted positions and propose a tree rooted at tokens[-1].

        states: [T, n*H] fused target states at positions start..start+T-1; tokens: [T] the token after
        each of those positions (tokens[-1] is the root: the target's last produced token).
        steps: depth to propose (0 = a root-only tree); spec: the round's `decode.engine.SpecConfig` (its topk and
        num_draft_tokens shape a tree). Chain trees carry q (sampling) when not greedy.
        """
        ...


class EagleProposer:
    """Chain or EAGLE-2 tree proposals from an `Eagle3Draft`, with its own KV cache."""

    def __init__(self, draft: Eagle3Draft, *, capacity: int):
        c = draft.config
        self.draft = draft
        self.hs_ids = tuple(c.wiring.hs_ids)
        w = draft.fc.weight
        self.cache = DraftKVCache(num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, capacity=capacity,
                                  device=w.device, dtype=w.dtype)
        self.draft_to_target = draft.to_target_ids(torch.arange(c.draft_vocab_size, device=w.device))  # shape: [Vd]
        self.vocab_size = c.vocab_size
        self._cos = self._sin = self.cache.k.new_zeros(1, 0, c.head_dim)  # rope table by position, [1, n, d] each

    def _rope(self, first: int, count: int, *, repeat: bool = False):
        """(cos, sin), each [1, count, d], for positions first..first+count-1, or for `first` repeated count
        times (draft nodes all sit at one position), sliced from a table: the same numbers as `Eagle3Draft.rope`
        (elementwise in the position) without its half-dozen ops per step."""
        end = first + 1 if repeat else first + count
        if end > self._cos.shape[1]:
            n = max(end, 2 * self._cos.shape[1], self.cache.k.shape[2])
            self._cos, self._sin = self.draft.rope(torch.arange(n, device=self.cache.k.device)[None], self.cache.k)
        cos, sin = self._cos[:, first:end], self._sin[:, first:end]
        return (cos.expand(1, count, -1), sin.expand(1, count, -1)) if repeat else (cos, sin)

    def _step(self, hidden, ids, rope, mask, *, last_only: bool):
        """One draft layer pass appending to the cache. hidden [1,T,H], ids [1,T], rope (`_rope`) ->
        logits [T', Vd], hidden [T', H] with T' = 1 if last_only else T."""
        if self.draft.served is not None:
            return self.draft.served(hidden, ids, rope, self.cache, mask, last_only=last_only)
        h = self.draft.step(hidden, self.cache.attend(mask), input_ids=ids, rope=rope)  # shape: [1, T, H]
        if last_only:
            h = h[:, -1:]
        return self.draft.logits(h)[0], h[0]

    def propose(self, states, tokens, start, *, steps, spec, tree, params, generator) -> DraftTree:
        T = tokens.shape[0]
        if self.cache.length != start:
            raise RuntimeError(f"draft cache holds {self.cache.length} positions, the engine feeds from {start}")
        dev = tokens.device
        hidden = self.draft.fuse(states[None])  # shape: [1, T, H]
        logits, h = self._step(hidden, tokens[None], self._rope(start, T), causal_prefix_mask(T, start, dev),
                               last_only=True)
        root = tokens[-1]
        if steps == 0:
            return root_only(root)
        real = self.cache.length
        last_pos = start + T - 1  # position b of the last real input; every draft node sits at b too
        try:
            if tree and spec.topk > 1:
                return self._tree(logits, h, root, last_pos, steps=steps, topk=spec.topk, budget=spec.num_draft_tokens)
            return self._chain(logits, h, root, last_pos, steps=steps, params=params, generator=generator)
        finally:
            self.cache.crop(real)

    def _chain(self, logits, h, root, last_pos, *, steps, params, generator) -> DraftTree:
        toks, qs = [], []
        for i in range(steps):
            if i:  # TTT: every draft node at the constant position last_pos
                logits, h = self._step(h[None], toks[-1].reshape(1, 1), self._rope(last_pos, 1), None, last_only=True)
            if params.greedy:
                d = greedy_token(logits)  # shape: [1]
            else:
                qd = logits_to_probs(logits, params)  # shape: [1, Vd]
                d = sample_from(qd, generator)
                qs.append(qd)
            toks.append(self.draft_to_target[d])
        q = None
        if qs:
            qd = torch.cat(qs)  # shape: [k, Vd]
            q = qd.new_zeros(qd.shape[0], self.vocab_size)
            q[:, self.draft_to_target] = qd  # shape: [k, V]; draft probs over target ids
        return chain_tree(root, torch.cat(toks), q)

    def _tree(self, logits, h, root, last_pos, *, steps, topk, budget) -> DraftTree:
        """EAGLE-2: expand the top-k frontier by cumulative log-prob for `steps` depths, keep `budget`."""
        dev = h.device
        real = self.cache.length
        top = torch.log_softmax(logits[0].float(), -1).topk(topk)  # shape: [k]
        scores = top.values  # cumulative log-probs of the frontier
        f_tokens = self.draft_to_target[top.indices]  # shape: [k] target ids
        f_hidden = h.expand(topk, -1)  # shape: [k, H], the state that predicted each frontier node
        f_ids = torch.arange(topk, device=dev)  # candidate index of each frontier node
        anc = torch.eye(topk, dtype=torch.bool, device=dev)  # shape: [k, S] ancestry over tree slots
        cand_tokens, cand_scores, cand_parents = [f_tokens], [scores], [torch.full((topk,), -1, device=dev)]
        n_cand = topk
        for step in range(1, steps):
            mask = torch.cat([torch.ones(topk, real, dtype=torch.bool, device=dev), anc], dim=1)[None, None]
            rope = self._rope(last_pos, topk, repeat=True)  # TTT: constant position
            lg, hid = self._step(f_hidden[None], f_tokens[None], rope, mask, last_only=False)  # [k, Vd], [k, H]
            top = torch.log_softmax(lg.float(), -1).topk(topk, dim=-1)  # shape: [k, k]
            cu = (scores[:, None] + top.values).reshape(-1)  # shape: [k*k]
            toks = self.draft_to_target[top.indices.reshape(-1)]
            cand_tokens.append(toks)
            cand_scores.append(cu)
            cand_parents.append(f_ids.repeat_interleave(topk))
            sel = cu.topk(topk).indices  # next frontier, shape: [k]
            par = sel // topk
            scores, f_tokens, f_hidden = cu[sel], toks[sel], hid[par]
            f_ids = n_cand + sel
            anc = torch.cat([anc[par], torch.eye(topk, dtype=torch.bool, device=dev)], dim=1)
            n_cand += topk * topk
        parents = torch.cat(cand_parents).tolist()
        return select_tree(root, torch.cat(cand_tokens), parents, torch.cat(cand_scores), budget)


def primed_proposer(draft: Eagle3Draft, context: int, *, room: int) -> tuple[EagleProposer, torch.Tensor]:
    """A proposer whose cache holds `context` positions of zero states and tokens, with room for `room` more, and
    those tokens ([1, context]): the fixed start from which draft steps are timed."""
    c, w0 = draft.config, draft.fc.weight
    proposer = EagleProposer(draft, capacity=context + room + 8)
    states = torch.zeros(1, context, c.num_fused * c.target_hidden_size, device=w0.device, dtype=w0.dtype)
    ids = torch.zeros(1, context, dtype=torch.long, device=w0.device)
    proposer._step(draft.fuse(states), ids, proposer._rope(0, context), causal_prefix_mask(context, 0, w0.device),
                   last_only=True)
    return proposer, ids
