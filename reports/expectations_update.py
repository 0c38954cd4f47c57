"""`flexconf expectations update`: bring an expectations file up to date with a run.

The file is edited as text, so comments and layout of the entries that stay are kept:
entries of the run's backend whose cases all pass now are removed, and the run's failures
that no entry covers are appended under the "to triage" heading, each with the first line
of its message as a provisional reason, for a person to replace with a reason and a link.
"""
from __future__ import annotations

from dataclasses import dataclass

from reports.expectations import (ENTRY_TABLE, TRIAGE_REASON, Expectation, Expectations,
                                  ExpectationsError, check_case_id, decided_cases,
                                  header_lines, parse_expectations, stale_expectations)
from records.text import first_line
from records.results import Label, Record, RunResults

TRIAGE_HEADING = "# ==== To triage"
FILE_HEADER = f"""\
# Known failures of the FlexAttention conformance suite, per backend (docs/gate.md).
# Each [[{ENTRY_TABLE}]] names a backend (or glob), a case id (or glob), the expected label,
# the reason and a link to the bug. `flexconf gate --expectations FILE` accepts these
# failures; `pytest conformance/ --expectations FILE` marks them xfail.
version = 1
"""
_TRIAGE_BLOCK = (f"{TRIAGE_HEADING}: new failures added by `flexconf expectations update`; "
                 "give each a reason and a link ====\n")


@dataclass(frozen=True)
class Update:
    text: str
    added: tuple[Record, ...]
    dropped: tuple[Expectation, ...]
    passing: frozenset[int] = frozenset()  # lines of dropped entries whose cases all pass
    fuzzed: tuple[Record, ...] = ()  # failures of fuzzed variants: no entry can name them


def toml_string(value: str) -> str:
    """A TOML basic string (escapes quotes, backslashes and control characters)."""
    out = ['"']
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def entry_text(backend: str, case: str, label: Label, reason: str, link: str = "") -> str:
    """The TOML text of one entry."""
    return (f"[[{ENTRY_TABLE}]]\nbackend = {toml_string(backend)}\ncase = {toml_string(case)}\n"
            f"label = {toml_string(label.value)}\nreason = {toml_string(reason)}\n"
            f"link = {toml_string(link)}\n")


def uncovered_failures(expectations: Expectations, results: RunResults) -> list[Record]:
    """Failures of the run that no entry expects with exactly their label."""
    backend = results.options.get("backend", "")
    out = []
    for rec in results.records:
        if rec.label.acceptable:
            continue
        entry = expectations.lookup(backend, rec.case_id)
        if entry is None or entry.label is not rec.label:
            out.append(rec)
    return out


def update_expectations(text: str, results: RunResults, source: str = "expectations") -> Update:
    """The new text of an expectations file after ``results`` (``text`` may be empty)."""
    expectations = parse_expectations(text, source)
    backend = results.options.get("backend", "")
    # the gate's STALE entries of this backend: their cases pass, or fail otherwise (those
    # are added below as new failures, in place of the entry); an entry for several
    # backends (a glob) cannot be judged from one backend's run
    dropped = [e for e in stale_expectations(expectations, results) if e.backend == backend]
    from records.results import is_fuzzed

    uncovered = uncovered_failures(expectations, results)
    # a fuzzed failure's id (fuzz/...) is no case of a matrix: an entry cannot name it (the
    # parser refuses it), and a run of the matrix never meets it; it is listed, not written
    fuzzed = tuple(r for r in uncovered if is_fuzzed(r.case_id))
    added = [r for r in uncovered if not is_fuzzed(r.case_id)]
    _refuse_what_would_be_a_glob(backend, added)
    lines = (text if text.strip() else FILE_HEADER).splitlines(keepends=True)
    if dropped:
        if any(e.line == 0 for e in expectations.entries):
            raise ValueError(f"{source}: cannot edit entries written inline; write each "
                             f"entry as a [[{ENTRY_TABLE}]] table")
        lines = _remove_entries(lines, {e.line for e in dropped})
    new_text = "".join(lines)
    if added:
        if not new_text.endswith("\n"):
            new_text += "\n"
        if not any(line.startswith(TRIAGE_HEADING) for line in new_text.splitlines()):
            new_text += "\n" + _TRIAGE_BLOCK
        for rec in added:
            reason = f"{TRIAGE_REASON} " + (first_line(rec.message, 200) or rec.label.value)
            new_text += "\n" + entry_text(backend, rec.case_id, rec.label, reason)
    parse_expectations(new_text, source)  # never write a file the suite cannot read back
    passing = frozenset(e.line for e in dropped if all(
        r.label is Label.PASS for r in decided_cases(expectations, e, results)))
    return Update(new_text, tuple(added), tuple(dropped), passing, fuzzed)


def _refuse_what_would_be_a_glob(backend: str, added) -> None:
    """A backend name or case id of the results that is no name or id of this suite (one with
    a glob character, ``*`` ``?`` ``[``, or not of the shape variant/shape/dtype/mode): an entry
    written for it would be a glob matching other cases (``case = "*"`` from a doctored file
    would excuse every failure at the gate). One line naming the results' value."""
    from records.text import one_line

    for what, value in [("backend", backend)] + [("case id", r.case_id) for r in added]:
        if any(ch in value for ch in "*?["):
            raise ValueError(f"the results' {what} {one_line(value)!r} holds a glob character "
                             "(* ? [), which no name of this suite has: an entry written for it "
                             "would match other cases; use the results of a run of this suite")
    for rec in added:
        try:
            check_case_id(rec.case_id, "the results")
        except ExpectationsError as exc:
            raise ValueError(f"{exc}; use the results of a run of this suite") from None


def _remove_entries(lines: list[str], drop_lines: set[int]) -> list[str]:
    """``lines`` without the entries whose header is on one of ``drop_lines`` (1-based).

    An entry spans the comment lines directly above its header, the header and everything
    up to the next entry, the triage heading or the end, less trailing blank lines.
    """
    text = "".join(lines)
    headers = header_lines(text)
    starts = []
    for header in headers:
        start = header - 1  # 0-based index of the header
        while start > 0 and lines[start - 1].lstrip().startswith("#") \
                and not lines[start - 1].startswith(TRIAGE_HEADING):
            start -= 1
        starts.append(start)
    keep = [True] * len(lines)
    for i, header in enumerate(headers):
        if header not in drop_lines:
            continue
        end = starts[i + 1] if i + 1 < len(headers) else len(lines)
        for j in range(header, end):
            if lines[j].startswith(TRIAGE_HEADING):
                end = j
                break
        for j in range(starts[i], end):
            keep[j] = False
    kept = [line for line, k in zip(lines, keep) if k]
    return _squeeze_blank_lines(kept)


def _squeeze_blank_lines(lines: list[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if not line.strip() and out and not out[-1].strip():
            continue
        out.append(line)
    return out
