"""A run stopped the way schedulers stop jobs never leaves a lie behind: SIGTERM and SIGHUP do
what Ctrl-C does; after ``kill -9`` nothing green is left, ``flexconf recover`` renders what
finished and ``--resume`` completes the run, equal case for case to an uninterrupted one.
Resumed shards and what a resume refuses are in tests/test_resumed_runs.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cases.model import Case, Shape, Variant
from records.results import Label, RunResults, load_results, write_results
from records import Record
from tests import fault_backends
from tests.test_plugin_runs import CASES, REPO, _stop_signals_delivered, _wait_gone, clean_env, \
    pytest_args, run

BACKEND = "tests.fault_backends:HangsWhileFileExists"


def _stale_green_run(report_dir) -> None:
    """What an earlier, finished run left: complete, every case PASS."""
    report_dir.mkdir(parents=True, exist_ok=True)
    records = tuple(Record(case_id=c.id, label=Label.PASS) for c in CASES)
    write_results(RunResults({"backend": "old"}, {"backend": "old", "profile": "smoke", "seed": 0},
                             records, "old"), report_dir / "results.json")
    (report_dir / "index.html").write_text("<p>all green</p>")
    (report_dir / "summary.md").write_text("all green")


def _start_and_wait_for_the_hang(tmp_path, *extra):
    hang, pid_file = tmp_path / "hang", tmp_path / "grandchild.pid"
    hang.touch()
    env = clean_env(**{fault_backends.GRANDCHILD_PID_FILE: str(pid_file),
                       fault_backends.HANG_FILE: str(hang)})
    proc = subprocess.Popen(pytest_args(tmp_path, BACKEND, CASES[:3], *extra), cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_stop_signals_delivered)
    deadline = time.monotonic() + 240
    while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # the event: the hanging case's compile has started
    assert pid_file.exists(), "the hanging case never started"
    hang.unlink()  # from now on the backend computes: a resumed run finishes
    return proc, int(pid_file.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_stop_the_run_as_ctrl_c_does(tmp_path, signal_name):
    report = tmp_path / "report"
    _stale_green_run(report)
    proc, grandchild = _start_and_wait_for_the_hang(tmp_path)
    try:
        proc.send_signal(getattr(signal, signal_name))
        output, _ = proc.communicate(timeout=300)  # waits for the exit; a safety net only
    finally:
        proc.kill()
        if not _wait_gone(grandchild, 0):
            os.kill(grandchild, signal.SIGKILL)
    assert proc.returncode == 2, output[-3000:]  # pytest's "interrupted"
    results = load_results(report / "results.json")
    assert not results.complete and results.selected_count == 3
    assert [(r.case_id, r.label) for r in results.records] == [
        (CASES[0].id, Label.PASS), (CASES[1].id, Label.CRASH)]
    assert "INCOMPLETE" in (report / "index.html").read_text()
    assert "INCOMPLETE" in (report / "summary.md").read_text()
    # how many of how many, as the report and the gate say it (an outside walkthrough)
    assert "2 of 3 selected cases on " in output and "(incomplete run)" in output, output[-3000:]
    assert json.loads((report / "previous" / "results.json").read_text())["suite_version"] == "old"
    # what to type next, printed where the run stopped (it was only in docs/execution.md)
    finish = [line for line in output.splitlines() if line.startswith("finish it: ")]
    assert len(finish) == 1 and f"--resume {report}" in finish[0], output[-3000:]


@pytest.mark.slow
def test_while_a_run_goes_on_its_directory_is_its_own_and_after_kill_9_recover_and_resume_finish_it(
        tmp_path):
    report = tmp_path / "report"
    _stale_green_run(report)
    proc, grandchild = _start_and_wait_for_the_hang(tmp_path)
    # while it goes on, a second run into its directory is refused before it touches anything
    # (both would write its store, and each set the other's results aside), and so is recover
    manifest = (report / "records" / "run.json").read_text()
    second = run(pytest_args(tmp_path, BACKEND, CASES[:3]))
    assert second.returncode == 4, second.stdout[-3000:] + second.stderr[-3000:]  # usage error
    assert (f"ERROR: --report-dir {report}: another run is going on there (pid {proc.pid} on "
            in second.stderr), second.stderr
    assert second.stderr.strip().endswith(
        "; wait for it to end, or give this run another --report-dir"), second.stderr
    early = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    assert early.returncode == 2 and early.stderr.count("\n") == 1, early.stderr
    assert f"its run is still going on (pid {proc.pid} on " in early.stderr
    assert (report / "records" / "run.json").read_text() == manifest
    assert not (report / "results.json").exists()
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"
    proc.kill()  # SIGKILL: no handler, no cleanup; the kernel lets the run lock go
    proc.communicate(timeout=60)
    if not _wait_gone(grandchild, 0):
        os.kill(grandchild, signal.SIGKILL)
    # nothing green is left behind, and the earlier run is kept aside
    assert not (report / "results.json").exists() and not (report / "index.html").exists()
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"

    recovered = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    assert recovered.returncode == 0, recovered.stderr
    assert "recovered 1 finished of 3 selected cases of the run started " in recovered.stdout
    assert ", 1 cut off (CRASH): " in recovered.stdout
    finish = next(line for line in recovered.stdout.splitlines() if line.startswith("finish it: "))
    assert f"pytest conformance/ --backend {BACKEND} --profile " in finish  # the run's options
    assert f"--case-file {tmp_path / 'cases.json'} --seed 0 " in finish
    assert finish.endswith(f" --resume {report}") and "--report-dir" not in finish
    partial = load_results(report / "results.json")
    assert not partial.complete and partial.selected_count == 3
    assert partial.selection["case_ids"] == [c.id for c in CASES[:3]]  # the run's, as started
    assert [(r.case_id, r.label) for r in partial.records] == [
        (CASES[0].id, Label.PASS), (CASES[1].id, Label.CRASH)]
    page = (report / "index.html").read_text()
    assert "INCOMPLETE" in page and "2 of 3 selected cases have a record" in page
    # the cut-off case's CRASH is counted apart: "2 of 2 have a record" read as all but done
    assert "2 of 3 selected cases have a record, 1 of them cut off (CRASH)" in page

    # resumed with -k narrowed to the case that finished: nothing to run, and the run is not
    # finished (2, as an interrupted part: not 5, "finished, nothing selected", which the CI
    # recipes of docs/scale-out.md merge); narrowed to one more case, the same
    narrowed = run(pytest_args(tmp_path, BACKEND, CASES[:3], "-k", "full", "--resume",
                               str(report)))
    assert narrowed.returncode == 2, narrowed.stdout[-3000:]
    assert (f"--resume: 2 case(s) of the run still have no finished record (e.g. "
            f"{CASES[1].id}); resume without narrowing -k / -m to run them") in narrowed.stdout
    assert not load_results(report / "results.json").complete
    narrowed = run(pytest_args(tmp_path, BACKEND, CASES[:3], "-k", "causal", "--resume",
                               str(report)))
    assert narrowed.returncode == 2, narrowed.stdout[-3000:]
    assert "1 passed" in narrowed.stdout and "--resume: 1 case(s) of the run still" in \
        narrowed.stdout
    assert not load_results(report / "results.json").complete

    resumed = run(pytest_args(tmp_path, BACKEND, CASES[:3], "--resume", str(report)))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "1 passed" in resumed.stdout and "2 deselected" in resumed.stdout  # the rest: done
    whole = load_results(report / "results.json")
    assert whole.complete and whole.started_at == partial.started_at
    # previous/ still holds the run before, not the recovered rendering of this one's part
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"

    (tmp_path / "fresh").mkdir()
    fresh = run(pytest_args(tmp_path / "fresh", BACKEND, CASES[:3]))
    assert fresh.returncode == 0, fresh.stdout[-3000:]
    uninterrupted = load_results(tmp_path / "fresh" / "report" / "results.json")
    assert [(r.case_id, r.label, r.metrics["error_ratio"]) for r in whole.records] == \
        [(r.case_id, r.label, r.metrics["error_ratio"]) for r in uninterrupted.records]


@pytest.mark.slow
def test_the_reports_rerun_command_reruns_exactly_that_case_into_its_own_directory(tmp_path):
    from reports.summary import rerun_command

    shape = Shape(1, 2, 2, 64, 64, 16)
    cases = [Case(Variant("full"), shape, "fp32", "fwd"), Case(Variant("full"), shape, "fp32", "fwd+lse")]
    assert cases[1].id.startswith(cases[0].id)  # a -k substring would select both
    first = run(pytest_args(tmp_path, "cpu-eager", cases, "--seed", "3"))
    assert first.returncode == 0, first.stdout[-3000:]
    original = load_results(tmp_path / "report" / "results.json")
    command = rerun_command(original, cases[0].id)
    proc = subprocess.run(["bash", "-c", command.replace("pytest ", f"{sys.executable} -m pytest -p no:cacheprovider ", 1)],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, command + "\n" + proc.stdout[-3000:]
    rerun = load_results(tmp_path / "report-rerun" / "results.json")
    assert [r.case_id for r in rerun.records] == [cases[0].id] and rerun.complete
    assert rerun.options["seed"] == 3 and rerun.records[0].label is Label.PASS
    assert load_results(tmp_path / "report" / "results.json") == original  # untouched


def _self_signalling_plugin(tmp_path, hook: str, signal_name: str, *more_hooks: str
                            ) -> dict[str, str]:
    """An extra pytest plugin (``-p self_signal``) that sends ``signal_name`` to its own
    process from ``hook`` (and from each of ``more_hooks``), and the environment that finds
    it."""
    (tmp_path / "self_signal.py").write_text("import os, signal\n" + "".join(
        f"def {name}(*args, **kwargs):\n    os.kill(os.getpid(), signal.{signal_name})\n"
        for name in (hook, *more_hooks)))
    return _env_importing_from(tmp_path)


def _env_importing_from(folder) -> dict[str, str]:
    """The test environment, with ``folder`` first on PYTHONPATH (for ``-p`` plugins there)."""
    return clean_env(PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGHUP"])
def test_a_signal_after_the_results_are_written_ends_the_process_quietly(tmp_path, signal_name):
    """pytest's own exit takes seconds with torch loaded (its garbage collection passes); a
    scheduler's SIGTERM (or a hangup) that lands there finds the run already complete, and
    must neither raise a KeyboardInterrupt nor touch the results."""
    env = _self_signalling_plugin(tmp_path, "pytest_unconfigure", signal_name)
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "-p", "self_signal"), env=env,
               preexec_fn=_stop_signals_delivered)
    signum = getattr(signal, signal_name)
    assert proc.returncode == -signum, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "KeyboardInterrupt" not in proc.stdout + proc.stderr
    results = load_results(tmp_path / "report" / "results.json")
    assert results.complete and [r.label for r in results.records] == [Label.PASS]


@pytest.mark.slow
def test_under_nohup_a_hangup_does_not_stop_the_run(tmp_path):
    """A run started with SIGHUP ignored (``nohup``) keeps it ignored: a hangup in the middle
    of the run (here, as its first case starts) changes nothing."""
    env = _self_signalling_plugin(tmp_path, "pytest_runtest_setup", "SIGHUP")
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:2], "-p", "self_signal"), env=env,
               preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = load_results(tmp_path / "report" / "results.json")
    assert results.complete and [r.label for r in results.records] == [Label.PASS] * 2


@pytest.mark.parametrize("signals", ["once", "twice"])
def test_a_signal_before_any_case_is_selected_is_an_interruption_not_an_empty_selection(
        tmp_path, signals):
    """A SIGTERM while pytest collects (xdist still bringing up its workers, say): the run is
    interrupted (exit 2), says so, and writes no results; not "0 cases selected" (a usage
    error, exit 4), which would send the user to widen a selection that was fine. ``timeout``
    and Slurm signal the process group as well as the process, so a second SIGTERM comes while
    pytest handles the first: it is ignored."""
    report = tmp_path / "report"
    _stale_green_run(report)
    again = ("pytest_keyboard_interrupt",) if signals == "twice" else ()
    env = _self_signalling_plugin(tmp_path, "pytest_collection", "SIGTERM", *again)
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:2], "-p", "self_signal"), env=env,
               preexec_fn=_stop_signals_delivered)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "interrupted before any case was selected: nothing ran and no results were " \
        "written; run it again" in output
    assert "0 cases selected" not in output
    assert not (report / "results.json").exists()  # and the earlier run is set aside
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"


def test_a_signal_whose_interrupt_was_swallowed_does_not_make_the_next_one_an_echo(tmp_path):
    """A KeyboardInterrupt raised inside a __del__ (or a garbage collector's callback) is
    printed as "Exception ignored" and dropped, so that signal stopped nothing; the next one,
    past the echo window (set to 0 here), must stop the run."""
    (tmp_path / "swallowed_then_again.py").write_text(
        "import os, signal\n"
        "import conformance.termination\n"
        "conformance.termination.ECHO_SECONDS = 0.0\n"
        "class SignalsWhenCollected:\n"
        "    def __del__(self):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "def pytest_runtest_setup(item):\n"
        "    SignalsWhenCollected()  # collected at once: its KeyboardInterrupt is dropped\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n")
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:2], "-p", "swallowed_then_again"),
               env=_env_importing_from(tmp_path))
    output = proc.stdout + proc.stderr
    assert "Exception ignored" in output  # the first signal's interrupt was lost, as modelled
    assert proc.returncode == 2, output[-3000:]  # the second one stopped the run
    results = load_results(tmp_path / "report" / "results.json")
    assert not results.complete and results.selected_count == 2


@pytest.mark.slow
def test_a_second_ctrl_c_while_the_run_stops_is_ignored_and_the_results_are_written(tmp_path):
    """Stopping takes seconds (children killed, xdist's teardown, the results written); a
    second Ctrl-C in that window raised a KeyboardInterrupt inside the teardown, and the run
    ended with a traceback and no results.json (an audit). Here the first Ctrl-C comes as the
    second case starts, the second as the session finishes, before the results are written."""
    (tmp_path / "ctrl_c_twice.py").write_text(
        "import os, signal\n"
        "import pytest\n"
        "def pytest_runtest_setup(item):\n"
        "    if item.nodeid.endswith('" + CASES[1].id + "]'):\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_sessionfinish(session):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n")
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:3], "-p", "ctrl_c_twice"),
               env=_env_importing_from(tmp_path), preexec_fn=_stop_signals_delivered)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]  # pytest's "interrupted", not a crash
    assert "SIGINT ignored: the run is already stopping" in output
    assert "Traceback" not in output, output[-3000:]
    results = load_results(tmp_path / "report" / "results.json")
    assert not results.complete and results.selected_count == 3
    assert [(r.case_id, r.label) for r in results.records] == [(CASES[0].id, Label.PASS)]


def _started_cases(report, when: bool = False) -> list:
    """The case ids the run's workers have started so far (their record store's events); with
    ``when``, (case id, started_at) pairs."""
    started = []
    for path in sorted((report / "records").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if '"event": "started"' in line and line.endswith("}"):  # not one half written
                event = json.loads(line)
                started.append((event["case_id"], event["started_at"]) if when
                               else event["case_id"])
    return started


def _busy_workers(report) -> set[str]:
    """The workers whose record files hold a started case."""
    return {path.stem for path in (report / "records").glob("*.jsonl")
            if '"event": "started"' in path.read_text()}


@pytest.mark.slow
def test_a_sigterm_to_the_controller_alone_stops_its_xdist_workers_at_once(tmp_path):
    """``kill PID`` (or a container's init) signals the controller only, not its process
    group. It passes the signal on to its xdist workers, which stop as on Ctrl-C: no case
    starts after the signal. Without that, xdist's teardown tells each worker to finish its
    queue, and execnet interrupts a busy worker with a SIGINT after 5 s, which does nothing in
    a run started with SIGINT ignored, as a background job of a non-interactive shell is (CI
    runners, batch scripts), then ends it with os._exit after 10 s more: meanwhile each worker
    finished its case (a 2 s stand-in compile here) and started its queued ones."""
    from conformance.executor import now_iso

    report = tmp_path / "report"
    causal = [Case(Variant("causal"), Shape(1, 2, 2, n, n, 16)) for n in range(64, 0, -8)]
    proc = subprocess.Popen(
        pytest_args(tmp_path, "tests.slow_backends:SlowFirstCall", causal, "-n", "2"),
        cwd=REPO, env=clean_env(), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        deadline = time.monotonic() + 240
        while len(_busy_workers(report)) < 2 and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.2)  # the event: each worker has started a case (its handler is in)
        assert len(_busy_workers(report)) == 2, "the two workers never both started a case"
        signalled_at = now_iso()  # the records' clock and format
        proc.send_signal(signal.SIGTERM)  # to the controller alone
        output, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 2, output[-3000:]
    results = load_results(report / "results.json")
    assert not results.complete and results.selected_count == len(causal)
    late = [case_id for case_id, started_at in _started_cases(report, when=True)
            if started_at > signalled_at]
    assert late == [], f"cases started after the SIGTERM: {late}"
    assert Label.CRASH in {r.label for r in results.records}  # a case was cut off


@pytest.mark.slow
def test_a_new_run_keeps_a_killed_runs_records_until_they_are_recovered(tmp_path):
    """After ``kill -9`` only the record store holds what finished: a new run into the
    directory cleared it without a word. It is refused, before anything is moved, until
    ``flexconf recover`` has kept the run as a report, which the next run sets aside as
    usual."""
    report = tmp_path / "report"
    proc, grandchild = _start_and_wait_for_the_hang(tmp_path)
    proc.kill()  # SIGKILL: no results.json is written
    proc.communicate(timeout=60)
    if not _wait_gone(grandchild, 0):
        os.kill(grandchild, signal.SIGKILL)
    started_at = json.loads((report / "records" / "run.json").read_text())["started_at"]
    store = {path.name: path.read_bytes() for path in (report / "records").iterdir()}

    refused = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert refused.returncode == 4, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert [line for line in refused.stderr.splitlines() if line.strip()] == [
        f"ERROR: --report-dir {report}: it holds the records of a run that stopped without "
        f"writing its results (started {started_at}, 1 case(s) finished); keep them as an "
        f"incomplete report with flexconf recover {report}, finish that run with --resume "
        f"{report} and its options, or give this run another --report-dir"]
    assert {path.name: path.read_bytes() for path in (report / "records").iterdir()} == store
    assert not (report / "results.json").exists() and not (report / "previous").exists()

    recovered = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    assert recovered.returncode == 0, recovered.stderr
    after = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert after.returncode == 0, after.stdout[-3000:] + after.stderr[-3000:]
    assert load_results(report / "results.json").complete
    kept = load_results(report / "previous" / "results.json")
    assert kept.started_at == started_at and not kept.complete
    assert [(r.case_id, r.label) for r in kept.records] == [
        (CASES[0].id, Label.PASS), (CASES[1].id, Label.CRASH)]


def test_a_run_killed_before_its_first_case_leaves_nothing_to_recover_or_resume(tmp_path):
    """Killed while collecting, it has set the last run aside and not yet cleared the store,
    which holds the last run's records: recover and --resume must not turn that complete run
    into an unfinished one."""
    first = run(pytest_args(tmp_path, "cpu-eager", CASES[:2]))
    assert first.returncode == 0, first.stdout[-2000:]
    report = tmp_path / "report"
    env = _self_signalling_plugin(tmp_path, "pytest_collection", "SIGKILL")
    killed = run(pytest_args(tmp_path, "cpu-eager", CASES[:2], "-p", "self_signal"), env=env)
    assert killed.returncode == -signal.SIGKILL
    assert not (report / "results.json").exists()  # set aside: the killed run is not that one
    assert load_results(report / "previous" / "results.json").complete
    recovered = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    assert recovered.returncode == 2 and "nothing to recover: start a new run" in \
        recovered.stderr, recovered.stdout + recovered.stderr
    resumed = run(pytest_args(tmp_path, "cpu-eager", CASES[:2], "--resume", str(report)))
    assert resumed.returncode == 4 and "nothing to resume: run without --resume" in \
        resumed.stderr, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    again = run(pytest_args(tmp_path, "cpu-eager", CASES[:2]))
    assert again.returncode == 0 and load_results(report / "results.json").complete


@pytest.mark.slow
def test_results_that_cannot_be_written_are_one_line_and_the_records_are_recovered(tmp_path):
    """A disk that filled up as the run ended: the manifest's write raised, and the run ended
    with a traceback and exit 1, the status of failed cases, with no report at all (an outside
    audit). Here every write of a results file fails as the session finishes."""
    (tmp_path / "full_disk.py").write_text(
        "import errno\n"
        "import pytest\n"
        "import records.results, records.store\n"
        "def full(*args, **kwargs):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "@pytest.hookimpl(tryfirst=True)\n"
        "def pytest_sessionfinish(session):\n"
        "    records.results.write_text_atomic = records.store.write_text_atomic = full\n")
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "-p", "full_disk"),
               env=_env_importing_from(tmp_path))
    output = proc.stdout + proc.stderr
    report = tmp_path / "report"
    assert proc.returncode == 3, output[-3000:]  # not 1: no case failed, the run did
    assert "Traceback" not in output, output[-3000:]
    assert (f"the results could not be written into {report}: OSError: [Errno 28] No space "
            f"left on device; what finished is kept in {report / 'records'}: make room, then "
            f"flexconf recover {report}") in output
    assert not (report / "results.json").exists()
    recovered = run([sys.executable, "-m", "conformance.cli", "recover", str(report)])
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    results = load_results(report / "results.json")
    assert [(r.case_id, r.label) for r in results.records] == [(CASES[0].id, Label.PASS)]


def test_a_manifest_the_disk_refuses_is_one_line_not_an_internal_error(tmp_path):
    """A nearly full disk at the run's start: INTERNALERROR from write_manifest (an outside
    audit)."""
    (tmp_path / "full_at_start.py").write_text(
        "import errno\n"
        "import records.store\n"
        "def full(*args, **kwargs):\n"
        "    raise OSError(errno.ENOSPC, 'No space left on device', 'run.json')\n"
        "records.store.write_manifest = full\n")
    report = tmp_path / "report"
    _stale_green_run(report)
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "-p", "full_at_start"),
               env=_env_importing_from(tmp_path))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 4, output[-3000:]
    assert "INTERNALERROR" not in output and "Traceback" not in output, output[-3000:]
    assert (f"ERROR: --report-dir {report}: the run's manifest cannot be written ([Errno 28] "
            "No space left on device: 'run.json'); make room, then run again (the last run's "
            "results are in its previous/)") in output, output[-3000:]
    assert (report / "previous" / "index.html").read_text() == "<p>all green</p>"
    assert not (report / "index.html").exists()  # nothing old looks current
