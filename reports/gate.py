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
``-k``/``-m``, ``--case-id``; a single shard; an interrupted run) raise GateInputError
(reports/gate_inputs.py). A change of the
compile or run budget is a flagged note, not a refusal: the labels it affects are still judged. Time findings rest on one measurement
per run until reports/confirm.py measures them again (reports/timing.py: confirmed findings
block, findings dismissed as noise do not).
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.compare import DEFAULT_SLACK_SECONDS, compare_runs, slower_cases
from reports.expectations import (TRIAGE_REASON, Expectation, Expectations, decided_cases,
                                  misspelt_backends, shadowed_expectations,
                                  stale_expectations)
from records.text import first_line
from reports.formatting import precise_seconds
from reports.gate_notes import (Note, backend_notes, budget_notes, cold_cache_hit_notes,
                                merge_duplicate_notes, order_notes, run_times_not_gated)
from records.text import one_line
from records.results import Label, Record, RunResults, is_fuzzed
from reports.summary import rerun_command, verdict_line
from reports.gate_inputs import GateInputError
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
        message = first_line(self.new.message, MESSAGE_CHARS)
        # a KNOWN row whose reason quotes the message already (expectations update writes "to
        # triage: <message>"): said once, not "X — X" (an outside audit)
        return "" if self.kind == "KNOWN" and message in self.detail else message


@dataclass(frozen=True)
class GateDecision:
    findings: tuple[Finding, ...]
    notes: tuple[Note, ...]
    baseline_verdict: str
    candidate_verdict: str
    case_ids: tuple[str, ...] = ()  # every case compared: the candidate's, then the missing
    baseline_release: str = ""  # records.release.release_text of each run's environment
    candidate_release: str = ""

    @property
    def may_ship(self) -> bool:
        return not any(f.blocking for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.may_ship else 1

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


def decide(baseline: RunResults, candidate: RunResults,
           expectations: Expectations | None = None, budget: float = DEFAULT_BUDGET,
           slack_seconds: float = DEFAULT_SLACK_SECONDS,
           strict_expectations: bool = False, run_budget: float = DEFAULT_BUDGET,
           run_slack_seconds: float | None = None) -> GateDecision:
    """The decision on one measurement per run; ``run_slack_seconds`` (None: off) turns on
    the run-time rule."""
    # "not x >= 1": nan compares false with everything, and as a budget it let every time
    # through; inf is a real choice for compile time (no limit: the rule off), not for run
    # time, whose inf with a slack is refused below (an outside audit: the message offered inf
    # for both, and the next try refused it)
    for flag, factor, off in (("--compile-time-budget", budget, ", or inf for no limit"),
                              ("--run-time-budget", run_budget, "")):
        if not factor >= 1:
            raise GateInputError(f"{flag} {factor:g} is not a factor >= 1; give a factor such as "
                                 f"1.25 (25% slower allowed){off}")
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
    from records.release import release_text

    return GateDecision(ordered(findings), tuple(notes), verdict_line(baseline, False),
                        verdict_line(candidate, False), tuple(compared),
                        release_text(baseline.environment), release_text(candidate.environment))


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


def release_suffix(release: str) -> str:
    """`` · torch 2.14.1+cu130`` after a run's verdict: which release the gate judged."""
    return f" · {release}" if release else ""


def gate_text(decision: GateDecision, baseline_name: str, candidate_name: str) -> str:
    """The short table printed on the terminal (at most TEXT_ROWS_PER_KIND rows per kind);
    a failing case's row ends with the first line of its message. Control characters are
    escaped."""
    lines = [f"gate: {headline(decision)} ({finding_counts(decision)})",
             f"  baseline   {baseline_name}: {decision.baseline_verdict}"
             + release_suffix(decision.baseline_release),
             f"  candidate  {candidate_name}: {decision.candidate_verdict}"
             + release_suffix(decision.candidate_release)]
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
