"""The notes of a gate decision: facts beside the findings that a reader must weigh (a budget
or a backend given another way, run times that were not gated), never findings themselves;
``flagged`` ones are shown first, marked "!". reports/gate.py adds the notes about the
expectations, the machines and the seeds where it finds them."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from records.results import RunResults
from reports.compare import slower_cases
from reports.formatting import precise_seconds

#: budgets whose change is flagged (the labels COMPILE_TIMEOUT and RUN_TIMEOUT depend on them)
BUDGETS = ("compile_timeout", "run_timeout")


@dataclass(frozen=True)
class Note:
    kind: str  # BUDGET_CHANGE, BACKEND_SPEC_CHANGE, COLD_CACHE_HITS, COMPILE_NOT_GATED,
    #          TIMES_NOT_GATED,
    #          RUN_TIME_NOT_GATED, RUN_TIME_BUDGET_UNUSED,
    #          KNOWN_FAILURES, UNTRIAGED, UNMATCHED_EXPECTATIONS, SEED_CHANGE, UNCONFIRMED,
    #          CONFIRMATION, RERUN, MERGE_DUPLICATES, SHADOWED_EXPECTATIONS, TIMED_RUNS_CHANGE,
    #          ORDER, MISSPELT_BACKEND
    text: str
    flagged: bool = False  # a reader must see it: shown before the findings, marked "!"


#: Without --run-time-slack, the run times that the gate still names in a flagged note: at
#: least this many times as slow, and by more than this many seconds (the noise of tiny
#: calls on a loaded machine stays out: two runs of one release on one VM differed 3.3x on
#: a 2 ms case, docs/results/cpu-inductor-smoke-core.json against ...-torch2.13.0.json).
UNGATED_RUN_FACTOR, UNGATED_RUN_SLACK_SECONDS = 3.0, 0.05


def run_times_not_gated(baseline: RunResults, candidate: RunResults) -> list[Note]:
    """A flagged note when run times are not gated (``--run-time-slack`` off, the default) and
    cases ran far slower (UNGATED_RUN_FACTOR): a release whose kernels got far slower must not
    read "no findings" unremarked."""
    slower = slower_cases(baseline, candidate, "run", UNGATED_RUN_FACTOR,
                          UNGATED_RUN_SLACK_SECONDS)
    if not slower:
        return []
    worst = slower[0]
    return [Note("RUN_TIME_NOT_GATED", (
        f"run times are not gated (--run-time-slack is off), and {len(slower)} case(s) ran at "
        f"least {UNGATED_RUN_FACTOR:g}x as slow, e.g. {worst.case_id}: "
        f"{precise_seconds(worst.before)} s -> {precise_seconds(worst.after)} s "
        f"(x{worst.ratio:.3g}); pass --run-time-slack SECONDS to gate them"), flagged=True)]


def cold_cache_hit_notes(baseline: RunResults, candidate: RunResults) -> list[Note]:
    """A flagged note per run that compiled cold (``compile_cache`` cold: no cache of any layer
    may serve a case) and still records cache hits: those compiles are not compared (a hit
    measures no compile), so a slower compiler behind a cache the suite does not isolate, or a
    backend that always says "hit", would pass the compile-time rule unremarked."""
    notes = []
    for side, run in (("baseline", baseline), ("candidate", candidate)):
        hits = [r.case_id for r in run.records if r.cache_hit]
        if run.options.get("compile_cache") == "cold" and hits:
            notes.append(Note("COLD_CACHE_HITS", (
                f"the {side} ran with a cold compile cache, yet {len(hits)} case(s) report a "
                f"cache hit (e.g. {hits[0]}); their compile times are not compared: a cache "
                "the suite does not isolate served them, or the backend's cache_hit() is "
                "wrong"), flagged=True))
    return notes


def merge_duplicate_notes(baseline: RunResults, candidate: RunResults) -> list[Note]:
    """A note per run merged from files that held some cases twice, flagged where copies
    disagree (the merge kept the failing copy: a flaky case, or a retried part that a reader
    should look at)."""
    from reports.merge_facts import disagreeing, duplicated_cases, duplicates_note

    notes = []
    for side, run in (("baseline", baseline), ("candidate", candidate)):
        note = duplicates_note(run)
        if note:
            notes.append(Note("MERGE_DUPLICATES", f"the {side} is a merge: {note}",
                              flagged=bool(disagreeing(duplicated_cases(run)))))
    return notes


def backend_notes(baseline: RunResults, candidate: RunResults) -> list[Note]:
    """A flagged note when the two runs record one backend name but were given different
    --backend values (a plugin that calls itself like a built-in, another plugin object, or
    entry points of other names): the same name need not be the same code. A value that is
    the recorded name itself, or auto (which picks built-ins), names one code."""
    requested = [r.options.get("backend_requested") for r in (baseline, candidate)]
    name = candidate.options.get("backend")
    if None in requested or requested[0] == requested[1] \
            or all(spec in ("auto", name) for spec in requested):
        return []
    return [Note("BACKEND_SPEC_CHANGE", (
        f"both runs record the backend {candidate.options.get('backend')!r}, but it was given "
        f"as --backend {requested[0]} (baseline) and --backend {requested[1]} (candidate): the "
        "same name need not be the same code"), flagged=True)]


def order_notes(baseline: RunResults, candidate: RunResults) -> list[Note]:
    """A flagged note when the candidate started before the baseline: gating yesterday's run
    against today's is sometimes meant (a baseline measured again), but --baseline and
    --candidate given the wrong way round read every finding backwards: a regression as a fix,
    a slower compiler as a faster one."""
    before, after = _started(baseline), _started(candidate)
    if before is None or after is None or after >= before:
        return []
    return [Note("ORDER", (
        f"the candidate started before the baseline ({candidate.started_at} against "
        f"{baseline.started_at}{_torch_versions(baseline, candidate)}): if --baseline and "
        "--candidate are swapped, every finding reads backwards"), flagged=True)]


def _started(run: RunResults) -> datetime | None:
    try:
        started = datetime.fromisoformat(run.started_at)
    except (TypeError, ValueError):
        return None
    return started if started.tzinfo is not None else None  # comparable with any other


def _torch_versions(baseline: RunResults, candidate: RunResults) -> str:
    versions = [run.environment.get("torch") for run in (baseline, candidate)]
    if all(isinstance(v, str) for v in versions) and versions[0] != versions[1]:
        return f"; torch {versions[1]} against {versions[0]}"
    return ""


def budget_notes(baseline: RunResults, candidate: RunResults) -> list[Note]:
    """A flagged note per budget (``--compile-timeout``, ``--run-timeout``) that changed: the
    timeout labels of the two runs were reached under different limits; and one when
    ``--timed-runs`` changed: run times are medians of different numbers of calls, and each
    case's output was checked on a different number of calls (``flexconf merge`` refuses
    such parts outright; a gate may still compare them, but nobody should miss it)."""
    notes = []
    for key in BUDGETS:
        before, after = baseline.options.get(key), candidate.options.get(key)
        if before != after:
            notes.append(Note("BUDGET_CHANGE", f"{key} changed: {_budget(before)} (baseline) -> "
                              f"{_budget(after)} (candidate); timeouts and passes were judged "
                              "under different limits", flagged=True))
    before, after = baseline.options.get("timed_runs"), candidate.options.get("timed_runs")
    if before != after and None not in (before, after):  # runs older than the option: unknown
        notes.append(Note("TIMED_RUNS_CHANGE", f"timed_runs changed: {_count(before)} (baseline) "
                          f"-> {_count(after)} (candidate); run times are medians over different "
                          "numbers of calls, and each case's output was checked on "
                          f"{'fewer' if _fewer(after, before) else 'other numbers of'} calls; "
                          "gate runs made with the same --timed-runs", flagged=True))
    return notes


def _count(value) -> str:
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else "unknown"


def _fewer(after, before) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in (after, before)) \
        and after < before


def _budget(value) -> str:
    return f"{value:g} s" if isinstance(value, (int, float)) else "unknown"
