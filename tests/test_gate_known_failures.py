"""The gate with --expectations: known failures listed one by one (text, JSON, JUnit), and an
entry that another decides named (moved out of tests/test_gate.py when that passed 500
lines)."""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import replace

from records.results import Label
from tests.test_gate import A, B, gate, known
from tests.test_report_doctored import record, run


def test_an_entry_that_an_earlier_glob_or_an_exact_id_shadows_is_named(tmp_path, capsys):
    """A narrower glob listed after a broader one matched the failing case, yet the broader
    one decided it (the first glob wins): its label never applied, and the gate's blocking
    finding gave no hint why."""
    old = run([record(A), record(B)])
    new = run([record(A, Label.CRASH), record(B, Label.MISMATCH)])
    broad_first = known(f"{A.split('/')[0]}/*", "MISMATCH") + "\n" + known(A, "CRASH") \
        + "\n" + known(f"{A.split('/')[0]}/*/fwd", "CRASH")
    assert gate(tmp_path, old, new, expectations=broad_first) == 1
    out = capsys.readouterr().out
    assert (f"  note: 1 entry of {tmp_path / 'known.toml'} match cases of the candidate but "
            f"decide none, so their labels and reasons apply to none of them (e.g. line 15: "
            f"'{A.split('/')[0]}/*/fwd', whose case line 1: '{A.split('/')[0]}/*' decides; the "
            "first glob in the file decides a case: move the narrower one first)") in out
    exact_only = known(A, "CRASH") + "\n" + known(A.replace("/fwd", "/*"), "MISMATCH")
    assert gate(tmp_path, old, new, expectations=exact_only) == 1
    out = capsys.readouterr().out
    assert "whose case line 1: " in out and "an exact id decides its case before any glob" in out
    assert gate(tmp_path, old, new, expectations=known(A, "CRASH")) == 1
    assert "decide none" not in capsys.readouterr().out


def test_each_accepted_failure_is_listed_and_junit_skips_it(tmp_path, capsys):
    """The gate said only '2 known failures listed in FILE': a reviewer could not see which
    failures were waived, in the text, the JSON or the JUnit XML."""
    old = run([record(A), record(B, Label.MISMATCH)])
    new = run([record(A), record(B, Label.MISMATCH)])
    entries = known(B, "MISMATCH") + "\n" + known("casual/*", "CRASH")
    junit = tmp_path / "gate.xml"
    assert gate(tmp_path, old, new, "--junit", str(junit), expectations=entries) == 0
    out = capsys.readouterr().out
    assert out.startswith("gate: MAY SHIP (listed: 1 KNOWN)")
    assert f"* KNOWN              {B}  MISMATCH as expected (line 1): tracked" in out
    assert ("1 entry of " in out and "for this backend match no case of the candidate (e.g. "
            "line 8: 'casual/*'): a misspelt id or glob, or cases this run did not select" in out)
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("skipped") == "1" and suite.get("failures") == "0"
    skipped = [case for case in suite.iter("testcase") if case.find("skipped") is not None]
    assert [case.get("name") for case in skipped] == [B]
    assert skipped[0].find("skipped").get("message") == "KNOWN: MISMATCH as expected (line 1): tracked"
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "g.json"), expectations=entries) == 0
    findings = json.loads((tmp_path / "g.json").read_text())["findings"]
    assert [(f["kind"], f["case_id"], f["category"]) for f in findings] == [("KNOWN", B, "listed")]
    # a known failure that also blocks (its compile time grew tenfold) fails, and is not skipped
    slower = run([record(A), record(B, Label.MISMATCH, compile_seconds=40.0)])
    assert gate(tmp_path, old, slower, "--junit", str(junit), expectations=entries) == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "0")


def test_an_entry_for_a_misspelt_backend_is_flagged_in_the_gate_and_the_update(tmp_path,
                                                                            capsys):
    """backend = "neuorn" was accepted without a word: its failures were unknown to the run
    and blocked, and `expectations update` added a second entry beside the typo (an outside
    audit). Entries for other backends, spelt otherwise, say nothing."""
    from conformance.cli import main
    from records.results import write_results

    old = run([record(A), record(B)])
    new = run([record(A), record(B, Label.MISMATCH)])  # backend "neuron"
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH", backend="neuorn")) == 1
    out = capsys.readouterr().out
    assert (f"  ! MISSPELT_BACKEND: 1 entry of {tmp_path / 'known.toml'} name backend 'neuorn' "
            "(line 1), not the candidate's 'neuron': they apply to none of its cases; fix the "
            "name if it is meant") in out.splitlines()
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH", backend="cuda")) == 1
    assert "MISSPELT_BACKEND" not in capsys.readouterr().out
    # a registered backend is never a misspelling, however close (an outside review: one file
    # for cpu-eager and cuda-eager got a flagged note on every gate)
    eager = run([record(A), record(B, Label.MISMATCH)], backend="cpu-eager")
    assert gate(tmp_path, run([record(A), record(B)], backend="cpu-eager"), eager,
                expectations=known(B, "MISMATCH", backend="cuda-eager")) == 1
    assert "MISSPELT_BACKEND" not in capsys.readouterr().out
    write_results(new, tmp_path / "new.json")
    (tmp_path / "known.toml").write_text(known(B, "MISMATCH", backend="neuorn"))
    assert main(["expectations", "update", str(tmp_path / "new.json"), "--expectations",
                 str(tmp_path / "known.toml")]) == 0
    assert (f"note     {tmp_path / 'known.toml'}:1  backend 'neuorn' is not the run's 'neuron': "
            "the entry applies to none of its cases; fix the name if it is meant") \
        in capsys.readouterr().out.splitlines()


def test_a_known_row_whose_reason_quotes_the_message_says_it_once(tmp_path, capsys):
    """expectations update writes 'to triage: <message>': the row read 'X — X'."""
    old = run([record(A), record(B, Label.MISMATCH, message="rms error 9 vs limit 1")])
    entry = (f'[[failure]]\nbackend = "neuron"\ncase = "{B}"\nlabel = "MISMATCH"\n'
             'reason = "to triage: rms error 9 vs limit 1"\n')
    assert gate(tmp_path, old, old, expectations=entry) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "* KNOWN" in line]
    assert row.endswith("MISMATCH as expected (line 1): to triage: rms error 9 vs limit 1"), row
    other = run([record(A), record(B, Label.MISMATCH, message="rms error 3 vs limit 1")])
    assert gate(tmp_path, old, replace(other, started_at="t9"), expectations=entry) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if "* KNOWN" in line]
    assert row.endswith("to triage: rms error 9 vs limit 1 — rms error 3 vs limit 1"), row
