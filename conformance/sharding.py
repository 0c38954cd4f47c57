"""Splitting a matrix into N parts of about equal estimated cost, for N machines.

``--shard I/N`` runs part I of N. The split is deterministic (it depends only on the set of
case ids and their costs, not on the order they arrive in or the machine) and balanced by
estimated cost, not by count: the full core matrix's costliest cases (batch 4, length 8192)
cost about 100 times its cheapest, so equal counts would leave one machine running long after
the others. Assignment is longest-processing-time-first: cases from costliest to cheapest
(ties by id), each to the part with the least cost so far (ties to the lowest part). The
costliest part is then at most 4/3 of the best possible split, and in practice within a few
per cent of the mean.
"""
from __future__ import annotations

from typing import Callable, Sequence

from cases.model import Case

CostFn = Callable[[Case], float]


def default_cost(case: Case) -> float:
    """The executor's estimate of a case's cost (conformance.estimates.relative_cost)."""
    from conformance.estimates import relative_cost

    return relative_cost(case)


def assign_shards(cases: Sequence[Case], count: int, cost: CostFn | None = None) -> dict[str, int]:
    """Case id -> 0-based part, for ``count`` parts."""
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"shard count {count!r} must be a whole number >= 1; write --shard I/N "
                         "with N >= 1")
    cost = cost or default_cost
    costed = sorted(((float(cost(c)), c.id) for c in cases), key=lambda t: (-t[0], t[1]))
    # the k-th case dealt goes to a part below k+1 (parts past those dealt to are all empty,
    # and ties go to the lowest), so parts past the number of cases never get one: no load is
    # kept for them, whatever the count
    loads = [0.0] * min(count, len(costed))
    parts: dict[str, int] = {}
    for value, case_id in costed:
        if case_id in parts:
            continue  # the same case listed twice is still run once
        part = min(range(len(loads)), key=lambda p: (loads[p], p))
        parts[case_id] = part
        loads[part] += value
    return parts


def select_shard(cases: Sequence[Case], index: int, count: int,
                 cost: CostFn | None = None) -> list[Case]:
    """The cases of part ``index`` (0-based; ``--shard 1/N`` is index 0) of ``count``, in the
    order they were given."""
    if not isinstance(index, int) or not 0 <= index < max(count, 1):
        raise ValueError(f"shard index {index!r} is outside 0..{count - 1} (0-based) for {count} "
                         "parts; write --shard I/N with 1 <= I <= N")
    parts = assign_shards(cases, count, cost)
    return [c for c in cases if parts[c.id] == index]


def shard_costs(cases: Sequence[Case], count: int, cost: CostFn | None = None) -> list[float]:
    """The estimated cost of each of the ``count`` parts (for docs, logs and tests)."""
    cost = cost or default_cost
    by_id = {c.id: c for c in cases}
    totals = [0.0] * count
    for case_id, part in assign_shards(cases, count, cost).items():
        totals[part] += float(cost(by_id[case_id]))
    return totals
