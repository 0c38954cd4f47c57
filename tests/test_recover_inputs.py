"""flexconf recover on what a killed run leaves, damaged or not: a corrupt manifest, store
lines that are no event, a run that already wrote its results, and the fix lines it prints
(moved out of tests/test_bad_input.py when that passed 500 lines)."""
from __future__ import annotations

import json
import sys

import pytest

from tests.test_bad_input import _error_lines
from tests.test_plugin_runs import CASES, pytest_args, run


def test_recover_says_a_corrupt_manifest_is_corrupt_not_missing(tmp_path):
    records = tmp_path / "report" / "records"
    records.mkdir(parents=True)
    (records / "run.json").write_text('{"started_at": "2026-')  # torn by hand or a disk fault
    proc = run([sys.executable, "-m", "conformance.cli", "recover", str(tmp_path / "report")])
    assert proc.returncode == 2
    assert _error_lines(proc) == [
        f"flexconf recover: error: {records / 'run.json'}: not JSON (Unterminated string "
        "starting at: line 1 column 16 (char 15)); this directory's run cannot be recovered "
        "or resumed; move its records/ away to keep what finished, then run it again"]


def _killed_after_the_last_case(tmp_path, cases: int):
    """The report directory of a cpu-eager run of ``cases`` cases as a kill -9 after its last
    case, before its results were written, leaves it: the record store alone."""
    from records.store import REPORTED_NAME, RESULT_FILES

    finished = run(pytest_args(tmp_path, "cpu-eager", CASES[:cases]))
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    report = tmp_path / "report"
    for name in RESULT_FILES:
        (report / name).unlink()
    (report / "records" / REPORTED_NAME).unlink(missing_ok=True)
    return report


def test_recover_keeps_the_good_records_of_a_store_with_damaged_lines(tmp_path, capsys):
    """A line that was JSON but no event (a list, a number, a record that is a string or has a
    negative time, a started event without its case) was a traceback, or a results.json that
    recover wrote and then could not read, with every good record lost (an outside trial)."""
    import json

    from conformance.cli import main
    from records.results import load_results
    from records.store import REPORTED_NAME, RESULT_FILES

    report = _killed_after_the_last_case(tmp_path, 2)
    store = next((report / "records").glob("*.jsonl"))
    nested = {"event": "finished", "record": {"case_id": "zz/deep", "label": "PASS"}}
    inner = nested["record"]
    for _ in range(900):  # read by recursion: a RecursionError (a review)
        inner["case"] = {}
        inner = inner["case"]
    bad = ['[1, 2]', '5', '{"event": "finished", "record": "x"}', '{"event": "started"}',
           json.dumps({"event": "finished", "record": {"case_id": "zz/new", "label": "PASS",
                                                         "compile_seconds": -1}}),
           json.dumps({"event": "finished", "record": {"case_id": "zz/big", "label": "PASS",
                                                         "compiled_bytes": 10 ** 301}}),
           json.dumps({"event": "started", "case_id": "zz/late", "started_at": 5}),
           json.dumps(nested), "{not json", '{"event": "started", "case_id": "zz/torn"']
    with open(store, "a") as f:  # the last line is torn, as a kill leaves it: no damage
        f.write("\n".join(bad))
    assert main(["recover", str(report)]) == 0
    out = capsys.readouterr().out
    assert "recovered 2 finished of 2 selected cases" in out
    assert f"skipped 9 damaged line(s) of {report / 'records'}/*.jsonl" in out
    assert [r.case_id for r in load_results(report / "results.json").records] == \
        [c.id for c in CASES[:2]]

    manifest = report / "records" / "run.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "case_order": 5}))
    for name in RESULT_FILES:
        (report / name).unlink()
    (report / "records" / REPORTED_NAME).unlink(missing_ok=True)
    assert main(["recover", str(report)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf recover: error: {manifest}: not a run manifest (its case_order is a int no "
        "run writes there); this directory's run cannot be recovered or resumed; move its "
        "records/ away to keep what finished, then run it again"]
    assert not (report / "results.json").exists()


def test_recover_refuses_a_run_that_wrote_its_own_results_and_leaves_them(tmp_path, capsys):
    """Recover on a finished run rewrote its results as an INCOMPLETE rendering of its store,
    and the original was lost; on a run a signal stopped it would hide that --resume
    finishes it. Both are refused, and the files stay as they are."""
    from dataclasses import replace

    from conformance.cli import main
    from records.results import load_results, write_results
    from records.store import RESULT_FILES

    finished = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert finished.returncode == 0, finished.stdout[-2000:] + finished.stderr[-2000:]
    report = tmp_path / "report"
    before = {name: (report / name).read_bytes() for name in RESULT_FILES}
    assert main(["recover", str(report)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"flexconf recover: error: {report}: its results.json already reports its run, "
        "complete; nothing to recover (recover is for a run that was killed)"]
    assert {name: (report / name).read_bytes() for name in RESULT_FILES} == before

    stopped = replace(load_results(report / "results.json"), complete=False)
    write_results(stopped, report / "results.json")  # what a SIGTERM leaves
    assert main(["recover", str(report)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        f"flexconf recover: error: {report}: its results.json already reports its run, "
        f"stopped before its end; nothing to recover: finish it with ")
    # the command, with the run's options (it said "and the run's options": an outside audit)
    assert line.endswith(f"--resume {report}") and " --backend cpu-eager " in line
    assert load_results(report / "results.json") == stopped


def test_a_fix_that_names_a_directory_quotes_it_for_the_shell(tmp_path):
    """'keep what finished with flexconf recover /tmp/my run;$(id)' ran id when pasted (an
    outside trial); every printed command quotes the paths it names."""
    import shlex

    from records.files import UserFileError
    from records.results import load_results

    report = tmp_path / "my run;$(id)"
    (report / "records").mkdir(parents=True)
    (report / "records" / "run.json").write_text("{}")
    with pytest.raises(UserFileError) as missing:
        load_results(report / "results.json")
    assert f"flexconf recover {shlex.quote(str(report))}, or finish it with --resume " \
        f"{shlex.quote(str(report))} and its options" in str(missing.value)


def test_a_new_run_does_not_clear_finished_records_whose_manifest_is_damaged(tmp_path):
    """A killed run's run.json with a BOM (or torn): recover refused it, and the next run
    cleared its store, finished records and all, without a word (an outside audit)."""
    report = _killed_after_the_last_case(tmp_path, 1)
    manifest = report / "records" / "run.json"
    manifest.write_bytes(b"\xef\xbb\xbf" + manifest.read_bytes())
    store = sorted((report / "records").glob("*.jsonl"))
    kept = [path.read_bytes() for path in store]
    refused = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert refused.returncode == 4, refused.stdout[-2000:] + refused.stderr[-2000:]
    [line] = _error_lines(refused)
    assert line.startswith(f"ERROR: --report-dir {report}: it holds 1 finished case record(s) "
                           "of a run that stopped without its results, whose manifest cannot "
                           f"be read ({manifest}: "), line
    assert line.endswith(f"); move {report / 'records'} away to keep them (or remove it), or "
                         "give this run another --report-dir"), line
    assert [path.read_bytes() for path in store] == kept


def test_a_run_killed_after_its_last_case_is_recovered_and_marked_complete_by_a_resume(
        tmp_path, capsys):
    """Killed after its last case, before its results: recover says every case finished and
    that the resume it prints runs none (it said "finish it" as for cases left to run); that
    resume runs nothing and writes the run complete."""
    from conformance.cli import main
    from records.results import load_results

    report = _killed_after_the_last_case(tmp_path, 2)
    assert main(["recover", str(report)]) == 0
    out = capsys.readouterr().out.splitlines()
    started = json.loads((report / "records" / "run.json").read_text())["started_at"]
    assert out[0] == (f"recovered 2 finished of 2 selected cases of the run started {started}: "
                      f"{report / 'index.html'}")
    assert out[1].startswith("every selected case finished before the run was stopped: "
                             "mark it complete (this runs no case; with the suite and release "
                             "that started it): "), out
    assert out[1].endswith(f" --resume {report}") and " pytest conformance/ " in out[1], out
    assert not load_results(report / "results.json").complete
    store = next((report / "records").glob("*.jsonl"))
    kept = store.read_bytes()
    with open(store, "a") as f:  # a fuzzed example cut off after the matrix (a review)
        f.write(json.dumps({"event": "started", "case_id": "fuzz/x/b1-h1x1-s8x8-d8/fp32/fwd",
                            "case": {}, "worker": "main", "started_at": "t"}) + "\n")
    assert main(["recover", str(report)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("finish it: ")
    store.write_bytes(kept)
    resumed = run(pytest_args(tmp_path, "cpu-eager", CASES[:2]) + ["--resume", str(report)])
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "nothing was left to run" in resumed.stdout, resumed.stdout[-2000:]
    results = load_results(report / "results.json")
    assert results.complete and [r.label.value for r in results.records] == ["PASS", "PASS"]


def test_the_resume_command_of_a_manifest_that_names_no_backend_is_no_made_up_command(tmp_path):
    """Built from options that lack the backend, the command read `--backend '?' --profile
    '?'`, which runs nothing (a review): such a manifest gets the plain wording."""
    from types import SimpleNamespace

    from reports.summary import resume_command_of

    bare = SimpleNamespace(options={}, suite_version="", started_at="", selection=None)
    assert resume_command_of(tmp_path, bare) == (
        f"pytest conformance/ --resume {tmp_path} and the run's options")
    named = SimpleNamespace(options={"backend": "cpu-eager", "profile": "smoke", "seed": 3},
                            suite_version="", started_at="", selection=None)
    assert resume_command_of(tmp_path, named) == (
        f"pytest conformance/ --backend cpu-eager --profile smoke --seed 3 --resume {tmp_path}")
