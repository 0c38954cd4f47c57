"""`pytest conformance/` end to end, in subprocesses: xdist merge, -k, Ctrl-C (a killed
worker: tests/test_stop_at_run_end.py, whose run of it shows a late stop signal too).

Tiny cases on test backends (cpu-eager based) keep each run to a few seconds of work.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cases.model import Case, Shape, Variant
from conformance.backends.base import WorkerSlot, threads_per_worker, usable_cores
from reference.golden import REFERENCE_VERSION
from records.results import Label, load_results
from tests import fault_backends

REPO = Path(__file__).resolve().parent.parent
TINY = Shape(1, 2, 2, 64, 64, 16)
CASES = [Case(Variant("full"), TINY), Case(Variant("causal"), TINY),
         Case(Variant("alibi"), TINY), Case(Variant("sliding_window", (("w", 16),)), TINY)]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(extra)
    return env


def pytest_args(tmp_path: Path, backend: str, cases, *extra: str) -> list[str]:
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps([c.to_json() for c in cases]))
    return [sys.executable, "-m", "pytest", "conformance/", "-p", "no:cacheprovider", "-rs",
            "--backend", backend, "--case-file", str(case_file),
            "--report-dir", str(tmp_path / "report"), "--reference-cache", "none", *extra]


def run(args, env=None, timeout=300, cwd=REPO, **popen) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), **popen)


@pytest.mark.slow
def test_two_workers_give_one_merged_results_file(tmp_path):
    proc = run(pytest_args(tmp_path, "tests.fault_backends:WrongNumbers", CASES, "-n", "2"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = load_results(tmp_path / "report" / "results.json")  # validated against the schema
    assert [r.case_id for r in results.records] == [c.id for c in CASES]  # each once, in order
    assert results.complete
    labels = {r.case_id: r.label for r in results.records}
    assert labels.pop(CASES[1].id) is Label.MISMATCH
    assert set(labels.values()) == {Label.PASS}
    for record in results.records:
        assert record.worker.startswith("gw")
        assert record.compile_seconds is not None and record.run_seconds is not None
    assert results.environment["workers"] == 2
    assert results.environment["threads_per_worker"] == threads_per_worker(WorkerSlot(0, 2))
    assert results.environment["usable_cores"] == usable_cores()
    assert results.reference_version == REFERENCE_VERSION  # the oracle that judged the run
    assert results.options["backend"] == "test-wrong-numbers"
    worker_files = sorted(p.name for p in (tmp_path / "report" / "records").glob("*.jsonl"))
    assert worker_files and all(name.startswith("gw") for name in worker_files)
    failure_lines = [line for line in proc.stdout.splitlines() if line.startswith("[MISMATCH]")]
    assert len(failure_lines) == 1


def test_k_selects_cases_by_id_and_unsupported_skips(tmp_path):
    wanted = [CASES[1].id, CASES[2].id]
    proc = run(pytest_args(tmp_path, "tests.fault_backends:Unsupported", CASES,
                           "-k", f"{wanted[0]} or {wanted[1]}"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # -k also deselects conformance/test_fuzz.py
    assert "1 passed, 1 skipped, 3 deselected" in proc.stdout
    assert "[UNSUPPORTED] this test backend declares causal masks unsupported" in proc.stdout
    results = load_results(tmp_path / "report" / "results.json")
    assert [r.case_id for r in results.records] == wanted
    assert [r.label for r in results.records] == [Label.UNSUPPORTED, Label.PASS]
    assert results.complete


def _process_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not _process_gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _process_gone(pid)


def _stop_signals_delivered() -> None:
    """In the pytest under test: Ctrl-C, SIGTERM and SIGHUP as a terminal and a scheduler
    deliver them. A test suite started as a background job of a non-interactive shell
    (``cmd &``, as CI runners may) ignores SIGINT, one started under ``nohup`` ignores SIGHUP,
    and an ignored signal is inherited through exec: the run under test would never see it
    (under nohup the suite keeps SIGHUP ignored on purpose, docs/execution.md)."""
    stops = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    for signum in stops:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)


@pytest.mark.slow
def test_ctrl_c_leaves_results_of_finished_cases(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    cases = [CASES[0], CASES[1]]  # full passes, then causal hangs while compiling
    proc = subprocess.Popen(
        pytest_args(tmp_path, "tests.fault_backends:CompileHang", cases), cwd=REPO,
        env=clean_env(**{fault_backends.GRANDCHILD_PID_FILE: str(pid_file)}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=_stop_signals_delivered)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:  # inside the hang
            time.sleep(0.2)
        assert pid_file.exists(), "the hanging case never started"
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)  # waits for the exit (~5 s); a safety net
    finally:
        proc.kill()
    assert proc.returncode == 2, output[-3000:]  # pytest's "interrupted"
    results = load_results(tmp_path / "report" / "results.json")
    assert not results.complete
    labels = [(r.case_id, r.label) for r in results.records]
    assert labels == [(cases[0].id, Label.PASS), (cases[1].id, Label.CRASH)]
    assert _wait_gone(int(pid_file.read_text())), "the hung compile outlived Ctrl-C"


@pytest.mark.slow
def test_expected_failure_is_xfail_and_still_recorded(tmp_path):
    known = tmp_path / "known.toml"
    known.write_text(f'[[failure]]\nbackend = "test-wrong-numbers"\ncase = "{CASES[1].id}"\n'
                     'label = "MISMATCH"\nreason = "row doubled on purpose"\n')
    proc = run(pytest_args(tmp_path, "tests.fault_backends:WrongNumbers", CASES[:2],
                           "--expectations", str(known), "-rx"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed, 1 skipped, 1 xfailed" in proc.stdout  # the skip: test_fuzz.py, off
    assert "[MISMATCH] known MISMATCH: row doubled on purpose" in proc.stdout
    results = load_results(tmp_path / "report" / "results.json")
    assert [r.label for r in results.records] == [Label.PASS, Label.MISMATCH]
    assert [r.expected_failure for r in results.records] == [None, "row doubled on purpose"]
    # the file's content, for merge: shards may name one file by different paths
    import hashlib
    assert results.options["expectations_sha256"] == hashlib.sha256(known.read_bytes()).hexdigest()
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "1 MISMATCH · 1 of 1 failures known** (❌ does not conform)" in summary
    assert "| MISMATCH | known: row doubled on purpose |" in summary
    assert "known: row doubled on purpose" in (tmp_path / "report" / "index.html").read_text()
    assert "still reads 'to triage:" not in proc.stdout
    # a reason as flexconf expectations update writes it: the run says so, as the gate does
    # (an outside audit: "1 xfailed", exit 0, not a word)
    known.write_text(known.read_text().replace("row doubled on purpose", "to triage: MISMATCH"))
    proc = run(pytest_args(tmp_path, "tests.fault_backends:WrongNumbers", CASES[:2],
                           "--expectations", str(known)))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ("1 known failure(s) accepted by --expectations on a reason that still reads 'to "
            f"triage: ...' (e.g. {CASES[1].id}): give each entry a reason and a link"
            in proc.stdout), proc.stdout[-3000:]


def _copy_kept_warm_up_builds(backend: str, cache_home: Path) -> None:
    """Copy the warm-up builds this user's runs keep (conformance/backends/kept_builds.py;
    published whole, by a rename) into the cache root under ``cache_home``: a child there
    starts as a user's does, not with a fresh warm-up (10 s more). They never serve a case,
    so the compile cache there still starts empty."""
    import shutil

    from conformance.cache_dirs import warm_up_cache_dir

    kept = warm_up_cache_dir(backend)
    target = cache_home / kept.relative_to(kept.parents[2])
    for release in kept.glob("torch-*"):
        shutil.copytree(release, target / release.name, symlinks=True)


@pytest.mark.slow
def test_a_compile_only_pass_fills_the_warm_cache_that_the_next_run_hits(tmp_path):
    from conformance.cli import main

    cases = CASES[1:3]
    env = clean_env(XDG_CACHE_HOME=str(tmp_path / "cache"))  # the suite's warm cache lives here
    _copy_kept_warm_up_builds("cpu-inductor", tmp_path / "cache")
    proc = run(pytest_args(tmp_path, "cpu-inductor", cases, "--phase", "compile"), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    compiled = load_results(tmp_path / "report" / "results.json")
    assert compiled.options["phase"] == "compile" and compiled.options["compile_cache"] == "warm"
    assert [r.label for r in compiled.records] == [Label.COMPILED, Label.COMPILED]
    assert all(r.compile_seconds and r.run_seconds is None and r.metrics is None
               for r in compiled.records)  # no timed runs, no verdict
    assert "2/2 COMPILED · compile-only pass, numbers not judged" in proc.stdout + \
        (tmp_path / "report" / "summary.md").read_text()
    passes = tmp_path / "compile-pass.json"
    (tmp_path / "report" / "results.json").rename(passes)
    assert main(["gate", "--baseline", str(passes), "--candidate", str(passes)]) == 2
    proc = run(pytest_args(tmp_path, "cpu-inductor", cases, "--compile-cache", "warm"), env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    warm = load_results(tmp_path / "report" / "results.json")
    assert [r.label for r in warm.records] == [Label.PASS, Label.PASS]
    assert [r.cache_hit for r in warm.records] == [True, True]


@pytest.mark.slow
def test_bad_phase_and_device_check_values_are_usage_errors(tmp_path):
    for option, value, expected in (
            ("--phase", "link", "--phase 'link' is unknown; use one of: all, compile"),
            ("--neuron-device-check", "off", "--neuron-device-check 'off' is unknown; use one "
                                             "of: bypass, strict")):
        proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], option, value))
        assert proc.returncode == 4 and f"ERROR: {expected}" in proc.stderr, proc.stderr[-2000:]
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--phase", "compile",
                           "--compile-cache", "cold"))
    assert proc.returncode == 4
    assert "--phase compile fills the warm cache, but --compile-cache is cold" in proc.stderr
    # a backend that compiles nothing has no cache to fill: its cases were labeled COMPILED
    proc = run(pytest_args(tmp_path, "cpu-eager", CASES[:1], "--phase", "compile"))
    assert proc.returncode == 4
    assert ("ERROR: --phase compile: backend cpu-eager compiles nothing, so there is no cache "
            "to fill; run without --phase") in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "report" / "results.json").exists()


@pytest.mark.slow
def test_a_run_started_outside_the_checkout_prints_rerun_commands_that_run_there(tmp_path):
    """The report's rerun command names the matrix as the run did, from where it started: run
    as printed from that directory, it reruns the case (before, `pytest conformance/` ran only
    from the checkout's root)."""
    import shlex

    from conformance.run_info import matrix_path
    from reports.summary import rerun_command

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "cases.json").write_text(json.dumps([c.to_json() for c in CASES[:2]]))
    args = [sys.executable, "-m", "pytest", f"{REPO}/conformance/", "-p", "no:cacheprovider",
            "--backend", "tests.fault_backends:WrongNumbers", "--case-file", "cases.json",
            "--report-dir", "report", "--reference-cache", "none"]
    proc = run(args, cwd=elsewhere)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = load_results(elsewhere / "report" / "results.json")
    assert results.options["matrix_path"] == f"{REPO}/conformance/" == matrix_path(elsewhere)
    assert matrix_path(REPO) == "conformance/"
    assert matrix_path(REPO.parent) == f"{REPO.name}/conformance/"
    command = shlex.split(rerun_command(results, CASES[1].id))
    env_words = [w for w in command[:command.index("pytest")] if "=" in w]
    rerun = run([sys.executable, "-m"] + command[len(env_words):], cwd=elsewhere,
                env=clean_env(**dict(w.split("=", 1) for w in env_words)))
    assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    again = load_results(elsewhere / "report-rerun" / "results.json")
    assert [(r.case_id, r.label) for r in again.records] == [(CASES[1].id, Label.MISMATCH)]
