"""Measure the gate's flagged cases again (``flexconf gate --confirm auto|N``) and confirm or
dismiss each time finding on the repeated figures (reports/timing.py says how).

Each side is rerun with its own run's options (``reports.summary.rerun_args``: the same
backend, profile, seed, budgets, timed runs), cold, in a subprocess under that side's python,
so the gate itself never imports torch and each release is measured with what it has
installed (reports/confirm_plan.py chooses and checks the pythons). One rerun is one
``pytest conformance/`` process running every flagged case of that side, with as many xdist
workers as the candidate's run had (``environment.workers``) on both sides, so each case gets
the share of the cores it had when it was flagged, and the same on both (the backends give
each worker a share of the cores); the sides take turns (baseline, candidate, baseline, ...)
so that a change in the machine's load falls on both.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from records.release import release_difference
from records.results import Record, ResultsError, RunResults, is_fuzzed, load_results
from records.text import one_line
from reports.compare import MEASURES
from reports.gate import Finding, GateDecision, Note, ordered
from reports.summary import rerun_args
from reports.timing import Figures, judge

#: the checkout whose ``conformance/`` the reruns run (the gate's own)
SUITE_ROOT = Path(__file__).resolve().parents[1]
#: seconds a rerun process may take beyond its cases' compile and run budgets
RERUN_MARGIN_SECONDS = 300
#: the most seconds one rerun may take (a longer timeout overflows the OS's wait, in ms)
MAX_RERUN_SECONDS = 2_000_000


@dataclass(frozen=True)
class Side:
    """One release to measure again: its run, the python that has it installed, and the
    xdist workers each rerun gets (the same on both sides: reports/confirm_plan.py)."""

    name: str  # baseline | candidate
    results: RunResults
    python: str
    workers: int = 1


@dataclass
class Remeasured:
    """What the reruns gave: per side, per case, the records of the reruns that ran it, and
    one line per rerun that gave no results file."""

    repeats: int
    pythons: dict[str, str]  # side name -> python; a side not measured again is absent
    records: dict[str, dict[str, list[Record]]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)


#: runs one rerun: (side, case ids, report dir) -> results, or the one-line reason it gave none
Rerun = Callable[[Side, list[str], Path], "RunResults | str"]


#: How many flagged cases ``--confirm`` measures again at most, by default. Each costs N cold
#: reruns per side; a run with more findings than this is rarely noise.
DEFAULT_MAX_CASES = 20


def flagged_cases(decision: GateDecision, limit: int | None = None) -> list[str]:
    """The case ids of the time findings that a rerun can select, each once: in the
    decision's order, or with ``limit``, at most that many, the measures (compile, run)
    taking turns, each giving its case whose time grew by the largest factor first (ties
    in the decision's order). By the factor alone, a release whose every compile grew
    x1.4 left its one run-time finding (x1.32) unmeasured and blocking (torch 2.15.0,
    docs/results/README.md). A fuzzed case is in no matrix (``--case-id`` cannot select
    it): its findings stay unconfirmed, and block."""
    flagged = [f for f in decision.findings if f.rule is not None and not is_fuzzed(f.subject)]
    cases = list(dict.fromkeys(f.subject for f in flagged))
    if limit is None or len(cases) <= limit:
        return cases
    growth: dict[str, dict[str, float]] = {}  # measure -> case id -> factor
    for f in flagged:
        before, after = (MEASURES[f.rule.measure](r) for r in (f.old, f.new))
        ratio = after / before if before and after is not None else float("inf")
        of_measure = growth.setdefault(f.rule.measure, {})
        of_measure[f.subject] = max(of_measure.get(f.subject, 0.0), ratio)
    queues = [sorted(of_measure, key=lambda cid: -of_measure[cid])
              for of_measure in growth.values()]
    chosen: dict[str, None] = {}
    while len(chosen) < limit:
        for queue in queues:
            while queue and queue[0] in chosen:
                queue.pop(0)
            if queue and len(chosen) < limit:
                chosen[queue.pop(0)] = None
    return list(chosen)


def only_fuzzed_flagged(decision: GateDecision) -> GateDecision:
    """The decision when every flagged case is fuzzed (none can be measured again): its
    UNCONFIRMED note says why, not that --confirm would measure them."""
    fuzzed = {f.subject for f in decision.findings if f.rule is not None and is_fuzzed(f.subject)}
    if not fuzzed:
        return decision
    notes = [n for n in decision.notes if n.kind != "UNCONFIRMED"]
    notes.append(Note("UNCONFIRMED", (
        f"time findings are unconfirmed: the {len(fuzzed)} flagged case"
        f"{'s are' if len(fuzzed) != 1 else ' is'} fuzzed, in no matrix, so --confirm cannot "
        "measure them again (--case-id cannot select them); they block as measured once")))
    return replace(decision, notes=tuple(notes))


def remeasure(sides: list[Side], case_ids: list[str], repeats: int, workdir: Path,
              rerun: Rerun | None = None,
              progress: Callable[[str], None] = lambda line: None) -> Remeasured:
    """Rerun ``case_ids`` ``repeats`` times on each side, the sides taking turns."""
    rerun = rerun or run_pytest
    measured = Remeasured(repeats, {s.name: s.python for s in sides})
    for side in sides:
        measured.records[side.name] = {cid: [] for cid in case_ids}
        measured.failures[side.name] = []
    for i in range(repeats):
        for side in sides:
            progress(f"confirm: rerun {i + 1}/{repeats} of the {side.name} ({len(case_ids)} "
                     f"case{'s' if len(case_ids) != 1 else ''}, {side.python})")
            outcome = rerun(side, case_ids, workdir / f"{side.name}-{i + 1}")
            if isinstance(outcome, str):
                measured.failures[side.name].append(f"rerun {i + 1}: {outcome}")
                continue
            by_id = outcome.by_id()
            for cid in case_ids:
                if cid in by_id:
                    measured.records[side.name][cid].append(by_id[cid])
    return measured


def run_pytest(side: Side, case_ids: list[str], report_dir: Path) -> RunResults | str:
    """One rerun: ``python -m pytest conformance/ ... --case-id ...`` from the suite's root
    (reports/confirm_plan.py has checked that it is there). A rerun that recorded another
    release than its side's run gives no figures."""
    _, args = rerun_args(side.results, case_ids, str(report_dir.resolve()), "conformance/")
    opts = side.results.options
    budget = (float(opts.get("compile_timeout") or 600) + float(opts.get("run_timeout") or 300)
              ) * len(case_ids) + RERUN_MARGIN_SECONDS
    command = [side.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               *(["-n", str(side.workers)] if side.workers > 1 else []), *args]
    try:
        proc = subprocess.run(command, cwd=SUITE_ROOT, env=side_env(side.python, side.results),
                              capture_output=True, text=True, encoding="utf-8",
                              errors="replace", timeout=min(budget, MAX_RERUN_SECONDS))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return one_line(f"{side.python} could not run pytest: {exc}")
    if proc.returncode not in (0, 1):  # 0, 1: finished, every case has a label
        tail = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
        return one_line(f"pytest exited {proc.returncode}: {tail[-1] if tail else 'no output'}")
    try:
        rerun = load_results(report_dir / "results.json")
    except ResultsError as exc:
        return one_line(str(exc))
    difference = release_difference(side.results.environment, rerun.environment)
    if difference:
        return one_line(f"the rerun ran another release than the {side.name} ({difference})")
    return rerun


def side_env(python: str, results: RunResults) -> dict[str, str]:
    """The environment a side's python runs in, for the release probe and the reruns alike:
    the gate's, without pytest's own variables, with the directory of ``python`` first on
    PATH (as activating its virtual environment would: a release's command-line tools, such
    as neuronx-cc, are found there, not the gate's). Never a PYTHONPATH the results file
    records (where the run imported its plugin and case modules): what the gate runs is what
    the user's own environment imports, not code a file points at (confirm_plan.py says to set
    it where the backend cannot be loaded without it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PATH"] = os.pathsep.join(p for p in (str(Path(python).parent), env.get("PATH")) if p)
    return env


def run_workers(results: RunResults) -> int:
    """How many xdist workers the run had (1 when it does not say)."""
    workers = results.environment.get("workers")
    return workers if isinstance(workers, int) and workers > 1 else 1


def confirm_decision(decision: GateDecision, measured: Remeasured) -> GateDecision:
    """The decision with every time finding of a case measured again confirmed, dismissed or
    unmeasured on the repeated figures; only dismissed ones stop blocking. Findings of cases
    left out (``--confirm-max-cases``) stay unconfirmed, and block."""
    remeasured = set(measured.records.get("candidate", {}))
    findings = [_confirmed(f, measured) if f.rule is not None and f.subject in remeasured
                else f for f in decision.findings]
    notes = [n for n in decision.notes if n.kind != "UNCONFIRMED"]  # the note below says it
    if any(f.rule for f in findings):
        notes.append(Note("CONFIRMATION", confirmation_note(findings, measured, remeasured)))
    return replace(decision, findings=ordered(findings), notes=tuple(notes))


def confirmation_note(findings: list[Finding], measured: Remeasured,
                      remeasured: set[str]) -> str:
    """What measuring again found: per status, the findings of the cases measured again; and
    how many flagged cases were left out (--confirm-max-cases)."""
    flagged = {f.subject for f in findings if f.rule is not None}
    fuzzed = len({c for c in flagged - remeasured if is_fuzzed(c)})
    cases, left_out = len(flagged & remeasured), len(flagged - remeasured) - fuzzed
    counts = {}
    for f in findings:
        if f.confirmation is not None and f.subject in remeasured:
            counts[f.confirmation.status] = counts.get(f.confirmation.status, 0) + 1
    who = f"candidate with {measured.pythons['candidate']}"
    if "baseline" in measured.pythons:
        who += f", baseline with {measured.pythons['baseline']}"
    else:
        who += ("; the baseline was not measured again (its recorded figures can confirm a "
                "finding, never dismiss one)")
    failed = sum(len(v) for v in measured.failures.values())
    return (f"{cases} flagged case{'s' if cases != 1 else ''} measured again "
            f"{measured.repeats} time{'s' if measured.repeats != 1 else ''}, cold, each with its "
            f"run's options: {who}; "
            + ", ".join(f"{n} {status}" for status, n in counts.items())
            + (f"; {failed} reruns gave no results" if failed else "")
            + (f"; {left_out} more flagged case{'s' if left_out != 1 else ''} not measured "
               f"again (--confirm-max-cases: those whose time grew by the largest factor, "
               f"compile and run taking turns, "
               "were), their findings unconfirmed and blocking" if left_out else "")
            + (f"; {fuzzed} flagged fuzzed case{'s' if fuzzed != 1 else ''} not measured "
               "again (in no matrix: --case-id cannot rerun it), unconfirmed and blocking"
               if fuzzed else ""))


def _confirmed(finding: Finding, measured: Remeasured) -> Finding:
    rule = finding.rule
    recorded = MEASURES[rule.measure](finding.old)
    candidate = _figures(measured, "candidate", finding.subject, rule.measure)
    baseline = _figures(measured, "baseline", finding.subject, rule.measure) \
        if "baseline" in measured.pythons else None
    confirmation = judge(rule, measured.repeats, recorded, candidate, baseline)
    return replace(finding, blocking=confirmation.blocking, confirmation=confirmation)


def _figures(measured: Remeasured, side: str, case_id: str, measure: str) -> Figures:
    seconds, failures = [], list(measured.failures.get(side, []))
    records = measured.records.get(side, {}).get(case_id, [])
    for record in records:
        value = MEASURES[measure](record)
        if value is None:
            failures.append(f"{record.label.value}" + (" (cache hit)" if record.cache_hit else ""))
        else:
            seconds.append(value)
    return Figures(measured.pythons[side], tuple(seconds), tuple(failures),
                   median_breakdown(records) if measure == "compile" else None)


def median_breakdown(records: list[Record]) -> dict[str, float] | None:
    """Each compile stage's median seconds over the records that reported stages."""
    breakdowns = [r.compile_breakdown for r in records
                  if r.compile_breakdown and MEASURES["compile"](r) is not None]
    if not breakdowns:
        return None
    stages = list(dict.fromkeys(s for b in breakdowns for s in b))
    return {s: statistics.median(b.get(s, 0.0) for b in breakdowns) for s in stages}


def default_python() -> str:
    """The candidate's python unless told otherwise: the one running the gate."""
    return sys.executable
