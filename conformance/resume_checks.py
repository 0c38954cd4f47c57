"""What ``--resume`` checks before it finishes an interrupted run (conformance/run_lifecycle.py
calls ``resumable_run`` at the start): the run's manifest is there and its own, and this
command would measure and judge its remaining cases as the run did its finished ones (the
same options, oracle, release and threads per worker); otherwise one line, a usage error.
"""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from conformance import options as opts
from records.events import recorded_environments
from reports.summary import resume_command_of

_RESUME_SAME = ("backend", "profile", "matrix", "cases_modules", "case_file", "seed",
                "compile_timeout", "run_timeout", "timed_runs", "compile_cache", "phase",
                "shard", "expectations", "fuzz_examples")


def resumable_run(options: opts.RunOptions, recorded: dict, backend, workers: int):
    """The manifest of the interrupted run in ``--resume``'s directory; UsageError, one line,
    when there is none, or its options, oracle, release or threads per worker differ."""
    from records.files import UserFileError
    from records.store import read_manifest

    try:
        manifest = read_manifest(options.report_dir)
    except UserFileError as exc:
        raise pytest.UsageError(f"--resume: {exc}") from None
    if manifest is None:
        raise pytest.UsageError(f"--resume {options.report_dir}: no run's records there "
                                "(records/run.json is missing); run without --resume")
    from records.store import set_aside_report

    if set_aside_report(options.report_dir, manifest):
        raise pytest.UsageError(
            f"--resume {options.report_dir}: its records are those of the run reported in "
            f"{options.report_dir / 'previous'}/ (a later run stopped before its first case "
            "and set it aside); nothing to resume: run without --resume")
    from records.events import records_dir
    from records.selection import matrix_selects
    from records.text import one_line

    for path in sorted(records_dir(options.report_dir).glob("*.jsonl")):
        if not path.is_file():  # every case's record would fail to be written (an audit)
            raise pytest.UsageError(
                f"--resume {options.report_dir}: {one_line(str(path))} is not a file, where a "
                "worker's records belong; move it away, then resume")
    for key in _RESUME_SAME:
        before, now = manifest.options.get(key), recorded.get(key)
        if key == "matrix" and not matrix_selects(before, manifest.options.get("case_file")) \
                and not matrix_selects(now, recorded.get("case_file")):
            continue  # beside a case file (an older suite recorded it): it chose nothing
        if before != now:
            raise pytest.UsageError(
                f"--resume {options.report_dir}: the run had {key} {_given(before)}, this one "
                f"{_given(now)}; resume with the run's own options: "
                f"{resume_command_of(options.report_dir, manifest)}")
    _refuse_another_suite(options.report_dir, manifest)
    _refuse_another_oracle(options.report_dir)
    _refuse_another_release(options.report_dir, backend, options.backend)
    _refuse_another_layout(options.report_dir, workers, manifest)
    return manifest


def _refuse_another_layout(report_dir: Path, workers: int, manifest) -> None:
    """UsageError, one line, when this command's workers would get another number of threads
    than the run's did (another -n, or a machine with other cores): compile and run times
    measured with 2 threads and with 1 would stand side by side in one results file, and a
    gate would compare them as one run's."""
    from conformance.backends.base import WorkerSlot, threads_per_worker
    from records.text import one_line

    now = threads_per_worker(WorkerSlot(0, workers))
    for environment in recorded_environments(report_dir):
        before, count = environment.get("threads_per_worker"), environment.get("workers")
        if isinstance(before, int) and before != now:
            raise pytest.UsageError(
                f"--resume {one_line(str(report_dir))}: the run measured its cases with {before} "
                f"thread(s) per worker (-n {count}), this command would with {now} (-n "
                f"{workers}); resume with -n {count} on the run's machine (and "
                f"OMP_NUM_THREADS={before} if the run had it), so one results file holds "
                f"comparable times: {resume_command_of(report_dir, manifest)}")


def _given(value) -> str:
    """An option's value as a resume refusal shows it: None is an option not given."""
    return "none (not given)" if value is None else repr(value)


def _refuse_another_release(report_dir: Path, backend, spec: str) -> None:
    """UsageError, one line, when this command would measure another release than the run's
    finished cases did (records/release.py: torch, the compiler stack, a plugin's code): one
    results file would hold two releases, under the first one's name."""
    from conformance.backends.registry import BackendError, environment_of
    from records.release import release_difference, release_of
    from records.text import one_line

    try:
        now = release_of(environment_of(backend, spec))
    except BackendError as exc:
        raise pytest.UsageError(str(exc)) from None
    for environment in recorded_environments(report_dir):
        difference = release_difference(release_of(environment), now)
        if difference:
            where = one_line(str(report_dir))
            raise pytest.UsageError(
                f"--resume {where}: this command would measure another release: {difference}; "
                f"resume with the release that started the run, or keep its cases as an "
                f"incomplete report with flexconf recover {shlex.quote(where)}")


def _refuse_another_suite(report_dir: Path, manifest) -> None:
    """UsageError, one line, when another suite version started the run: its matrix may hold
    other cases (0.2.0's core soft-cap cases are not 0.1.0's), so the resume could neither run
    the cases it selected nor end complete, and the file would bear the new version's name."""
    from conformance.run_info import suite_version
    from records.text import one_line

    if manifest.suite_version and manifest.suite_version != suite_version():
        where = one_line(str(report_dir))
        raise pytest.UsageError(
            f"--resume {where}: suite {one_line(manifest.suite_version)} started the run, this "
            f"is suite {suite_version()}; resume with the suite that started it, or keep its "
            f"cases as an incomplete report with flexconf recover {shlex.quote(where)}")


def _refuse_another_oracle(report_dir: Path) -> None:
    """UsageError, one line, when another version of the oracle judged the run's finished
    cases (records/results.py REFERENCE_VERSION_KEY): one results file would hold the
    verdicts of two oracles. Records that name no version (written before it was recorded)
    are not checked."""
    from records.results import REFERENCE_VERSION_KEY
    from records.text import one_line
    from reference.golden import REFERENCE_VERSION

    for environment in recorded_environments(report_dir):
        judged_by = environment.get(REFERENCE_VERSION_KEY)
        if judged_by is not None and judged_by != REFERENCE_VERSION:
            where = one_line(str(report_dir))
            raise pytest.UsageError(
                f"--resume {where}: reference version {one_line(repr(judged_by))} judged its "
                f"finished cases, this suite's is {REFERENCE_VERSION}; keep them as an "
                f"incomplete report with flexconf recover {shlex.quote(where)}, or resume with "
                "the suite "
                "that started the run")
