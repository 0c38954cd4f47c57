"""The gate's time findings: the run-time rule, the stage that grew, and confirmation
(``--confirm auto|N``): a finding blocks only when the repeated medians confirm it.

Most tests give the reruns' figures through a stand-in rerun (the decision's logic); one,
``test_a_planted_slowdown_is_confirmed_and_a_spurious_finding_dismissed``, measures for real,
in subprocesses, a planted slowdown and a spurious finding (tests/slow_backends.py).
"""
from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conformance.cli import main
from records.results import Label, RunResults, load_results, write_results
from reports.confirm import Side, confirm_decision, flagged_cases, remeasure, run_workers
from reports.gate import decide, gate_text
from reports.gate_json import gate_json
from tests.slow_backends import SLOWDOWN
from tests.test_gate import gate
from tests.test_plugin_runs import TINY, clean_env, pytest_args, run as run_pytest
from tests.test_report_doctored import case_id, record, run

A, B = case_id(seq=128), case_id(seq=256)


def rerun_giving(figures: dict[str, list[float]], calls: list | None = None,
                 label: Label = Label.PASS):
    """A stand-in rerun: the i-th rerun of a side gives each case that side's i-th figure as
    its compile and run seconds."""
    count: dict[str, int] = {}

    def rerun(side: Side, case_ids, report_dir: Path):
        if calls is not None:
            calls.append((side.name, tuple(case_ids)))
        i = count[side.name] = count.get(side.name, -1) + 1
        seconds = figures[side.name][i]
        records = [replace(record(cid, label, compile_seconds=seconds), run_seconds=seconds)
                   for cid in case_ids]
        return RunResults({}, side.results.options, tuple(records), "0.1.0")

    return rerun


def confirmed(old: RunResults, new: RunResults, figures: dict[str, list[float]],
              tmp_path, **rules):
    decision = decide(old, new, **rules)
    sides = [Side(name, old if name == "baseline" else new, f"/py/{name}") for name in figures]
    measured = remeasure(sides, flagged_cases(decision), len(figures["candidate"]), tmp_path,
                         rerun=rerun_giving(figures))
    return confirm_decision(decision, measured)


def test_sides_take_turns_and_each_rerun_runs_every_flagged_case(tmp_path):
    old = run([record(A, compile_seconds=4.0), record(B, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=9.0), record(B, compile_seconds=8.0)])
    decision = decide(old, new)
    calls: list = []
    sides = [Side("baseline", old, "/py/old"), Side("candidate", new, "/py/new")]
    remeasure(sides, flagged_cases(decision), 2, tmp_path,
              rerun=rerun_giving({"baseline": [4, 4], "candidate": [9, 9]}, calls))
    assert calls == [("baseline", (A, B)), ("candidate", (A, B))] * 2


def test_a_run_says_how_many_workers_it_had():
    two = replace(run([record(A)]), environment={"workers": 2})
    assert run_workers(two) == 2
    assert run_workers(replace(two, environment={"workers": 1})) == 1
    assert run_workers(run([record(A)])) == 1  # not recorded: one process


def test_a_finding_the_reruns_do_not_reproduce_is_dismissed_and_does_not_block(tmp_path):
    old = run([record(A, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=5.2)])
    assert not decide(old, new).may_ship  # one measurement per run: it blocks
    decision = confirmed(old, new, {"baseline": [5.0, 4.8, 5.3], "candidate": [5.1, 4.9, 5.6]},
                         tmp_path)
    assert decision.may_ship
    [finding] = decision.findings
    assert (finding.category, finding.confirmation.status) == ("dismissed", "dismissed")
    text = gate_text(decision, "old.json", "new.json")
    assert text.startswith("gate: MAY SHIP (dismissed: 1 COMPILE_TIME)")
    assert (f"  ~ COMPILE_TIME       {A}  4.00 s -> 5.20 s (x1.30 >= x1.25)\n"
            "      dismissed as noise, measured again x3: candidate median 5.10 s (4.90-5.60 over "
            "3), baseline median 5.00 s (4.80-5.30 over 3): x1.02 < x1.25\n") in text
    assert "note: 1 flagged case measured again 3 times, cold, each with its run's options: " \
           "candidate with /py/candidate, baseline with /py/baseline; 1 dismissed" in text


def test_sub_second_figures_keep_the_digits_their_ratio_needs():
    """Run times of 0.0140 s and 0.0310 s were printed as 0.01 s and 0.03 s beside a ratio of
    x0.45 that those figures do not give (an outside trial)."""
    from reports.timing import Confirmation, Figures, TimeRule

    candidate = Figures("/py/new", (0.014031, 0.0139, 0.0142))
    baseline = Figures("/py/old", (0.031035, 0.0305, 0.0320))
    assert candidate.text == "median 0.0140 s (0.0139-0.0142 over 3)"
    line = Confirmation("dismissed", TimeRule("run", 1.25, 0.01), 3, candidate, baseline).text
    assert line == ("dismissed as noise, measured again x3: candidate median 0.0140 s "
                    "(0.0139-0.0142 over 3), baseline median 0.0310 s (0.0305-0.0320 over 3): "
                    "x0.45 < x1.25")


def test_a_slowdown_the_reruns_reproduce_is_confirmed_and_blocks(tmp_path):
    old = run([record(A, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=6.0)])
    decision = confirmed(old, new, {"baseline": [4.1, 3.9, 4.4], "candidate": [6.2, 5.8, 6.1]},
                         tmp_path)
    assert not decision.may_ship
    [finding] = decision.blocking
    assert finding.confirmation.status == "confirmed"
    assert ("      confirmed, measured again x3: candidate median 6.10 s (5.80-6.20 over 3), "
            "baseline median 4.10 s (3.90-4.40 over 3): x1.49 >= x1.25\n") in \
        gate_text(decision, "old.json", "new.json")
    data = gate_json(decision, old, new, "old.json", "new.json")["findings"][0]["confirmation"]
    assert data["status"] == "confirmed" and data["repeats"] == 3
    assert data["candidate"] == {"python": "/py/candidate", "seconds": [6.2, 5.8, 6.1],
                                 "median": 6.1, "min": 5.8, "max": 6.2, "failures": [],
                                 "breakdown": None}
    assert data["compared"] == {"baseline_seconds": 4.1, "candidate_seconds": 6.1,
                                "ratio": pytest.approx(6.1 / 4.1)}
    assert data["recorded_baseline_seconds"] == 4.0


def test_a_recorded_baseline_figure_can_confirm_a_finding_but_never_dismiss_one(tmp_path):
    """The baseline's run may have been slowed by load: a candidate measured again on a quiet
    machine against it would hide a real slowdown (a review reproduced one: a 2x slower
    plugin passed). Only both releases measured again can dismiss a finding."""
    old = run([record(A, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=5.2)])
    decision = confirmed(old, new, {"candidate": [5.1, 4.9, 5.6]}, tmp_path)
    assert not decision.may_ship  # 5.1 s against the recorded 4.0 s: confirmed
    text = gate_text(decision, "old.json", "new.json")
    assert "confirmed, measured again x3: candidate median 5.10 s (4.90-5.60 over 3), baseline " \
           "as recorded 4.00 s: x1.27 >= x1.25" in text
    assert "the baseline was not measured again (its recorded figures can confirm a finding, " \
           "never dismiss one)" in text
    assert gate_json(decision, old, new, "o", "n")["findings"][0]["confirmation"][
        "baseline"] is None
    quiet = confirmed(old, new, {"candidate": [4.1, 3.9, 4.2]}, tmp_path)
    assert not quiet.may_ship  # x1.02 against the recorded figure: still not dismissed
    [finding] = quiet.blocking
    assert finding.confirmation.status == "unmeasured"
    assert ("not confirmed, still blocking: the baseline was not measured again, measured "
            "again x3: candidate median 4.10 s (3.90-4.20 over 3), baseline as recorded 4.00 s: "
            "x1.02 < x1.25") in gate_text(quiet, "old.json", "new.json")
    candidate_only = rerun_giving({"candidate": [4.1, 3.9, 4.2]})

    def baseline_fails(side, case_ids, report_dir):  # the baseline's reruns give no figure
        return "pytest exited 3: INTERNALERROR" if side.name == "baseline" else \
            candidate_only(side, case_ids, report_dir)

    measured = remeasure([Side("baseline", old, "/py/old"), Side("candidate", new, "/py/new")],
                         [A], 3, tmp_path, rerun=baseline_fails)
    no_figure = confirm_decision(decide(old, new), measured)
    assert [f.confirmation.status for f in no_figure.blocking] == ["unmeasured"]
    assert "not confirmed, still blocking: the reruns gave the baseline no figure" in \
        gate_text(no_figure, "old.json", "new.json")


def test_a_finding_whose_reruns_give_no_figure_still_blocks(tmp_path):
    old = run([record(A, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=6.0)])
    decision = decide(old, new)
    measured = remeasure([Side("candidate", new, "/py/new")], [A], 2, tmp_path,
                         rerun=lambda side, ids, d: "pytest exited 3: INTERNALERROR")
    decision = confirm_decision(decision, measured)
    assert not decision.may_ship
    assert decision.findings[0].confirmation.status == "unmeasured"
    assert ("not confirmed, still blocking: the reruns gave no figure, measured again x2: "
            "candidate no figure (rerun 1: pytest exited 3: INTERNALERROR; rerun 2: pytest "
            "exited 3: INTERNALERROR)") in gate_text(decision, "o", "n")
    crashed = remeasure([Side("candidate", new, "/py/new")], [A], 1, tmp_path,
                        rerun=rerun_giving({"candidate": [6.0]}, label=Label.CRASH))
    assert confirm_decision(decide(old, new), crashed).findings[0].confirmation.text.endswith(
        "candidate no figure (CRASH), baseline as recorded 4.00 s")


def test_findings_not_measured_again_block_and_the_note_says_why(tmp_path, capsys):
    """Runs that record no release (their backend's environment() records no torch version):
    ``--confirm auto`` (the default) cannot show any python has them, so it measures nothing,
    and the note (shown first) says why; ``--confirm 0`` says it is off."""
    def no_release(results):
        return replace(results, environment={"backend": "neuron", "host": "host-1"})

    old = no_release(run([record(A, compile_seconds=4.0)]))
    new = no_release(run([record(A, compile_seconds=6.0)]))
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "gate.json"), confirm="auto") == 1
    out = capsys.readouterr().out
    assert ("! UNCONFIRMED: time findings are unconfirmed, and block: each case was measured "
            "once per run, and --confirm auto did not measure them again: the baseline's "
            "results record no release (no torch version: its backend's environment() records "
            "none), so no python can be shown to have it") in out, out
    finding = json.loads((tmp_path / "gate.json").read_text())["findings"][0]
    assert finding["confirmation"]["status"] == "unconfirmed"
    assert finding["confirmation"]["candidate"] is None
    assert gate(tmp_path, old, new, "--confirm", "0") == 1
    assert ("note: time findings are unconfirmed, and block: each case was measured once per "
            "run, and --confirm 0 turned measuring them again off") in capsys.readouterr().out
    assert gate(tmp_path, old, old, confirm="auto") == 0
    assert "unconfirmed" not in capsys.readouterr().out  # no time finding, no note


@pytest.mark.parametrize("old_s, new_s, extra, code", [
    (0.010, 0.020, (), 0),  # run time is not gated by default
    (0.010, 0.020, ("--run-time-slack", "0.005"), 1),
    (0.010, 0.012, ("--run-time-slack", "0"), 0),  # x1.2: within the default budget
    (0.010, 0.020, ("--run-time-slack", "0.02"), 0),  # doubled, but by less than the slack
    (0.010, 0.020, ("--run-time-slack", "0", "--run-time-budget", "2.5"), 0),
])
def test_run_time_blocks_only_when_its_slack_is_given(tmp_path, capsys, old_s, new_s, extra,
                                                      code):
    old = run([replace(record(A), run_seconds=old_s)])
    new = run([replace(record(A), run_seconds=new_s)])
    assert gate(tmp_path, old, new, *extra) == code
    assert ("x RUN_TIME" in capsys.readouterr().out) == (code == 1)


def test_a_run_time_finding_is_confirmed_on_the_repeated_run_times(tmp_path):
    old = run([replace(record(A), run_seconds=1.0)])
    new = run([replace(record(A), run_seconds=2.0)])
    rule = dict(run_slack_seconds=0.1)
    assert [f.kind for f in decide(old, new, **rule).blocking] == ["RUN_TIME"]
    noise = confirmed(old, new, {"baseline": [1.0, 1.1, 1.0], "candidate": [1.1, 1.0, 1.2]},
                      tmp_path, **rule)
    assert noise.may_ship and noise.findings[0].confirmation.rule.measure == "run"
    real = confirmed(old, new, {"baseline": [1.0, 1.1, 1.0], "candidate": [2.1, 1.9, 2.0]},
                     tmp_path, **rule)
    assert [f.confirmation.status for f in real.blocking] == ["confirmed"]


def test_a_compile_time_finding_names_the_stage_that_grew_most(tmp_path, capsys):
    old = run([replace(record(A, compile_seconds=4.0), compile_breakdown={
        "dynamo": 1.0, "inductor codegen": 1.5, "cpp compile": 1.2, "other": 0.3})])
    new = run([replace(record(A, compile_seconds=6.0), compile_breakdown={
        "dynamo": 1.1, "inductor codegen": 1.4, "cpp compile": 3.1, "other": 0.4})])
    assert gate(tmp_path, old, new, "--json", str(tmp_path / "gate.json")) == 1
    assert (f"x COMPILE_TIME       {A}  4.00 s -> 6.00 s (x1.50 >= x1.25); stage that grew "
            "most: cpp compile 1.20 s -> 3.10 s") in capsys.readouterr().out
    finding = json.loads((tmp_path / "gate.json").read_text())["findings"][0]
    assert finding["stage_grew_most"] == {"stage": "cpp compile", "old_seconds": 1.2,
                                          "new_seconds": 3.1}
    without = run([record(A, compile_seconds=4.0)])  # a record without a breakdown
    assert gate(tmp_path, without, new) == 1
    assert "stage that grew" not in capsys.readouterr().out


@pytest.mark.parametrize("extra, words", [
    (("--confirm", "0", "--baseline-python", sys.executable), "--baseline-python " +
     sys.executable + " is used only when findings are measured again, which --confirm 0 "
                      "turns off; drop one of them"),
    (("--confirm", "-1"), "--confirm -1 is negative"),
    (("--confirm", "abc"), "--confirm 'abc' is not auto or a count; give how many times"),
    (("--confirm", "1.5"), "--confirm '1.5' is not auto or a count"),
    (("--confirm", "2", "--candidate-python", "/no/such/python"), "'/no/such/python' is not an "
                                                                   "executable python"),
    (("--confirm", "1", "--candidate-python", "/bin/false"), "'/bin/false' is not an "
                                                              "executable python (`-c 'import "
                                                              "sys'` exited 1)"),
    (("--run-time-slack", "-1"), "--run-time-slack -1 is not a number of seconds >= 0"),
    (("--run-time-budget", "0.9"), "--run-time-budget 0.9 is not a factor >= 1"),
])
def test_bad_confirmation_arguments_are_one_line_errors(tmp_path, capsys, extra, words):
    assert gate(tmp_path, run([record(A)]), run([record(A)]), *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def slow_python(tmp_path: Path, share: str) -> str:
    """A python whose runs have the planted slowdown: the candidate release of the test."""
    script = tmp_path / "python-slow"
    script.write_text(f"#!/bin/sh\n{SLOWDOWN}={share} exec {sys.executable} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.slow
def test_a_planted_slowdown_is_confirmed_and_a_spurious_finding_dismissed(tmp_path, capsys):
    """Measured for real: the candidate's ``causal`` case sleeps half its first call longer
    (tests/slow_backends.py); its ``full`` case is unchanged, but the baseline recorded it at
    half its time (a figure the machine does not reproduce: noise). The baseline is the
    candidate's own run as it measured itself without the planted sleep. One measurement
    blocks on both; without a python for the baseline nothing is measured again and both stay
    blocking; given one, the gate measures both releases again (twice here: --confirm auto's 3
    is tests/test_gate_confirm_plan.py's), side by side: the baseline with this python, the
    candidate with a python that has the slowdown. The slowdown is confirmed, the noise
    dismissed."""
    from cases.model import Case, Variant

    cases = [Case(Variant("causal"), TINY), Case(Variant("full"), TINY)]
    slow, spurious = (c.id for c in cases)
    proc = run_pytest(pytest_args(tmp_path, "tests.slow_backends:SlowFirstCall", cases),
                      env=clean_env(**{SLOWDOWN: "0.5"}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    candidate = load_results(tmp_path / "report" / "results.json")
    by_id = candidate.by_id()
    planted = by_id[slow].compile_breakdown["planted sleep"]
    assert planted > 0 and by_id[spurious].compile_breakdown["planted sleep"] == 0
    baseline = replace(candidate, started_at="2026-01-02T03:04:05.000+00:00", records=(
        replace(by_id[slow], compile_seconds=by_id[slow].compile_seconds - planted,
                compile_breakdown={**by_id[slow].compile_breakdown, "planted sleep": 0.0}),
        replace(by_id[spurious], compile_seconds=by_id[spurious].compile_seconds / 2,
                compile_breakdown={k: v / 2 for k, v in
                                   by_id[spurious].compile_breakdown.items()})))
    write_results(baseline, tmp_path / "old.json")
    args = ["gate", "--baseline", str(tmp_path / "old.json"), "--candidate",
            str(tmp_path / "report" / "results.json")]  # the default budget and slack

    assert main(args + ["--confirm", "0", "--json", str(tmp_path / "once.json")]) == 1
    once = {f["case_id"]: f for f in json.loads((tmp_path / "once.json").read_text())["findings"]}
    assert {cid: f["blocking"] for cid, f in once.items()} == {slow: True, spurious: True}
    assert once[slow]["stage_grew_most"]["stage"] == "planted sleep"
    assert main(args + ["--json", str(tmp_path / "unmeasured.json")]) == 1  # no baseline python
    unmeasured = json.loads((tmp_path / "unmeasured.json").read_text())["findings"]
    assert [(f["blocking"], f["confirmation"]["status"], f["confirmation"]["repeats"])
            for f in unmeasured] == [(True, "unconfirmed", 0)] * 2, unmeasured
    capsys.readouterr()

    assert main(args + ["--baseline-python", sys.executable,
                        "--candidate-python", slow_python(tmp_path, "0.5"), "--confirm", "2",
                        "--json", str(tmp_path / "confirmed.json")]) == 1
    err = capsys.readouterr().err
    assert ("confirm: 2 flagged cases measured again 2 times, cold, for the baseline and the "
            "candidate\n") in err, err
    assert "confirm: rerun 2/2 of the candidate (2 cases" in err, err
    data = json.loads((tmp_path / "confirmed.json").read_text())
    found = {f["case_id"]: f for f in data["findings"]}
    assert data["counts"] == {"COMPILE_TIME": 2}
    assert (found[slow]["category"], found[slow]["confirmation"]["status"]) == \
        ("blocking", "confirmed"), found[slow]["confirmation"]
    assert (found[spurious]["category"], found[spurious]["confirmation"]["status"]) == \
        ("dismissed", "dismissed"), found[spurious]["confirmation"]
    for f in found.values():
        for side in ("baseline", "candidate"):
            assert len(f["confirmation"][side]["seconds"]) == 2, f["confirmation"]
    assert found[slow]["confirmation"]["stage_grew_most"]["stage"] == "planted sleep"


def test_confirm_measures_at_most_max_cases_again_those_that_grew_most(tmp_path):
    """Three flagged cases, at most two measured again: the two that grew most; the third's
    finding stays unconfirmed and blocks, and the note says so."""
    C = case_id(seq=512)
    old = run([record(c, compile_seconds=4.0) for c in (A, B, C)])
    new = run([record(A, compile_seconds=5.2), record(B, compile_seconds=9.0),
               record(C, compile_seconds=7.0)])
    decision = decide(old, new)
    assert flagged_cases(decision, 2) == [B, C]
    assert sorted(flagged_cases(decision)) == sorted([A, B, C])
    sides = [Side("baseline", old, "/py/old"), Side("candidate", new, "/py/new")]
    calls: list = []
    measured = remeasure(sides, flagged_cases(decision, 2), 1, tmp_path,
                         rerun=rerun_giving({"baseline": [4.0], "candidate": [3.9]}, calls))
    assert calls == [("baseline", (B, C)), ("candidate", (B, C))]
    confirmed_decision = confirm_decision(decision, measured)
    status = {f.subject: f.confirmation.status if f.confirmation else "unconfirmed"
              for f in confirmed_decision.findings}
    assert status == {A: "unconfirmed", B: "dismissed", C: "dismissed"}
    assert not confirmed_decision.may_ship  # A was never measured again: it still blocks
    [note] = [n.text for n in confirmed_decision.notes if n.kind == "CONFIRMATION"]
    assert note.startswith("2 flagged cases measured again 1 time,")
    assert "; 2 dismissed; 1 more flagged case not measured again" in note  # A is not counted
    assert note.endswith("(--confirm-max-cases: those whose time grew by the largest factor, "
                         "compile and run taking turns, were), their findings unconfirmed and "
                         "blocking")
    assert not [n for n in confirmed_decision.notes if n.kind == "UNCONFIRMED"]


def test_a_fuzzed_case_is_not_rerun_by_id_and_its_finding_keeps_blocking(tmp_path):
    """--case-id fuzz/... is refused by the matrix: one such id failed the whole rerun, and
    every flagged case of it went unmeasured."""
    fuzzed = "fuzz/" + B
    old = run([record(A, compile_seconds=4.0), record(fuzzed, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=9.0), record(fuzzed, compile_seconds=9.0)])
    decision = decide(old, new)
    assert flagged_cases(decision) == [A]
    sides = [Side("baseline", old, "/py/old"), Side("candidate", new, "/py/new")]
    measured = remeasure(sides, flagged_cases(decision), 1, tmp_path,
                         rerun=rerun_giving({"baseline": [4.0], "candidate": [3.9]}))
    confirmed_decision = confirm_decision(decision, measured)
    status = {f.subject: f.confirmation.status if f.confirmation else "unconfirmed"
              for f in confirmed_decision.findings}
    assert status == {A: "dismissed", fuzzed: "unconfirmed"}
    assert not confirmed_decision.may_ship
    [note] = [n.text for n in confirmed_decision.notes if n.kind == "CONFIRMATION"]
    assert note.endswith("; 1 flagged fuzzed case not measured again (in no matrix: --case-id "
                         "cannot rerun it), unconfirmed and blocking")


def test_when_every_flagged_case_is_fuzzed_the_note_says_none_can_be_measured(tmp_path, capsys):
    fuzzed = "fuzz/" + B
    old = run([record(fuzzed, compile_seconds=4.0)])
    new = run([record(fuzzed, compile_seconds=9.0)])
    assert gate(tmp_path, old, new, confirm="3") == 1  # nothing to rerun: nothing probed
    out = capsys.readouterr().out
    assert ("note: time findings are unconfirmed: the 1 flagged case is fuzzed, in no matrix, "
            "so --confirm cannot measure them again") in out
    assert "--confirm N measures" not in out


def test_confirm_max_cases_below_one_or_without_confirm_is_a_one_line_error(tmp_path, capsys):
    for extra, words in ((("--confirm", "2", "--confirm-max-cases", "0"),
                          "--confirm-max-cases 0 is below 1"),
                         (("--confirm", "0", "--confirm-max-cases", "5"),
                          "--confirm-max-cases 5 is used only when findings are measured "
                          "again")):
        assert gate(tmp_path, run([record(A)]), run([record(A)]), *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err


def test_a_candidate_rerun_without_a_figure_keeps_the_finding_blocking(tmp_path):
    """A COMPILE_TIMEOUT among the candidate's reruns is slower than any figure: the median
    of the others must not dismiss the finding (a review: 5.0 s and two timeouts against a
    baseline of 4.9-5.1 s read "dismissed as noise")."""
    old = run([record(A, compile_seconds=4.0)])
    new = run([record(A, compile_seconds=6.0)])
    calls = {"candidate": 0}

    def rerun(side, case_ids, report_dir):
        if side.name == "baseline":
            return RunResults({}, old.options, (record(A, compile_seconds=5.0),), "0.1.0")
        calls["candidate"] += 1
        timed_out = calls["candidate"] > 1
        return RunResults({}, new.options, (record(
            A, Label.COMPILE_TIMEOUT if timed_out else Label.PASS,
            compile_seconds=None if timed_out else 5.0),), "0.1.0")

    measured = remeasure([Side("baseline", old, "/py/old"), Side("candidate", new, "/py/new")],
                         [A], 3, tmp_path, rerun=rerun)
    decision = confirm_decision(decide(old, new), measured)
    assert not decision.may_ship
    [finding] = decision.blocking
    assert finding.confirmation.status == "unmeasured"
    assert ("not confirmed, still blocking: 2 of the candidate's reruns gave no figure "
            "(COMPILE_TIMEOUT; COMPILE_TIMEOUT)") in gate_text(decision, "o", "n")


def test_a_rerun_runs_from_an_absolute_report_dir_and_must_record_its_sides_release(
        tmp_path, monkeypatch):
    """pytest runs from the suite's root: a relative --confirm-dir must not send its results
    elsewhere than the gate reads them; and a rerun that recorded another release than its
    side's run (a python changed since it was asked) gives no figure. The side's python's
    directory comes first on PATH (its release's tools, as activating its venv would)."""
    import subprocess

    import reports.confirm as confirm

    seen = {}

    def fake_run(command, cwd, env, **kwargs):
        report_dir = Path(command[command.index("--report-dir") + 1])
        seen.update(report_dir=report_dir, path=env["PATH"])
        write_results(replace(run([record(A)]), environment={"torch": "9.9.9"}),
                      report_dir / "results.json")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(confirm.subprocess, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    side = Side("candidate", replace(run([record(A)]), environment={"torch": "2.13.0"}),
                "/opt/sdk/bin/python")
    said = confirm.run_pytest(side, [A], Path("confirm") / "candidate-1")
    assert seen["report_dir"] == tmp_path / "confirm" / "candidate-1"
    assert seen["path"].startswith("/opt/sdk/bin" + os.pathsep)
    assert said == ("the rerun ran another release than the candidate (torch '9.9.9' where the "
                    "run recorded '2.13.0')")


def test_the_text_table_counts_dismissed_findings_apart_from_confirmed_ones(tmp_path,
                                                                           monkeypatch):
    """Dismissed time findings come after the confirmed ones of their kind: counted with them,
    they were the rows cut, under a "more COMPILE_TIME" that read as more blocking ones."""
    import reports.gate

    monkeypatch.setattr(reports.gate, "TEXT_ROWS_PER_KIND", 2)
    ids = [case_id(seq=64 * (i + 1)) for i in range(6)]
    old = run([record(c, compile_seconds=4.0) for c in ids])
    new = run([record(c, compile_seconds=8.0) for c in ids])
    slow = set(ids[:3])  # the reruns confirm these and dismiss the rest

    def rerun(side: Side, case_ids, report_dir: Path):
        seconds = {c: 8.0 if side.name == "candidate" and c in slow else 4.0 for c in case_ids}
        records = [replace(record(c, compile_seconds=seconds[c]), run_seconds=1.0)
                   for c in case_ids]
        return RunResults({}, side.results.options, tuple(records), "0.1.0")

    decision = decide(old, new)
    sides = [Side("baseline", old, "/py/old"), Side("candidate", new, "/py/new")]
    measured = remeasure(sides, flagged_cases(decision), 1, tmp_path, rerun=rerun)
    text = gate_text(confirm_decision(decision, measured), "old.json", "new.json")
    assert text.startswith("gate: MAY NOT SHIP: 3 blocking findings (blocking: 3 COMPILE_TIME; "
                           "dismissed: 3 COMPILE_TIME)")
    rows = [line[:4] for line in text.splitlines() if line.startswith(("  x ", "  ~ "))]
    assert rows == ["  x "] * 2 + ["  ~ "] * 2
    assert "  ... and 1 more COMPILE_TIME (blocking; --markdown or --json FILE lists all)" in text
    assert "  ... and 1 more COMPILE_TIME (dismissed; --markdown or --json FILE lists all)" in text
