"""Context lookup (`decode.lookup`): the n-gram index, the graft onto a draft tree, the live rates, the cut.

- The index proposes what followed the latest earlier occurrence of the text's last n-gram, longest n first,
  and agrees with a brute-force scan of the text at every length of a repetitive sequence.
- A graft keeps the tree's nodes and indices, follows its matching nodes, appends the rest as one chain, and
  every proposed token sits on the root-to-node path of its own node.
- The cut (`tail_length`) equals a brute-force search over every length, on fixed rates and costs, and
  verifies nothing where copied rows cost more than they are expected to give.
"""

from __future__ import annotations

import random

import pytest
import torch

from specwire.decode.lookup import (PRIOR_ROUNDS, LookupModel, NgramIndex, expected_copied, follow, graft,
                                    tail_length)
from specwire.decode.tree import DraftTree, chain_tree


def scan(tokens: list[int], limit: int, min_n: int = 2, max_n: int = 3) -> list[int]:
    """The proposal by a plain scan, written out again: the longest suffix n-gram that occurred earlier
    (ending before the last token), its latest such occurrence, and what followed it, the text extended by the
    copy itself as it goes (a copy from distance d repeats the last d tokens)."""
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) < n:
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == suffix:
                text = list(tokens)
                for i in range(limit):
                    text.append(text[start + n + i])
                return text[len(tokens):]
    return []


def test_index_proposes_what_followed_the_last_ngram():
    idx = NgramIndex([5, 6, 7, 8, 9, 1, 5, 6])
    assert idx.propose(3) == [7, 8, 9]
    idx.extend([7])  # the trigram 5 6 7 now matches too: the same occurrence, copied on past the end
    assert idx.propose(10) == [8, 9, 1, 5, 6, 7, 8, 9, 1, 5]
    assert NgramIndex([1, 2, 3]).propose(4) == []  # no n-gram occurs twice
    assert NgramIndex([1, 2, 1, 2]).propose(0) == []


def test_index_repeats_a_loop_for_the_whole_limit():
    assert NgramIndex([4, 21, 21, 21]).propose(5) == [21] * 5
    assert NgramIndex([9, 1, 2, 1, 2, 1, 2]).propose(5) == [1, 2, 1, 2, 1]


def test_index_prefers_the_longest_then_the_latest_match():
    #        the bigram 3 4 is followed by 9 (latest), the trigram 2 3 4 by 7 (earlier): the trigram wins
    idx = NgramIndex([2, 3, 4, 7, 0, 3, 4, 9, 0, 2, 3, 4])
    assert idx.propose(1) == [7]
    idx = NgramIndex([3, 4, 7, 0, 3, 4, 9, 0, 8, 3, 4])  # bigram only: its latest occurrence
    assert idx.propose(2) == [9, 0]


@pytest.mark.parametrize("seed", range(5))
def test_index_agrees_with_a_scan_at_every_length(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(6) for _ in range(300)]  # a small alphabet: many repeats
    idx = NgramIndex()
    for i, tok in enumerate(tokens):
        idx.extend([tok])
        assert idx.propose(5) == scan(tokens[:i + 1], 5), i


def test_index_rejects_bad_sizes():
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)


def _tree() -> DraftTree:
    #   root 10 -> 11 (1), 12 (2); 11 -> 13 (3), 14 (4); 13 -> 15 (5)
    return DraftTree(tokens=torch.tensor([10, 11, 12, 13, 14, 15]), parents=[-1, 0, 0, 1, 1, 3])


def _path_tokens(tree: DraftTree, node: int) -> list[int]:
    return tree.tokens[tree.path(node)[1:]].tolist()


@pytest.mark.parametrize("proposal, shared", [([11, 13, 15, 20, 21], 3), ([11, 14, 30], 2), ([40, 41], 0),
                                              ([11, 13], 2), ([12], 1)])
def test_graft_follows_the_tree_then_appends_a_chain(proposal, shared):
    tree = _tree()
    g = graft(tree, proposal)
    assert g.shared == shared and g.added == len(proposal) - shared and g.base == tree.size
    assert g.tree.size == tree.size + g.added
    assert g.tree.tokens[:tree.size].tolist() == tree.tokens.tolist() and g.tree.parents[:tree.size] == tree.parents
    for k, node in enumerate(g.path):  # every copied token is on its own node's path, in order
        assert _path_tokens(g.tree, node) == proposal[:k + 1]
    assert all(node >= tree.size for node in g.path[shared:])
    if not g.added:
        assert g.tree is tree
    assert follow(tree, proposal) == g.path[:shared]  # what the graft found already in the tree
    given = graft(tree, proposal, follow(tree, proposal))  # the engine follows once, then cuts and grafts
    assert given.path == g.path and given.tree.parents == g.tree.parents
    assert torch.equal(given.tree.tokens, g.tree.tokens)


def test_graft_onto_a_chain_stays_a_chain_only_when_it_extends_it():
    chain = chain_tree(torch.tensor(10), torch.tensor([11, 12]))
    assert graft(chain, [11, 12, 13, 14]).tree.is_chain
    assert not graft(chain, [11, 19]).tree.is_chain


def test_graft_refuses_a_sampled_tree():
    tree = chain_tree(torch.tensor(1), torch.tensor([2]), q=torch.full((1, 4), 0.25))
    with pytest.raises(ValueError, match="laws"):
        graft(tree, [2, 3])


def test_model_learns_rates_per_position():
    m = LookupModel(prior=(0.5,))
    assert m.rates(3) == [0.5, 0.5, 0.5]
    tree = _tree()
    g = graft(tree, [11, 13, 15, 20, 21])  # path: nodes 1, 3, 5, 6, 7
    for _ in range(PRIOR_ROUNDS):
        m.observe(g.path, accepted=[1, 3, 5, 6])  # the last copied token rejected
    rates = m.rates(5)
    assert rates[:4] == [0.75, 0.75, 0.75, 0.75] and rates[4] == 0.25
    m2 = LookupModel(prior=(0.5,))
    m2.observe(g.path, accepted=[2])  # the target took another branch: position 0 reached, rejected
    assert m2.live[0] == [1, 0] and all(r == [0, 0] for r in m2.live[1:])
    carried = LookupModel(live=m.carried(2)).live
    assert carried[0] == [2.0, 2.0] and carried[4] == [2.0, 0.0]


def test_expected_copied_counts_only_the_tail():
    rates = [0.5, 0.5, 1.0, 0.5]
    assert expected_copied(rates, 0, 2) == pytest.approx(0.5 + 0.25)
    assert expected_copied(rates, 2, 2) == pytest.approx(0.25 + 0.125)
    assert expected_copied(rates, 1, 0) == 0.0


@pytest.mark.parametrize("slope", [0.0, 0.5, 1.5, 3.0, 10.0])
@pytest.mark.parametrize("rates", [[0.9] * 8, [0.2] * 8, [0.4, 0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9]])
@pytest.mark.parametrize("shared", [0, 2])
def test_tail_length_equals_a_brute_force_search(slope, rates, shared):
    available = len(rates) - shared
    round_tokens, round_ms = 2.0, 30.0

    def extra(t):
        return slope * t

    def rate(t):
        got, run = 0.0, 1.0
        for k in range(shared + t):
            run *= rates[k]
            got += run if k >= shared else 0.0
        return (round_tokens + got) / (round_ms + extra(t))

    best = max(range(available + 1), key=lambda t: (rate(t), -t))
    assert tail_length(rates, shared, available, round_tokens, round_ms, extra) == best


def test_tail_length_is_zero_where_rows_cost_more_than_they_give():
    assert tail_length([0.1] * 4, 0, 4, 2.0, 20.0, lambda t: 5.0 * t) == 0
    assert tail_length([0.95] * 4, 0, 4, 2.0, 20.0, lambda t: 0.0) == 4  # free rows: all of them
