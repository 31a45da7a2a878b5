"""Verification maths without models: greedy acceptance, and sampled chains/trees keep p (chi-square)."""

import pytest
import torch
from scipy.stats import chisquare

from specwire.decode.sampling import SamplingParams, logits_to_probs
from specwire.decode.tree import DraftTree, chain_tree, root_only
from specwire.decode.verify import (greedy_by_paths, greedy_walk, verify_chain_sampled, verify_greedy,
                                   verify_tree_sampled)

V = 6  # tiny vocabulary: joint of two tokens has 36 cells
DRAWS = 20_000


# ---- greedy ---------------------------------------------------------------------------------------------

def test_greedy_chain_accepts_prefix_and_adds_bonus():
    tree = chain_tree(torch.tensor(9), torch.tensor([1, 2, 3, 4]))
    # target argmax after root, 1, 2, 3, 4
    res = verify_greedy(tree, torch.tensor([1, 2, 5, 0, 0]))
    assert res.accepted == [1, 2] and res.tokens == [1, 2, 5]
    res = verify_greedy(tree, torch.tensor([1, 2, 3, 4, 8]))
    assert res.accepted == [1, 2, 3, 4] and res.tokens == [1, 2, 3, 4, 8]
    res = verify_greedy(tree, torch.tensor([7, 2, 3, 4, 8]))
    assert res.accepted == [] and res.tokens == [7]


def test_greedy_root_only():
    res = verify_greedy(root_only(torch.tensor(3)), torch.tensor([6]))
    assert res.accepted == [] and res.tokens == [6]


def test_greedy_tree_follows_the_matching_branch():
    #  root(0) -> 1:'a'=10, 2:'b'=11 ; 1 -> 3:12 ; 2 -> 4:13, 5:14 ; 5 -> 6:15
    tree = DraftTree(tokens=torch.tensor([0, 10, 11, 12, 13, 14, 15]), parents=[-1, 0, 0, 1, 2, 2, 5])
    #                  after: root  1   2   3   4   5   6
    argmax = torch.tensor([11, 12, 14, 0, 0, 15, 42])
    res = verify_greedy(tree, argmax)
    assert res.accepted == [2, 5, 6] and res.tokens == [11, 14, 15, 42]
    argmax[5] = 99  # the target disagrees after node 5: stop there, bonus 99
    res = verify_greedy(tree, argmax)
    assert res.accepted == [2, 5] and res.tokens == [11, 14, 99]


def test_greedy_walk_equals_the_path_scoring_on_random_trees():
    """The CPU's host walk and the device form give the same result; where siblings share a token the walk
    declines (None) and the device form decides."""
    g = torch.Generator().manual_seed(0)
    declined = 0
    for _ in range(400):
        n = int(torch.randint(2, 18, (1,), generator=g))
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        tree = DraftTree(tokens=torch.randint(0, 4, (n,), generator=g), parents=parents)  # 4 tokens: many matches
        argmax = torch.randint(0, 4, (n,), generator=g)
        walked = greedy_walk(tree, argmax.tolist())
        ref = greedy_by_paths(tree, argmax)
        if walked is None:
            declined += 1
            assert verify_greedy(tree, argmax) == ref
        else:
            assert (walked.accepted, walked.tokens) == (ref.accepted, ref.tokens)
            assert verify_greedy(tree, argmax) == walked
    assert 0 < declined < 400


def test_sampled_tree_with_one_hot_target_equals_greedy():
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        n = int(torch.randint(1, 9, (1,), generator=g))
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
        tokens = torch.randint(0, 4, (n,), generator=g)
        tree = DraftTree(tokens=tokens, parents=parents)
        # make siblings distinct, as real drafts propose distinct children
        if any(len(set(tokens[c].tolist() for c in ch)) < len(ch) for ch in tree.children):
            continue
        argmax = torch.randint(0, 4, (n,), generator=g)
        p = logits_to_probs(torch.nn.functional.one_hot(argmax, 4).float(), SamplingParams())
        assert verify_tree_sampled(tree, p, g).tokens == verify_greedy(tree, argmax).tokens


# ---- sampling: a toy Markov target and draft -----------------------------------------------------------

def _markov(seed: int, params: SamplingParams) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return logits_to_probs(torch.randn(V, V, generator=g) * 1.5, params)  # row t: distribution after token t


P = _markov(1, SamplingParams(temperature=1.0))
Q = _markov(2, SamplingParams(temperature=1.0))
P_TOPK = _markov(3, SamplingParams(temperature=0.8, top_k=4))  # zeros in p
Q_TOPP = _markov(4, SamplingParams(temperature=1.2, top_p=0.8))  # zeros in q, not where p has them
ROOT = 0


def _draw(probs: torch.Tensor, g: torch.Generator) -> int:
    """Inverse-CDF draw (cheaper than torch.multinomial for the harness's many tiny draws)."""
    u, acc = float(torch.rand((), generator=g)) * float(probs.sum()), 0.0
    last = 0
    for i, pi in enumerate(probs.tolist()):
        if pi > 0:
            acc, last = acc + pi, i
            if u < acc:
                return i
    return last


def _chain_pass(root: int, g, P, Q, k: int = 3) -> list[int]:
    xs, ps, qs, prev = [], [P[root]], [], root
    for _ in range(k):
        x = _draw(Q[prev], g)
        xs.append(x)
        qs.append(Q[prev])
        ps.append(P[x])
        prev = x
    return verify_chain_sampled(torch.tensor(xs), torch.stack(ps), torch.stack(qs), g).tokens


def _tree_pass(root: int, g, P, Q, *, without_replacement: bool, k: int = 2, depth: int = 2) -> list[int]:
    """Each node has k children: EAGLE-2's deterministic top-k of Q, or k draws from Q without replacement."""
    tokens, parents, qrows = [root], [-1], [torch.zeros(V)]
    frontier = [0]
    for _ in range(depth):
        nxt = []
        for node in frontier:
            qn = Q[tokens[node]].clone()
            if without_replacement:
                for _ in range(k):
                    law = qn / qn.sum()
                    x = _draw(law, g)
                    tokens.append(x)
                    parents.append(node)
                    qrows.append(law)
                    qn[x] = 0.0
                    nxt.append(len(tokens) - 1)
            else:
                for x in torch.topk(qn, k).indices.tolist():
                    tokens.append(x)
                    parents.append(node)
                    nxt.append(len(tokens) - 1)
        frontier = nxt
    tree = DraftTree(tokens=torch.tensor(tokens), parents=parents, q=torch.stack(qrows) if without_replacement else None)
    p = torch.stack([P[t] for t in tokens])
    return verify_tree_sampled(tree, p, g).tokens


def _two_tokens(one_pass, g) -> tuple[int, int]:
    out, root = [], ROOT
    while len(out) < 2:
        out += one_pass(root, g)
        root = out[-1]
    return out[0], out[1]


def _pvalue(one_pass, P, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V * V)
    for _ in range(DRAWS):
        a, b = _two_tokens(one_pass, g)
        counts[a * V + b] += 1
    expected = (P[ROOT][:, None] * P).reshape(-1) * DRAWS  # P(a) P(b | a)
    support = expected > 0
    assert counts[~support].sum() == 0, "a token the target cannot produce was produced"
    return float(chisquare(counts[support].numpy(), expected[support].numpy()).pvalue)


@pytest.mark.parametrize("P,Q", [(P, Q), (P_TOPK, Q_TOPP)], ids=["full", "topk-topp"])
def test_chain_sampling_keeps_target_distribution(P, Q):
    assert _pvalue(lambda r, g: _chain_pass(r, g, P, Q), P, seed=11) > 1e-3


@pytest.mark.parametrize("P,Q,without_replacement", [(P, Q, True), (P_TOPK, Q_TOPP, False)],
                         ids=["full-sampled-children", "topk-topp-topk-children"])
def test_tree_sampling_keeps_target_distribution(P, Q, without_replacement):
    one = lambda r, g: _tree_pass(r, g, P, Q, without_replacement=without_replacement)
    assert _pvalue(one, P, seed=12) > 1e-3


def test_chi_square_detects_a_wrong_sampler():
    """Control: emitting the draft's tokens unchecked (q instead of p) fails the same test."""
    def unchecked(root, g):
        return [_draw(Q[root], g)]
    assert _pvalue(unchecked, P, seed=13) < 1e-6


def test_sampled_chain_accepts_everything_when_draft_equals_target():
    g = torch.Generator().manual_seed(0)
    xs = torch.tensor([1, 2, 3])
    p = torch.stack([P[ROOT], P[1], P[2], P[3]])
    res = verify_chain_sampled(xs, p, p[:3], g)
    assert res.accepted == [1, 2, 3] and res.tokens[:3] == [1, 2, 3] and len(res.tokens) == 4
