"""The gate's decision as Markdown for a pull-request comment (``flexconf gate --markdown``),
and what that file holds when the gate refused to judge, so that an earlier verdict is never
left there looking current."""
from __future__ import annotations

from collections import Counter

from reports.gate import LISTED_KINDS, GateDecision, finding_counts, headline, release_suffix
from reports.markdown import md_code, md_table, md_text

#: Rows per listed kind (NEW, KNOWN) in the Markdown (a PR comment has a size limit; what
#: blocks and the good news are always listed whole)
MARKDOWN_LISTED_ROWS = 30


def gate_markdown(decision: GateDecision, baseline_name: str, candidate_name: str) -> str:
    """The decision (reports/gate.py) as Markdown: every finding, but at most
    MARKDOWN_LISTED_ROWS of each listed kind."""
    def text(value: str) -> str:
        return md_text(value)

    mark = "✅" if decision.may_ship else "❌"
    lines = [f"## Release gate: {mark} {text(headline(decision))}", "",
             text(finding_counts(decision)), "",
             f"- baseline {md_code(baseline_name)}: {text(decision.baseline_verdict)}"
             + release_suffix(text(decision.baseline_release)),
             f"- candidate {md_code(candidate_name)}: "
             f"{text(decision.candidate_verdict)}"
             + release_suffix(text(decision.candidate_release)), ""]
    lines += [f"- **{note.kind}**: {text(note.text)}" for note in decision.notes if note.flagged]
    if decision.findings:
        if lines[-1].startswith("- **"):
            lines.append("")
        shown, rows = Counter(), []
        for f in decision.findings:
            shown[f.kind] += 1
            if f.category != "listed" or shown[f.kind] <= MARKDOWN_LISTED_ROWS:
                rows.append([f.category, f.kind, md_code(f.subject),
                             text(f.detail + f.confirmation_suffix), text(f.why)])
        lines += md_table(["", "finding", "case", "detail", "why"], rows)
        lines.append("")
        lines += [f"... and {n - MARKDOWN_LISTED_ROWS} more {kind} (the gate's --json lists "
                  "them all)" for kind, n in shown.items()
                  if kind in LISTED_KINDS and n > MARKDOWN_LISTED_ROWS]
    lines += [f"- {text(note.text)}" for note in decision.notes if not note.flagged]
    return "\n".join(lines).rstrip() + "\n"


def gate_refusal_markdown(error: str, baseline_name: str, candidate_name: str) -> str:
    """What ``--markdown`` holds when the gate refused to judge (exit 2)."""
    return "\n".join(["## Release gate: ⛔ REFUSED", "", md_text(error), "",
                      f"- baseline {md_code(baseline_name)}",
                      f"- candidate {md_code(candidate_name)}"]) + "\n"
