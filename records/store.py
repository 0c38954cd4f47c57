"""Records on disk while a run goes on, and their merge into results.json at its end.

A run starts by taking the directory's run lock (``hold_run_lock``: one run at a time in a
directory), setting an earlier run's results aside (``set_aside_results``) and writing its
manifest (``records/run.json``); so a killed run never leaves an older run's green results
looking current, and ``flexconf recover`` or ``--resume`` can finish it from what is here.

The workers' event log under ``records/`` and its merge are records/events.py's.
``write_run`` writes the merged run with ``records.results.write_results`` and notes
that the store is reported; ``unreported_run`` finds a store that is not (a killed run's), which
a new run may not clear.
"""
from __future__ import annotations

import fcntl
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable

from records.events import Merged, read_events, records_dir
from records.files import (UserFileError, read_json, shape_problem, strict_json_text,
                           write_text_atomic)
from records.results import RunResults, load_results, write_results
from records.text import one_line

#: The run's own description, written when it starts: what ``flexconf recover`` and
#: ``--resume`` need to finish a run that was killed.
MANIFEST_NAME = "run.json"
#: The files of a finished run; a new run sets the previous ones aside first.
RESULT_FILES = ("results.json", "index.html", "summary.md")
PREVIOUS_DIR = "previous"
#: Where set_aside_results keeps what previous/ held, until the run that set it aside selects
#: a case (forget_superseded) or selects none (restore_set_aside puts both back).
SUPERSEDED_DIR = ".superseded-previous"
_EMPTY_RUN = "no-case-run"  # under SUPERSEDED_DIR: the results of no case a new run found
#: Written into records/ with the results of the store's run (by the run as it ends, or by
#: ``flexconf recover``): its records are reported, also once results.json is moved away.
REPORTED_NAME = "reported"


#: The run lock: held (flock) by the process that runs the directory's run, from its start to
#: its end, and written with who that is. The kernel lets it go when that process ends, however
#: it ends (kill -9 included), so it is never stale. The file stays: a new file at the path
#: would be another lock.
RUN_LOCK_NAME = ".run.lock"


class RunInProgress(Exception):
    """Another process holds the directory's run lock; ``holder`` says who (pid, start)."""

    def __init__(self, holder: str):
        super().__init__(holder)
        self.holder = holder


def hold_run_lock(report_dir: str | Path, holder: str) -> IO[str]:
    """Take the run lock of ``report_dir`` (an existing directory) for this process and write
    ``holder`` into it; keep the returned file open for the run, closing it lets the lock go.
    RunInProgress when another run holds it: two runs writing one directory would mix their
    records, and each would set the other's results aside. OSError when the lock cannot be
    taken at all (a lock file this user cannot open, a filesystem without locks)."""
    handle = open(Path(report_dir) / RUN_LOCK_NAME, "a+", encoding="utf-8")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        other = one_line(handle.read().strip()) or "another process"
        handle.close()
        raise RunInProgress(other) from None
    except OSError:
        handle.close()
        raise
    handle.seek(0)
    handle.truncate()
    handle.write(holder)
    handle.flush()
    return handle


def run_in_progress(report_dir: str | Path) -> str | None:
    """Who holds ``report_dir``'s run lock (what it wrote there), None when no run does.
    OSError when that cannot be told (a lock file this user cannot read)."""
    try:
        handle = open(Path(report_dir) / RUN_LOCK_NAME, encoding="utf-8", errors="replace")
    except FileNotFoundError:  # no run has started here since runs took the lock
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return one_line(handle.read().strip()) or "another process"
        return None


def refuse_if_run_going_on(directory: str | Path, writing: str) -> None:
    """ValueError, one line, when a run is going on in ``directory``: what a command would
    write there (``writing``) would mix with that run's files, or outlive it looking current."""
    holder = run_in_progress(directory)
    if holder is not None:
        raise ValueError(f"{directory}: a run is going on there ({holder}); {writing} would mix "
                         "with its files: wait for it to end, or write elsewhere")


def results_overwrite_problem(path: str | Path, writer: str, own_kind: str,
                              own: Callable[[dict[str, Any]], bool]) -> str | None:
    """Why ``writer`` (a command writing a results file of its own kind, ``own_kind``) may not
    write ``path``, as the words after its name in a one-line error; None when it may. Refused:
    a ``path`` in a run's report directory (even a killed run's, which has no results.json
    yet), where it would pass for that run's results and its index.html and summary.md would
    contradict it; and a results file of a run, not of ``own_kind`` (``own(options)`` says
    which: an earlier output of the same command is replaced); and any other file that is not
    empty (merge -o /etc/passwd replaced it, as root: an outside audit of the gate's outputs).
    A device such as /dev/null is written into; a link is replaced, its target untouched."""
    path = Path(path)
    if holds_a_run(path.parent):
        return (f"it lies in the report directory of a run ({one_line(str(path.parent))}), "
                "where it would pass for that run's results")
    if path.is_symlink() or not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        options = load_results(path).options
    except UserFileError:
        if _says_results(path):  # a newer suite's, or a damaged one: maybe a run's
            return (f"it is a results file this suite cannot read, which {writer} would "
                    "overwrite")
        return f"it exists and is not a results file {writer} wrote, which it would overwrite"
    if own(options):
        return None
    return f"it is the results.json of a run, not of {own_kind}, which {writer} would overwrite"


def _says_results(path: Path) -> bool:
    """Whether ``path`` is JSON that names this suite's results schema (readable or not)."""
    from records.results import SCHEMA_NAME

    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("schema") == SCHEMA_NAME


def clear_records(report_dir: str | Path) -> None:
    """Start a run: remove the previous run's worker files (the controller does this once)."""
    shutil.rmtree(records_dir(report_dir), ignore_errors=True)
    records_dir(report_dir).mkdir(parents=True, exist_ok=True)


@dataclass(frozen=True)
class RunManifest:
    """What a run is, on disk from its start (``records/run.json``)."""

    started_at: str
    suite_version: str
    options: dict[str, Any]  # as results.json will record them
    case_order: list[str]  # the ids of the matrix (or case file), in order
    selected: list[str] | None = None  # the ids selected (after -k, -m, --case-id), once known
    #: results.json's selection block of the run as started (records/selection.py), once the
    #: ids are known: what a resumed or recovered run records, not the resuming command's -k
    selection: dict[str, Any] | None = None
    #: the run's fuzzing test was collected (--fuzz-examples N > 0): it is complete only once
    #: that test ran its search to the end (records/events.py fuzzing_done); None: a manifest
    #: written before the suite said (its options' fuzz_examples is all there is)
    fuzzing: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {"started_at": self.started_at, "suite_version": self.suite_version,
                "options": self.options, "case_order": self.case_order,
                "selected": self.selected, "selection": self.selection,
                "fuzzing": self.fuzzing}


def holds_a_run(report_dir: str | Path) -> bool:
    """Whether ``report_dir`` is a run's report directory: its store has the run's manifest
    (written when a run starts, kept after it ends, killed or not)."""
    return (records_dir(report_dir) / MANIFEST_NAME).is_file()


def write_manifest(report_dir: str | Path, manifest: RunManifest) -> None:
    path = records_dir(report_dir) / MANIFEST_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(manifest.to_json()), encoding="ascii")


def read_manifest(report_dir: str | Path) -> RunManifest | None:
    """The run's manifest; None when the directory holds no run's records. A manifest that is
    there but cannot be read (a disk fault, a hand edit) is a UserFileError, one line: it is
    written whole (a temporary file renamed), so a run never leaves it torn."""
    path = records_dir(report_dir) / MANIFEST_NAME
    if not path.exists():
        return None
    cannot = ("this directory's run cannot be recovered or resumed; move its records/ away to "
              "keep what finished, then run it again")
    data = read_json(path, cannot)
    if not isinstance(data, dict):
        raise UserFileError(f"{one_line(str(path))}: not a run manifest (a JSON object)", cannot)
    problem = _manifest_problem(data)
    if problem:
        raise UserFileError(f"{one_line(str(path))}: not a run manifest ({problem})", cannot)
    return RunManifest(data.get("started_at", ""), data.get("suite_version", ""),
                       data.get("options") or {}, list(data.get("case_order") or []),
                       data.get("selected"), data.get("selection"), data.get("fuzzing"))


def _manifest_problem(data: dict) -> str | None:
    """Which field of a manifest has a type no run writes (a hand edit, a disk fault)."""
    def ids(value) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    checks = (("started_at", lambda v: isinstance(v, str)),
              ("suite_version", lambda v: isinstance(v, str)),
              ("options", lambda v: isinstance(v, dict)
               and isinstance(v.get("backend", ""), str)
               and isinstance(v.get("profile"), (str, type(None)))),
              ("case_order", ids),
              ("selected", lambda v: v is None or ids(v)),
              ("selection", lambda v: v is None or isinstance(v, dict)),
              ("fuzzing", lambda v: v is None or isinstance(v, bool)))
    for key, fine in checks:
        if key in data and not fine(data[key]):
            return f"its {key} is a {type(data[key]).__name__} no run writes there"
    return None


def set_aside_results(report_dir: str | Path, resuming: RunManifest | None = None) -> list[Path]:
    """Move an earlier run's results.json, index.html and summary.md into ``previous/``, so
    that while this run goes on, and after it is killed, nothing in the directory looks like
    its results. Returns where they went.

    A run that ``resuming`` finishes set the run before it aside when it started, and may have
    left its own partial results (interrupted, or ``flexconf recover``ed): those are removed
    instead, so ``previous/`` keeps the last run before it, not a rendering of its own part.
    So are the results of a run that recorded no case (stopped before its first case started,
    or an empty --shard part): they hold nothing, and moved they would push the last real run
    out of ``previous/``.

    What ``previous/`` held goes to ``SUPERSEDED_DIR`` until the run knows it selected a case
    (``forget_superseded``) or that it selected none (``restore_set_aside``), and so do the
    results of no case a new run finds (a merge still needs an empty part's). One left there by
    a run that died before either is dropped first (the run lock says no run owns it), except
    the results of no case, which go back first; and a run that ``resuming`` finishes, whose
    own partial results such a run moved into ``previous/``, gets the run before it back
    there."""
    report_dir = Path(report_dir)
    restore_held_empty_run(report_dir)
    superseded = report_dir / SUPERSEDED_DIR
    if resuming is not None and resuming.started_at and \
            results_head(report_dir / PREVIOUS_DIR).get("started_at") == resuming.started_at:
        for name in RESULT_FILES:
            (report_dir / PREVIOUS_DIR / name).unlink(missing_ok=True)
            if (superseded / name).exists():
                (superseded / name).replace(report_dir / PREVIOUS_DIR / name)
    shutil.rmtree(superseded, ignore_errors=True)
    if resuming is not None:  # its results go, and it will record more: none of it is reported
        (records_dir(report_dir) / REPORTED_NAME).unlink(missing_ok=True)
    earlier = results_head(report_dir)
    pages_alone = not (report_dir / RESULT_FILES[0]).exists()  # a rendering, not a run's results
    if resuming is not None and (earlier.get("records") == 0 or pages_alone or (
            resuming.started_at and earlier.get("started_at") == resuming.started_at)):
        for name in RESULT_FILES:
            (report_dir / name).unlink(missing_ok=True)
        return []
    if earlier.get("records") == 0:
        held = report_dir / SUPERSEDED_DIR / _EMPTY_RUN
        held.mkdir(parents=True)
        for name in RESULT_FILES:
            if (report_dir / name).exists():
                (report_dir / name).replace(held / name)
        return []
    moved = []
    for name in RESULT_FILES:
        source = report_dir / name
        if source.exists():
            target = report_dir / PREVIOUS_DIR / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                (report_dir / SUPERSEDED_DIR).mkdir(exist_ok=True)
                target.replace(report_dir / SUPERSEDED_DIR / name)
            source.replace(target)
            moved.append(target)
    if resuming is not None:  # a resume selects cases: nothing to put back, ever (an audit:
        shutil.rmtree(superseded, ignore_errors=True)  # it was left there for good)
    return moved


def restore_held_empty_run(report_dir: str | Path) -> None:
    """Put the results of no case that ``set_aside_results`` held back (an empty --shard
    part's, which a merge needs) back into the directory, where it has none: for a run that
    stopped, or died, before it selected a case."""
    report_dir = Path(report_dir)
    held = report_dir / SUPERSEDED_DIR / _EMPTY_RUN
    if not held.is_dir() or any((report_dir / name).exists() for name in RESULT_FILES):
        return
    for name in RESULT_FILES:
        if (held / name).exists():
            (held / name).replace(report_dir / name)
    shutil.rmtree(held, ignore_errors=True)


def forget_superseded(report_dir: str | Path) -> None:
    """The run that set the last one aside selected cases: what ``previous/`` held before goes."""
    shutil.rmtree(Path(report_dir) / SUPERSEDED_DIR, ignore_errors=True)


def restore_set_aside(report_dir: str | Path, moved: list[Path]) -> None:
    """Undo ``set_aside_results`` (which returned ``moved``) for a run that selected no case:
    the last run's results back in the directory, and the run before it back in
    ``previous/`` (no ``previous/`` where there was none)."""
    report_dir = Path(report_dir)
    superseded = report_dir / SUPERSEDED_DIR
    for aside in moved:
        if aside.exists() and not (report_dir / aside.name).exists():
            aside.replace(report_dir / aside.name)
            if (superseded / aside.name).exists():
                (superseded / aside.name).replace(aside)
    restore_held_empty_run(report_dir)  # the results of no case it held back instead
    shutil.rmtree(superseded, ignore_errors=True)
    try:
        (report_dir / PREVIOUS_DIR).rmdir()  # only where it is empty
    except OSError:
        pass


def foreign_result_file(report_dir: str | Path) -> Path | None:
    """The first of ``report_dir``'s results.json, index.html and summary.md when none of them
    is a results file of this suite (files of the user's own): a run would move them into
    ``previous/``, and the run after it would drop them. None when there is none."""
    from records.results import SCHEMA_NAME

    report_dir = Path(report_dir)
    present = [report_dir / name for name in RESULT_FILES if (report_dir / name).exists()]
    if not present:
        return None
    try:
        data = json.loads((report_dir / RESULT_FILES[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    return None if isinstance(data, dict) and data.get("schema") == SCHEMA_NAME else present[0]


def results_head(report_dir: Path) -> dict[str, Any]:
    """``started_at`` and the number of ``records`` of ``report_dir``'s results.json, each
    where it can be read (a partial or corrupt file gives what it can, maybe nothing)."""
    try:
        data = json.loads((report_dir / RESULT_FILES[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    head: dict[str, Any] = {}
    if isinstance(data, dict):
        for key, kind in (("started_at", str), ("finished_at", str), ("complete", bool)):
            if isinstance(data.get(key), kind):
                head[key] = data[key]
        if isinstance(data.get("records"), list):
            head["records"] = len(data["records"])
    return head


def reported_run(report_dir: str | Path, manifest: RunManifest) -> dict[str, Any] | None:
    """The head of ``report_dir``'s results.json (``results_head``) when it reports the run of
    ``manifest`` (the same start), else None. The run writes it when it ends, also when a
    signal stops it (``complete: false``, a ``finished_at``); ``flexconf recover`` writes it
    with no ``finished_at``."""
    head = results_head(Path(report_dir))
    if manifest.started_at and head.get("started_at") == manifest.started_at:
        return head
    return None


def set_aside_report(report_dir: str | Path, manifest: RunManifest) -> bool:
    """Whether the store's run (``manifest``) reported itself complete and a later run,
    stopped before its first case, set that report aside into ``previous/``: nothing to recover
    or resume, its report is ``previous/``'s. (An incomplete one may still be resumed.)"""
    head = set_aside_head(report_dir, manifest)
    return head is not None and head.get("complete") is True


def set_aside_head(report_dir: str | Path, manifest: RunManifest) -> dict[str, Any] | None:
    """The head (``results_head``) of ``previous/results.json`` where it reports the store's
    run (``manifest``), reported (complete, stopped by a signal, or recovered) before a later
    run, stopped before its first case, set it aside; else None."""
    report_dir = Path(report_dir)
    head = results_head(report_dir / PREVIOUS_DIR)
    if manifest.started_at and head.get("started_at") == manifest.started_at \
            and (records_dir(report_dir) / REPORTED_NAME).exists():
        return head
    return None


def unreported_run(report_dir: str | Path) -> RunManifest | None:
    """The manifest of a run that recorded cases in ``report_dir`` and stopped without its
    results (``kill -9``, a lost machine): clearing its store would lose what finished. None
    when there is no such run: no manifest, no case recorded, or a results.json of that run
    (written by the run, or by ``flexconf recover``; moved away since, or still here). A
    manifest that cannot be read is no run to keep either: neither recover nor ``--resume``
    can use it."""
    try:
        manifest = read_manifest(report_dir)
    except UserFileError:
        return None
    if manifest is None or (records_dir(report_dir) / REPORTED_NAME).exists() \
            or reported_run(report_dir, manifest) is not None:  # a store from before the note
        return None
    recorded_a_case = any(event.get("event") in ("started", "finished")
                          for event in read_events(report_dir))
    return manifest if recorded_a_case else None


def unreadable_run(report_dir: str | Path) -> str | None:
    """Why the manifest of a run that recorded finished cases in ``report_dir`` and was not
    reported cannot be read (a disk fault, a hand edit); None otherwise. Neither recover nor
    ``--resume`` can use such a store, but its records are still what finished: a new run
    that cleared it lost them without a word (an outside audit)."""
    try:
        read_manifest(report_dir)
        return None
    except UserFileError as exc:
        problem = str(exc)
    if (records_dir(report_dir) / REPORTED_NAME).exists():
        return None
    finished = any(event.get("event") == "finished" for event in read_events(report_dir))
    return problem if finished else None


def write_run(report_dir: str | Path, merged: Merged, environment: dict[str, Any],
              options: dict[str, Any], suite_version: str, started_at: str, finished_at: str,
              complete: bool, selected_count: int | None = None,
              selection: dict[str, Any] | None = None) -> RunResults:
    """Write ``<report-dir>/results.json``, note that the store's records are reported
    (``REPORTED_NAME``), and return what was written."""
    results = RunResults(environment=environment, options=options,
                         records=tuple(merged.records), suite_version=suite_version,
                         started_at=started_at, finished_at=finished_at, complete=complete,
                         selected_count=selected_count, selection=selection)
    from records.results import ResultsError, validate_results_json

    try:  # checked before anything is written: never a results.json that cannot be read
        data = json.loads(strict_json_text(results.to_json()))
        problem = shape_problem(data)
        if problem:
            raise ResultsError(f"{report_dir}/records: {problem}", "")
        validate_results_json(data, f"{report_dir}/records")
    except ResultsError as exc:
        raise ResultsError(exc.problem, "the run's manifest or records hold what no results "
                           "file may (a hand edit, a disk fault); run it again") from None
    write_results(results, Path(report_dir) / "results.json")
    records_dir(report_dir).mkdir(parents=True, exist_ok=True)
    (records_dir(report_dir) / REPORTED_NAME).touch()
    return results
