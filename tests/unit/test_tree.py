"""Draft tree structure: masks, positions, retrieve indices, EAGLE-2 selection (no models)."""

import pytest
import torch

from specwire.decode.tree import DraftTree, chain_tree, root_only, select_tree


def test_chain_tree_is_causal():
    t = chain_tree(torch.tensor(7), torch.tensor([1, 2, 3]))
    assert t.size == 4 and t.is_chain and t.max_depth == 3
    assert t.tokens.tolist() == [7, 1, 2, 3]
    assert torch.equal(t.tree_mask(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert t.positions().tolist() == [0, 1, 2, 3]
    assert t.retrieve_indices().tolist() == [[0, 1, 2, 3]]
    assert t.q is None


def test_chain_tree_pads_q_with_an_unused_root_row():
    q = torch.softmax(torch.randn(2, 5), -1)
    t = chain_tree(torch.tensor(0), torch.tensor([1, 2]), q)
    assert t.q.shape == (3, 5) and torch.equal(t.q[1:], q)


def test_root_only():
    t = root_only(torch.tensor([5]))
    assert t.size == 1 and t.is_chain and t.retrieve_indices().tolist() == [[0]]


def test_branching_tree_mask_positions_and_paths():
    #        0
    #      /   \
    #     1     2
    #    / \    |
    #   3   4   5
    #   |
    #   6
    t = DraftTree(tokens=torch.arange(7), parents=[-1, 0, 0, 1, 1, 2, 3])
    assert not t.is_chain
    assert t.depth == [0, 1, 1, 2, 2, 2, 3]
    assert t.children[1] == [3, 4] and t.children[0] == [1, 2]
    m = t.tree_mask()
    assert m[6].nonzero().flatten().tolist() == [0, 1, 3, 6]
    assert m[5].nonzero().flatten().tolist() == [0, 2, 5]
    assert not m[3, 4] and not m[1, 2]
    assert t.retrieve_indices().tolist() == [[0, 1, 4, -1], [0, 2, 5, -1], [0, 1, 3, 6]]  # leaves 4, 5, 6
    assert t.path(6) == [0, 1, 3, 6]


def test_parents_must_precede_children():
    with pytest.raises(ValueError):
        DraftTree(tokens=torch.arange(3), parents=[-1, 2, 0])
    with pytest.raises(ValueError):
        DraftTree(tokens=torch.arange(3), parents=[0, 0, 1])


def test_select_tree_keeps_best_cumulative_scores():
    # candidates: depth 1 = c0 (-0.1), c1 (-1.0); depth 2 under c0 = c2 (-0.3), c3 (-2.5); under c1 = c4 (-1.2), c5 (-3.0)
    tokens = torch.tensor([10, 11, 12, 13, 14, 15])
    parents = [-1, -1, 0, 0, 1, 1]
    scores = torch.tensor([-0.1, -1.0, -0.3, -2.5, -1.2, -3.0])
    t = select_tree(torch.tensor(99), tokens, parents, scores, budget=4)
    # kept: c0, c2, c1, c4 -> in candidate order c0, c1, c2, c4
    assert t.tokens.tolist() == [99, 10, 11, 12, 14]
    assert t.parents == [-1, 0, 0, 1, 2]
    assert t.depth == [0, 1, 1, 2, 2]
    # siblings are in try order (most likely first)
    assert t.children[0] == [1, 2]


def test_select_tree_budget_larger_than_candidates_keeps_all():
    t = select_tree(torch.tensor(0), torch.tensor([1, 2]), [-1, 0], torch.tensor([-0.5, -0.7]), budget=16)
    assert t.size == 3 and t.is_chain


def test_select_tree_ties_keep_parents():
    # a child with log-prob 0 ties with its parent; the stable sort must keep the parent first
    tokens = torch.tensor([1, 2, 3, 4])
    parents = [-1, -1, 1, 2]
    scores = torch.tensor([-0.9, -0.2, -0.2, -0.2])
    t = select_tree(torch.tensor(0), tokens, parents, scores, budget=2)
    assert t.tokens.tolist() == [0, 2, 3] and t.parents == [-1, 0, 1]
