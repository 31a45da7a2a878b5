"""Verification: which draft tokens the target accepts, and the token it adds (pure maths, no models).

Owns the acceptance rules that make speculative decoding lossless:
- greedy (`verify_greedy`): walk from the root, accept the child equal to the target's argmax, stop
  at the first node with no such child; the target's argmax there is the bonus token. The output is
  token-for-token what plain greedy decoding gives.
- sampled chain (`verify_chain_sampled`): standard speculative sampling (Leviathan et al. 2023;
  Chen et al. 2023): accept draft token x drawn from q with probability min(1, p(x)/q(x)); at the
  first rejection draw from norm(max(0, p - q)); if all are accepted draw the bonus from p.
- sampled tree (`verify_tree_sampled`): recursive rejection sampling over siblings (SpecInfer,
  Miao et al. 2024; EAGLE): at a node try its children in order; child c, drawn from q_c, is accepted
  with probability min(1, p(c)/q_c(c)); on rejection p <- norm(max(0, p - q_c)) and the next child
  (whose law q_{c+1} is conditional on the earlier siblings, e.g. q without them when children are
  drawn without replacement) is tried against the updated p. If none is accepted, draw from p.
  Deterministic children (EAGLE-2's top-k) have q_c = one-hot: rejection then zeroes p(c).
  Lossless because each step outputs exactly its current p (min(p,q) + (1 - sum min) * residual = p).

p is the target's sampling distribution (`sampling.logits_to_probs`, so temperature/top-k/top-p
apply), q is over *target* ids (the engine scatters draft-vocab probabilities through d2t). Draws use
the caller's `torch.Generator`. Does not build trees (`tree`) or run models (`engine`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specwire.decode.sampling import sample_from
from specwire.decode.tree import DraftTree


@dataclass
class VerifyResult:
    accepted: list[int]  # node indices (>= 1) of the accepted draft nodes, root to leaf
    tokens: list[int]  # target ids produced by this pass: the accepted draft tokens, then the bonus token

    @property
    def bonus(self) -> int:
        return self.tokens[-1]

    @property
    def num_accepted(self) -> int:
        return len(self.accepted)


def verify_greedy(tree: DraftTree, target_argmax: torch.Tensor) -> VerifyResult:
    """target_argmax: [N+1] the target's argmax after each node. One host sync.

    On CPU the tree is walked on the host (`greedy_walk`), where a dozen tensor ops cost more than the
    walk; elsewhere, and where siblings share a token, by tensor ops over every root-to-leaf path
    (`greedy_by_paths`). Both give the same result."""
    if tree.size == 1:
        return VerifyResult(accepted=[], tokens=[int(target_argmax[0])])
    if target_argmax.device.type == "cpu":
        walked = greedy_walk(tree, target_argmax.tolist())
        if walked is not None:
            return walked
    return greedy_by_paths(tree, target_argmax)


def greedy_walk(tree: DraftTree, target_argmax: list[int]) -> VerifyResult | None:
    """From the root, step to the child whose token is the target's argmax at the node, while one is; None
    where two siblings match (then the path is the first leaf's of the longest, `greedy_by_paths`)."""
    tokens = tree.tokens.tolist()
    node, accepted = 0, []
    while True:
        match = [c for c in tree.children[node] if tokens[c] == target_argmax[node]]
        if len(match) > 1:
            return None
        if not match:
            return VerifyResult(accepted=accepted, tokens=[tokens[n] for n in accepted] + [target_argmax[node]])
        node = match[0]
        accepted.append(node)


def greedy_by_paths(tree: DraftTree, target_argmax: torch.Tensor) -> VerifyResult:
    """`verify_greedy` by tensor ops on the tree's device: every root-to-leaf path scored at once, the first
    leaf of the longest accepted prefix taken."""
    par = tree.parents_tensor()
    correct = tree.tokens == target_argmax[par]  # shape: [N+1]; node n matches the target after its parent
    correct[0] = True
    ri = tree.retrieve_indices()  # shape: [leaves, D+1]
    ok = correct[ri.clamp(min=0)] & (ri >= 0)
    acc_len = ok.long().cumprod(-1).sum(-1)  # shape: [leaves], nodes accepted on each path (root counts)
    best = acc_len.argmax()
    row = ri[best]  # shape: [D+1]
    n = acc_len[best]
    bonus = target_argmax[row[n - 1]]
    host = torch.cat([row, tree.tokens[row.clamp(min=0)], n.reshape(1), bonus.reshape(1)]).tolist()
    width = row.shape[0]
    n_host = host[-2]
    return VerifyResult(accepted=host[1:n_host], tokens=host[width + 1: width + n_host] + [host[-1]])


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)); falls back to p in the measure-zero case p <= q everywhere."""
    r = (p - q).clamp_(min=0)
    s = r.sum()
    return torch.where(s > 0, r / s.clamp(min=1e-30), p)


def verify_chain_sampled(draft_tokens: torch.Tensor, p: torch.Tensor, q: torch.Tensor,
                         generator: torch.Generator | None) -> VerifyResult:
    """Standard speculative sampling for a chain.

    draft_tokens [k] target ids, x_i drawn from q[i]; p [k+1, V] target distributions after the root and
    after each draft token; q [k, V]. Accepted nodes are numbered 1..k as in `tree.chain_tree`.
    """
    k = draft_tokens.shape[0]
    if k:
        idx = torch.arange(k, device=p.device)
        px = p[idx, draft_tokens]  # shape: [k]
        qx = q[idx, draft_tokens]
        u = torch.rand(k, generator=generator, device=p.device)
        accept = u * qx < px  # u < p/q without dividing
        n = int(accept.long().cumprod(0).sum())
    else:
        n = 0
    if n < k:
        last = sample_from(_residual(p[n], q[n]), generator)
    else:
        last = sample_from(p[k], generator)
    tokens = draft_tokens[:n].tolist() + [int(last)]
    return VerifyResult(accepted=list(range(1, n + 1)), tokens=tokens)


def verify_tree_sampled(tree: DraftTree, p: torch.Tensor, generator: torch.Generator | None) -> VerifyResult:
    """Recursive rejection sampling down a tree.

    p: [N+1, V] the target's distribution after each node. tree.q: [N+1, V] the law each node was
    drawn from given its earlier siblings (row 0 unused), or None when children are deterministic.
    """
    node = 0
    accepted: list[int] = []
    tokens = tree.tokens
    while True:
        pn = p[node]
        for c in tree.children[node]:
            x = tokens[c]
            u = torch.rand((), generator=generator, device=p.device)
            if tree.q is None:
                if bool(u < pn[x]):
                    break
                pn = pn.clone()
                pn[x] = 0.0
                s = pn.sum()
                pn = pn / s if bool(s > 0) else p[node]
            else:
                qc = tree.q[c]
                if bool(u * qc[x] < pn[x]):
                    break
                pn = _residual(pn, qc)
        else:
            last = int(sample_from(pn, generator))
            return VerifyResult(accepted=accepted, tokens=tokens[accepted].tolist() + [last] if accepted else [last])
        accepted.append(c)
        node = c
