"""The release gate: each rule that blocks, the good news, new cases, flagged budget changes
(exit 0, 1), and the decision as text, JSON and JUnit XML; what it refuses (exit 2) is in
tests/test_gate_refusals.py."""
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.cli import main
from records.results import Label, RunResults, write_results
from records.selection import Selection
from tests.test_report_doctored import HOSTILE, case_id, record, run

REPO = Path(__file__).resolve().parents[1]
A, B, C = case_id(seq=128), case_id(seq=256), case_id(seq=512)


def gate(tmp_path, baseline, candidate, *extra: str, expectations: str | None = None,
         confirm: str = "0") -> int:
    """``flexconf gate`` on the two runs; time findings are not measured again unless
    ``confirm`` says so (tests/test_gate_confirm_plan.py tests the default, auto)."""
    write_results(baseline, tmp_path / "old.json")
    write_results(candidate, tmp_path / "new.json")
    args = ["gate", "--baseline", str(tmp_path / "old.json"),
            "--candidate", str(tmp_path / "new.json"), *extra]
    if "--confirm" not in extra and confirm is not None:
        args += ["--confirm", confirm]
    if expectations is not None:
        (tmp_path / "known.toml").write_text(expectations)
        args += ["--expectations", str(tmp_path / "known.toml")]
    return main(args)


def known(case: str, label: str, backend: str = "neuron") -> str:
    return (f'[[failure]]\nbackend = "{backend}"\ncase = "{case}"\nlabel = "{label}"\n'
            f'reason = "tracked"\nlink = "https://example.com/1"\n')


def test_identical_passing_runs_may_ship(tmp_path, capsys):
    both = run([record(A), record(B)])
    assert gate(tmp_path, both, both) == 0
    assert capsys.readouterr().out.startswith("gate: MAY SHIP (no findings)")


def test_a_regression_blocks_even_when_the_expectations_list_it(tmp_path, capsys):
    old = run([record(A), record(B)])
    new = run([record(A), record(B, Label.COMPILE_TIMEOUT, compile_seconds=None)])
    assert gate(tmp_path, old, new, expectations=known(B, "COMPILE_TIMEOUT")) == 1
    out = capsys.readouterr().out
    assert "MAY NOT SHIP: 1 blocking finding" in out
    assert "x REGRESSION" in out and "PASS -> COMPILE_TIMEOUT" in out and B in out


def test_a_failure_blocks_unless_listed_with_that_label(tmp_path, capsys):
    old = run([record(A), record(B, Label.MISMATCH)])
    new = run([record(A), replace(record(B, Label.MISMATCH), expected_failure="the run's")])
    assert gate(tmp_path, old, new) == 1
    out = capsys.readouterr().out
    assert "MISMATCH; the gate was given no --expectations" in out
    # the run's own --expectations are not the gate's: its verdict line does not count them
    assert "failures known" not in out
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH")) == 0
    assert gate(tmp_path, old, new, expectations=known("causal/*", "MISMATCH")) == 0
    assert gate(tmp_path, old, new, expectations=known(B, "CRASH")) == 1
    assert "MISMATCH; expected CRASH (line 1)" in capsys.readouterr().out
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH", backend="cuda*")) == 1


def test_the_blocking_failures_come_with_the_command_that_reruns_them(tmp_path, capsys):
    import shlex

    known_case = case_id(seq=1024)
    old = run([record(A), record(B), record(C, Label.MISMATCH), record(known_case, Label.CRASH)])
    new = run([record(A), record(B, Label.RUNTIME_ERROR), record(C, Label.MISMATCH),
               record(known_case, Label.CRASH)])
    new.options["report_dir"] = "reports/candidate"
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "gate.json"),
                expectations=known(known_case, "CRASH")) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if x.startswith("  note: rerun ")]
    assert line.startswith("  note: rerun the 2 blocking cases of the candidate: pytest ")
    words = shlex.split(line.split(": ", 2)[2])
    ids = [words[i + 1] for i, word in enumerate(words) if word == "--case-id"]
    assert ids == [B, C]  # the regression, the unexpected failure; not the known failure
    assert words[words.index("--backend") + 1] == "neuron"
    assert words[words.index("--report-dir") + 1] == "reports/candidate-rerun"
    notes = json.loads((tmp_path / "gate.json").read_text())["notes"]
    assert [n["kind"] for n in notes if n["text"].startswith("rerun ")] == ["RERUN"]
    # a shipping candidate has nothing to rerun
    assert gate(tmp_path, run([record(A)]), run([record(A)])) == 0
    assert "rerun" not in capsys.readouterr().out


def test_a_blocking_fuzzed_case_is_reproduced_not_rerun_by_id(tmp_path, capsys):
    """--case-id fuzz/... is refused (no matrix has it): one such id among the ids made the
    whole printed command fail."""
    fuzzed = "fuzz/" + C
    old = run([record(A), record(fuzzed)])
    new = run([record(A, Label.MISMATCH), record(fuzzed, Label.MISMATCH)])
    new.options["report_dir"] = "reports/candidate"
    assert gate(tmp_path, old, new) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  note: ")]
    (rerun,) = [x for x in lines if x.startswith("  note: rerun ")]
    assert f"--case-id {A} " in rerun and "fuzz/" not in rerun
    (repro,) = [x for x in lines if "fuzzed" in x]
    assert repro.endswith("1 blocking fuzzed case(s) are in no matrix; reproduce each from the "
                          "candidate's results, e.g. flexconf repro "
                          f"reports/candidate/results.json {fuzzed} -o repro.py")


def test_the_rerun_command_names_at_most_20_failing_cases(tmp_path, capsys):
    ids = [case_id(seq=64 * (i + 1)) for i in range(25)]
    old = run([record(i) for i in ids])
    new = run([record(i, Label.MISMATCH) for i in ids])
    assert gate(tmp_path, old, new) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  note: rerun ")]
    assert "rerun the first 20 of the 25 blocking cases of the candidate" in line
    assert line.count("--case-id") == 20 and ids[19] in line and ids[20] not in line


def test_the_markdown_lists_at_most_30_of_a_listed_kind(tmp_path):
    from reports.gate_markdown import MARKDOWN_LISTED_ROWS

    failing = run([record(case_id(seq=64 * (i + 1)), Label.MISMATCH)
                   for i in range(MARKDOWN_LISTED_ROWS + 5)])
    out = tmp_path / "gate.md"
    assert gate(tmp_path, failing, failing, "--markdown", str(out),
                expectations=known("causal/*", "MISMATCH")) == 0
    text = out.read_text()
    assert text.count("| listed | KNOWN |") == MARKDOWN_LISTED_ROWS
    assert "... and 5 more KNOWN (the gate's --json lists them all)" in text


def test_an_entry_naming_a_backend_spec_is_refused_in_one_line(tmp_path, capsys):
    both = run([record(A), record(B, Label.MISMATCH)])
    assert gate(tmp_path, both, both, expectations=known(
        B, "MISMATCH", backend="tests.fault_backends:WrongNumbers")) == 2
    err = capsys.readouterr().err
    assert ("known.toml:1: backend 'tests.fault_backends:WrongNumbers' is a --backend "
            "module:object spec; an entry names the backend itself, as results.json records it "
            "in options.backend") in err


def test_unsupported_is_not_a_failure(tmp_path):
    both = run([record(A), record(B, Label.UNSUPPORTED, compile_seconds=None)])
    assert gate(tmp_path, both, both) == 0


def selected(results: RunResults, **fields) -> RunResults:
    """``results`` with a recorded selection (the whole smoke core matrix unless changed)."""
    selection = Selection("core", results.options["profile"], (), None, None, "", "", None,
                          tuple(r.case_id for r in results.records))
    return replace(results, selection=replace(selection, **fields).to_json())


def test_a_missing_baseline_case_blocks_and_a_new_case_is_listed(tmp_path, capsys):
    assert gate(tmp_path, run([record(A), record(B)]), run([record(A), record(C)])) == 1
    out = capsys.readouterr().out
    assert "(blocking: 1 MISSING; listed: 1 NEW)" in out
    assert f"x MISSING            {B}  in the baseline (PASS), absent now" in out
    assert f"* NEW                {C}  not in the baseline; PASS now" in out


def test_new_cases_alone_do_not_block(tmp_path, capsys):
    assert gate(tmp_path, run([record(A)]), run([record(A), record(B)])) == 0
    assert capsys.readouterr().out.startswith("gate: MAY SHIP (listed: 1 NEW)")


@pytest.mark.parametrize("old_s, new_s, cache, extra, code", [
    (4.0, 5.2, "cold", (), 1),  # 30% slower, both cold
    (4.0, 4.8, "cold", (), 0),  # 20% slower: within the default budget
    (4.0, 5.2, "cold", ("--compile-time-budget", "1.5"), 0),
    (4.0, 5.2, "warm", (), 0),  # not both cold: not gated
    (0.2, 0.4, "cold", (), 0),  # doubled, but by less than the 0.5 s slack
    (0.2, 0.4, "cold", ("--compile-time-slack", "0"), 1),
])
def test_compile_time_budget(tmp_path, capsys, old_s, new_s, cache, extra, code):
    old = run([record(A, compile_seconds=old_s)], compile_cache=cache)
    new = run([record(A, compile_seconds=new_s)], compile_cache=cache)
    assert gate(tmp_path, old, new, *extra) == code
    out = capsys.readouterr().out
    assert ("COMPILE_TIME" in out) == (code == 1)
    assert ("compile times not gated" in out) == (cache == "warm")


def test_a_backend_that_compiles_nothing_has_its_first_calls_not_gated_as_compiles(
        tmp_path, capsys):
    """An eager backend's "compile" phase is its first call: sub-second and noisy, not a
    compile. A run that records no ``compiled`` (older files) is gated as before."""
    old = run([record(A, compile_seconds=0.5)])
    new = run([record(A, compile_seconds=1.1)])
    assert gate(tmp_path, old, new) == 1 and "COMPILE_TIME" in capsys.readouterr().out
    eager = [replace(r, environment={**r.environment, "compiled": False}) for r in (old, new)]
    assert gate(tmp_path, *eager) == 0
    out = capsys.readouterr().out
    assert "COMPILE_TIME" not in out and ("compile times not gated: neuron compiles nothing "
                                          "(compiled = False)") in out
    compiled = [replace(r, environment={**r.environment, "compiled": True}) for r in (old, new)]
    assert gate(tmp_path, *compiled) == 1


def test_one_backend_name_given_as_two_specs_is_flagged(tmp_path, capsys):
    old = run([record(A)], backend="cpu-inductor")
    new = run([record(A)], backend="cpu-inductor")
    old = replace(old, options={**old.options, "backend_requested": "cpu-inductor"})
    new = replace(new, options={**new.options, "backend_requested": "badrelease:SlowCompile"})
    assert gate(tmp_path, old, new) == 0
    assert ("  ! BACKEND_SPEC_CHANGE: both runs record the backend 'cpu-inductor', but it was "
            "given as --backend cpu-inductor (baseline) and --backend badrelease:SlowCompile "
            "(candidate): the same name need not be the same code") in capsys.readouterr().out
    assert gate(tmp_path, old, old) == 0
    assert "BACKEND_SPEC_CHANGE" not in capsys.readouterr().out
    auto = replace(old, options={**old.options, "backend_requested": "auto"})
    assert gate(tmp_path, auto, old) == 0  # auto resolved to the built-in: one code
    assert "BACKEND_SPEC_CHANGE" not in capsys.readouterr().out
    # two entry points of other names whose backends call themselves alike (a review)
    vendor = [replace(r, options={**r.options, "backend_requested": spec})
              for r, spec in ((old, "vendor-a"), (new, "vendor-b"))]
    assert gate(tmp_path, *vendor) == 0
    assert "--backend vendor-a (baseline) and --backend vendor-b" in capsys.readouterr().out


def test_run_times_far_slower_are_named_even_when_not_gated(tmp_path, capsys):
    """A kernel 700x as slow (0.0007 s -> 0.5 s per call) read 'MAY SHIP (no findings)' with
    --run-time-slack off (the default), and its row, when gated, read '0.00 s -> 0.50 s'."""
    old = run([replace(record(A), run_seconds=0.0007), replace(record(B), run_seconds=0.0007)])
    new = run([replace(record(A), run_seconds=0.5), replace(record(B), run_seconds=0.0074)])
    assert gate(tmp_path, old, new) == 0
    out = capsys.readouterr().out
    assert ("  ! RUN_TIME_NOT_GATED: run times are not gated (--run-time-slack is off), and 1 "
            f"case(s) ran at least 3x as slow, e.g. {A}: 0.000700 s -> 0.50 s (x714); pass "
            "--run-time-slack SECONDS to gate them") in out
    assert gate(tmp_path, old, new, "--run-time-slack", "0") == 1
    out = capsys.readouterr().out
    assert "0.000700 s -> 0.50 s" in out and "RUN_TIME_NOT_GATED" not in out
    from reports.formatting import precise_seconds
    assert [precise_seconds(v) for v in (2e-05, 0.00226, 0.05, 0.5)] == [
        "0.0000200", "0.00226", "0.0500", "0.50"]
    assert gate(tmp_path, old, old) == 0
    assert "RUN_TIME_NOT_GATED" not in capsys.readouterr().out


def test_times_measured_on_different_machines_are_not_gated_but_labels_are(tmp_path, capsys):
    """A compile 1.3x as long measured on another machine says nothing about the release (the
    suite's own smoke matrix ran twice as fast on the Xeon VM as on the EPYC one): no time
    finding either way, a flagged note that says why and how to gate them; a label that
    regressed still blocks. A merged run whose shards ran on different machines has no one
    machine; files that record no machine are compared as before."""
    old = run([record(A, compile_seconds=4.0), record(B, compile_seconds=4.0)])
    slower = run([replace(record(A, compile_seconds=8.0), run_seconds=1.0),
                  record(B, compile_seconds=4.0)])
    elsewhere = replace(slower, environment={**slower.environment, "device_name": "Xeon"})
    old = replace(old, environment={**old.environment, "device_name": "EPYC"})
    assert gate(tmp_path, old, replace(slower, environment=old.environment),  # one machine
                "--run-time-slack", "0") == 1
    assert {"COMPILE_TIME", "RUN_TIME"} <= set(capsys.readouterr().out.split())
    assert gate(tmp_path, old, elsewhere, "--run-time-slack", "0",
                "--json", str(tmp_path / "gate.json")) == 0
    out = capsys.readouterr().out
    note = ("  ! TIMES_NOT_GATED: times not gated: the runs were measured on different machines "
            "(device_name 'EPYC' (baseline), 'Xeon' (candidate)); run the baseline again on the "
            "candidate's machine to gate them")
    assert note in out.splitlines() and "COMPILE_TIME" not in out and "RUN_TIME" not in out
    data = json.loads((tmp_path / "gate.json").read_text())
    assert [(n["kind"], n["flagged"]) for n in data["notes"]] == [("TIMES_NOT_GATED", True)]
    assert data["findings"] == []
    regressed = replace(elsewhere, records=(record(A, Label.MISMATCH, compile_seconds=8.0),
                                            record(B, compile_seconds=4.0)))
    assert gate(tmp_path, old, regressed) == 1
    assert "REGRESSION" in capsys.readouterr().out
    mixed = replace(slower, environment={**old.environment, "differs_between_shards": {
        "device_name": ["EPYC", "Xeon"]}})
    assert gate(tmp_path, old, mixed) == 0
    assert "the candidate's shards ran on different machines (device_name 'EPYC', 'Xeon')" \
        in capsys.readouterr().out
    unrecorded = {k: v for k, v in slower.environment.items() if k != "device_name"}
    assert gate(tmp_path, old, replace(slower, environment=unrecorded)) == 1


def test_a_cache_hit_is_not_compared_and_on_a_cold_run_is_flagged(tmp_path, capsys):
    """A backend whose cache_hit() always says True escaped the compile-time rule on two cold
    runs without a word (an outside trial: a compile 0.68 s -> 3.27 s, "no findings")."""
    old = run([record(A, compile_seconds=4.0), record(B, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=9.0, cache_hit=True), record(B, compile_seconds=4.0)])
    assert gate(tmp_path, old, new) == 0
    out = capsys.readouterr().out
    assert f"  ! COLD_CACHE_HITS: the candidate ran with a cold compile cache, yet 1 case(s) " \
           f"report a cache hit (e.g. {A}); their compile times are not compared" in out
    warm = run([record(A, compile_seconds=9.0, cache_hit=True)], compile_cache="warm")
    assert gate(tmp_path, warm, warm) == 0
    assert "COLD_CACHE_HITS" not in capsys.readouterr().out  # a warm run's hits are its point


def test_fixes_are_good_news_and_stale_expectations_block_only_when_strict(tmp_path, capsys):
    old = run([record(A), record(B, Label.COMPILE_TIMEOUT, compile_seconds=None)])
    new = run([record(A), record(B)])
    assert gate(tmp_path, old, new, expectations=known(B, "COMPILE_TIMEOUT")) == 0
    out = capsys.readouterr().out
    assert "+ FIXED" in out and "COMPILE_TIMEOUT -> PASS" in out
    assert "+ STALE" in out and "known.toml:1" in out
    assert gate(tmp_path, old, new, "--strict-expectations",
                expectations=known(B, "COMPILE_TIMEOUT")) == 1
    assert "x STALE" in capsys.readouterr().out


def test_markdown_output_is_written_and_escaped(tmp_path):
    old = run([record(A)])
    new = run([record(A, Label.MISMATCH, message=HOSTILE)])
    assert gate(tmp_path, old, new, "--markdown", str(tmp_path / "gate.md")) == 1
    text = (tmp_path / "gate.md").read_text()
    assert text.startswith("## Release gate: ❌ MAY NOT SHIP: 1 blocking finding")
    assert (f"| blocking | REGRESSION | `{A}` | PASS -&gt; MISMATCH | &lt;script&gt;alert(1)"
            "&lt;/script&gt; &amp; ") in text


def test_text_rows_say_why_a_case_fails_and_escape_control_characters(tmp_path, capsys):
    old = run([record(A), record(B)])
    new = run([record(A, Label.COMPILE_ERROR, message="neuronx-cc: error: op \x1b[2Jfoo\n"
                      "  at stage 3\ntraceback ..."),
               record(B, Label.CRASH, message="")])
    assert gate(tmp_path, old, new) == 1
    out = capsys.readouterr().out
    assert f"{A}  PASS -> COMPILE_ERROR — neuronx-cc: error: op \\x1b[2Jfoo\n" in out
    assert "\x1b" not in out and "at stage 3" not in out
    (row,) = [line for line in out.splitlines() if line.startswith("  x ") and B in line]
    assert row.endswith(f"{B}  PASS -> CRASH")  # no message, nothing added


def test_a_budget_change_is_flagged_not_refused(tmp_path, capsys):
    old = run([record(A), record(B)])
    new = replace(old, options={**old.options, "compile_timeout": 5000.0})
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "gate.json")) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[3] == ("  ! BUDGET_CHANGE: compile_timeout changed: 600 s (baseline)"
                                   " -> 5000 s (candidate); timeouts and passes were judged "
                                   "under different limits")
    notes = json.loads((tmp_path / "gate.json").read_text())["notes"]
    assert [(n["kind"], n["flagged"]) for n in notes] == [("BUDGET_CHANGE", True)]
    assert gate(tmp_path, old, old) == 0
    assert "BUDGET_CHANGE" not in capsys.readouterr().out


def test_a_change_of_timed_runs_is_flagged_and_a_run_older_than_the_option_is_not(tmp_path,
                                                                                  capsys):
    """A candidate timed on 1 call against a baseline on 3 gave RUN_TIME findings and no word
    of why (an outside trial); merge refuses such parts."""
    old = run([record(A), record(B)])
    old = replace(old, options={**old.options, "timed_runs": 3})
    new = replace(old, options={**old.options, "timed_runs": 1})
    assert gate(tmp_path, old, new) == 0
    assert ("  ! TIMED_RUNS_CHANGE: timed_runs changed: 3 (baseline) -> 1 (candidate); run "
            "times are medians over different numbers of calls, and each case's output was "
            "checked on fewer calls; gate runs made with the same --timed-runs") \
        in capsys.readouterr().out.splitlines()
    older = replace(old, options={k: v for k, v in old.options.items() if k != "timed_runs"})
    assert gate(tmp_path, older, old) == 0
    assert "TIMED_RUNS_CHANGE" not in capsys.readouterr().out


def test_json_decision_has_every_finding_with_labels_times_and_message(tmp_path, capsys):
    old = run([record(A, compile_seconds=4.0), record(B), record(C)])
    new = run([record(A, Label.MISMATCH, compile_seconds=6.0, message="error ratio 3.2\nrow 7"),
               record(B, compile_seconds=9.0)])
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "gate.json")) == 1
    data = json.loads((tmp_path / "gate.json").read_text())
    assert (data["verdict"], data["exit_code"]) == ("MAY_NOT_SHIP", 1)
    assert data["exit_code_meaning"].startswith("the candidate may not ship")
    assert data["counts"] == {"REGRESSION": 1, "MISSING": 1, "COMPILE_TIME": 2}
    regression = data["findings"][0]
    assert regression == {
        "kind": "REGRESSION", "category": "blocking", "blocking": True, "subject": A,
        "case_id": A, "detail": "PASS -> MISMATCH", "old_label": "PASS",
        "new_label": "MISMATCH", "old_compile_seconds": 4.0, "new_compile_seconds": 6.0,
        "old_run_seconds": 0.01, "new_run_seconds": 0.01,
        "message_first_line": "error ratio 3.2", "message": "error ratio 3.2\nrow 7",
        "stage_grew_most": None, "confirmation": None}
    missing = next(f for f in data["findings"] if f["kind"] == "MISSING")
    assert (missing["case_id"], missing["old_label"], missing["new_label"]) == (C, "PASS", None)
    slower = [f["case_id"] for f in data["findings"] if f["kind"] == "COMPILE_TIME"]
    assert slower == [B, A]  # the largest growth first
    assert data["candidate"]["selection"]["matrix"] == "core"
    assert data["error"] is None


def test_junit_has_a_test_case_per_case_compared_failed_by_blocking_findings(tmp_path):
    old = run([record(A), record(B, Label.MISMATCH), record(C)])
    new = run([record(A, Label.CRASH,
                      message="worker died \x00\x1b[31m\nwith signal 11 \uffff\ufffe"),
               record(B), record(case_id(seq=1024))])
    assert gate(tmp_path, old, new, "--junit", str(tmp_path / "gate.xml")) == 1
    root = ET.parse(tmp_path / "gate.xml").getroot()  # parses: control characters escaped
    suite = root.find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == [A, B, case_id(seq=1024), C]
    assert (suite.get("tests"), suite.get("failures")) == ("4", "2")
    failure = cases[A].find("failure")
    assert failure.get("type") == "REGRESSION"
    assert failure.get("message") == "REGRESSION: PASS -> CRASH — worker died \\x00\\x1b[31m"
    # U+FFFF and U+FFFE, which XML cannot hold at all, made the whole file unreadable
    assert failure.text == "worker died \\x00\\x1b[31m\nwith signal 11 \\uffff\\ufffe"
    assert {p.get("name"): p.get("value") for p in cases[A].iter("property")}["label"] == "CRASH"
    assert cases[C].find("failure").get("type") == "MISSING"
    assert cases[B].find("failure") is None
    assert cases[B].find("system-out").text == "FIXED: MISMATCH -> PASS"
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert props["verdict"] == "MAY_NOT_SHIP"


def test_a_refusal_is_recorded_in_json_junit_and_markdown(tmp_path, capsys):
    """--markdown kept the last verdict after a refusal: a CI job posting it would post a
    stale MAY NOT SHIP as current (an outside trial)."""
    old = selected(run([record(A)]))
    new = selected(run([record(A)]), matrix="extended")
    (tmp_path / "g.md").write_text("## Release gate: ❌ MAY NOT SHIP: 14 blocking findings\n")
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "g.json"),
                "--junit", str(tmp_path / "g.xml"), "--markdown", str(tmp_path / "g.md")) == 2
    err = capsys.readouterr().err.strip()
    data = json.loads((tmp_path / "g.json").read_text())
    assert (data["verdict"], data["exit_code"], data["findings"]) == ("REFUSED", 2, [])
    assert err == f"flexconf gate: error: {data['error']}"
    error = ET.parse(tmp_path / "g.xml").getroot().find("testsuite/testcase/error")
    assert error.get("type") == "REFUSED" and error.get("message") == data["error"]
    markdown = (tmp_path / "g.md").read_text().splitlines()
    assert markdown[0] == "## Release gate: ⛔ REFUSED" and "MAY NOT SHIP" not in markdown
    assert "matrix 'extended' differs from the baseline" in markdown[2]


def test_an_infinite_budget_turns_the_compile_time_rule_off(tmp_path, capsys):
    old, new = run([record(A, compile_seconds=4.0)]), run([record(A, compile_seconds=80.0)])
    assert gate(tmp_path, old, new) == 1
    assert gate(tmp_path, old, new, "--compile-time-budget", "inf") == 0


def test_gate_as_a_subprocess_exits_1_on_a_regression(tmp_path):
    write_results(run([record(A)]), tmp_path / "old.json")
    write_results(run([record(A, Label.CRASH)]), tmp_path / "new.json")
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "gate", "--baseline", str(tmp_path / "old.json"),
         "--candidate", str(tmp_path / "new.json")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.startswith("gate: MAY NOT SHIP")


def test_the_gate_never_imports_torch(tmp_path):
    write_results(run([record(A, compile_seconds=4.0)]), tmp_path / "old.json")
    write_results(run([record(A, compile_seconds=6.0)]), tmp_path / "new.json")
    script = ("import sys; from conformance.cli import main; "
              f"code = main(['gate', '--baseline', {str(tmp_path / 'old.json')!r}, "
              f"'--candidate', {str(tmp_path / 'new.json')!r}]); "
              "print('torch imported' if 'torch' in sys.modules else 'torch-free', code)")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True)
    assert proc.stdout.splitlines()[-1] == "torch-free 1", proc.stdout + proc.stderr


def test_failures_an_update_added_pass_the_gate_with_a_flagged_note_until_triaged(
        tmp_path, capsys):
    old = run([record(A), record(B, Label.MISMATCH)])
    new = run([record(A), record(B, Label.MISMATCH)])
    write_results(new, tmp_path / "new.json")
    assert main(["expectations", "update", str(tmp_path / "new.json"), "--expectations",
                 str(tmp_path / "known.toml")]) == 0
    assert 'reason = "to triage: ' in (tmp_path / "known.toml").read_text()
    capsys.readouterr()
    write_results(old, tmp_path / "old.json")
    assert main(["gate", "--baseline", str(tmp_path / "old.json"), "--candidate",
                 str(tmp_path / "new.json"), "--expectations", str(tmp_path / "known.toml")]
                ) == 0
    out = capsys.readouterr().out
    assert "! UNTRIAGED: 1 known failure(s) still read 'to triage: ...', as flexconf " \
        "expectations update wrote them (e.g. line " in out
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH")) == 0
    assert "UNTRIAGED" not in capsys.readouterr().out


def test_a_row_says_why_where_the_label_is_the_finding_and_not_on_a_time_finding(
        tmp_path, capsys):
    old = run([record(A, compile_seconds=4.0), record(B, compile_seconds=4.0)])
    unsupported = replace(record(A, Label.UNSUPPORTED), message="the SDK does not lower this mask")
    slow_mismatch = replace(record(B, Label.MISMATCH, compile_seconds=9.0),
                            message="mean error 0.3 is 9.00x the baseline's")
    new = run([unsupported, slow_mismatch])
    assert gate(tmp_path, old, new, expectations=known(B, "MISMATCH")) == 1
    rows = {tuple(line.split()[1:3]): line for line in capsys.readouterr().out.splitlines()
            if line.startswith("  x ")}
    assert rows["REGRESSION", A].endswith("PASS -> UNSUPPORTED — the SDK does not lower this mask")
    assert rows["REGRESSION", B].endswith("PASS -> MISMATCH — mean error 0.3 is 9.00x the "
                                          "baseline's")
    assert "9.00x" not in rows["COMPILE_TIME", B]  # about time only
