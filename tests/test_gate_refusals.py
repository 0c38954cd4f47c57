"""What the release gate refuses, each as one line and exit 2: runs that cannot be compared
(another case set, backend, suite or oracle), unreadable files, values out of range, and outputs
it cannot write or that would overwrite an input; and the output directories it makes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import replace

import pytest

from conformance.cli import main
from records.results import Label, RunResults, write_results
from tests.test_gate import A, REPO, gate, known, selected
from tests.test_report_doctored import record, run

@pytest.mark.parametrize("old_selection, new_selection, words", [
    (dict(), dict(matrix="extended"), ["matrix 'extended' differs from the baseline's 'core'"]),
    (dict(), dict(keyword="causal"), ["-k expression 'causal' differs from the baseline's ''"]),
    (dict(), dict(markexpr="slow"), ["-m expression 'slow'"]),
    (dict(), dict(cases_modules=("my.cases",)), ["cases modules my.cases differs from the "
                                                 "baseline's none"]),
    (dict(case_file="/a/cases.json", case_file_sha256="1" * 64),
     dict(case_file="/b/cases.json", case_file_sha256="2" * 64),
     ["case file /b/cases.json (sha256 222222222222) differs from the baseline's "
      "/a/cases.json (sha256 111111111111)"]),
    (dict(), dict(shard="1/2"), ["new.json: shard 1/2 of a run, not the whole run; merge"]),
    # a shard's selection is the whole run's: it is a shard, not a damaged file (a review)
    (dict(), dict(shard="1/2", case_ids=(A, "causal/b1-h8x8-s256x256-d128/bf16/fwd")),
     ["new.json: shard 1/2 of a run, not the whole run; merge"]),
])
def test_runs_of_different_case_set_definitions_are_refused(tmp_path, capsys, old_selection,
                                                           new_selection, words):
    old = selected(run([record(A)]), **old_selection)
    new = selected(run([record(A)]), **new_selection)
    assert gate(tmp_path, old, new) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("flexconf gate: error: ")
    for word in words:
        assert word in err, err


def test_a_case_file_at_another_path_with_the_same_content_is_comparable(tmp_path):
    old = selected(run([record(A)]), case_file="/a/cases.json", case_file_sha256="1" * 64)
    new = selected(run([record(A)]), case_file="/b/cases.json", case_file_sha256="1" * 64)
    assert gate(tmp_path, old, new) == 0


def test_runs_of_one_case_file_are_comparable_whatever_matrix_an_older_suite_recorded(
        tmp_path):
    """--matrix extended beside --case-file chose nothing, yet gate and merge refused the
    run against one of the same file without it (an outside audit; a run now refuses the
    pair, and files from before are compared as without it)."""
    same_file = dict(case_file="/a/cases.json", case_file_sha256="1" * 64)
    old = selected(run([record(A)]), **same_file)
    new = selected(run([record(A)]), matrix="extended", **same_file)
    assert gate(tmp_path, old, new) == 0


def test_a_k_run_against_a_case_id_run_names_both_differences(tmp_path, capsys):
    """Only the -k difference was named, and the fix ("the same -k expression") did not say
    that --case-id differed too (an outside walkthrough)."""
    old = selected(run([record(A)]), keyword="b1-")
    new = selected(run([record(A)]))
    new = replace(new, options={**new.options, "case_ids": [A]})
    assert gate(tmp_path, old, new) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert (f"-k expression '' differs from the baseline's 'b1-'; --case-id {[A]!r} differs "
            "from the baseline's none") in err, err
    assert err.endswith("gate two runs of the same -k expression and --case-id"), err


def test_a_baseline_of_another_matrix_without_a_selection_block_is_refused(tmp_path, capsys):
    old = run([record(A)])
    old = replace(old, options={**old.options, "matrix": "extended"})
    assert gate(tmp_path, old, selected(run([record(A)]))) == 2
    assert "matrix 'core' differs from the baseline's 'extended'" in capsys.readouterr().err


@pytest.mark.parametrize("change, words", [
    (dict(profile="full"), ["new.json", "profile 'full'", "baseline's 'smoke'"]),
    (dict(suite_version="0.2.0"), ["suite version '0.2.0'"]),
    (dict(backend="cuda-inductor"), ["backend 'cuda-inductor'"]),
    (dict(complete=False), ["new.json", "interrupted"]),
])
def test_runs_that_cannot_be_compared_are_bad_input(tmp_path, capsys, change, words):
    assert gate(tmp_path, run([record(A)]), run([record(A)], **change)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("flexconf gate: error: ")
    for word in words:
        assert word in err


def test_a_complete_run_that_lacks_selected_cases_is_bad_input(tmp_path, capsys):
    """A hand-edited selected_count of 10**30 beside one record, or a selection naming cases
    with no record, still gave MAY SHIP (an outside audit)."""
    from tests.test_gate import B

    whole = run([record(A)])
    for candidate in (replace(whole, selected_count=10**30),
                      selected(whole, case_ids=(A, B))):
        assert gate(tmp_path, whole, candidate) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"flexconf gate: error: {tmp_path / 'new.json'}: it says "
                              "complete, but ")
        assert err.endswith(("selected cases have no record (an edited or damaged file); gate "
                             "a results file a run wrote", "1 of its 2 selected cases has no "
                             "record (an edited or damaged file); gate a results file a run "
                             "wrote"))
    assert gate(tmp_path, whole, selected(whole)) == 0
    # a record of a case the selection does not name (an id a disk fault changed: MAY SHIP
    # before, an outside audit); a fuzzed example's record is named by no selection
    stray = replace(record(A), case_id=B)
    assert gate(tmp_path, whole, selected(run([record(A), stray]), case_ids=(A,))) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"it says complete, but 1 of its records is of a case it did not select ({B!r}) (an "
        "edited or damaged file); gate a results file a run wrote")
    fuzzed = replace(record(A), case_id="fuzz/" + B)
    assert gate(tmp_path, whole, selected(run([record(A), fuzzed]), case_ids=(A,))) == 0


def _judged_by(version: int | None, revision: str | None = None) -> RunResults:
    """A run whose results.json says which oracle judged it (None: a file from before that
    was recorded) and at which revision of the suite."""
    results = run([record(A)])
    environment = dict(results.environment)
    if version is not None:
        environment["reference_version"] = version
    if revision is not None:
        environment["git_revision"] = revision
    return replace(results, environment=environment)


def test_runs_judged_by_another_oracle_are_bad_input_that_says_how_to_gate_them(tmp_path,
                                                                              capsys):
    """A label that changed between runs that two versions of the oracle judged could be the
    suite's change, not the release's: one line naming both versions, the run the older oracle
    judged (to run again) and the suite revision of the newer one (not a dirty one, which no
    checkout gives back). A file that records no version is gated as before: what was not
    recorded cannot be checked."""
    assert gate(tmp_path, _judged_by(17, "abc1234"), _judged_by(18, "def5678")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("flexconf gate: error: ")
    for words in (f"{tmp_path / 'new.json'}: reference version 18 differs from the baseline's "
                  f"17 ({tmp_path / 'old.json'})",
                  f"run {tmp_path / 'old.json'} again with the suite that judged the other "
                  "(reference version 18, git checkout def5678)"):
        assert words in err, err
    assert gate(tmp_path, _judged_by(18, "abc1234"), _judged_by(17, "def5678")) == 2
    assert (f"run {tmp_path / 'new.json'} again with the suite that judged the other "
            "(reference version 18, git checkout abc1234)") in capsys.readouterr().err
    assert gate(tmp_path, _judged_by(17), _judged_by(18, "abc1234-dirty")) == 2
    err = capsys.readouterr().err
    assert "reference version 18" in err and "git checkout" not in err
    assert gate(tmp_path, _judged_by(18, "abc1234"), _judged_by(18, "def5678"),
                "--json", str(tmp_path / "gate.json")) == 0
    decision = json.loads((tmp_path / "gate.json").read_text())
    assert decision["baseline"]["reference_version"] == 18
    assert gate(tmp_path, _judged_by(None), _judged_by(18)) == 0
    assert gate(tmp_path, _judged_by(18), _judged_by(None)) == 0


def test_unreadable_files_are_bad_input(tmp_path, capsys):
    write_results(run([record(A)]), tmp_path / "old.json")
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["gate", "--baseline", str(tmp_path / "old.json"),
                 "--candidate", str(tmp_path / "absent.json")]) == 2
    assert "absent.json: no such file" in capsys.readouterr().err
    assert main(["gate", "--baseline", str(tmp_path / "broken.json"),
                 "--candidate", str(tmp_path / "old.json")]) == 2
    assert "broken.json: not JSON" in capsys.readouterr().err
    assert gate(tmp_path, run([record(A)]), run([record(A)]),
                expectations=known(A, "PASSED")) == 2
    assert "known.toml:1: unknown label 'PASSED'" in capsys.readouterr().err


def test_unreadable_kinds_of_file_name_the_file_and_the_fix(tmp_path, capsys):
    write_results(run([record(A)]), tmp_path / "old.json")
    (tmp_path / "binary.json").write_bytes(b"\xd9\x00garbage")  # 0xd9 needs a continuation
    (tmp_path / "other.json").write_text('{"anything": 1}')
    (tmp_path / "dir.json").mkdir()
    for name, problem in (("binary.json", "not UTF-8 text (byte 0xd9 at offset 0)"),
                          ("dir.json", "is a directory, not a file"),
                          ("other.json", "not a valid results file at (top level)")):
        assert main(["gate", "--baseline", str(tmp_path / "old.json"),
                     "--candidate", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith(f"flexconf gate: error: {tmp_path / name}: {problem}")
        assert err.endswith("; pass the results.json of a run")


@pytest.mark.parametrize("flag", ["--compile-time-budget", "--run-time-budget",
                                  "--compile-time-slack", "--run-time-slack"])
@pytest.mark.parametrize("value", ["nan", "-1"])
def test_a_factor_or_slack_that_is_not_a_number_in_range_is_bad_input(tmp_path, capsys, flag,
                                                                      value):
    """nan compares false with everything: as a budget it let every compile time through,
    and a run that the default budget blocks shipped (exit 0)."""
    old = run([replace(record(A, compile_seconds=4.0), run_seconds=0.1)])
    new = run([replace(record(A, compile_seconds=8.0), run_seconds=0.2)])
    assert gate(tmp_path, old, new, "--run-time-slack", "0") == 1  # blocked, as it must be
    capsys.readouterr()
    extra = (flag, value) if flag == "--run-time-slack" else (flag, value, "--run-time-slack", "0")
    assert gate(tmp_path, old, new, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"flexconf gate: error: {flag} ")
    assert "is not a" in err and "; give" in err


@pytest.mark.parametrize("args, words", [
    (("--run-time-slack", "abc"), "argument --run-time-slack: invalid float value: 'abc'"),
    (("--no-such-option",), "unrecognized arguments: --no-such-option"),
])
def test_a_value_argparse_refuses_is_one_line_naming_it_and_where_the_usage_is(tmp_path, args,
                                                                                words):
    write_results(run([record(A)]), tmp_path / "old.json")
    proc = subprocess.run(
        [sys.executable, "-m", "conformance.cli", "gate", "--baseline", str(tmp_path / "old.json"),
         "--candidate", str(tmp_path / "old.json"), *args], cwd=REPO, capture_output=True,
        text=True)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [f"flexconf gate: error: {words}; see flexconf gate -h"]


def test_an_output_the_gate_cannot_write_is_bad_input_before_judging(tmp_path, capsys):
    """It printed the whole verdict (with --confirm, after seconds of measuring) and only then
    failed on the path."""
    afile = tmp_path / "afile"
    afile.write_text("")
    for unwritable, problem in ((afile / "g.json",
                                 f"its directory {afile}: it is a file, not a directory"),
                                (afile / "dir" / "g.json", f"its directory {afile / 'dir'}: "
                                                           f"{afile} is a file, not a directory")):
        assert gate(tmp_path, run([record(A)]), run([record(A, Label.MISMATCH)]),
                    "--json", str(unwritable)) == 2
        out, err = capsys.readouterr()
        assert out == ""  # nothing judged
        assert err.splitlines() == [f"flexconf gate: error: --json {unwritable}: {problem}; "
                                    "give a path this user can write, e.g. --json gate.json"]
    assert gate(tmp_path, run([record(A)]), run([record(A)]), "--junit", str(tmp_path)) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf gate: error: --junit {tmp_path}: it is a directory, not a file; give a path "
        "this user can write, e.g. --junit gate.xml"]


#: flag -> the example file's extension in the gate's messages.
OUTPUTS_BY_FLAG = (("--json", "json"), ("--markdown", "md"), ("--junit", "xml"))


def test_an_output_that_is_an_input_or_another_output_is_bad_input_and_nothing_is_lost(
        tmp_path, capsys):
    """``--candidate new.json --json new.json`` replaced the candidate's results with the
    gate's decision, and said MAY SHIP (an audit)."""
    write_results(run([record(A)]), tmp_path / "old.json")
    write_results(run([record(A)]), tmp_path / "new.json")
    kept = {name: (tmp_path / name).read_bytes() for name in ("old.json", "new.json")}
    for flag, output, clash in (("--json", "new.json", "--candidate"),
                                ("--markdown", "old.json", "--baseline"),
                                ("--junit", "./new.json", "--candidate")):  # another spelling
        assert main(["gate", "--baseline", str(tmp_path / "old.json"), "--candidate",
                     str(tmp_path / "new.json"), flag, f"{tmp_path}/{output}"]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err.splitlines() == [
            f"flexconf gate: error: {flag} {tmp_path}/{output}: it is the {clash} file, which "
            f"the gate would overwrite; give another path, e.g. {flag} "
            f"gate.{dict(OUTPUTS_BY_FLAG)[flag]}"]
    assert main(["gate", "--baseline", str(tmp_path / "old.json"), "--candidate",
                 str(tmp_path / "new.json"), "--json", str(tmp_path / "g"), "--junit",
                 str(tmp_path / "g")]) == 2
    assert "--junit " + str(tmp_path / "g") + ": it is the --json file" in capsys.readouterr().err
    assert {name: (tmp_path / name).read_bytes() for name in kept} == kept
    # the first of the two outputs records the refusal: no earlier verdict stays there
    assert json.loads((tmp_path / "g").read_text())["verdict"] == "REFUSED"


def test_an_existing_file_the_gate_did_not_write_is_never_overwritten(tmp_path, capsys):
    """``--markdown /etc/passwd``, as root, replaced the machine's users with the gate's
    verdict (an outside audit). A file of the gate's own kind is overwritten, as each run of
    a CI job writes over the last; an empty file (mktemp's) and /dev/null are written."""
    baseline, candidate = run([record(A)]), run([record(A, Label.MISMATCH)])
    precious = tmp_path / "notes.txt"
    precious.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for flag, _ in OUTPUTS_BY_FLAG:
        assert gate(tmp_path, baseline, candidate, flag, str(precious)) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.splitlines() == [
            f"flexconf gate: error: {flag} {precious}: it exists and is not a file flexconf "
            f"gate wrote (it would be overwritten); give another path, e.g. {flag} "
            f"gate.{dict(OUTPUTS_BY_FLAG)[flag]}"]
    assert precious.read_text() == "root:x:0:0:root:/root:/bin/bash\n"
    outputs = [tmp_path / name for name in ("g.json", "g.md", "g.xml")]
    for path in outputs:
        path.write_text("")
    flags = [word for (flag, _), path in zip(OUTPUTS_BY_FLAG, outputs)
             for word in (flag, str(path))]
    for _ in range(2):  # into empty files, then over the gate's own
        assert gate(tmp_path, baseline, candidate, *flags) == 1
        capsys.readouterr()
        assert json.loads(outputs[0].read_text())["verdict"] == "MAY_NOT_SHIP"
        assert outputs[1].read_text().startswith("## Release gate")
        assert ET.parse(outputs[2]).getroot().get("name") == "flexconf gate"
    reformatted = json.dumps(json.loads(outputs[0].read_text()), indent=4, sort_keys=True)
    outputs[0].write_text(reformatted)  # jq-style reformatting: still the gate's
    assert gate(tmp_path, baseline, candidate, "--json", str(outputs[0]), "--markdown",
                "/dev/null") == 1


def test_a_run_gated_against_itself_is_bad_input_not_may_ship(tmp_path, capsys):
    write_results(run([record(A)]), tmp_path / "new.json")
    assert main(["gate", "--baseline", str(tmp_path / "new.json"), "--candidate",
                 f"{tmp_path}/./new.json"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf gate: error: --baseline and --candidate are the same file "
        f"({tmp_path}/./new.json); give the baseline run's results.json as --baseline "
        "and the candidate's as --candidate"]


def test_missing_directories_of_the_gate_outputs_are_made(tmp_path):
    new = tmp_path / "new" / "dir"
    assert gate(tmp_path, run([record(A)]), run([record(A, Label.MISMATCH)]),
                "--markdown", str(new / "g.md"), "--json", str(new / "g.json"),
                "--junit", str(new / "deeper" / "g.xml")) == 1
    assert json.loads((new / "g.json").read_text())["verdict"] == "MAY_NOT_SHIP"
    assert (new / "g.md").read_text().startswith("## Release gate")
    assert ET.parse(new / "deeper" / "g.xml").getroot() is not None


def test_an_incomplete_merge_is_refused_with_what_it_lacks(tmp_path, capsys):
    from reports.gate_inputs import GateInputError, check_comparable

    whole = run([record("causal/b1-h8x8-s128x128-d64/bf16/fwd")])
    lacking = replace(whole, complete=False, options={**whole.options,
                                                      "merged_shards": ["1/3", "3/3"]})
    lacking = replace(lacking, selection={"case_ids": ["a", "b", "c"]})
    with pytest.raises(GateInputError) as refused:
        check_comparable(whole, lacking)
    assert str(refused.value) == (
        "candidate: a merge of shard(s) 1/3, 3/3 without shard(s) 2/3 (1 of 3 selected cases "
        "have a record; complete=false); merge the missing shard(s) in (flexconf merge) and "
        "gate the merged file")
    # a doctored count: the gate listed range(1, count + 1), hours and gigabytes (outside trial)
    for doctored, says in ((["1/99999999999"], "['1/99999999999']"), (["1/x"], "['1/x']"),
                           (["3/2"], "['3/2']"), (["1/\u00b2"], "['1/\u00b2']")):
        with pytest.raises(GateInputError) as refused:
            check_comparable(whole, replace(lacking, options={**lacking.options,
                                                              "merged_shards": doctored}))
        assert str(refused.value) == (
            f"candidate: its options.merged_shards {says} is not a list of I/N shard names of "
            "one run (complete=false); gate a file flexconf merge wrote")
    many = replace(lacking, options={**lacking.options, "merged_shards": ["1/500"]})
    with pytest.raises(GateInputError, match=r"without shard\(s\) 2/500, .*, 11/500 and 489 "
                                             r"more \("):
        check_comparable(whole, many)
    interrupted_part = replace(lacking, options={**lacking.options,
                                                 "merged_shards": ["1/2", "2/2"]})
    with pytest.raises(GateInputError, match="one of whose shards was interrupted"):
        check_comparable(whole, interrupted_part)
    with pytest.raises(GateInputError, match=r"^baseline: the run was interrupted \(complete="
                                             r"false\); finish it with --resume"):
        check_comparable(replace(whole, complete=False), whole)
    recorded = replace(whole, complete=False,
                       options={**whole.options, "report_dir": "/runs/2.33"})
    with pytest.raises(GateInputError) as refused:  # the command, with the run's directory
        check_comparable(recorded, whole)
    from conformance.run_info import matrix_path

    assert (f"finish it (pytest {matrix_path()} --backend neuron --profile smoke --seed 0 "
            "--compile-timeout 600 --run-timeout 120 --resume /runs/2.33) and gate that"
            ) in str(refused.value)


def test_a_copy_of_the_baseline_is_not_a_candidate(tmp_path, capsys):
    baseline = replace(run([record(A)]), started_at="2026-12-01T10:00:00.000+00:00")
    assert gate(tmp_path, baseline, baseline) == 2
    assert "are the same run (started 2026-12-01T10:00:00.000+00:00): a copy compared with " \
        "itself shows nothing" in capsys.readouterr().err
    later = replace(baseline, started_at="2026-12-01T11:00:00.000+00:00")
    assert gate(tmp_path, baseline, later) == 0


def test_a_run_time_slack_of_inf_is_refused_not_a_silenced_note(tmp_path, capsys):
    """--run-time-slack inf gated nothing and silenced RUN_TIME_NOT_GATED: a case 3.87x as slow
    went unmentioned (--compile-time-budget inf, documented as the rule off, stays)."""
    old = run([replace(record(A), run_seconds=0.1)])
    new = run([replace(record(A), run_seconds=0.387)])
    assert gate(tmp_path, old, new) == 0
    assert "RUN_TIME_NOT_GATED" in capsys.readouterr().out
    for inf in ("inf", "Infinity", "1e999"):
        assert gate(tmp_path, old, new, "--run-time-slack", inf) == 2
        assert capsys.readouterr().err.splitlines() == [
            "flexconf gate: error: --run-time-slack inf gates no run time, and would hide the "
            "note that names cases far slower; give seconds, e.g. 0.01, or leave the option out"]
    assert gate(tmp_path, old, new, "--compile-time-budget", "inf") == 0
    # the same by the factor (an outside review): a budget of inf with a slack gated nothing
    assert gate(tmp_path, old, new, "--run-time-slack", "0.01", "--run-time-budget", "inf") == 2
    assert capsys.readouterr().err.splitlines() == [
        "flexconf gate: error: --run-time-budget inf with --run-time-slack gates no run time, and "
        "would hide the note that names cases far slower; give a factor, e.g. 1.25, or leave "
        "--run-time-slack out"]
    assert gate(tmp_path, old, new, "--run-time-budget", "inf") == 0  # no slack: the note
    capsys.readouterr()
    # a budget without a slack gates nothing: said (an outside audit: accepted in silence)
    assert gate(tmp_path, old, new, "--run-time-budget", "2") == 0
    assert ("  ! RUN_TIME_BUDGET_UNUSED: --run-time-budget 2 gates nothing without "
            "--run-time-slack (run times are not gated by default); add --run-time-slack "
            "SECONDS, e.g. 0.05, to gate them") in capsys.readouterr().out.splitlines()
    assert gate(tmp_path, old, new) == 0
    assert "RUN_TIME_BUDGET_UNUSED" not in capsys.readouterr().out


def test_each_refusal_offers_a_fix_the_gate_then_takes(tmp_path, capsys, monkeypatch):
    """A run-time budget below 1 offered 'inf for no limit', which the next try refused with a
    slack (an outside audit); a python that is a directory said 'no such executable'."""
    old, new = run([record(A)]), run([record(A)])
    assert gate(tmp_path, old, new, "--run-time-budget", "0.5", "--run-time-slack", "0") == 2
    assert capsys.readouterr().err.splitlines() == [
        "flexconf gate: error: --run-time-budget 0.5 is not a factor >= 1; give a factor such as "
        "1.25 (25% slower allowed)"]
    assert gate(tmp_path, old, new, "--run-time-budget", "1.25", "--run-time-slack", "0") == 0
    capsys.readouterr()
    assert gate(tmp_path, old, new, "--compile-time-budget", "0.5") == 2
    assert capsys.readouterr().err.endswith("(25% slower allowed), or inf for no limit\n")
    assert gate(tmp_path, old, new, "--compile-time-budget", "inf") == 0
    assert gate(tmp_path, old, new, "--confirm", "1", "--baseline-python", str(tmp_path)) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf gate: error: --baseline-python {str(tmp_path)!r} is not an executable python "
        "(a directory, not a python); give the path of the python that has that release "
        "installed, e.g. /path/to/.tox/ENV/bin/python"]
    # a name that PATH resolves is that python, even beside a directory of the same name
    from reports.cmd_gate import _python_problem

    monkeypatch.setenv("PATH", f"{os.path.dirname(sys.executable)}{os.pathsep}/usr/bin")
    (tmp_path / os.path.basename(sys.executable)).mkdir()
    monkeypatch.chdir(tmp_path)
    assert _python_problem(os.path.basename(sys.executable)) is None
