"""No message can cost the report or reach a terminal raw: a lone surrogate, NUL, ESC, a
terminal title sequence and a backtick-laden case id render in every output, escaped."""
from __future__ import annotations

import json
import re
import sys
from dataclasses import replace

import pytest

from records import Label, Record, RunResults, load_results, write_results
from records.text import clean_text, first_line, one_line
from reports.markdown import md_code
from tests.fault_backends import HOSTILE_TEXT
from tests.test_plugin_runs import CASES, pytest_args, run

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e]")
TICKS = "causal``x`/b1-h2x2-s64x64-d16/bf16/fwd"


def test_clean_text_escapes_what_cannot_be_shown_and_keeps_the_rest():
    assert clean_text("a\udc80b") == "a\\udc80b"
    assert clean_text("\x00\x1b]0;t\x07") == "\\x00\\x1b]0;t\\x07"
    assert clean_text("line one\n\tline two é ✓") == "line one\n\tline two é ✓"
    assert clean_text(b"\xff\xfeok") == "\\udcff\\udcfeok"
    assert one_line("a\nb\tc") == "a\\x0ab\\x09c" and first_line("x\x1b\ny") == "x\\x1b"
    assert RAW.search(clean_text(HOSTILE_TEXT)) is None
    clean_text(HOSTILE_TEXT).encode("utf-8")  # valid text: encodes


def test_first_line_is_the_first_line_with_content_and_what_a_wrapper_line_introduces():
    wrapped = "\n  BackendCompilerFailed: backend='inductor' raised:\r\nLoweringException: x\nmore"
    assert first_line(wrapped) == ("BackendCompilerFailed: backend='inductor' raised: "
                                   "LoweringException: x")
    assert first_line("one\r\ntwo") == "one"  # CRLF's CR is no content
    assert first_line("a: b\nc") == "a: b" and first_line("last:") == "last:"
    assert first_line(b"\xffbad\nnext") == "\\udcffbad" and first_line("") == ""
    assert first_line("abcdef", limit=4) == "abc…" and first_line("abcd", limit=4) == "abcd"
    assert first_line("x\udc80:\n\x1b[2J", limit=80) == "x\\udc80: \\x1b[2J"


def test_md_code_is_a_single_span_whatever_backticks_an_id_holds():
    for text in ("plain", "a`b", "a``b`c", "`lead", "trail``"):
        span = md_code(text)
        fence = re.match("`+", span).group()
        inner = span[len(fence):-len(fence)]
        assert span.endswith(fence) and fence not in inner.strip(" ").replace(fence + "`", "")
        assert inner.strip(" ") == text  # CommonMark strips one space each side


@pytest.mark.slow
def test_a_hostile_message_renders_escaped_in_terminal_results_report_summary_and_gate(tmp_path):
    proc = run(pytest_args(tmp_path, "tests.fault_backends:HostileMessage", CASES[:2]))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert RAW.search(proc.stdout) is None and RAW.search(proc.stderr) is None
    assert "\\udc80" in proc.stdout and "\\x1b]0;pwned\\x07title" in proc.stdout
    report = tmp_path / "report"
    results = load_results(report / "results.json")
    failed = results.by_id()[CASES[1].id]
    assert failed.label is Label.COMPILE_ERROR and "\\udc80" in failed.message
    # a backtick-laden id, and the same hostile text again, through flexconf report and gate
    odd = Record(case_id=TICKS, label=Label.RUNTIME_ERROR, message=HOSTILE_TEXT)
    candidate = replace(results, records=results.records + (odd,),  # a run that selected it
                        selection={**results.selection,
                                   "case_ids": [*results.selection["case_ids"], TICKS]},
                        selected_count=results.selected_count + 1)
    write_results(candidate, tmp_path / "candidate.json")
    for name in ("results.json", "candidate.json"):
        json.loads((report / name if name == "results.json" else tmp_path / name).read_text())
    out = tmp_path / "rendered"
    rendered = run([sys.executable, "-m", "conformance.cli", "report",
                    str(tmp_path / "candidate.json"), "-o", str(out)])
    assert rendered.returncode == 0, rendered.stderr
    html = (out / "index.html").read_text(encoding="utf-8")
    summary = (out / "summary.md").read_text(encoding="utf-8")
    for text in (html, summary):
        assert RAW.search(text) is None
        assert "\\udc80" in text
    assert "````" not in summary and md_code(TICKS) in summary
    baseline = replace(results, started_at="2026-01-01T00:00:00.000+00:00",  # another run
                       records=tuple(replace(r, label=Label.PASS, message="")
                                     for r in results.records))
    write_results(baseline, tmp_path / "baseline.json")
    gate = run([sys.executable, "-m", "conformance.cli", "gate", "--baseline",
                str(tmp_path / "baseline.json"), "--candidate", str(tmp_path / "candidate.json"),
                "--markdown", str(tmp_path / "gate.md")])
    assert gate.returncode == 1, gate.stdout + gate.stderr
    assert RAW.search(gate.stdout) is None and "\\x1b" in gate.stdout
    assert RAW.search((tmp_path / "gate.md").read_text()) is None


def test_a_record_with_lone_surrogates_everywhere_survives_write_load_and_render(tmp_path):
    from reports.render import write_report

    hostile = "\ud800\x00\x1b[2J"
    record = Record(case_id=f"id{hostile}", label=Label.MISMATCH, message=hostile,
                    case={"variant": hostile}, worker=hostile)
    run_ = RunResults({"host": hostile}, {"backend": hostile, "profile": "smoke", "seed": 0},
                      (record,), "t")
    write_results(run_, tmp_path / "results.json")
    loaded = load_results(tmp_path / "results.json")
    write_report(loaded, tmp_path)
    for name in ("results.json", "index.html", "summary.md"):
        assert RAW.search((tmp_path / name).read_text(encoding="utf-8")) is None
    assert loaded.records[0].case_id == "id\\ud800\\x00\\x1b[2J"
