"""A run killed while fuzzing is finished by the command recover prints: the resume fuzzes
again with the run's examples and seed, replays the examples the run had finished from their
records, runs the one cut off and those never drawn, and ends with the records of an
uninterrupted run, complete. Until its fuzzing test has ended the run is not complete, and a
resume that does not fuzz is refused or left unfinished, never called complete."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys

import pytest

from records.results import Label, load_results
from tests import fault_backends
from tests.test_plugin_runs import REPO, _stop_signals_delivered, _wait_gone, clean_env, run
from tests.test_shrink import run_printed

BACKEND = "tests.fault_backends:HangsOnItsFifthCaseWhileFileExists"
FUZZ = ["conformance/test_fuzz.py", "--fuzz-examples", "9", "--seed", "3"]


def _fuzz_args(report, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", *FUZZ, "-p", "no:cacheprovider", "--backend",
            BACKEND, "--report-dir", str(report), "--reference-cache", "none", *extra]


def _kill_at_the_fifth_example(tmp_path, report, stop=signal.SIGKILL) -> tuple[int, str]:
    """Start the fuzzing run, wait until its fifth example hangs (the event: the backend's
    helper pid written), then stop the run with ``stop`` (kill -9 by default); its exit
    status and output."""
    import subprocess
    import time

    hang, pid_file = tmp_path / "hang", tmp_path / "grandchild.pid"
    hang.touch()
    env = clean_env(**{fault_backends.GRANDCHILD_PID_FILE: str(pid_file),
                       fault_backends.HANG_FILE: str(hang)})
    proc = subprocess.Popen(_fuzz_args(report), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_stop_signals_delivered)
    deadline = time.monotonic() + 300
    while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the fifth example never started"
    hang.unlink()  # from now on every case computes: the resume finishes
    try:
        proc.send_signal(stop)
        output, _ = proc.communicate(timeout=300)  # waits for the exit; a safety net only
    finally:
        proc.kill()
        grandchild = int(pid_file.read_text())
        if not _wait_gone(grandchild, 0):
            os.kill(grandchild, signal.SIGKILL)
    return proc.returncode, output


def _events(report) -> list[dict]:
    return [json.loads(line) for path in sorted((report / "records").glob("*.jsonl"))
            for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_a_run_stopped_while_fuzzing_is_not_complete_and_says_its_fuzzing_did_not_finish(
        tmp_path):
    """SIGTERM mid-search: the stop reaches the fuzzing test as KeyboardInterrupt, which
    must not tell the store the search ended (its run would read complete)."""
    report = tmp_path / "report"
    code, output = _kill_at_the_fifth_example(tmp_path, report, signal.SIGTERM)
    assert code == 2, output[-3000:]  # pytest's "interrupted"
    done = len({e["record"]["case_id"] for e in _events(report) if e.get("event") == "finished"})
    assert f"{done + 1} fuzzed examples on test-hangs-on-its-fifth-case: {done} PASS, 1 CRASH " \
        "(incomplete run: its fuzzing did not finish)" in output, output[-3000:]
    assert not load_results(report / "results.json").complete
    assert not [e for e in _events(report) if e.get("event") == "fuzzing_finished"]
    assert any(line.startswith("finish it: ") and " --fuzz-examples 9 " in line
               for line in output.splitlines()), output[-3000:]


@pytest.mark.slow
def test_a_run_killed_while_fuzzing_is_finished_by_the_printed_resume_as_if_never_killed(
        tmp_path):
    whole = run(_fuzz_args(tmp_path / "whole"))  # the same run, never killed
    assert whole.returncode == 0, whole.stdout[-3000:]
    uninterrupted = load_results(tmp_path / "whole" / "results.json")
    assert uninterrupted.complete and len(uninterrupted.records) >= 5

    report = tmp_path / "report"
    _kill_at_the_fifth_example(tmp_path, report)
    assert not (report / "results.json").exists()
    # four examples finished (a hypothesis release may draw one case twice: fewer ids)
    finished = [e["record"]["case_id"] for e in _events(report) if e.get("event") == "finished"]
    distinct = len(set(finished))
    assert len(finished) == 4
    (cut,) = [e["case_id"] for e in _events(report)
              if e.get("event") == "started" and e["case_id"] not in finished]
    recovered = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    assert recovered.returncode == 0, recovered.stderr
    assert f"recovered {distinct} finished fuzzed examples of the run started " in recovered.stdout
    assert ", 1 cut off (CRASH): " in recovered.stdout  # the fifth
    partial = load_results(report / "results.json")
    assert not partial.complete and len(partial.records) == distinct + 1
    assert f"{distinct + 1} fuzzed examples have a record, 1 of them cut off (CRASH)" \
        in (report / "index.html").read_text()
    finish = next(line.removeprefix("finish it: ") for line in recovered.stdout.splitlines()
                  if line.startswith("finish it: "))
    assert "pytest conformance/test_fuzz.py " in finish  # the matrix was no part of the run
    assert " --fuzz-examples 9 " in finish and finish.endswith(f"--resume {report}")

    # without the run's --fuzz-examples a resume is refused: it would leave the fuzzing undone
    bare = run([sys.executable, "-m", "pytest", "conformance/test_fuzz.py", "-p",
                "no:cacheprovider", "--backend", BACKEND, "--seed", "3", "--resume", str(report)])
    assert bare.returncode == 4, bare.stdout[-3000:] + bare.stderr[-3000:]
    assert "the run had fuzz_examples 9, this one 0; resume with the run's own options: " \
        in bare.stderr, bare.stderr

    # nor is a resume whose test path leaves the fuzzing test out called complete
    elsewhere = run_printed(
        finish.replace("conformance/test_fuzz.py", "conformance/test_matrix.py"), REPO,
        clean_env())
    assert elsewhere.returncode == 2, elsewhere.stdout[-3000:] + elsewhere.stderr[-3000:]
    assert ("--resume: the run's fuzzing did not finish, and this command did not fuzz (its "
            "test path or -k left conformance/test_fuzz.py out); finish it with the command "
            "above") \
        in elsewhere.stdout, elsewhere.stdout[-3000:]
    assert not load_results(report / "results.json").complete

    resumed = run_printed(finish + " -v", REPO, clean_env())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "fuzz: 4 example(s) replayed from the records of the run it resumed" \
        in resumed.stdout, resumed.stdout[-3000:]
    done = load_results(report / "results.json")
    assert done.complete
    assert [(r.case_id, r.label) for r in done.records] == [
        (r.case_id, r.label) for r in uninterrupted.records]
    assert all(r.label is Label.PASS for r in done.records)
    events = _events(report)
    assert sum(e.get("event") == "fuzzing_finished" for e in events) == 1
    # the four finished examples ran once: the resume replayed them, it did not run them again
    started = [e["case_id"] for e in events if e.get("event") == "started"]
    assert all(started.count(cid) == finished.count(cid) for cid in finished)
    assert started.count(cut) == 2  # the fifth: cut off, then run by the resume

    # once its fuzzing ended, a resume does not fuzz again (it ran the search, and shrank a
    # failure, again: a review)
    again = run_printed(finish, REPO, clean_env())
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "--resume: every case of the run had a record already; nothing was left to run" \
        in again.stdout, again.stdout[-3000:]
    assert _events(report) == events and load_results(report / "results.json").complete


@pytest.mark.slow
def test_an_example_cut_off_that_the_resume_does_not_draw_again_is_run_by_itself(tmp_path):
    """Another hypothesis release may draw other examples for the seed: the one the kill cut
    off is then run by itself, so no CRASH of the kill is left in a complete run."""
    from dataclasses import replace

    from cases.model import Case, Shape, fuzz_id

    report = tmp_path / "report"
    _kill_at_the_fifth_example(tmp_path, report)
    # the cut-off example becomes one no search draws (lengths 1 to 200: a key length of 203)
    store = report / "records" / "main.jsonl"  # the one process's (no xdist)
    events = [json.loads(line) for line in store.read_text().splitlines()]
    finished = {e["record"]["case_id"] for e in events if e.get("event") == "finished"}
    (cut,) = [e for e in events if e.get("event") == "started" and e["case_id"] not in finished]
    case = Case.from_json(cut["case"])
    s = case.shape
    odd = replace(case, shape=Shape(s.B, s.Hq, s.Hkv, s.Sq, 203, s.D, s.Bkv))
    cut.update(case_id=fuzz_id(odd), case=odd.to_json())
    store.write_text("".join(json.dumps(e) + "\n" for e in events))

    recovered = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    finish = next(line.removeprefix("finish it: ") for line in recovered.stdout.splitlines()
                  if line.startswith("finish it: "))
    resumed = run_printed(finish + " -v", REPO, clean_env())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"{fuzz_id(odd)} PASS, run again by itself (cut off when the run stopped)" \
        in resumed.stdout, resumed.stdout[-3000:]
    done = load_results(report / "results.json")
    assert done.complete
    labels = {r.case_id: r.label for r in done.records}
    assert labels[fuzz_id(odd)] is Label.PASS and fuzz_id(case) in labels
    assert set(labels.values()) == {Label.PASS}


@pytest.mark.parametrize("how, ended", [
    ("returns", True), ("fails", True), ("skips", True),
    ("errs", True),  # an error of its own (hypothesis' Unsatisfiable): a resume raises it again
    ("stop after a failure", False),  # the hook failed once inside the search, then a stop
    ("timeout", False),  # pytest-timeout's failure raised into the search (an outside audit)
    ("stop", False),  # a stop signal: KeyboardInterrupt
    ("disk", False),  # a store that refused an example's record
])
def test_the_store_hears_the_search_ended_only_when_the_fuzzing_test_itself_ended(how, ended):
    from types import SimpleNamespace

    from conformance.fuzz_log import FuzzLog

    said = []
    runner = SimpleNamespace(options=SimpleNamespace(resume=None, report_dir="."),
                             writer=SimpleNamespace(fuzzing_finished=said.append))
    config = SimpleNamespace(getoption=lambda *a: 0,
                             pluginmanager=SimpleNamespace(get_plugin=lambda name: None))
    log = FuzzLog(config, runner)
    raised = {"fails": pytest.fail.Exception, "skips": pytest.skip.Exception,
              "timeout": pytest.fail.Exception, "stop": KeyboardInterrupt, "disk": OSError,
              "errs": ValueError, "stop after a failure": KeyboardInterrupt}
    with pytest.raises(raised.get(how, ZeroDivisionError)) if how != "returns" \
            else contextlib.nullcontext():
        with log.search_ends():
            if how == "fails":
                log.fail("a failure the search found")
            elif how == "skips":
                log.skip("the backend runs no mode the fuzzer draws")
            elif how == "timeout":
                pytest.fail("Timeout (>6.0s) from pytest-timeout.")
            elif how == "stop":
                raise KeyboardInterrupt
            elif how == "disk":
                raise OSError(28, "No space left on device")
            elif how == "errs":
                raise ValueError("Unable to satisfy assumptions of run_one")
            elif how == "stop after a failure":
                try:
                    log.fail("fuzzing on a backend: its unsupported_reason raised")
                except pytest.fail.Exception:  # caught by hypothesis, which went on
                    pass
                raise KeyboardInterrupt
    assert said == ([0] if ended else [])
