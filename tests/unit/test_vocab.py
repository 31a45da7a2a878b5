"""The draft vocabulary map: pure maths on token counts, no model."""

from __future__ import annotations

import pytest
import torch

from specwire.draft.model import check_vocab_map
from specwire.errors import SpecwireError
from specwire.draft.vocab import (build_vocab_map, coverage, coverage_table, format_coverage_table, frequency_order,
                                  refit_rows)


def test_top_ids_sorted_by_target_id_with_offsets():
    counts = torch.tensor([0, 5, 1, 9, 0, 7, 3, 0])
    d2t, t2d = build_vocab_map(counts, 3)
    # most frequent: 3 (9), 5 (7), 1 (5) -> sorted by id: [1, 3, 5]
    assert d2t.tolist() == [1 - 0, 3 - 1, 5 - 2]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert t2d.nonzero().flatten().tolist() == [1, 3, 5]
    assert build_vocab_map(counts, 3).target_ids.tolist() == [1, 3, 5]
    check_vocab_map(d2t, t2d, vocab_size=8, source="test")


def test_ties_broken_by_lower_id_first():
    counts = torch.tensor([2, 4, 4, 1, 4, 2])
    assert frequency_order(counts).tolist() == [1, 2, 4, 0, 5, 3]
    assert build_vocab_map(counts, 2).target_ids.tolist() == [1, 2]
    assert build_vocab_map(counts, 4).target_ids.tolist() == [0, 1, 2, 4]
    # a large all-tied vocabulary (where an unstable sort would scramble ties) keeps the lowest ids
    assert build_vocab_map(torch.ones(5000, dtype=torch.int64), 100).target_ids.tolist() == list(range(100))


def test_fewer_seen_ids_than_draft_vocab_fills_lowest_unseen():
    counts = torch.zeros(10, dtype=torch.int64)
    counts[7], counts[4] = 3, 1
    vm = build_vocab_map(counts, 5)
    # seen: 7, 4; then the lowest unseen ids 0, 1, 2
    assert vm.target_ids.tolist() == [0, 1, 2, 4, 7]
    check_vocab_map(vm.d2t, vm.t2d, vocab_size=10, source="test")
    # all zero counts: the first ids
    assert build_vocab_map(torch.zeros(6, dtype=torch.int64), 3).target_ids.tolist() == [0, 1, 2]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_counts_pass_check_vocab_map(seed):
    g = torch.Generator().manual_seed(seed)
    V = 500
    counts = torch.randint(0, 6, (V,), generator=g) * (torch.rand(V, generator=g) < 0.3)
    for size in (1, 17, 150, 400, V):
        d2t, t2d = build_vocab_map(counts, size)
        assert d2t.shape == (size,) and t2d.shape == (V,)
        check_vocab_map(d2t, t2d, vocab_size=V, source="test")
        # no id outside the map is more frequent than one inside
        if size < V:
            assert int(counts[~t2d].max()) <= int(counts[t2d].min())
    assert build_vocab_map(counts, V).t2d.all()


def test_coverage_maths():
    counts = torch.tensor([10, 0, 30, 60])
    t2d = torch.tensor([True, True, False, True])
    assert coverage(counts, t2d) == pytest.approx(0.7)
    _, t2d2 = build_vocab_map(counts, 2)
    assert coverage(counts, t2d2) == pytest.approx(0.9)
    with pytest.raises(SpecwireError, match="all zero"):
        coverage(torch.zeros(4, dtype=torch.int64), t2d)
    with pytest.raises(SpecwireError, match="bool tensor shaped like"):
        coverage(counts, torch.ones(3, dtype=torch.bool))


def test_coverage_table_matches_maps():
    g = torch.Generator().manual_seed(0)
    counts = torch.randint(0, 50, (300,), generator=g)
    counts[:40] = 0
    rows = coverage_table(counts, [1, 8, 64, 260, 300, 1000])
    assert [r.draft_vocab_size for r in rows] == [1, 8, 64, 260, 300]  # 1000 clamps to V = 300
    for r in rows:
        assert r.coverage == pytest.approx(coverage(counts, build_vocab_map(counts, r.draft_vocab_size).t2d))
        assert r.seen == int((counts > 0).sum())
    assert [r.coverage for r in rows] == sorted(r.coverage for r in rows)
    assert rows[-1].coverage == 1.0
    assert "coverage" in format_coverage_table(rows)
    default = coverage_table(counts)
    assert default[-1].draft_vocab_size == 300 and default[-1].coverage == 1.0


@pytest.mark.parametrize("counts,size,match", [
    (torch.tensor([1, 2, 3]), 0, "draft_vocab_size"),
    (torch.tensor([1, 2, 3]), 4, "draft_vocab_size"),
    (torch.tensor([1.0, 2.0]), 1, "integer frequencies"),
    (torch.tensor([1, -2]), 1, "negative"),
    (torch.zeros(2, 2, dtype=torch.int64), 1, "1-D"),
])
def test_bad_input_is_refused(counts, size, match):
    with pytest.raises(SpecwireError, match=match):
        build_vocab_map(counts, size)


def test_refit_rows_keeps_trained_rows_and_maps_new_ones_through_the_fitted_map():
    """Draft rows that are an exact linear image of the target's (plus nothing else): the ids that stay keep
    their rows bit for bit, and a new id's row is its target row through that same map."""
    g = torch.Generator().manual_seed(0)
    H, V = 8, 64
    target_lm_head = torch.randn(V, H, generator=g, dtype=torch.float64)
    M = torch.randn(H, H, generator=g, dtype=torch.float64)
    old_ids = torch.arange(0, 40)  # shape: [40]
    new_ids = torch.cat([torch.arange(10, 40, 2), torch.arange(50, 60)])  # 15 kept, 10 new, ascending
    draft_rows = (target_lm_head[old_ids] @ M).float()
    draft_rows[5] += 1.0  # a kept row off the map stays as trained
    rows = refit_rows(draft_rows, old_ids, new_ids, target_lm_head[new_ids].float())
    assert rows.shape == (len(new_ids), H) and rows.dtype == torch.float32
    kept = torch.isin(new_ids, old_ids)
    assert torch.equal(rows[kept], draft_rows[new_ids[kept]])
    want = (target_lm_head[new_ids[~kept]] @ M).float()
    torch.testing.assert_close(rows[~kept], want, rtol=1e-3, atol=1e-3)  # least squares, one row perturbed


def test_refit_rows_with_too_few_shared_ids_starts_new_rows_from_the_target():
    target_rows = torch.randn(6, 8)
    draft_rows = torch.randn(4, 8)
    rows = refit_rows(draft_rows, torch.tensor([0, 1, 2, 3]), torch.tensor([2, 3, 7, 9, 11, 12]), target_rows)
    assert torch.equal(rows[:2], draft_rows[2:]) and torch.equal(rows[2:], target_rows[2:])
    with pytest.raises(SpecwireError, match="refit_rows"):
        refit_rows(draft_rows, torch.tensor([0, 1, 2]), torch.tensor([2, 3]), target_rows[:2])
