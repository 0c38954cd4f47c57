"""JUnit XML: the properties a case carries in ``pytest --junitxml`` output, and the gate's
decision as a JUnit file (``flexconf gate --junit FILE``).

The pytest plugin appends the properties to ``item.user_properties`` once the case's record
exists; pytest's junitxml writes each as ``<property name=... value=...>`` of the test case.
The gate's file gives each compared case the same properties.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from records.text import clean_text, one_line
from records.results import Record, RunResults


def junit_properties(record: Record) -> list[tuple[str, str]]:
    """(name, value) pairs: case id, label, compile and run seconds (empty when unknown),
    cache hit, and the error ratio when the verdict computed one."""
    def seconds(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}"

    props = [("case_id", record.case_id), ("label", record.label.value),
             ("compile_seconds", seconds(record.compile_seconds)),
             ("run_seconds", seconds(record.run_seconds))]
    if record.cache_hit is not None:
        props.append(("cache_hit", "true" if record.cache_hit else "false"))
    if record.metrics and "error_ratio" in record.metrics:
        props.append(("error_ratio", str(record.metrics["error_ratio"])))
    return props


def gate_junit(decision, candidate: RunResults, baseline_name: str, candidate_name: str) -> str:
    """The gate's decision (reports.gate.GateDecision) as JUnit XML: one test case per case
    compared (and per blocking STALE expectation), failed when a blocking finding names it;
    the failure's text is the candidate's full message. A failure the expectations accept
    (KNOWN) is skipped, with the entry's reason; good news and other listed findings go to
    the case's system-out. Control characters are escaped (XML 1.0 cannot hold them)."""
    records = candidate.by_id()
    by_subject: dict[str, list] = {}
    for finding in decision.findings:
        by_subject.setdefault(finding.subject, []).append(finding)
    # every case compared, then what else blocks (a STALE expectation under --strict-...)
    subjects = list(dict.fromkeys([*decision.case_ids, *(f.subject for f in decision.blocking)]))
    failed = sum(1 for s in subjects if any(f.blocking for f in by_subject.get(s, ())))
    known = {f.subject: f for f in decision.findings if f.kind == "KNOWN"
             and not any(g.blocking for g in by_subject.get(f.subject, ()))}
    suite = _suite(len(subjects), failed, 0, len(known))
    verdict = "MAY_SHIP" if decision.may_ship else "MAY_NOT_SHIP"
    _properties(suite, [("verdict", verdict), ("baseline", baseline_name),
                        ("candidate", candidate_name)])
    for subject in subjects:
        case = ET.SubElement(suite, "testcase", classname="flexconf.gate", name=_text(subject))
        record = records.get(subject)
        if record is not None:
            _properties(case, junit_properties(record))
        findings = by_subject.get(subject, [])
        blocking = [f for f in findings if f.blocking]
        if blocking:
            message = "; ".join(f"{f.kind}: {f.detail}" + (f" — {f.why}" if f.why else "")
                                + f.confirmation_suffix for f in blocking)
            failure = ET.SubElement(case, "failure", type=blocking[0].kind,
                                    message=_text(message))
            failure.text = _text(record.message if record is not None else message, multiline=True)
        elif subject in known:
            ET.SubElement(case, "skipped", type="KNOWN",
                          message=_text(f"KNOWN: {known[subject].detail}"))
        others = [f"{f.kind}: {f.detail}{f.confirmation_suffix}" for f in findings
                  if not f.blocking and f.kind != "KNOWN"]
        if others:
            ET.SubElement(case, "system-out").text = _text("\n".join(others), multiline=True)
    return _xml(suite)


def gate_refusal_junit(error: str) -> str:
    """What ``--junit`` holds when the gate refused to judge (exit 2): one test case in error."""
    suite = _suite(1, 0, 1)
    case = ET.SubElement(suite, "testcase", classname="flexconf.gate", name="comparable runs")
    ET.SubElement(case, "error", type="REFUSED", message=_text(error))
    return _xml(suite)


def _suite(tests: int, failures: int, errors: int, skipped: int = 0) -> ET.Element:
    return ET.Element("testsuite", name="flexconf gate", tests=str(tests),
                      failures=str(failures), errors=str(errors), skipped=str(skipped))


def _properties(parent: ET.Element, pairs: list[tuple[str, str]]) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in pairs:
        ET.SubElement(props, "property", name=_text(name), value=_text(value))


#: Characters XML 1.0 cannot hold even escaped, beyond the controls records/text.py escapes:
#: the noncharacters U+FFFE and U+FFFF (a JUnit reader refused the whole file over one).
_NOT_XML = re.compile("[\ufffe\uffff]")


def _text(value: str, multiline: bool = False) -> str:
    """Text XML can hold: control characters escaped (records/text.py), newlines kept in
    ``multiline`` text, U+FFFE and U+FFFF written as ``\\ufffe`` and ``\\uffff``."""
    text = clean_text(value) if multiline else one_line(value)
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _xml(suite: ET.Element) -> str:
    root = ET.Element("testsuites", name="flexconf gate", tests=suite.get("tests"),
                      failures=suite.get("failures"), errors=suite.get("errors"),
                      skipped=suite.get("skipped"))
    root.append(suite)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
