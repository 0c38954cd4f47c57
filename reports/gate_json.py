"""The gate's decision as JSON (``flexconf gate --json FILE``), for CI systems and bots.

    {"schema": "flexattention-conformance/gate", "schema_version": 1,
     "verdict": "MAY_SHIP" | "MAY_NOT_SHIP" | "REFUSED", "exit_code": 0 | 1 | 2,
     "exit_code_meaning": "...", "headline": "...", "counts": {"REGRESSION": 1, ...},
     "baseline": {"file", "verdict", "suite_version", "reference_version", "backend",
                  "release", "selection"}, "candidate": {...},
     "findings": [{"kind", "category", "blocking", "subject", "case_id", "detail",
                   "old_label", "new_label", "old_compile_seconds", "new_compile_seconds",
                   "old_run_seconds", "new_run_seconds", "message_first_line", "message",
                   "stage_grew_most", "confirmation"}],
     "notes": [{"kind", "text", "flagged"}],
     "error": null | "the one-line reason of a refusal"}

Labels, times and messages are null where the case is not in that run (or the finding is not
about a case: STALE names an expectation). ``message`` is the candidate's full message.
``category`` is blocking, good news, dismissed (a time finding that its reruns did not
reproduce) or listed. Time findings (COMPILE_TIME, RUN_TIME) carry ``confirmation``
(reports/timing.py, ``Confirmation.to_json``: status confirmed, dismissed, inconclusive,
unmeasured or unconfirmed, the rule, and each side's repeated figures with median, min and max) and
COMPILE_TIME ones ``stage_grew_most`` ({"stage", "old_seconds", "new_seconds"} from the
recorded breakdowns, or null); both are null for other findings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from records.text import first_line
from reports.gate import Finding, GateDecision, finding_counts, headline
from reports.timing import stage_json
from records.files import strict_json_text, write_text_atomic
from records.results import Record, RunResults
from records.selection import selection_of

SCHEMA_NAME = "flexattention-conformance/gate"
SCHEMA_VERSION = 1
EXIT_MEANINGS = {
    0: "the candidate may ship",
    1: "the candidate may not ship: at least one blocking finding",
    2: "bad input: the runs could not be compared or a file could not be read; nothing judged",
}


def gate_json(decision: GateDecision, baseline: RunResults, candidate: RunResults,
              baseline_name: str, candidate_name: str) -> dict[str, Any]:
    """The decision, every finding and note, as a JSON-ready dict."""
    code = decision.exit_code
    counts: dict[str, int] = {}
    for f in decision.findings:
        counts[f.kind] = counts.get(f.kind, 0) + 1
    return {
        "schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION,
        "verdict": "MAY_SHIP" if decision.may_ship else "MAY_NOT_SHIP",
        "exit_code": code, "exit_code_meaning": EXIT_MEANINGS[code],
        "headline": f"{headline(decision)} ({finding_counts(decision)})",
        "counts": counts,
        "baseline": _run(baseline, baseline_name, decision.baseline_verdict),
        "candidate": _run(candidate, candidate_name, decision.candidate_verdict),
        "findings": [_finding(f) for f in decision.findings],
        "notes": [{"kind": n.kind, "text": n.text, "flagged": n.flagged} for n in decision.notes],
        "error": None,
    }


def refusal_json(error: str, baseline_name: str, candidate_name: str) -> dict[str, Any]:
    """What ``--json`` holds when the gate refused to judge (exit 2)."""
    return {"schema": SCHEMA_NAME, "schema_version": SCHEMA_VERSION, "verdict": "REFUSED",
            "exit_code": 2, "exit_code_meaning": EXIT_MEANINGS[2], "headline": f"REFUSED: {error}",
            "counts": {}, "baseline": {"file": baseline_name},
            "candidate": {"file": candidate_name}, "findings": [], "notes": [], "error": error}


def write_json(data: dict[str, Any], path: str | Path) -> None:
    write_text_atomic(path, strict_json_text(data) + "\n")


def _run(run: RunResults, name: str, verdict: str) -> dict[str, Any]:
    from records.release import release_of

    return {"file": name, "verdict": verdict, "suite_version": run.suite_version,
            "reference_version": run.reference_version, "backend": run.options.get("backend"),
            "release": release_of(run.environment),
            "selection": {k: v for k, v in selection_of(run).to_json().items()
                          if k != "case_ids"}}


def _finding(f: Finding) -> dict[str, Any]:
    def side(record: Record | None, field: str):
        if record is None:
            return None
        value = getattr(record, field)
        return value.value if field == "label" else value

    message = f.new.message if f.new is not None else ""
    return {"kind": f.kind, "category": f.category, "blocking": f.blocking,
            "subject": f.subject, "case_id": f.case_id, "detail": f.detail,
            "old_label": side(f.old, "label"), "new_label": side(f.new, "label"),
            "old_compile_seconds": side(f.old, "compile_seconds"),
            "new_compile_seconds": side(f.new, "compile_seconds"),
            "old_run_seconds": side(f.old, "run_seconds"),
            "new_run_seconds": side(f.new, "run_seconds"),
            "message_first_line": first_line(message) or None,
            "message": message or None, "stage_grew_most": stage_json(f.stage),
            "confirmation": f.confirmation.to_json() if f.confirmation else None}
