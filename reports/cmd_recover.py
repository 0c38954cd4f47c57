"""`flexconf recover REPORT_DIR`: the results of a run that was killed (``kill -9``, a lost
machine) from its record store: results.json, index.html and summary.md, ``complete: false``.

A case that was started and never finished is a CRASH record (the store's rule). The run can
then be finished with ``pytest conformance/ --resume REPORT_DIR`` and the same options (the
command is printed, for the current directory).
A run that wrote its own results (complete, or stopped by a signal) is refused: there is
nothing to recover, and its results stay as they are. No torch: this reads files only.
"""
from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path

from records.text import one_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from records.files import NonEmpty

    parser.add_argument("report_dir", metavar="REPORT_DIR", action=NonEmpty,
                        what="the report directory of the killed run",
                        help="the --report-dir of the killed run (it holds records/)")


def run(args: argparse.Namespace) -> int:
    from records.store import RunInProgress, hold_run_lock, holds_a_run

    report_dir = Path(args.report_dir)
    if not holds_a_run(report_dir):
        return _recover(report_dir)  # says that no run's records are here
    # held while it writes, as a run holds it: no run starts into the directory meanwhile
    try:
        lock = hold_run_lock(report_dir, f"flexconf recover, pid {os.getpid()}")
    except RunInProgress as exc:  # its cases going on would be recorded as CRASH
        raise ValueError(f"{report_dir}: its run is still going on ({exc.holder}); recover is "
                         "for a run that was killed: wait for it to end, or stop it first") \
            from None
    with lock:
        return _recover(report_dir)


def _recover(report_dir: Path) -> int:
    from records.results import is_fuzzed, load_results
    from records.store import read_manifest, write_run
    from records.events import (damage_line, finished_in, fuzzing_done, merge_records,
                                recorded_selection)
    from reports.render import write_report
    from conformance.run_info import matrix_path
    from reports.summary import resume_command

    manifest = read_manifest(report_dir)
    if manifest is None:
        raise ValueError(_no_records_here(report_dir))
    _refuse_a_reported_run(report_dir, manifest)
    # a record outside the run's selection (where it is known) is damage: not counted
    known = manifest.selected if manifest.selected is not None \
        else recorded_selection(report_dir)
    merged = merge_records(report_dir, manifest.case_order, known)
    if merged.environment is None and not merged.records:
        raise ValueError(f"{report_dir}: the run recorded nothing before it stopped; run it "
                         "again (nothing to recover)")
    # [] is a run that selected none of the matrix (it fuzzed): a count of none, as a run
    # that ends writes it; None is a run stopped before it knew: the matrix
    selected = manifest.case_order if manifest.selected is None else manifest.selected
    selection = manifest.selection  # as started: its case_ids are the run's before sharding
    if selection is not None and selection.get("case_ids") is None:  # xdist: the workers'
        selection = {**selection, "case_ids": recorded_selection(report_dir)}
    results = write_run(report_dir, merged, merged.environment or {}, manifest.options,
                        manifest.suite_version, manifest.started_at, "", complete=False,
                        selected_count=len(selected) or None, selection=selection)
    write_report(load_results(report_dir / "results.json"), report_dir)
    finished = [r for r in results.records if r.case_id not in merged.unfinished]
    fuzzed = sum(1 for r in finished if is_fuzzed(r.case_id))
    cases = f"{len(finished) - fuzzed} finished" + (
        f" of {len(selected)} selected cases" if selected else "")
    if fuzzed:  # counted apart (an audit: "35 finished of 12 selected cases")
        cases = (f"{cases} and " if selected or len(finished) > fuzzed else "") + \
            f"{fuzzed} finished fuzzed example{'' if fuzzed == 1 else 's'}"
    print(f"recovered {cases}"
          + (f" of the run started {one_line(manifest.started_at)}"
             if manifest.started_at else "")
          + (f", {len(merged.unfinished)} cut off (CRASH)" if merged.unfinished else "")
          + f": {report_dir / 'index.html'}")
    if merged.damaged:
        print(damage_line(merged, report_dir))
    command = resume_command(results, report_dir, matrix_path())
    fuzzes = manifest.fuzzing if manifest.fuzzing is not None else \
        bool((manifest.options or {}).get("fuzz_examples"))  # an older manifest: its options
    fuzzing_cut = fuzzes and not fuzzing_done(report_dir)  # its resume fuzzes again
    if (selected or fuzzes) and not merged.unfinished and not fuzzing_cut \
            and set(selected) <= finished_in(merged):  # what --resume would not run
        print(f"every selected case{' and the fuzzing' if fuzzes else ''} finished before the "
              "run was stopped: mark it complete "
              f"(this runs no case; with the suite and release that started it): {command}")
    else:
        if fuzzing_cut:  # said apart: the counts above read as whole (an outside audit)
            print(f"its fuzzing did not finish: {fuzzed} fuzzed example"
                  f"{'' if fuzzed == 1 else 's'} recorded (of --fuzz-examples "
                  f"{(manifest.options or {}).get('fuzz_examples', '?')}); the resume draws the "
                  "rest")
        print(f"finish it: {command}")
    return 0


def _no_records_here(report_dir: Path) -> str:
    """The one line for a path that holds no run's records: the directory to pass instead
    when the path is a file of a run's report directory (its results.json, say)."""
    from records.store import MANIFEST_NAME, holds_a_run
    from records.events import records_dir

    if holds_a_run(report_dir.parent) and not report_dir.is_dir():
        return (f"{report_dir}: not a report directory; its directory holds a run's records: "
                f"flexconf recover {shlex.quote(one_line(str(report_dir.parent)))}")
    what = "a file, not a report directory" if report_dir.is_file() else (
        f"no run's records here ({records_dir(report_dir)}/{MANIFEST_NAME} is missing)")
    return f"{report_dir}: {what}; pass the --report-dir of the run"


def _refuse_a_reported_run(report_dir: Path, manifest) -> None:
    """ValueError, one line, when the run wrote its own results (it finished, or a signal
    stopped it): recovering would replace them with an INCOMPLETE rendering of its records.
    What recover wrote itself (no ``finished_at``) may be written again, to take in a case a
    worker recorded after the controller was killed."""
    from records.store import results_head, reported_run, set_aside_head
    from reports.summary import resume_command_of

    aside = set_aside_head(report_dir, manifest)
    if aside is not None:  # rendered again here, it read as the later run's (an outside audit)
        how = "complete" if aside.get("complete") is True else (
            "stopped before its end" if aside.get("finished_at") else "recovered")
        finish = "start a new run" if how == "complete" else (
            f"finish it with {resume_command_of(report_dir, manifest)}, or start a new run")
        raise ValueError(f"{report_dir}: its records are those of the run reported in "
                         f"{report_dir / 'previous'}/ (started {one_line(manifest.started_at)}, "
                         f"{how}; a later run stopped before its first case and set it aside); "
                         f"nothing to recover: {finish}")
    head = reported_run(report_dir, manifest)
    other = results_head(report_dir) if head is None else {}
    if other.get("started_at"):  # another run's results (a merge written there, say)
        raise ValueError(f"{report_dir}: its results.json reports another run (started "
                         f"{one_line(other['started_at'])}; the records are of the run started "
                         f"{one_line(manifest.started_at)}), which recover would overwrite; "
                         "move that results.json away, then recover")
    if head is None or not head.get("finished_at"):
        return
    if head.get("complete"):
        raise ValueError(f"{report_dir}: its results.json already reports its run, complete; "
                         "nothing to recover (recover is for a run that was killed)"
                         + _pages_missing(report_dir))
    raise ValueError(f"{report_dir}: its results.json already reports its run, stopped before "
                     f"its end; nothing to recover: finish it with "
                     f"{resume_command_of(report_dir, manifest)}" + _pages_missing(report_dir))


def _pages_missing(report_dir: Path) -> str:
    """How to render the pages of a run whose results.json was written and its pages not (a
    kill between the two: an outside audit found recover's refusal silent about them)."""
    from records.store import RESULT_FILES

    missing = [name for name in RESULT_FILES[1:] if not (report_dir / name).exists()]
    if not missing:
        return ""
    quoted = shlex.quote(one_line(str(report_dir)))
    return (f"; its {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing: "
            f"flexconf report {shlex.quote(one_line(str(report_dir / 'results.json')))} -o "
            f"{quoted} writes {'it' if len(missing) == 1 else 'them'}")

