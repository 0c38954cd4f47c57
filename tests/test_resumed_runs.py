"""Resuming an interrupted run, and the shards of one: a resumed part records the whole run's
selection as it started (from its manifest, or under xdist from its workers' store files),
whatever -k resumes it, so flexconf merge takes it; a run stopped by a signal under xdist
records its cases too; a resume refuses another run's options, oracle or release. The
signals and kills themselves are tested in tests/test_interrupted_runs.py, whose helpers
these use."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from cases.model import Case
from records.results import Label, load_results
from tests import fault_backends
from tests.test_interrupted_runs import BACKEND, _start_and_wait_for_the_hang, _started_cases
from tests.test_plugin_runs import (CASES, REPO, _stop_signals_delivered, _wait_gone, clean_env,
                                    pytest_args, run)


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_under_xdist_records_its_cases(tmp_path):
    """Its controller learns the selection only from workers that end, and workers stopped in
    a case never say: the run recorded no case ids (a merge of such a part judged it against
    the whole matrix). Its workers' store files hold them."""
    from dataclasses import replace as with_shape

    hang, pid_file = tmp_path / "hang", tmp_path / "grandchild.pid"
    hang.touch()  # both workers hang in a causal case: neither can say what it selected
    cases = [CASES[1], Case(CASES[1].variant, with_shape(CASES[1].shape, Sq=32, Skv=32))]
    env = clean_env(**{fault_backends.GRANDCHILD_PID_FILE: str(pid_file),
                       fault_backends.HANG_FILE: str(hang)})
    proc = subprocess.Popen(pytest_args(tmp_path, BACKEND, cases, "-n", "2"), cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=_stop_signals_delivered)
    deadline = time.monotonic() + 240
    while len(_started_cases(tmp_path / "report")) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)  # the event: both causal cases have started (and hang)
    assert len(_started_cases(tmp_path / "report")) == 2, "the hanging cases never started"
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2, output[-3000:]
    results = load_results(tmp_path / "report" / "results.json")
    assert not results.complete
    assert results.selection["case_ids"] == [c.id for c in cases]


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one-process", "xdist"])
def test_a_shard_killed_and_resumed_merges_with_the_other_shard(tmp_path, capsys, workers):
    """The resumed shard records the whole run's selection (every shard's cases), as an
    uninterrupted shard does, so flexconf merge takes it; and it names no case as outside.
    Resumed with a -k of its own shard's cases only, it still records the whole run's: from
    the manifest, or under xdist (whose controller learns the selection only at the end) from
    the workers' store files. A resume never rewrites the manifest's selection."""
    from conformance.cli import main
    from conformance.sharding import assign_shards

    part = assign_shards(CASES[:3], 2)
    hung = f"{part[CASES[1].id] + 1}/2"  # the shard of the case that hangs (causal)
    other = f"{2 - part[CASES[1].id]}/2"
    proc, grandchild = _start_and_wait_for_the_hang(tmp_path, "--shard", hung, *workers)
    proc.kill()
    proc.communicate(timeout=60)
    if not _wait_gone(grandchild, 0):
        os.kill(grandchild, signal.SIGKILL)
    own = " or ".join(c.id for c in CASES[:3] if part[c.id] == part[CASES[1].id])
    manifest = (tmp_path / "report" / "records" / "run.json").read_text()
    assert main(["recover", str(tmp_path / "report")]) == 0  # its own partial results.json
    resumed = run(pytest_args(tmp_path, BACKEND, CASES[:3], "--shard", hung, "-k", own,
                              *workers, "--resume", str(tmp_path / "report")))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "not part of the interrupted run" not in resumed.stdout
    if workers:  # the schedule read the recovered results, which the resume then removed
        assert "; since removed: the results this run replaces" in resumed.stdout, \
            resumed.stdout[-3000:]
    after = (tmp_path / "report" / "records" / "run.json").read_text()
    assert json.loads(after)["selection"] == json.loads(manifest)["selection"]
    (tmp_path / "other").mkdir()
    second = run(pytest_args(tmp_path / "other", BACKEND, CASES[:3], "--shard", other))
    assert second.returncode == 0, second.stdout[-3000:]
    shards = [tmp_path / "report" / "results.json", tmp_path / "other" / "report" / "results.json"]
    assert load_results(shards[0]).selection["case_ids"] == [c.id for c in CASES[:3]]
    merged = tmp_path / "merged.json"
    assert main(["merge", *map(str, shards), "-o", str(merged)]) == 0, capsys.readouterr().err
    whole = load_results(merged)
    assert whole.complete and [r.label for r in whole.records] == [Label.PASS] * 3


@pytest.mark.slow
def _resume_with_recorded(tmp_path, ours: str, theirs: str):
    """``--resume`` of the run in tmp_path/report with ``ours`` in its store's records
    replaced by ``theirs`` (put back afterwards): what the resuming command said."""
    texts = {path: path.read_text()
             for path in (tmp_path / "report" / "records").glob("*.jsonl")}
    assert any(ours in text for text in texts.values())
    for path, text in texts.items():
        path.write_text(text.replace(ours, theirs))
    try:
        return run(pytest_args(tmp_path, "cpu-eager", CASES[:3], "-k", "full or causal",
                               "--resume", str(tmp_path / "report")))
    finally:
        for path, text in texts.items():
            path.write_text(text)


def test_resume_refuses_another_runs_options_and_a_directory_without_a_run(tmp_path):
    args = pytest_args(tmp_path, BACKEND, CASES[:1], "--resume", str(tmp_path / "none"))
    at = args.index("--report-dir")
    del args[at:at + 2]  # --resume names the report directory (another one is refused)
    empty = run(args)
    assert empty.returncode == 4
    assert "no run's records there (records/run.json is missing); run without --resume" in \
        empty.stderr
    first = run(pytest_args(tmp_path, "cpu-eager", CASES[:3], "-k", "full or causal"))
    assert first.returncode == 0, first.stdout[-2000:]
    other = run(pytest_args(tmp_path, "cpu-eager", CASES[:3], "-k", "full or causal",
                            "--seed", "5", "--resume", str(tmp_path / "report")))
    assert other.returncode == 4
    assert "the run had seed 0, this one 5; resume with the run's own options" in other.stderr
    # and says them: the command flexconf recover would print (an outside audit)
    command = other.stderr.split("resume with the run's own options: ", 1)[1].splitlines()[0]
    assert " --seed 0 " in command and " -k 'full or causal' " in command
    # (OMP_NUM_THREADS=1 first where the run's threads were capped: under xdist, here)
    assert re.match(r"(OMP_NUM_THREADS=\d+ )?pytest conformance/ --backend cpu-eager ", command)
    assert command.endswith(f"--resume {tmp_path / 'report'}")
    # its known failures: a resume without them would fail the cases they make xfail
    known = tmp_path / "known.toml"
    known.write_text('[[failure]]\nbackend = "*"\ncase = "x/*"\nlabel = "CRASH"\nreason = "r"\n')
    without = run(pytest_args(tmp_path, "cpu-eager", CASES[:3], "-k", "full or causal",
                              "--expectations", str(known), "--resume", str(tmp_path / "report")))
    assert without.returncode == 4
    assert (f"the run had expectations none (not given), this one '{known}'; resume with the "
            "run's own options") in without.stderr

    # Its cases judged by another version of the oracle: one results file would hold two.
    from reference.golden import REFERENCE_VERSION
    judged = _resume_with_recorded(tmp_path, f'"reference_version": {REFERENCE_VERSION}',
                                   '"reference_version": 7')
    assert judged.returncode == 4
    assert (f"reference version 7 judged its finished cases, this suite's is "
            f"{REFERENCE_VERSION}; keep them as an incomplete report") in judged.stderr

    # Its cases measured by another release (here torch; a plugin's code is another key of
    # records/release.py): one results file would hold two releases under the first's name.
    import torch
    measured = _resume_with_recorded(tmp_path, f'"torch": "{torch.__version__}"',
                                     '"torch": "2.99.0"')
    assert measured.returncode == 4
    assert (f"this command would measure another release: torch '{torch.__version__}' where "
            "the run recorded '2.99.0'; resume with the release that started the run") in \
        measured.stderr

    # Its cases measured with another number of threads per worker (another -n, another
    # machine): one results file would hold times of two layouts, which a gate compares as one.
    from conformance.backends.base import WorkerSlot, threads_per_worker
    threads = threads_per_worker(WorkerSlot(0, 1))
    layout = _resume_with_recorded(tmp_path, f'"threads_per_worker": {threads}',
                                   f'"threads_per_worker": {threads + 7}')
    assert layout.returncode == 4
    assert (f"the run measured its cases with {threads + 7} thread(s) per worker (-n 1), this "
            f"command would with {threads} (-n 1); resume with -n 1 on the run's machine") in \
        layout.stderr

    # Resumed with another -k: the run stays the one that was started (what the gate and merge
    # compare), and a case outside it is named, not run into it.
    resumed = run(pytest_args(tmp_path, "cpu-eager", CASES[:3], "-k", "full or alibi",
                              "--resume", str(tmp_path / "report")))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert f"--resume: 1 case(s) selected here are not part of the interrupted run and were " \
           f"not run (e.g. {CASES[2].id}); run them without --resume" in resumed.stdout
    whole = load_results(tmp_path / "report" / "results.json")
    assert whole.complete and [r.case_id for r in whole.records] == [c.id for c in CASES[:2]]
    assert whole.selection["keyword"] == "full or causal"
    assert whole.selection["case_ids"] == [c.id for c in CASES[:2]]
    assert "every case of the run had a record already; nothing was left to run" in resumed.stdout


def test_a_run_an_older_suite_recorded_with_a_matrix_beside_its_case_file_resumes(tmp_path):
    """A run may no longer give --matrix extended or all beside --case-file (it chose
    nothing); one an older suite recorded with it was told to drop --matrix, and then that its
    matrix differed: it could not be resumed at all (an outside review)."""
    from types import SimpleNamespace

    from conformance.backends.registry import resolve_backend
    from conformance.resume_checks import resumable_run
    from conformance.run_info import suite_version
    from records.store import RunManifest, write_manifest

    recorded = {"backend": "cpu-eager", "profile": "smoke", "matrix": "all",
                "case_file": "/a/cases.json", "seed": 0}
    write_manifest(tmp_path, RunManifest("t1", suite_version(), recorded, ["full/a"]))
    options = SimpleNamespace(report_dir=tmp_path, backend="cpu-eager")
    backend = resolve_backend("cpu-eager")
    assert resumable_run(options, {**recorded, "matrix": "core"}, backend, 1).started_at == "t1"
    with pytest.raises(pytest.UsageError, match="the run had matrix 'all', this one 'core'"):
        resumable_run(options, {**recorded, "matrix": "core", "case_file": None}, backend, 1)
    # another suite version started it: its matrix may hold other cases (0.1.0's soft-cap ids)
    write_manifest(tmp_path, RunManifest("t1", "0.1.0", recorded, ["full/a"]))
    with pytest.raises(pytest.UsageError) as refused:
        resumable_run(options, {**recorded, "matrix": "core"}, backend, 1)
    assert str(refused.value) == (
        f"--resume {tmp_path}: suite 0.1.0 started the run, this is suite {suite_version()}; "
        "resume with the suite that started it, or keep its cases as an incomplete report with "
        f"flexconf recover {tmp_path}")


def test_a_resume_whose_record_file_is_a_directory_is_one_line(tmp_path):
    """records/main.jsonl made a directory: every resumed case was an IsADirectoryError
    traceback, and the printed command to finish the run did the same (an outside audit)."""
    from tests.test_bad_input import _error_lines

    done = run(pytest_args(tmp_path, "cpu-eager", CASES[:1]))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = tmp_path / "report"
    [store] = (report / "records").glob("*.jsonl")
    store.unlink()
    store.mkdir()
    resumed = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--resume", str(report)))
    assert resumed.returncode == 4, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert _error_lines(resumed) == [
        f"ERROR: --resume {report}: {store} is not a file, where a worker's records belong; "
        "move it away, then resume"]
    assert "Traceback" not in resumed.stdout + resumed.stderr


@pytest.mark.slow
def test_a_resume_exits_1_where_a_case_failed_before_the_run_was_stopped(tmp_path):
    """The resume runs only what was left, and its own tests pass: it exited 0 over a
    MISMATCH recorded before the kill (an outside audit), where the whole run exits 1."""
    faulty = "tests.fault_backends:WrongNumbers"  # wrong on causal, right elsewhere
    cases = [c for c in CASES if c.variant.name == "causal"][:1] + \
        [c for c in CASES if c.variant.name != "causal"][:1]
    whole = run(pytest_args(tmp_path, faulty, cases))
    assert whole.returncode == 1, whole.stdout[-3000:]
    report = tmp_path / "report"
    store = report / "records" / "main.jsonl"
    events = store.read_text().splitlines(keepends=True)
    assert [json.loads(e).get("event") for e in events][-2:] == ["started", "finished"]
    store.write_text("".join(events[:-1]))  # killed in the second case: its record never came
    for written in ("results.json", "index.html", "summary.md", "records/reported"):
        (report / written).unlink()
    resumed = run(pytest_args(tmp_path, faulty, cases, "--resume", str(report)))
    assert resumed.returncode == 1, resumed.stdout[-3000:]
    assert (f"--resume: 1 record(s) of the run failed before it was stopped (e.g. "
            f"{cases[0].id}): the run exits 1, as the whole run would have") in resumed.stdout
    done = load_results(report / "results.json")
    assert done.complete and [r.label for r in done.records] == [Label.MISMATCH, Label.PASS]


@pytest.mark.slow
def test_a_resume_does_not_fuzz_a_run_that_did_not(tmp_path):
    """Given --fuzz-examples, the run's test path left the fuzzing test out; its resume, from
    conformance/ as recover prints it, fuzzed and wrote examples the run never had (a review)."""
    args = [a if a != "conformance/" else "conformance/test_matrix.py"
            for a in pytest_args(tmp_path, BACKEND, CASES[:2], "--fuzz-examples", "2")]
    whole = run(args)
    assert whole.returncode == 0, whole.stdout[-3000:]
    assert ("--fuzz-examples 2: nothing was fuzzed here: its test path, -k or -m left "
            "conformance/test_fuzz.py out") in whole.stdout, whole.stdout[-3000:]
    report = tmp_path / "report"
    store = report / "records" / "main.jsonl"
    store.write_text("".join(store.read_text().splitlines(keepends=True)[:-1]))  # killed
    for written in ("results.json", "index.html", "summary.md", "records/reported"):
        (report / written).unlink()
    resumed = run(pytest_args(tmp_path, BACKEND, CASES[:2], "--fuzz-examples", "2",
                              "--resume", str(report)))
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    done = load_results(report / "results.json")
    assert done.complete and [r.case_id for r in done.records] == [c.id for c in CASES[:2]]
