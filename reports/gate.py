"""The release gate: may the candidate run ship, given the baseline and the known failures?

It may not ship (blocking findings) when
  - a case that passed in the baseline does not pass in the candidate (REGRESSION);
  - a case fails that the expectations do not list with that label (UNEXPECTED_FAILURE);
  - a case of the baseline is missing from the candidate (MISSING);
  - both runs compiled cold and a case's compile time grew past the budget (COMPILE_TIME);
  - with ``strict_expectations``: an expectation no longer matches a failure (STALE).
Fixes and stale expectations are reported as good news. Runs that cannot be compared
(different backend, profile or suite version, or an interrupted run) raise GateInputError.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.compare import DEFAULT_SLACK_SECONDS, compare_runs
from reports.expectations import Expectation, Expectations
from reports.formatting import fmt_seconds
from reports.markdown import md_code, md_table, md_text
from records.results import RunResults
from reports.summary import verdict_line

DEFAULT_BUDGET = 1.25
TEXT_ROWS_PER_KIND = 15
BLOCKING_ORDER = ("REGRESSION", "UNEXPECTED_FAILURE", "MISSING", "COMPILE_TIME", "STALE")


class GateInputError(ValueError):
    """The two runs cannot be compared; the message names the file and the fix."""


@dataclass(frozen=True)
class Finding:
    kind: str
    subject: str  # a case id, or an expectation's "file:line"
    detail: str
    blocking: bool


@dataclass(frozen=True)
class GateDecision:
    findings: tuple[Finding, ...]
    notes: tuple[str, ...]
    baseline_verdict: str
    candidate_verdict: str

    @property
    def may_ship(self) -> bool:
        return not any(f.blocking for f in self.findings)

    @property
    def exit_code(self) -> int:
        return 0 if self.may_ship else 1

    @property
    def blocking(self) -> list[Finding]:
        return [f for f in self.findings if f.blocking]


def check_comparable(baseline: RunResults, candidate: RunResults,
                     baseline_name: str = "baseline", candidate_name: str = "candidate") -> None:
    """Raise GateInputError when the runs are not two complete runs of one suite setup."""
    for name, run in ((baseline_name, baseline), (candidate_name, candidate)):
        if run.options.get("phase") == "compile":
            raise GateInputError(f"{name}: a compile-only pass (--phase compile) judged no "
                                 "numbers; gate on the run that followed it")
        if not run.complete:
            raise GateInputError(f"{name}: the run was interrupted (complete=false); "
                                 "gate on a finished run")
    for what, old, new in (
            ("backend", baseline.options.get("backend"), candidate.options.get("backend")),
            ("profile", baseline.options.get("profile"), candidate.options.get("profile")),
            ("suite version", baseline.suite_version, candidate.suite_version)):
        if old != new:
            raise GateInputError(
                f"{candidate_name}: {what} {new!r} differs from the baseline's {old!r} "
                f"({baseline_name}); gate two runs of the same {what}")


def decide(baseline: RunResults, candidate: RunResults,
           expectations: Expectations | None = None, budget: float = DEFAULT_BUDGET,
           slack_seconds: float = DEFAULT_SLACK_SECONDS,
           strict_expectations: bool = False) -> GateDecision:
    if budget < 1:
        raise GateInputError(f"--compile-time-budget {budget} is below 1; give a factor such "
                             "as 1.25 (25% slower allowed)")
    comparison = compare_runs(baseline, candidate, budget, slack_seconds)
    backend = candidate.options.get("backend", "")
    findings: list[Finding] = []
    notes: list[str] = []
    regressed = {c.case_id for c in comparison.regressions}
    for change in comparison.regressions:
        findings.append(Finding("REGRESSION", change.case_id,
                                f"PASS -> {change.after.value}", True))
    expected_count = 0
    for rec in candidate.records:
        if rec.label.acceptable or rec.case_id in regressed:
            continue
        entry = expectations.lookup(backend, rec.case_id) if expectations else None
        if entry is not None and entry.label is rec.label:
            expected_count += 1
            continue
        why = (f"expected {entry.label.value} ({_where(entry)})" if entry
               else "not in the expectations")
        findings.append(Finding("UNEXPECTED_FAILURE", rec.case_id,
                                f"{rec.label.value}; {why}", True))
    for rec in comparison.missing:
        findings.append(Finding("MISSING", rec.case_id,
                                f"in the baseline ({rec.label.value}), absent now", True))
    if comparison.both_cold:
        for c in comparison.slower:
            findings.append(Finding(
                "COMPILE_TIME", c.case_id,
                f"{fmt_seconds(c.before)} s -> {fmt_seconds(c.after)} s "
                f"(x{c.ratio:.2f} >= x{budget:g})", True))
    else:
        caches = [r.options.get("compile_cache", "unknown") for r in (baseline, candidate)]
        notes.append(f"compile times not gated: compile_cache is {caches[0]} (baseline) and "
                     f"{caches[1]} (candidate); both must be cold")
    for change in comparison.fixes:
        findings.append(Finding("FIXED", change.case_id, f"{change.before.value} -> PASS", False))
    if expectations is not None:
        for entry in stale_expectations(expectations, candidate):
            findings.append(Finding(
                "STALE", f"{expectations.source}:{entry.line}" if entry.line else entry.case,
                f"{entry.case} expects {entry.label.value}, which no case shows now",
                strict_expectations))
        if expected_count:
            notes.append(f"{expected_count} known failures listed in {expectations.source}")
    if baseline.options.get("seed") != candidate.options.get("seed"):
        notes.append(f"seeds differ (baseline {baseline.options.get('seed')}, candidate "
                     f"{candidate.options.get('seed')}): inputs differ")
    order = {kind: i for i, kind in enumerate(BLOCKING_ORDER)}
    findings.sort(key=lambda f: (not f.blocking, order.get(f.kind, len(order))))
    return GateDecision(tuple(findings), tuple(notes), verdict_line(baseline),
                        verdict_line(candidate))


def stale_expectations(expectations: Expectations, results: RunResults) -> list[Expectation]:
    """Entries for the run's backend that cover cases of the run, none with the expected
    label (the failure was fixed, or it now fails differently)."""
    backend = results.options.get("backend", "")
    stale = []
    for entry in expectations.entries:
        if not entry.applies_to(backend):
            continue
        covered = [r for r in results.records if entry.matches(backend, r.case_id)
                   and expectations.lookup(backend, r.case_id) is entry]
        if covered and not any(r.label is entry.label for r in covered):
            stale.append(entry)
    return stale


def _where(entry: Expectation) -> str:
    return f"line {entry.line}" if entry.line else entry.case


def headline(decision: GateDecision) -> str:
    if decision.may_ship:
        return "MAY SHIP"
    n = len(decision.blocking)
    return f"MAY NOT SHIP: {n} blocking finding{'s' if n != 1 else ''}"


def finding_counts(decision: GateDecision) -> str:
    """``blocking: 2 REGRESSION, 1 MISSING; good news: 3 FIXED``."""
    parts = []
    for blocking, title in ((True, "blocking"), (False, "good news")):
        counts: dict[str, int] = {}
        for f in decision.findings:
            if f.blocking is blocking:
                counts[f.kind] = counts.get(f.kind, 0) + 1
        if counts:
            parts.append(f"{title}: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    return "; ".join(parts) or "no findings"


def gate_text(decision: GateDecision, baseline_name: str, candidate_name: str) -> str:
    """The short table printed on the terminal (at most TEXT_ROWS_PER_KIND rows per kind)."""
    lines = [f"gate: {headline(decision)} ({finding_counts(decision)})",
             f"  baseline   {baseline_name}: {decision.baseline_verdict}",
             f"  candidate  {candidate_name}: {decision.candidate_verdict}"]
    if decision.findings:
        width = min(max(len(f.subject) for f in decision.findings), 72)
        lines.append("")
        shown: dict[str, int] = {}
        for f in decision.findings:
            shown[f.kind] = shown.get(f.kind, 0) + 1
            if shown[f.kind] <= TEXT_ROWS_PER_KIND:
                mark = "x" if f.blocking else "+"
                lines.append(f"  {mark} {f.kind:<18} {f.subject:<{width}}  {f.detail}")
        for kind, n in shown.items():
            if n > TEXT_ROWS_PER_KIND:
                lines.append(f"  ... and {n - TEXT_ROWS_PER_KIND} more {kind} "
                             "(--markdown FILE lists all)")
    lines += [f"  note: {note}" for note in decision.notes]
    return "\n".join(lines) + "\n"


def gate_markdown(decision: GateDecision, baseline_name: str, candidate_name: str) -> str:
    """The same, as markdown for a pull-request comment."""
    mark = "✅" if decision.may_ship else "❌"
    lines = [f"## Release gate: {mark} {md_text(headline(decision))}", "",
             md_text(finding_counts(decision)), "",
             f"- baseline {md_code(baseline_name)}: {md_text(decision.baseline_verdict)}",
             f"- candidate {md_code(candidate_name)}: {md_text(decision.candidate_verdict)}", ""]
    if decision.findings:
        lines += md_table(["", "finding", "case", "detail"], [
            ["blocking" if f.blocking else "good news", f.kind, md_code(f.subject),
             md_text(f.detail)] for f in decision.findings])
        lines.append("")
    lines += [f"- {md_text(note)}" for note in decision.notes]
    return "\n".join(lines).rstrip() + "\n"
