"""The release gate: may the candidate run ship, given the baseline and the known failures?

It may not ship (blocking findings) when
  - a case that passed in the baseline does not pass in the candidate (REGRESSION);
  - a case fails that the expectations do not list with that label (UNEXPECTED_FAILURE);
  - a case of the baseline is missing from the candidate (MISSING);
  - both runs compiled cold and a case's compile time grew past the budget (COMPILE_TIME);
  - with ``run_slack_seconds``: a case's run time grew past the run-time budget (RUN_TIME);
    (times are gated only between runs measured on one kind of machine:
    reports.compare.MACHINE_FIELDS)
  - with ``strict_expectations``: an expectation no longer matches a failure (STALE).
Fixes and stale expectations are reported as good news; new cases (in the candidate only)
are listed. Runs that cannot be compared (different backend, suite version, oracle (the
reference version) or case set definition: matrix, profile, case modules, case file,
``-k``/``-m``; a single shard; an interrupted run) raise GateInputError. A change of the
compile or run budget is a flagged note, not a refusal: the labels it affects are still judged. Time findings rest on one measurement
per run until reports/confirm.py measures them again (reports/timing.py: confirmed findings
block, findings dismissed as noise do not).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, replace

from reports.compare import DEFAULT_SLACK_SECONDS, compare_runs, slower_cases
from reports.expectations import (TRIAGE_REASON, Expectation, Expectations, decided_cases,
                                  misspelt_backends, shadowed_expectations,
                                  stale_expectations)
from records.text import first_line
from reports.formatting import precise_seconds
from reports.gate_notes import (Note, backend_notes, budget_notes, cold_cache_hit_notes,
                                merge_duplicate_notes, order_notes, run_times_not_gated)
from records.text import one_line
from records.results import Label, Record, RunResults
from records.selection import DEFINITION, first_difference, selection_of
from reports.summary import is_fuzzed, rerun_command, verdict_line
from reports.timing import Confirmation, StageGrowth, TimeRule, stage_growth

DEFAULT_BUDGET = 1.25
TEXT_ROWS_PER_KIND = 15
MESSAGE_CHARS = 160  # of a failure's first line in a text row
#: the most failing cases one printed rerun command names (more: the first ones)
RERUN_CASES = 20
BLOCKING_ORDER = ("REGRESSION", "UNEXPECTED_FAILURE", "MISSING", "COMPILE_TIME", "RUN_TIME",
                  "STALE")
#: findings that neither block nor are good news: listed so that nothing changes silently
LISTED_KINDS = ("NEW", "KNOWN")
CATEGORIES = ("blocking", "good news", "dismissed", "listed")


class GateInputError(ValueError):
    """The two runs cannot be compared; the message names the file and the fix."""


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str  # a case id, or an expectation's "file:line"
    detail: str
    blocking: bool
    old: Record | None = None  # the case in the baseline, when it is a case there
    new: Record | None = None  # the case in the candidate, when it is a case there
    rule: TimeRule | None = None  # a time finding's rule (COMPILE_TIME, RUN_TIME)
    stage: StageGrowth | None = None  # COMPILE_TIME: the stage that grew most, as recorded
    confirmation: Confirmation | None = None  # a time finding's: unconfirmed until measured

    @property
    def category(self) -> str:
        """blocking, good news, dismissed (a time finding measured again: noise), or listed
        (neither)."""
        if self.blocking:
            return "blocking"
        if self.confirmation is not None and not self.confirmation.blocking:
            return "dismissed"
        return "listed" if self.kind in LISTED_KINDS else "good news"

    @property
    def case_id(self) -> str | None:
        record = self.new or self.old
        return record.case_id if record else None

    @property
    def confirmation_suffix(self) -> str:
        """``; confirmed, measured again x3: ...`` for a time finding measured again, else ""."""
        c = self.confirmation
        return f"; {c.text}" if c is not None and c.status != "unconfirmed" else ""

    @property
    def why(self) -> str:
        """The first line of the candidate's message where its label is the finding (a
        failure, or a PASS that became UNSUPPORTED), else "": a time finding is about time."""
        if self.rule is not None or self.new is None or not self.new.message \
                or self.new.label in (Label.PASS, Label.COMPILED):
            return ""
        return first_line(self.new.message, MESSAGE_CHARS)


@dataclass(frozen=True)
class GateDecision:
    findings: tuple[Finding, ...]
    notes: tuple[Note, ...]
    baseline_verdict: str
    candidate_verdict: str
    case_ids: tuple[str, ...] = ()  # every case compared: the candidate's, then the missing

    @property
    def may_ship(self) -> bool:
        return not any(f.blocking for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.may_ship else 1

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


def _why_incomplete(run: RunResults, use: str) -> str:
    """Why a run says complete=false, and the fix: a merge that lacks a shard, or holds an
    interrupted one, or a run that was interrupted."""
    from reports.summary import records_held

    selected = run.selected_count or len(selection_of(run).case_ids or ())
    held = records_held(replace(run, selected_count=selected)) if selected else ""
    held = f"{held}; " if held else ""
    merged = run.options.get("merged_shards")
    if merged:
        from reports.merge_facts import lacking_shards, unfinished_parts

        lacking = lacking_shards(run)
        if lacking is None:
            return (f"its options.merged_shards {one_line(repr(merged))[:120]} is not a list "
                    "of I/N shard names of one run (complete=false); "
                    f"{use} a file flexconf merge wrote")
        if lacking:
            shown = ", ".join(lacking[:10]) + (f" and {len(lacking) - 10} more"
                                               if len(lacking) > 10 else "")
            return (f"a merge of shard(s) {', '.join(map(str, merged[:10]))}"
                    f"{' ...' if len(merged) > 10 else ''} without shard(s) {shown} ({held}"
                    f"complete=false); merge the missing shard(s) in (flexconf merge) and "
                    f"{use} the merged file")

        parts = unfinished_parts(run)
        if parts:
            named = "; ".join(
                f"{one_line(p.file)}" + (f" (shard {one_line(p.shard)})" if p.shard else "")
                + (f", --resume {shlex.quote(p.report_dir)}" if p.report_dir else "")
                for p in parts)
            return (f"a merge of a part whose run did not finish ({held}complete=false): "
                    f"{named}; finish it with --resume, merge again and {use} that")
        return (f"a merge one of whose shards was interrupted or lacks cases ({held}"
                f"complete=false); finish that shard with --resume, merge again and {use} that")
    report_dir = run.options.get("report_dir")
    if not report_dir:
        return (f"the run was interrupted ({held}complete=false); finish it with --resume "
                f"REPORT_DIR, or {use} a finished run")
    from conformance.run_info import matrix_path
    from reports.summary import resume_command

    return (f"the run was interrupted ({held}complete=false); finish it ("
            f"{resume_command(run, report_dir, matrix_path())}) and {use} that, or {use} a "
            "finished run")


def not_a_whole_finished_run(run: RunResults, use: str) -> str | None:
    """Why ``run`` cannot stand for the run it is part of (a compile-only pass, an interrupted
    run, one shard), and the fix, with ``use`` ("gate", "update from") as what to do with
    the right file; None when it can. The gate and ``expectations update`` both judge a run
    by its whole, finished results."""
    if run.options.get("phase") == "compile":
        return (f"a compile-only pass (--phase compile) judged no numbers; {use} the run that "
                "followed it")
    if not run.complete:
        return _why_incomplete(run, use)
    shard = selection_of(run).shard
    if shard:
        return (f"shard {shard} of a run, not the whole run; merge the shards first (flexconf "
                f"merge) and {use} the merged file")
    lacking = _selected_without_record(run)  # a shard's selection is the whole run's
    if lacking:  # complete says every selected case has one: an edited or damaged file
        return (f"it says complete, but {lacking[0]} of its {lacking[1]} selected cases have no "
                f"record (an edited or damaged file); {use} a results file a run wrote")
    return None


def _selected_without_record(run: RunResults) -> tuple[int, int] | None:
    """(cases without a record, cases selected) of a run whose selection names more cases
    than its records hold; None when every selected case has its record."""
    recorded = {r.case_id for r in run.records}
    ids = selection_of(run).case_ids
    if ids:
        missing = sum(cid not in recorded for cid in ids)
        return (missing, len(ids)) if missing else None
    selected = run.selected_count
    if isinstance(selected, int) and selected > len(recorded):
        return selected - len(recorded), selected
    return None


def check_comparable(baseline: RunResults, candidate: RunResults,
                     baseline_name: str = "baseline", candidate_name: str = "candidate") -> None:
    """Raise GateInputError when the runs are not two complete, whole runs of one suite and
    one case set definition (reports/selection.py: matrix, profile, case modules, case file,
    -k, -m)."""
    for name, run in ((baseline_name, baseline), (candidate_name, candidate)):
        problem = not_a_whole_finished_run(run, "gate")
        if problem:
            raise GateInputError(f"{name}: {problem}")
    if baseline.started_at and (baseline.started_at, baseline.environment.get("host")) == \
            (candidate.started_at, candidate.environment.get("host")):
        raise GateInputError(f"{baseline_name} and {candidate_name} are the same run (started "
                             f"{one_line(baseline.started_at)}): a copy compared with itself "
                             "shows nothing; gate a new run of the candidate release")
    differences = [(what, repr(old), repr(new)) for what, old, new in (
        ("backend", baseline.options.get("backend"), candidate.options.get("backend")),
        ("suite version", baseline.suite_version, candidate.suite_version)) if old != new]
    definition = first_difference(selection_of(baseline), selection_of(candidate), DEFINITION)
    if definition:
        differences.append(definition)
    if differences:
        what, old, new = differences[0]
        raise GateInputError(f"{candidate_name}: {what} {new} differs from the baseline's {old} "
                             f"({baseline_name}); gate two runs of the same {what}")
    _check_same_oracle(baseline, candidate, baseline_name, candidate_name)


def _check_same_oracle(baseline: RunResults, candidate: RunResults, baseline_name: str,
                       candidate_name: str) -> None:
    """Raise GateInputError when another oracle judged the baseline: a label that changed
    could then be the suite's change, not the release's. A file that records no version
    (written before 2026-12-04) is not checked: what was not recorded cannot be."""
    old, new = baseline.reference_version, candidate.reference_version
    if old is None or new is None or old == new:
        return
    # the run judged by the older oracle is the one to run again (versions only grow)
    older, older_name, newer = (baseline, baseline_name, candidate) \
        if _version_order(old) < _version_order(new) else (candidate, candidate_name, baseline)
    revision = newer.environment.get("git_revision")  # "<sha>", "<sha>-dirty" or None
    clean = isinstance(revision, str) and not revision.endswith("-dirty")
    at_revision = f", git checkout {one_line(revision)}" if clean else ""
    raise GateInputError(
        f"{candidate_name}: reference version {one_line(repr(new))} differs from the "
        f"baseline's {one_line(repr(old))} ({baseline_name}): another oracle judged it; run "
        f"{older_name} again with the suite that judged the other (reference version "
        f"{one_line(repr(newer.reference_version))}{at_revision})")


def _version_order(version) -> float:
    return float(version) if isinstance(version, (int, float)) else float("-inf")


def decide(baseline: RunResults, candidate: RunResults,
           expectations: Expectations | None = None, budget: float = DEFAULT_BUDGET,
           slack_seconds: float = DEFAULT_SLACK_SECONDS,
           strict_expectations: bool = False, run_budget: float = DEFAULT_BUDGET,
           run_slack_seconds: float | None = None) -> GateDecision:
    """The decision on one measurement per run; ``run_slack_seconds`` (None: off) turns on
    the run-time rule."""
    # "not x >= 1": nan compares false with everything, and as a budget it let every time
    # through; inf is a real choice (no limit: the rule off)
    for flag, factor in (("--compile-time-budget", budget), ("--run-time-budget", run_budget)):
        if not factor >= 1:
            raise GateInputError(f"{flag} {factor:g} is not a factor >= 1; give a factor such as "
                                 "1.25 (25% slower allowed), or inf for no limit")
    for flag, slack in (("--compile-time-slack", slack_seconds),
                        ("--run-time-slack", run_slack_seconds)):
        if slack is not None and not slack >= 0:
            raise GateInputError(f"{flag} {slack:g} is not a number of seconds >= 0; give e.g. "
                                 "0.5")
    if run_slack_seconds == float("inf"):  # no growth exceeds it, and it silenced the note
        raise GateInputError("--run-time-slack inf gates no run time, and would hide the note "
                             "that names cases far slower; give seconds, e.g. 0.01, or leave "
                             "the option out")
    if run_slack_seconds is not None and run_budget == float("inf"):  # the same, by the factor
        raise GateInputError("--run-time-budget inf with --run-time-slack gates no run time, "
                             "and would hide the note that names cases far slower; give a "
                             "factor, e.g. 1.25, or leave --run-time-slack out")
    comparison = compare_runs(baseline, candidate, budget, slack_seconds)
    old, new = baseline.by_id(), candidate.by_id()
    backend = candidate.options.get("backend", "")
    findings: list[Finding] = []
    notes = order_notes(baseline, candidate) + budget_notes(baseline, candidate) \
        + backend_notes(baseline, candidate) \
        + cold_cache_hit_notes(baseline, candidate) + merge_duplicate_notes(baseline, candidate)
    regressed = {c.case_id for c in comparison.regressions}
    for change in comparison.regressions:
        findings.append(Finding("REGRESSION", change.case_id, f"PASS -> {change.after.value}",
                                True, old[change.case_id], new[change.case_id]))
    expected_count, untriaged = 0, []
    for rec in candidate.records:
        if rec.label.acceptable or rec.case_id in regressed:
            continue
        entry = expectations.lookup(backend, rec.case_id) if expectations else None
        if entry is not None and entry.label is rec.label:
            expected_count += 1
            if entry.reason.startswith(TRIAGE_REASON):
                untriaged.append(entry)
            findings.append(Finding("KNOWN", rec.case_id, f"{rec.label.value} as expected "
                                    f"({_where(entry)}): {entry.reason}", False,
                                    old.get(rec.case_id), rec))
            continue
        why = (f"expected {entry.label.value} ({_where(entry)})" if entry
               else "not in the expectations" if expectations is not None
               else "the gate was given no --expectations")
        findings.append(Finding("UNEXPECTED_FAILURE", rec.case_id, f"{rec.label.value}; {why}",
                                True, old.get(rec.case_id), rec))
    for rec in comparison.missing:
        findings.append(Finding("MISSING", rec.case_id,
                                f"in the baseline ({rec.label.value}), absent now", True, rec))
    machines = comparison.machines
    compiles = candidate.environment.get("compiled") is not False  # unrecorded: it may
    rules = [TimeRule("compile", budget, slack_seconds)] \
        if comparison.both_cold and machines is None and compiles else []
    if run_slack_seconds is not None and machines is None:
        rules.append(TimeRule("run", run_budget, run_slack_seconds))
    elif run_slack_seconds is None and machines is None:
        notes += run_times_not_gated(baseline, candidate)
    for rule in rules:
        for c in slower_cases(baseline, candidate, rule.measure, rule.factor, rule.slack_seconds):
            findings.append(time_finding(rule, old[c.case_id], new[c.case_id], c.before, c.after))
    if any(f.rule for f in findings):
        notes.append(Note("UNCONFIRMED", "time findings are unconfirmed: each case was measured "
                          "once per run; --confirm N measures the flagged cases again and "
                          "dismisses those that do not reproduce"))
    if machines is not None:
        notes.append(Note("TIMES_NOT_GATED", f"times not gated: {machines}; run the baseline "
                          "again on the candidate's machine to gate them", flagged=True))
    if not compiles:
        notes.append(Note("COMPILE_NOT_GATED", f"compile times not gated: "
                          f"{one_line(candidate.options.get('backend', 'the backend'))} compiles "
                          "nothing (compiled = False): its first call is timed, not compiled"))
    elif not comparison.both_cold:
        caches = [r.options.get("compile_cache", "unknown") for r in (baseline, candidate)]
        notes.append(Note("COMPILE_NOT_GATED", f"compile times not gated: compile_cache is "
                          f"{caches[0]} (baseline) and {caches[1]} (candidate); both must be cold"))
    for change in comparison.fixes:
        findings.append(Finding("FIXED", change.case_id, f"{change.before.value} -> PASS", False,
                                old[change.case_id], new[change.case_id]))
    for rec in comparison.new:
        findings.append(Finding("NEW", rec.case_id, f"not in the baseline; {rec.label.value} now",
                                False, None, rec))
    if expectations is not None:
        for entry in stale_expectations(expectations, candidate):
            decided = decided_cases(expectations, entry, candidate)
            passing = sum(r.label is Label.PASS for r in decided)
            findings.append(Finding(
                "STALE", f"{expectations.source}:{entry.line}" if entry.line else entry.case,
                f"{entry.case} expects {entry.label.value}, which none of the {len(decided)} "
                f"case(s) it decides shows now ({passing} pass, {len(decided) - passing} fail "
                "otherwise); flexconf expectations update drops it", strict_expectations))
        if expected_count:
            notes.append(Note("KNOWN_FAILURES", f"{expected_count} known failures listed in "
                              f"{expectations.source}"))
        misspelt = misspelt_backends(expectations, backend)
        if misspelt:
            notes.append(Note("MISSPELT_BACKEND", (
                f"{len(misspelt)} entr{'y' if len(misspelt) == 1 else 'ies'} of "
                f"{expectations.source} name backend {misspelt[0].backend!r} "
                f"({_where(misspelt[0])}), not the candidate's {backend!r}: they apply to none "
                "of its cases; fix the name if it is meant"), flagged=True))
        unmatched = unmatched_expectations(expectations, candidate)
        if unmatched:
            notes.append(Note("UNMATCHED_EXPECTATIONS", (
                f"{len(unmatched)} entr{'y' if len(unmatched) == 1 else 'ies'} of "
                f"{expectations.source} for this backend match no case of the candidate (e.g. "
                f"{_where(unmatched[0])}: {unmatched[0].case!r}): a misspelt id or glob, or "
                "cases this run did not select")))
        shadowed = shadowed_expectations(expectations, candidate)
        if shadowed:
            entry, winner = shadowed[0]
            fix = ("the first glob in the file decides a case: move the narrower one first"
                   if winner.is_glob else "an exact id decides its case before any glob")
            notes.append(Note("SHADOWED_EXPECTATIONS", (
                f"{len(shadowed)} entr{'y' if len(shadowed) == 1 else 'ies'} of "
                f"{expectations.source} match cases of the candidate but decide none, so "
                f"their labels and reasons apply to none of them (e.g. {_where(entry)}: "
                f"{entry.case!r}, whose case {_where(winner)}: {winner.case!r} decides; {fix})")))
        if untriaged:
            first = untriaged[0]
            notes.append(Note("UNTRIAGED", f"{len(untriaged)} known failure(s) still read "
                              f"'{TRIAGE_REASON} ...', as flexconf expectations update wrote "
                              f"them (e.g. {_where(first)}): accepted as known but never looked "
                              "at; give each a reason and a link", flagged=True))
    if baseline.options.get("seed") != candidate.options.get("seed"):
        notes.append(Note("SEED_CHANGE", f"seeds differ (baseline {baseline.options.get('seed')}, "
                          f"candidate {candidate.options.get('seed')}): inputs differ"))
    notes += _rerun_note(findings, candidate)
    compared = [r.case_id for r in candidate.records] + [r.case_id for r in comparison.missing]
    return GateDecision(ordered(findings), tuple(notes), verdict_line(baseline, False),
                        verdict_line(candidate, False), tuple(compared))


def _rerun_note(findings: list[Finding], candidate: RunResults) -> list[Note]:
    """The command that reruns the candidate's blocking failures (REGRESSION,
    UNEXPECTED_FAILURE) with the candidate's own options, into a directory of their own: the
    first step of triage (does it reproduce? then `flexconf repro` of the rerun)."""
    blocking = [f.subject for f in ordered(findings)
                if f.kind in ("REGRESSION", "UNEXPECTED_FAILURE")]
    failing = [i for i in blocking if not is_fuzzed(i)]  # in no matrix: --case-id cannot
    fuzzed = [i for i in blocking if is_fuzzed(i)]
    notes = []
    if failing:
        which = (f"the {len(failing)} blocking case{'s' if len(failing) != 1 else ''}"
                 if len(failing) <= RERUN_CASES
                 else f"the first {RERUN_CASES} of the {len(failing)} blocking cases")
        notes.append(Note("RERUN", f"rerun {which} of the candidate: "
                          f"{rerun_command(candidate, failing[:RERUN_CASES])}"))
    if fuzzed:
        notes.append(Note("RERUN", f"{len(fuzzed)} blocking fuzzed case(s) are in no matrix; "
                          f"reproduce each from the candidate's results, e.g. "
                          f"{rerun_command(candidate, fuzzed[0])}"))
    return notes


def ordered(findings) -> tuple[Finding, ...]:
    """Blocking first, then good news, dismissed, listed; by kind within each (stable)."""
    order = {kind: i for i, kind in enumerate(BLOCKING_ORDER + LISTED_KINDS)}
    return tuple(sorted(findings, key=lambda f: (CATEGORIES.index(f.category),
                                                 order.get(f.kind, len(order)))))


def time_finding(rule: TimeRule, old: Record, new: Record, before: float,
                 after: float) -> Finding:
    """A COMPILE_TIME or RUN_TIME finding, blocking until measured again; a compile-time one
    names the stage that grew most when both records carry a breakdown."""
    stage = stage_growth(old.compile_breakdown, new.compile_breakdown) \
        if rule.measure == "compile" else None
    detail = (f"{precise_seconds(before)} s -> {precise_seconds(after)} s "
              f"({rule.verdict(before, after)})"
              + (f"; {stage.text}" if stage else ""))
    return Finding(rule.kind, new.case_id, detail, True, old, new, rule, stage,
                   Confirmation("unconfirmed", rule))


def unmatched_expectations(expectations: Expectations,
                           results: RunResults) -> list[Expectation]:
    """Entries for the run's backend whose case id or glob matches no case of the run."""
    backend = results.options.get("backend", "")
    return [entry for entry in expectations.entries if entry.applies_to(backend)
            and not any(entry.matches(backend, r.case_id) for r in results.records)]


def _where(entry: Expectation) -> str:
    return f"line {entry.line}" if entry.line else entry.case


def headline(decision: GateDecision) -> str:
    if decision.may_ship:
        return "MAY SHIP"
    n = len(decision.blocking)
    return f"MAY NOT SHIP: {n} blocking finding{'s' if n != 1 else ''}"


def finding_counts(decision: GateDecision) -> str:
    """``blocking: 2 REGRESSION, 1 MISSING; good news: 3 FIXED; listed: 1 NEW``."""
    parts = []
    for category in CATEGORIES:
        counts: dict[str, int] = {}
        for f in decision.findings:
            if f.category == category:
                counts[f.kind] = counts.get(f.kind, 0) + 1
        if counts:
            parts.append(f"{category}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return "; ".join(parts) or "no findings"


_MARKS = {"blocking": "x", "good news": "+", "dismissed": "~", "listed": "*"}


def gate_text(decision: GateDecision, baseline_name: str, candidate_name: str) -> str:
    """The short table printed on the terminal (at most TEXT_ROWS_PER_KIND rows per kind);
    a failing case's row ends with the first line of its message. Control characters are
    escaped."""
    lines = [f"gate: {headline(decision)} ({finding_counts(decision)})",
             f"  baseline   {baseline_name}: {decision.baseline_verdict}",
             f"  candidate  {candidate_name}: {decision.candidate_verdict}"]
    lines += [f"  ! {note.kind}: {note.text}" for note in decision.notes if note.flagged]
    if decision.findings:
        width = min(max(len(one_line(f.subject)) for f in decision.findings), 72)
        lines.append("")
        # counted per category too: dismissed time findings listed after confirmed ones of
        # their kind are never hidden in the count of the blocking ones
        shown: dict[tuple[str, str], int] = {}
        for f in decision.findings:
            key = (f.category, f.kind)
            shown[key] = shown.get(key, 0) + 1
            if shown[key] <= TEXT_ROWS_PER_KIND:
                why = f" — {f.why}" if f.why else ""
                lines.append(f"  {_MARKS[f.category]} {f.kind:<18} {one_line(f.subject):<{width}}"
                             f"  {f.detail}{why}")
                if f.confirmation is not None and f.confirmation.status != "unconfirmed":
                    lines.append(f"      {f.confirmation.text}")
        for (category, kind), n in shown.items():
            if n > TEXT_ROWS_PER_KIND:
                lines.append(f"  ... and {n - TEXT_ROWS_PER_KIND} more {kind} ({category}; "
                             "--markdown or --json FILE lists all)")
    lines += [f"  note: {note.text}" for note in decision.notes if not note.flagged]
    return "\n".join(one_line(line) for line in lines) + "\n"
