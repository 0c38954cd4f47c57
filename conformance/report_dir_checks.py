"""What a report directory must be before a run takes it (one line, exit 4, before anything
is moved): writable, holding no records of a killed run that clearing would lose, and nothing
that no run of this suite wrote that a run would replace or move away."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest


def refuse_to_clear_an_unreported_run(report_dir: Path) -> None:
    """UsageError, one line, before anything is moved, when ``report_dir`` holds the records
    of a run killed before it wrote its results: clearing them would lose what finished
    without a word. A run stopped by a signal wrote its results, and is set aside as usual."""
    from records.store import unreadable_run, unreported_run
    from records.events import finished_ids, merge_records, records_dir
    from records.text import one_line

    where = one_line(str(report_dir))
    unreadable = unreadable_run(report_dir)
    if unreadable:
        merged = merge_records(report_dir, [])  # every finished one, judged or not
        held = len(merged.records) - len(merged.unfinished)
        raise pytest.UsageError(
            f"--report-dir {where}: it holds {held} finished case "
            f"record(s) of a run that stopped without its results, whose manifest cannot be "
            f"read ({unreadable}); move {shlex.quote(one_line(str(records_dir(report_dir))))} "
            "away to keep them (or remove it), or give this run another --report-dir")
    killed = unreported_run(report_dir)
    if killed is None:
        return
    raise pytest.UsageError(
        f"--report-dir {where}: it holds the records of a run that stopped without writing its "
        f"results (started {one_line(killed.started_at) or 'at an unknown time'}, "
        f"{len(finished_ids(report_dir))} case(s) finished); keep them as an incomplete report "
        f"with flexconf recover {shlex.quote(where)}, finish that run with --resume "
        f"{shlex.quote(where)} and its "
        "options, or give this run another --report-dir")


def refuse_to_clear_foreign_files(report_dir: Path) -> None:
    """UsageError, one line, before anything is moved or locked, when ``report_dir`` holds
    what a run would replace or move away and no run wrote: a records/, outputs/ or
    artifacts/ with something in it and no run's manifest (records/run.json; a source tree,
    a folder of the user's own, or an older suite's run), or a results.json, index.html or
    summary.md beside no results file of this suite (moved into previous/, it is dropped by
    the run after), there or in previous/ (replaced by the second run); and, in any
    directory, a ``previous`` that is a link or a file."""
    from conformance.artifacts import ARTIFACTS_DIRNAME
    from conformance.kept_outputs import OUTPUTS_DIR
    from records.store import MANIFEST_NAME, PREVIOUS_DIR, foreign_result_file, holds_a_run
    from records.events import RECORDS_DIR
    from records.text import one_line

    where = f"--report-dir {one_line(str(report_dir))}"
    fix = "give this run another --report-dir (e.g. reports/latest), or move it away"
    # a run moves files into previous/ and replaces them: a link or a file there is refused in
    # a run's directory too (a FileExistsError, or across disks EXDEV: an outside audit)
    previous = report_dir / PREVIOUS_DIR
    if previous.is_symlink() or (previous.exists() and not previous.is_dir()):
        raise pytest.UsageError(
            f"{where}: its {PREVIOUS_DIR} is a {'link' if previous.is_symlink() else 'file'}, "
            f"where a run keeps the last run's results (a folder of its own); {fix}")
    if holds_a_run(report_dir):
        return  # a run's directory: what is in it is a run's
    for name in (RECORDS_DIR, OUTPUTS_DIR, ARTIFACTS_DIRNAME):
        folder = report_dir / name
        if folder.is_symlink() or folder.is_file() or (folder.is_dir() and any(folder.iterdir())):
            raise pytest.UsageError(
                f"{where}: it holds {name}/ with no {RECORDS_DIR}/{MANIFEST_NAME} (not a run's, "
                f"or an older suite's), and a run replaces {name}/ whole; {fix}")
    stray = foreign_result_file(report_dir)
    if stray is not None:
        raise pytest.UsageError(
            f"{where}: it holds {one_line(str(stray.relative_to(report_dir)))} with no results "
            "file of this suite beside it (a file of your own, or a report flexconf report "
            "rendered there), and a run moves it into previous/ and the run after drops it; "
            f"{fix}")
    stray = foreign_result_file(previous)  # the second run replaced it
    if stray is not None:
        raise pytest.UsageError(
            f"{where}: it holds {one_line(str(stray.relative_to(report_dir)))} with no results "
            f"file of this suite beside it (a file of your own), and each run replaces "
            f"{PREVIOUS_DIR}/'s files with the last run's; {fix}")


def check_writable(report_dir: Path, flag: str) -> None:
    """UsageError, one line, unless ``report_dir`` is (or, for --report-dir, can be made) a
    writable directory; a missing --resume directory is left for resumable_run to name."""
    from records.files import directory_problem
    from records.text import one_line

    problem = _too_long(report_dir) or directory_problem(report_dir, make=flag != "--resume")
    if problem is not None:
        fix = ("give the report directory of the interrupted run, writable by this user"
               if flag == "--resume" else
               "pass a directory this user can write, e.g. --report-dir reports/latest")
        raise pytest.UsageError(f"{flag} {one_line(str(report_dir))}: {problem}; {fix}")


#: How long a path a run writes below its report directory may be (compile artefacts keep a
#: compiler's own layout under artifacts/<case>/): the directory leaves this much of PATH_MAX.
BELOW_REPORT_DIR = 1024


def _too_long(report_dir: Path) -> str | None:
    """Why ``report_dir`` is too long a path for the files a run writes below it (one of about
    4,060 characters was made, then a record's path was "File name too long", a traceback,
    and an empty records/ stayed: an outside audit); None when it is not."""
    import os

    try:
        limit = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        limit = 4096
    length = len(os.fsencode(os.path.abspath(report_dir)))
    if length + BELOW_REPORT_DIR <= limit:
        return None
    return (f"its path is {length} bytes long, and a run writes files up to "
            f"{BELOW_REPORT_DIR} bytes below it, beyond this system's {limit}")
