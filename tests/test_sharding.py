"""--shard I/N: every case in exactly one part, the same parts on every machine, balanced by cost."""
from __future__ import annotations

import random

import pytest

from cases import variants
from cases.catalog import matrix
from cases.model import Case, Shape, Variant
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


def _dealt_to_every_part(cases, count: int) -> dict[str, int]:
    """The split as it was written before parts past the number of cases were left out."""
    loads, parts = [0.0] * count, {}
    for value, case_id in sorted(((relative_cost(c), c.id) for c in cases),
                                 key=lambda t: (-t[0], t[1])):
        if case_id in parts:
            continue
        part = min(range(count), key=lambda p: (loads[p], p))
        parts[case_id] = part
        loads[part] += value
    return parts


def test_a_count_past_the_cases_keeps_the_split_and_allocates_nothing_per_part():
    """--shard 1/1000000000 died of a MemoryError (a load per part), and a count of 20 digits
    of an OverflowError: parts past the number of cases are empty and cost nothing now."""
    cases = matrix("smoke")[:7] + [Case(Variant("full"), Shape(1, 2, 2, 64, 64, 16))] * 2
    for count in (len(cases) - 1, len(cases), len(cases) + 1, 40):
        assert assign_shards(cases, count) == _dealt_to_every_part(cases, count)
    huge = 10 ** 20
    assert [c.id for c in select_shard(cases, 0, huge)] == \
        [c.id for c in select_shard(cases, 0, len(cases))]
    assert select_shard(cases, huge - 1, huge) == []


def test_a_count_no_merge_takes_is_one_line_exit_4_and_sets_nothing_aside(tmp_path):
    from records.selection import MAX_SHARDS
    from tests.test_interrupted_runs import _stale_green_run
    from tests.test_plugin_runs import CASES, pytest_args, run

    report = tmp_path / "report"
    _stale_green_run(report)
    before = {p.name: p.read_bytes() for p in report.iterdir()}
    for count in ("99999999999999999999", str(MAX_SHARDS + 1)):
        proc = run(pytest_args(tmp_path, "cpu-eager", CASES, "--shard", f"1/{count}"))
        assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert [line for line in proc.stderr.splitlines() if line.strip()] == [
            f"ERROR: --shard '1/{count}': N is above {MAX_SHARDS}, the most parts flexconf "
            "merge joins; give N as the number of machines, e.g. --shard 2/4"]
    assert {p.name: p.read_bytes() for p in report.iterdir()} == before
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--shard",
                           f"{MAX_SHARDS}/{MAX_SHARDS}", "--report-dir", str(tmp_path / "part")))
    assert proc.returncode == 5, proc.stdout[-2000:] + proc.stderr[-2000:]  # an empty part
