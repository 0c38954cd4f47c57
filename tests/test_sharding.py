"""--shard I/N: every case in exactly one part, the same parts on every machine, balanced by cost."""
from __future__ import annotations

import random

import pytest

from cases import variants
from cases.catalog import matrix
from cases.model import Case, Shape
from conformance.estimates import relative_cost
from conformance.sharding import assign_shards, select_shard, shard_costs


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_parts_cover_every_case_exactly_once(count):
    cases = matrix("smoke")
    parts = [select_shard(cases, i, count) for i in range(count)]
    ids = [c.id for part in parts for c in part]
    assert sorted(ids) == sorted(c.id for c in cases)
    for part in parts:  # each part keeps the order the cases were given in
        positions = [cases.index(c) for c in part]
        assert positions == sorted(positions)


def test_same_parts_whatever_the_order_of_the_cases():
    cases = matrix("full")
    shuffled = cases[:]
    random.Random(7).shuffle(shuffled)
    for i in range(3):
        assert {c.id for c in select_shard(cases, i, 3)} == {c.id for c in select_shard(shuffled, i, 3)}
    assert assign_shards(cases, 4) == assign_shards(list(reversed(cases)), 4)


def test_balanced_by_cost_not_by_count():
    expensive = Case(variants.full(), Shape(4, 8, 8, 8192, 8192, 128))
    cheap = [Case(variants.full(), Shape(1, 8, 8, 128 * (i + 1), 128 * (i + 1), 128)) for i in range(6)]
    cost = {expensive.id: 6.0, **{c.id: 1.0 for c in cheap}}.__getitem__
    first, second = (select_shard([expensive, *cheap], i, 2, lambda c: cost(c.id)) for i in range(2))
    assert first == [expensive] and second == cheap  # 1 case against 6, 6.0 against 6.0


def test_full_matrix_in_three_parts_is_even_in_cost():
    cases = matrix("full")
    costs = shard_costs(cases, 3)
    assert sum(costs) == pytest.approx(sum(relative_cost(c) for c in cases))
    assert max(costs) <= 1.02 * min(costs)
    # a split by count would not be: the same 32 cases per part in matrix order differ widely
    by_count = [sum(relative_cost(c) for c in cases[i::3]) for i in range(3)]
    assert max(by_count) > 1.2 * min(by_count)


def test_bad_index_or_count_is_one_clear_line():
    cases = matrix("smoke")
    with pytest.raises(ValueError, match=r"shard index 3 is outside 0\.\.2 .* write --shard I/N "
                                         r"with 1 <= I <= N"):
        select_shard(cases, 3, 3)
    with pytest.raises(ValueError, match="shard count 0 must be a whole number >= 1"):
        select_shard(cases, 0, 0)


def test_more_parts_than_cases_leaves_parts_empty():
    cases = matrix("smoke")[:2]
    assert [len(select_shard(cases, i, 4)) for i in range(4)] == [1, 1, 0, 0]
