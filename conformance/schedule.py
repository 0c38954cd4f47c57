"""Longest first: the controller hands cases to xdist workers in decreasing expected cost.

On a compiler-bound backend a few cases take the whole compile budget; the makespan then
depends on where they fall, unless they start first (LPT: longest processing time first,
within 4/3 of the optimum). Expected cost per case, in seconds:

- from a run's measured setup, compile and run seconds (``--schedule-from RESULTS.json``, or
  by default the last run in the report directory when it is of the same matrix, profile and
  backend; a file named of another backend is used, and the terminal says whose it is); cases
  that run lacks get the estimate scaled to the measured ones;
- else from the estimate (``conformance.estimates.relative_cost``).

``LongestFirstScheduling`` is xdist's load scheduler with its pending list in that order and
one case sent at a time (a worker holds two: the one it runs and the next), so a free worker
always takes the longest case left. Installed through ``pytest_xdist_make_scheduler``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from records.results import ResultsError, RunResults, load_results
from records.selection import matrix_selects
from records.text import one_line

#: ``--schedule-from`` values besides a path: the default (a usable earlier run, else the
#: estimate), the estimate alone, or xdist's own order (collection order).
AUTO, ESTIMATE, OFF = "auto", "estimate", "off"


class ScheduleError(ValueError):
    """A --schedule-from file that cannot order this run: ``problem`` (naming the file), then
    the fix, on one line."""

    def __init__(self, problem: str, fix: str):
        super().__init__(f"--schedule-from {problem}; {fix}")
        self.problem = problem


@dataclass(frozen=True)
class CostModel:
    seconds: dict[str, float]  # case id -> expected seconds
    source: str  # where the figures came from, for the terminal
    path: Path | None = None  # the results file they came from, if any

    def cost(self, case_id: str) -> float:
        return self.seconds.get(case_id, 0.0)


def measured_seconds(results: RunResults) -> dict[str, float]:
    """Each record's wall time in the suite: setup, compile and the timed runs."""
    timed_runs = int(results.options.get("timed_runs") or 3)
    seconds = {}
    for record in results.records:
        parts = (record.setup_seconds, record.compile_seconds,
                 (record.run_seconds or 0.0) * timed_runs)
        if record.compile_seconds is not None:
            seconds[record.case_id] = sum(p for p in parts if p)
    return seconds


def cost_model(cases: list, estimate: Callable, choice: str, matrix: str, profile: str,
               last_run: Path | None, *, backend: str) -> CostModel:
    """The expected seconds of ``cases`` (every case of the run's matrix or case file, before
    -k and shards) for ``choice`` (a path, AUTO, ESTIMATE), on ``backend`` (its name)."""
    estimates = {case.id: float(estimate(case)) for case in cases}
    if choice == ESTIMATE:
        return CostModel(estimates, "the estimate")
    if choice == AUTO:
        if last_run is None or not last_run.exists():
            return CostModel(estimates, "the estimate (no earlier run in the report directory)")
        try:
            return _from_run(last_run, estimates, matrix, profile, backend, named=False)
        except ScheduleError as exc:  # an earlier run nobody asked for: note it, go on
            return CostModel(estimates, "the estimate (the last run in the report directory "
                                        f"cannot order this one: {exc.problem})", last_run)
    return _from_run(Path(choice), estimates, matrix, profile, backend, named=True)


def _from_run(path: Path, estimates: dict[str, float], matrix: str, profile: str,
              backend: str, named: bool) -> CostModel:
    """The cost model from the run at ``path``. Another backend's run is not taken unasked
    (``named`` False: its times, eager first calls where this run compiles, say little of this
    run's: an outside audit); one the user named is used, and its source says whose it is."""
    shown = one_line(str(path))
    try:
        results = load_results(path)
    except ResultsError as exc:
        raise ScheduleError(exc.problem, f"{exc.fix}, or --schedule-from auto") from None
    theirs = ((results.selection or {}).get("matrix") or results.options.get("matrix", "core"),
              (results.selection or {}).get("profile") or results.options.get("profile"))
    if not matrix_selects(theirs[0], results.options.get("case_file")):
        theirs = ("core", theirs[1])  # beside a case file (an older suite recorded it): none
    if theirs != (matrix, profile):
        raise ScheduleError(f"{shown} is a run of --matrix {one_line(theirs[0])} --profile "
                            f"{one_line(theirs[1])}, this one is --matrix {matrix} --profile "
                            f"{profile}", "pass a run of the same matrix, or --schedule-from auto")
    their_backend = results.options.get("backend")  # absent in a file of an older suite
    of_another = their_backend is not None and their_backend != backend
    if of_another and not named:
        raise ScheduleError(f"{shown} is a run of {one_line(str(their_backend))}, this one is "
                            f"{one_line(backend)}", "pass a run of this backend")
    measured = {cid: s for cid, s in measured_seconds(results).items() if cid in estimates}
    if not measured:
        raise ScheduleError(f"{shown} measured none of this run's cases",
                            "pass a run of the same cases, or --schedule-from auto")
    scale = statistics.median(measured[cid] / estimates[cid] for cid in measured)
    seconds = {cid: measured.get(cid, est * scale) for cid, est in estimates.items()}
    whose = f"a run of {one_line(str(their_backend))}; " if of_another else ""
    # of every case the matrix (or case file) holds: -k and shards select later
    return CostModel(seconds, f"{path} ({whose}{len(measured)} of the {len(estimates)} cases "
                              "of the matrix measured)", path)


def longest_first(indices: list[int], cost_of: Callable[[int], float]) -> list[int]:
    """``indices`` in decreasing cost, ties in their given order."""
    return sorted(indices, key=lambda i: -cost_of(i))


def make_scheduler(config, log, model: CostModel, case_id_of: Callable[[str], str | None]):
    """xdist's LoadScheduling, longest first (see the module doc)."""
    from xdist.scheduler import LoadScheduling

    class LongestFirstScheduling(LoadScheduling):
        def schedule(self) -> None:
            if self.collection is not None or not self.collection_is_completed:
                return super().schedule()
            if not self._check_nodes_have_same_collection():
                return super().schedule()  # xdist reports the difference
            self.collection = next(iter(self.node2collection.values()))
            order = longest_first(list(range(len(self.collection))),
                                  lambda i: model.cost(case_id_of(self.collection[i]) or ""))
            self.pending[:] = order
            if not self.collection:
                return
            self.maxschedchunk = 1
            # two cases per worker to start (it runs one and knows the next), dealt in turn
            # so the longest cases start first, one on each worker
            for _ in range(2):
                for node in self.nodes:
                    if self.pending:
                        self._send_tests(node, 1)
            if not self.pending:
                for node in self.nodes:
                    node.shutdown()

        def check_schedule(self, node, duration: float = 0) -> None:
            if node.shutting_down:
                return
            if self.pending:
                if len(self.node2pending[node]) < 2:
                    self._send_tests(node, 2 - len(self.node2pending[node]))
            else:
                node.shutdown()

    return LongestFirstScheduling(config, log)
