"""Two runs compared case by case (the report's comparison and the gate both use this), and
several runs side by side.

A *regression* is a case that passed in the baseline and does not pass now; a *fix* the
reverse. Compile times are compared only for cases that compiled in both runs without a
cache hit; a case is *slower* when its compile time grew by at least ``slower_factor`` and by
more than ``slack_seconds`` (the slack keeps sub-second noise from being flagged): ``grew``,
the one rule, which the gate also applies to run times and to repeated measurements. Times
of runs timed on different kinds of machine (MACHINE_FIELDS) are not comparable:
``Comparison.machines`` says why, and the gate then gates none.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from records.results import Label, Record, RunResults
from records.selection import run_differences
from records.text import one_line

DEFAULT_SLOWER_FACTOR = 1.25
DEFAULT_SLACK_SECONDS = 0.5
#: What a run's environment says of the machine its times were measured on. Runs that differ
#: in one of them were not timed on one kind of machine: the gate does not gate their times
#: and the report shows them for information only (a compile 1.3x as long on a machine twice
#: as fast would pass, and a slower machine would block a good release).
MACHINE_FIELDS = ("device", "device_name", "cpu_count")


@dataclass(frozen=True)
class LabelChange:
    case_id: str
    before: Label
    after: Label

    @property
    def before_text(self) -> str:
        return self.before.value

    @property
    def after_text(self) -> str:
        return self.after.value


@dataclass(frozen=True)
class TimeChange:
    """A case's compile (or run) time in the baseline and in the candidate."""

    case_id: str
    before: float
    after: float

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before > 0 else float("inf")


@dataclass(frozen=True)
class Comparison:
    """What changed from ``baseline`` to ``candidate``; lists are in candidate order, except
    compile-time changes: the largest change first."""

    regressions: tuple[LabelChange, ...]
    fixes: tuple[LabelChange, ...]
    changed: tuple[LabelChange, ...]  # not passing in either run, but a different label
    new: tuple[Record, ...]  # in the candidate only
    missing: tuple[Record, ...]  # in the baseline only
    slower: tuple[TimeChange, ...]
    faster: tuple[TimeChange, ...]
    both_cold: bool  # both runs compiled with a cold cache: compile times are comparable
    slower_factor: float
    machines: str | None  # why the runs were not timed on one kind of machine, in words
    #: what makes the two runs no release comparison (records.selection.run_differences), in
    #: words: the gate refuses such a pair, and a report says it beside the comparison
    differs: str | None = None

    @property
    def unchanged(self) -> bool:
        return not (self.regressions or self.fixes or self.changed or self.new
                    or self.missing or self.slower)


def finished_compile_seconds(record: Record) -> float | None:
    """The compile time of a record if it measures a finished, uncached compile."""
    if not record.label.compile_finished or record.cache_hit:
        return None
    return record.compile_seconds


def finished_run_seconds(record: Record) -> float | None:
    """The run time (median of the timed calls) of a record whose timed calls all finished."""
    if record.label not in (Label.PASS, Label.MISMATCH):
        return None
    return record.run_seconds


#: what a time finding measures: the record's compile phase, or its timed runs
MEASURES = {"compile": finished_compile_seconds, "run": finished_run_seconds}


def grew(before: float, after: float, factor: float, slack_seconds: float) -> bool:
    """Whether a time grew to at least ``factor`` times ``before`` and by more than
    ``slack_seconds``."""
    return after >= factor * before and after - before > slack_seconds


def slower_cases(baseline: RunResults, candidate: RunResults, measure: str, factor: float,
                 slack_seconds: float) -> tuple[TimeChange, ...]:
    """The cases of both runs whose ``measure`` (compile or run) time ``grew``, worst first."""
    seconds = MEASURES[measure]
    old = baseline.by_id()
    slower = []
    for rec in candidate.records:
        before = old.get(rec.case_id)
        t_old = seconds(before) if before is not None else None
        t_new = seconds(rec)
        if t_old is not None and t_new is not None and grew(t_old, t_new, factor, slack_seconds):
            slower.append(TimeChange(rec.case_id, t_old, t_new))
    return tuple(sorted(slower, key=lambda c: -c.ratio))


def compare_runs(baseline: RunResults, candidate: RunResults,
                 slower_factor: float = DEFAULT_SLOWER_FACTOR,
                 slack_seconds: float = DEFAULT_SLACK_SECONDS) -> Comparison:
    old = baseline.by_id()
    new_ids = candidate.by_id()
    regressions, fixes, changed, new, faster = [], [], [], [], []
    for rec in candidate.records:
        before = old.get(rec.case_id)
        if before is None:
            new.append(rec)
            continue
        change = LabelChange(rec.case_id, before.label, rec.label)
        if before.label is Label.PASS and rec.label is not Label.PASS:
            regressions.append(change)
        elif before.label is not Label.PASS and rec.label is Label.PASS:
            fixes.append(change)
        elif before.label is not rec.label:
            changed.append(change)
        t_old, t_new = finished_compile_seconds(before), finished_compile_seconds(rec)
        if t_old is not None and t_new is not None and grew(t_new, t_old, slower_factor,
                                                            slack_seconds):
            faster.append(TimeChange(rec.case_id, t_old, t_new))
    missing = [r for r in baseline.records if r.case_id not in new_ids]
    slower = slower_cases(baseline, candidate, "compile", slower_factor, slack_seconds)
    faster.sort(key=lambda c: c.ratio)  # the most improved first
    both_cold = all(r.options.get("compile_cache") == "cold" for r in (baseline, candidate))
    differences = run_differences(baseline, candidate)
    differs = "; ".join(f"{what} {new} here, {old} in the baseline"
                        for what, old, new in differences) or None
    return Comparison(tuple(regressions), tuple(fixes), tuple(changed), tuple(new),
                      tuple(missing), slower, tuple(faster), both_cold, slower_factor,
                      machine_difference(baseline, candidate), one_line(differs) if differs
                      else None)


def machine_difference(baseline: RunResults, candidate: RunResults) -> str | None:
    """Why the two runs' times were not measured on one kind of machine (MACHINE_FIELDS), in
    words, or None. A field that a run does not record is not compared (files of earlier
    suites); a merged run whose shards ran on machines that differ has no one machine."""
    for name, run in (("baseline", baseline), ("candidate", candidate)):
        mixed = run.environment.get("differs_between_shards") or {}
        for field in MACHINE_FIELDS:
            if field in mixed:
                values = ", ".join(one_line(repr(v)) for v in mixed[field])
                return f"the {name}'s shards ran on different machines ({field} {values})"
    for field in MACHINE_FIELDS:
        old, new = baseline.environment.get(field), candidate.environment.get(field)
        if old is not None and new is not None and old != new:
            return (f"the runs were measured on different machines ({field} "
                    f"{one_line(repr(old))} (baseline), {one_line(repr(new))} (candidate))")
    return None


@dataclass(frozen=True)
class SideBySideRow:
    case_id: str
    cells: tuple[Record | None, ...]  # one per run; None where the run lacks the case

    @property
    def agree(self) -> bool:
        labels = {c.label if c else None for c in self.cells}
        return len(labels) == 1


def side_by_side(runs: Sequence[RunResults]) -> list[SideBySideRow]:
    """Every case of any run (first run's order, then the cases only later runs have)."""
    order: dict[str, None] = {}
    for run in runs:
        for rec in run.records:
            order.setdefault(rec.case_id, None)
    lookups = [run.by_id() for run in runs]
    return [SideBySideRow(cid, tuple(lk.get(cid) for lk in lookups)) for cid in order]
